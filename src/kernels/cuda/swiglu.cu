// SwiGLU forward/backward (see swiglu.hpp): one thread per output element, grid-stride.
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/swiglu.hpp"

namespace laoyao::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;
constexpr int kThreads = 256;

__device__ __forceinline__ float sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }

template <bool kBackward>
__global__ void swiglu_kernel(const bf16* __restrict__ x, const bf16* __restrict__ dy, bf16* __restrict__ out,
                              int64_t T, int64_t F) {
  const int64_t n = T * F;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / F, f = i % F;
    const float gate = __bfloat162float(x[t * 2 * F + f]), lin = __bfloat162float(x[t * 2 * F + F + f]);
    const float s = sigmoid(gate);
    if (!kBackward) {
      out[i] = __float2bfloat16(gate * s * lin);
    } else {
      const float g = __bfloat162float(dy[i]);
      out[t * 2 * F + f] = __float2bfloat16(g * s * (1.0f + gate * (1.0f - s)) * lin);
      out[t * 2 * F + F + f] = __float2bfloat16(g * gate * s);
    }
  }
}

unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 65536 ? (b > 0 ? b : 1) : 65536);
}

}  // namespace

void swiglu_forward(const bf16* x, bf16* y, int64_t T, int64_t F, cudaStream_t stream) {
  if (T <= 0 || F <= 0) return;
  swiglu_kernel<false><<<blocks_for(T * F), kThreads, 0, stream>>>(x, nullptr, y, T, F);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

void swiglu_backward(const bf16* x, const bf16* dy, bf16* dx, int64_t T, int64_t F, cudaStream_t stream) {
  if (T <= 0 || F <= 0) return;
  swiglu_kernel<true><<<blocks_for(T * F), kThreads, 0, stream>>>(x, dy, dx, T, F);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

}  // namespace laoyao::kernels::cuda
