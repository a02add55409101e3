// Timing for the GPU microbenchmarks: CUDA events around `f` on `stream`, 3 warm-up calls, the
// median of `reps` timed calls, in milliseconds.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <vector>

#include "kernels/cuda/cuda_check.hpp"

namespace laoyao::bench {

inline float median_ms(const std::function<void()>& f, cudaStream_t stream, int reps) {
  cudaEvent_t a, b;
  LAOYAO_CUDA_CHECK(cudaEventCreate(&a));
  LAOYAO_CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) f();
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    LAOYAO_CUDA_CHECK(cudaEventRecord(a, stream));
    f();
    LAOYAO_CUDA_CHECK(cudaEventRecord(b, stream));
    LAOYAO_CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    LAOYAO_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  LAOYAO_CUDA_CHECK(cudaEventDestroy(a));
  LAOYAO_CUDA_CHECK(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace laoyao::bench
