// Dynamic shared memory beyond 48 KiB must be allowed per kernel, and the attribute belongs to the
// kernel on one device: a launch site sets it the first time it runs on each device (`laoyao
// doctor` runs the kernels on every GPU of one process).
#pragma once
#include <cuda_runtime.h>

#include <array>
#include <cstddef>

#include "kernels/cuda/cuda_check.hpp"

namespace laoyao::kernels::cuda {

// True the first time the calling site (its own `seen`, one flag per device) runs on the current
// device, and for devices beyond the array's size.
inline bool first_on_this_device(std::array<bool, 64>& seen) {
  int dev = 0;
  LAOYAO_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 0 || dev >= int(seen.size()) || seen[size_t(dev)]) return dev >= int(seen.size());
  seen[size_t(dev)] = true;
  return true;
}

template <class Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  LAOYAO_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

}  // namespace laoyao::kernels::cuda
