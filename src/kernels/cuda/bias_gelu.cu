// Fused bias + GeLU (tanh or erf) forward and backward (see bias_gelu.hpp). Memory-bound: each thread moves
// 16 bytes (8 bf16) per tensor per step when the rows allow it (F % 8 == 0, 16-byte aligned
// pointers), else one element; the math is identical in both paths.
#include <algorithm>
#include <cstdint>

#include "kernels/cuda/bias_gelu.hpp"
#include "kernels/cuda/cuda_check.hpp"

namespace laoyao::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;

// Megatron's constants kept exactly as fused_bias_gelu.py writes them (0.79788456 is sqrt(2/pi)
// rounded; 0.1070322243 is 3 * 0.044715 * 0.79788456), as in kernels/cpu/activations.cpp.
constexpr float kA = 0.79788456f;
constexpr float kB = 0.044715f;
constexpr float kDB = 0.1070322243f;

constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;

template <bool kErf>
__device__ __forceinline__ float gelu(float u) {
  if (kErf) return u * 0.5f * (1.0f + erff(u * kInvSqrt2));  // F.gelu, approximate='none'
  return u * 0.5f * (1.0f + tanhf(kA * u * (1.0f + kB * u * u)));
}

template <bool kErf>
__device__ __forceinline__ float gelu_grad(float u) {
  if (kErf) return 0.5f * (1.0f + erff(u * kInvSqrt2)) + u * kInvSqrt2Pi * expf(-0.5f * u * u);
  const float t = tanhf(kA * u * (1.0f + kB * u * u));
  return 0.5f * u * ((1.0f - t * t) * (kA + kDB * u * u)) + 0.5f * (1.0f + t);
}

// out = gelu(x + bias) (forward) or dy * gelu'(x + bias) (backward), kWidth elements per step.
template <bool kBackward, bool kErf, int kWidth>
__global__ void bias_gelu_kernel(const bf16* __restrict__ dy, const bf16* __restrict__ x,
                                 const bf16* __restrict__ bias, bf16* __restrict__ out, int64_t steps, int64_t F) {
  // 16-byte vectors when kWidth == 8, single elements otherwise.
  struct alignas(kWidth * sizeof(bf16)) Pack {
    bf16 v[kWidth];
  };
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t step = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; step < steps; step += stride) {
    const int64_t e = step * kWidth;
    const int64_t f = e % F;  // kWidth divides F, so the pack lies within one row
    const Pack xv = *reinterpret_cast<const Pack*>(x + e);
    const Pack bv = *reinterpret_cast<const Pack*>(bias + f);
    Pack gv{};
    if (kBackward) gv = *reinterpret_cast<const Pack*>(dy + e);
    Pack ov;
#pragma unroll
    for (int t = 0; t < kWidth; ++t) {
      const float u = __bfloat162float(xv.v[t]) + __bfloat162float(bv.v[t]);
      ov.v[t] = __float2bfloat16(kBackward ? gelu_grad<kErf>(u) * __bfloat162float(gv.v[t]) : gelu<kErf>(u));
    }
    *reinterpret_cast<Pack*>(out + e) = ov;
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <bool kBackward, bool kErf>
void launch(const bf16* dy, const bf16* x, const bf16* bias, bf16* out, int64_t T, int64_t F, cudaStream_t stream) {
  const int64_t n = T * F;
  if (n <= 0) return;
  constexpr int kThreads = 256;
  constexpr int64_t kMaxBlocks = 8192;  // a grid-stride loop covers the rest
  const bool vec = F % 8 == 0 && aligned16(x) && aligned16(bias) && aligned16(out) && (!kBackward || aligned16(dy));
  const int64_t steps = vec ? n / 8 : n;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((steps + kThreads - 1) / kThreads, kMaxBlocks));
  if (vec)
    bias_gelu_kernel<kBackward, kErf, 8><<<blocks, kThreads, 0, stream>>>(dy, x, bias, out, steps, F);
  else
    bias_gelu_kernel<kBackward, kErf, 1><<<blocks, kThreads, 0, stream>>>(dy, x, bias, out, steps, F);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void bias_gelu_forward(const bf16* x, const bf16* bias, bf16* y, int64_t T, int64_t F, cudaStream_t stream,
                       bool erf) {
  if (erf)
    launch<false, true>(nullptr, x, bias, y, T, F, stream);
  else
    launch<false, false>(nullptr, x, bias, y, T, F, stream);
}

void bias_gelu_backward(const bf16* dy, const bf16* x, const bf16* bias, bf16* dx, int64_t T, int64_t F,
                        cudaStream_t stream, bool erf) {
  if (erf)
    launch<true, true>(dy, x, bias, dx, T, F, stream);
  else
    launch<true, false>(dy, x, bias, dx, T, F, stream);
}

}  // namespace laoyao::kernels::cuda
