// SwiGLU forward/backward (see swiglu.hpp). Memory-bound: where F % 8 == 0 and the rows are 16-byte
// aligned each thread moves 16-byte packs of 8 bf16 (one gate pack, one linear pack) with 32-bit
// index math; otherwise one element a thread. Same fp32 arithmetic on both paths.
#include <cstdint>
#include <initializer_list>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/swiglu.hpp"

namespace laoyao::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;
constexpr int kThreads = 256;

struct alignas(16) Pack8 {
  bf16 v[8];
};

__device__ __forceinline__ float sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }

// y = silu(gate) * lin; or, given dy, dgate and dlin.
__device__ __forceinline__ float swiglu_y(float gate, float lin) { return gate * sigmoid(gate) * lin; }
__device__ __forceinline__ void swiglu_dx(float gate, float lin, float g, float& dgate, float& dlin) {
  const float s = sigmoid(gate);
  dgate = g * s * (1.0f + gate * (1.0f - s)) * lin;
  dlin = g * gate * s;
}

template <bool kBackward>
__global__ void swiglu_kernel(const bf16* __restrict__ x, const bf16* __restrict__ dy, bf16* __restrict__ out,
                              int64_t T, int64_t F, const int32_t* __restrict__ rows_end) {
  const int64_t n = (rows_end && *rows_end < T ? *rows_end : T) * F;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / F, f = i % F;
    const float gate = __bfloat162float(x[t * 2 * F + f]), lin = __bfloat162float(x[t * 2 * F + F + f]);
    if (!kBackward) {
      out[i] = __float2bfloat16(swiglu_y(gate, lin));
    } else {
      float dg, dl;
      swiglu_dx(gate, lin, __bfloat162float(dy[i]), dg, dl);
      out[t * 2 * F + f] = __float2bfloat16(dg);
      out[t * 2 * F + F + f] = __float2bfloat16(dl);
    }
  }
}

// Packs of 8: n = T * F/8 packs, Index 32-bit whenever n (plus one grid stride) fits.
template <bool kBackward, typename Index>
__global__ void swiglu_pack_kernel(const Pack8* __restrict__ x, const Pack8* __restrict__ dy, Pack8* __restrict__ out,
                                   Index n, Index fp, const int32_t* __restrict__ rows_end) {
  if (rows_end && Index(*rows_end) * fp < n) n = Index(*rows_end) * fp;
  for (Index i = Index(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += Index(gridDim.x) * blockDim.x) {
    const Index t = i / fp, f = i - t * fp;
    const Pack8 gate = x[t * 2 * fp + f], lin = x[t * 2 * fp + fp + f];
    if (!kBackward) {
      Pack8 y;
#pragma unroll
      for (int e = 0; e < 8; ++e)
        y.v[e] = __float2bfloat16(swiglu_y(__bfloat162float(gate.v[e]), __bfloat162float(lin.v[e])));
      out[i] = y;
    } else {
      const Pack8 g = dy[i];
      Pack8 dgate, dlin;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        float a, b;
        swiglu_dx(__bfloat162float(gate.v[e]), __bfloat162float(lin.v[e]), __bfloat162float(g.v[e]), a, b);
        dgate.v[e] = __float2bfloat16(a);
        dlin.v[e] = __float2bfloat16(b);
      }
      out[t * 2 * fp + f] = dgate;
      out[t * 2 * fp + fp + f] = dlin;
    }
  }
}

unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 65536 ? (b > 0 ? b : 1) : 65536);
}

bool packable(int64_t F, std::initializer_list<const void*> ptrs) {
  if (F % 8 != 0) return false;
  for (const void* p : ptrs)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}

template <bool kBackward>
void launch(const bf16* x, const bf16* dy, bf16* out, int64_t T, int64_t F, cudaStream_t stream,
            const int32_t* rows_end) {
  if (T <= 0 || F <= 0) return;
  if (packable(F, {x, dy, out})) {
    const int64_t fp = F / 8, n = T * fp;
    const auto* px = reinterpret_cast<const Pack8*>(x);
    const auto* pdy = reinterpret_cast<const Pack8*>(dy);
    auto* po = reinterpret_cast<Pack8*>(out);
    if (n < (int64_t(1) << 30))  // n + one stride (at most 2^24) stays below 2^31
      swiglu_pack_kernel<kBackward, int32_t><<<blocks_for(n), kThreads, 0, stream>>>(px, pdy, po, int32_t(n),
                                                                                     int32_t(fp), rows_end);
    else
      swiglu_pack_kernel<kBackward, int64_t><<<blocks_for(n), kThreads, 0, stream>>>(px, pdy, po, n, fp, rows_end);
  } else {
    swiglu_kernel<kBackward><<<blocks_for(T * F), kThreads, 0, stream>>>(x, dy, out, T, F, rows_end);
  }
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void swiglu_forward(const bf16* x, bf16* y, int64_t T, int64_t F, cudaStream_t stream, const int32_t* rows_end) {
  launch<false>(x, nullptr, y, T, F, stream, rows_end);
}

void swiglu_backward(const bf16* x, const bf16* dy, bf16* dx, int64_t T, int64_t F, cudaStream_t stream,
                     const int32_t* rows_end) {
  launch<true>(x, dy, dx, T, F, stream, rows_end);
}

}  // namespace laoyao::kernels::cuda
