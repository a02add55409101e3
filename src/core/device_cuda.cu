// Device discovery through the CUDA runtime. Compiled only when the CUDA backend is built.
#include <cuda_runtime.h>

#include <cstdio>
#include <string>

#include "core/device.hpp"
#include "core/error.hpp"

namespace laoyao {

bool cuda_backend_built() { return true; }

int cuda_device_count() {
  int n = 0;
  // No driver or no GPU is an ordinary answer here, not an error: report zero devices.
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

std::string cuda_device_summary(int i) {
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, i) != cudaSuccess) {
    (void)cudaGetLastError();
    return {};
  }
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s, cc %d.%d, %d SMs, %.1f GiB", p.name, p.major, p.minor,
                p.multiProcessorCount, static_cast<double>(p.totalGlobalMem) / (1024.0 * 1024 * 1024));
  return buf;
}

size_t cuda_device_memory_bytes(int i) {
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, i) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return p.totalGlobalMem;
}

void cuda_set_device(int i) {
  const cudaError_t st = cudaSetDevice(i);
  if (st != cudaSuccess) {
    (void)cudaGetLastError();
    throw Error("cudaSetDevice(" + std::to_string(i) + ") failed: " + cudaGetErrorString(st));
  }
}

}  // namespace laoyao
