// What the GPU microbenchmarks share: random bf16 inputs, and timing with CUDA events around `f`
// on `stream` (3 warm-up calls, the median of `reps` timed calls, in milliseconds).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>

#include "core/rng.hpp"
#include "core/runtime_options.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/device_buffer.hpp"

namespace laoyao::bench {

// laoyao's LAOYAO_* switches from the environment, as `laoyao` reads them (a bench's first call):
// LAOYAO_GROUPED_GEMM=cp_async laoyao_bench_grouped_gemm times the cp.async kernels.
inline void read_runtime_options() { set_runtime_options(runtime_options_from_environment()); }

// n values of N(0, stddev) from laoyao's stream `name`, rounded to bf16, on the device.
inline kernels::cuda::DeviceBuffer random_bf16(int64_t n, const char* name, double stddev = 1.0) {
  std::vector<__nv_bfloat16> h(static_cast<size_t>(n));
  Rng rng(1, name);
  for (auto& x : h) x = __float2bfloat16(static_cast<float>(stddev * rng.normal()));
  kernels::cuda::DeviceBuffer d(sizeof(__nv_bfloat16) * h.size());
  d.upload(h.data(), d.bytes);
  return d;
}

// `before` (when given) runs ahead of each call of f, untimed: f measured after other work, as it
// runs inside a training step (the GPU busy and hot, the caches holding someone else's data).
inline float median_ms(const std::function<void()>& f, cudaStream_t stream, int reps,
                       const std::function<void()>& before = {}) {
  cudaEvent_t a, b;
  LAOYAO_CUDA_CHECK(cudaEventCreate(&a));
  LAOYAO_CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) {
    if (before) before();
    f();
  }
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    if (before) before();
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
