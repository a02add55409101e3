// Dynamic shared memory beyond 48 KiB must be allowed per kernel, and the attribute belongs to the
// kernel on one device: a launch site sets it the first time it runs on each device (`laoyao
// doctor` runs the kernels on every GPU of one process), before any thread launches it there.
#pragma once
#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <mutex>

#include "kernels/cuda/cuda_check.hpp"

namespace laoyao::kernels::cuda {

// One launch site's record of the devices on which its kernels have been allowed their shared
// memory. once(allow) runs allow() the first time the site runs on the current device; any other
// caller, on any thread, waits until it has: no launch may see the attribute unset (threads
// sharing a GPU, as the tests' ranks do, would otherwise launch while the first one sets it).
class SmemSite {
 public:
  template <class Allow>
  void once(Allow&& allow) {
    int dev = 0;
    LAOYAO_CUDA_CHECK(cudaGetDevice(&dev));
    std::lock_guard<std::mutex> lock(mu_);
    const bool tracked = dev >= 0 && dev < kDevices;
    if (tracked && done_[size_t(dev)]) return;
    allow();
    if (tracked) done_[size_t(dev)] = true;
  }

 private:
  static constexpr int kDevices = 64;
  std::mutex mu_;
  std::array<bool, kDevices> done_{};
};

template <class Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  LAOYAO_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

}  // namespace laoyao::kernels::cuda
