#include "kernels/cuda/fp8_cast.hpp"

#include <cuda_fp8.h>

#include <algorithm>
#include <cfloat>

#include "kernels/cuda/cuda_check.hpp"

namespace laoyao::kernels::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ uint8_t to_fp8(float v, Fp8Format f) {
  return f == Fp8Format::E4M3 ? __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3)
                              : __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E5M2);
}

// Non-negative floats order as their bits do; a NaN never reaches here (fmaxf passed over it).
__device__ __forceinline__ void atomic_max_nonnegative(float* at, float v) {
  atomicMax(reinterpret_cast<int*>(at), __float_as_int(v));
}

// A block's max of its threads' values into *amax (blocks of kThreads threads, in x or in x and y).
__device__ void block_amax(float local, float* amax) {
  __shared__ float warps[kThreads / 32];
  const unsigned t = threadIdx.y * blockDim.x + threadIdx.x;
  for (int o = 16; o > 0; o >>= 1) local = fmaxf(local, __shfl_xor_sync(0xffffffffu, local, o));
  if (t % 32 == 0) warps[t / 32] = local;
  __syncthreads();
  if (t < 32) {
    float m = t < kThreads / 32 ? warps[t] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (t == 0 && m > 0.0f) atomic_max_nonnegative(amax, m);
  }
}

__global__ void cast_kernel(const __nv_bfloat16* __restrict__ x, int64_t n, const float* __restrict__ scale,
                            Fp8Format f, uint8_t* __restrict__ q, float* __restrict__ scale_inv, float* amax) {
  const float s = scale ? *scale : 1.0f;
  float m = 0.0f;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = __bfloat162float(x[i]);
    m = fmaxf(m, fabsf(v));
    if (q) q[i] = to_fp8(v * s, f);
  }
  if (amax) block_amax(m, amax);
  if (scale_inv && blockIdx.x == 0 && threadIdx.x == 0) *scale_inv = 1.0f / s;
}

// 32 x 32 tiles through shared memory: reads and both writes along rows; kThreads threads a block.
constexpr int kTile = 32, kRowsPerPass = kThreads / kTile;

__global__ void cast_transpose_kernel(const __nv_bfloat16* __restrict__ x, int64_t rows, int64_t cols,
                                      const float* __restrict__ scale, Fp8Format f, uint8_t* __restrict__ q,
                                      uint8_t* __restrict__ qt, float* __restrict__ scale_inv, float* amax) {
  __shared__ uint8_t tile[kTile][kTile + 4];
  const float s = *scale;
  const int64_t r0 = int64_t(blockIdx.y) * kTile, c0 = int64_t(blockIdx.x) * kTile;
  float m = 0.0f;
  for (int dr = threadIdx.y; dr < kTile; dr += kRowsPerPass) {
    const int64_t r = r0 + dr, c = c0 + threadIdx.x;
    if (r < rows && c < cols) {
      const float v = __bfloat162float(x[r * cols + c]);
      m = fmaxf(m, fabsf(v));
      const uint8_t b = to_fp8(v * s, f);
      if (q) q[r * cols + c] = b;
      tile[dr][threadIdx.x] = b;
    }
  }
  __syncthreads();
  if (qt)
    for (int dc = threadIdx.y; dc < kTile; dc += kRowsPerPass) {
      const int64_t c = c0 + dc, r = r0 + threadIdx.x;
      if (r < rows && c < cols) qt[c * rows + r] = tile[threadIdx.x][dc];
    }
  if (amax) block_amax(m, amax);
  if (scale_inv && blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0 && threadIdx.y == 0) *scale_inv = 1.0f / s;
}

__device__ float fp8_max_of(Fp8Format f) { return f == Fp8Format::E4M3 ? 448.0f : 57344.0f; }

__global__ void current_scale_kernel(const float* amax, Fp8Format f, float* scale) {
  const float a = *amax;
  float s = 1.0f;
  if (isfinite(a) && a > 0.0f) {
    s = __fdiv_rn(fp8_max_of(f), a);
    if (isinf(s)) s = FLT_MAX;
  }
  *scale = s;
}

__global__ void delayed_update_kernel(float* history, float* scale, const float* fp8_max, int64_t n, int64_t len,
                                      bool max_algo, int margin) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float last = history[i];
  float amax = last;  // (a tensor not cast this pass: 0 under either algorithm)
  if (last != 0.0f) {
    if (max_algo)
      for (int64_t r = 1; r < len; ++r) amax = fmaxf(amax, history[r * n + i]);
    for (int64_t r = 0; r + 1 < len; ++r) history[r * n + i] = history[(r + 1) * n + i];
    history[(len - 1) * n + i] = last;
    history[i] = 0.0f;  // (with a history of one the slot just written is also row 0: it starts over)
  }
  if (isfinite(amax) && amax > 0.0f) {
    float s = __fdiv_rn(ldexpf(fp8_max[i], -margin), amax);
    if (isinf(s)) s = FLT_MAX;
    scale[i] = s;
  }
}

int blocks_for(int64_t n) { return static_cast<int>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, 4096)); }

}  // namespace

void fp8_cast(const __nv_bfloat16* x, int64_t n, const float* scale, Fp8Format f, uint8_t* q, float* scale_inv,
              float* amax, cudaStream_t stream) {
  cast_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, n, scale, f, q, scale_inv, amax);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

void fp8_amax(const __nv_bfloat16* x, int64_t n, float* amax, cudaStream_t stream) {
  cast_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, n, nullptr, Fp8Format::E4M3, nullptr, nullptr, amax);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

void fp8_cast_transpose(const __nv_bfloat16* x, int64_t rows, int64_t cols, const float* scale, Fp8Format f,
                        uint8_t* q, uint8_t* qt, float* scale_inv, float* amax, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((cols + kTile - 1) / kTile), static_cast<unsigned>((rows + kTile - 1) / kTile));
  cast_transpose_kernel<<<grid, dim3(kTile, kRowsPerPass), 0, stream>>>(x, rows, cols, scale, f, q, qt, scale_inv,
                                                                        amax);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

void fp8_current_scale(const float* amax, Fp8Format f, float* scale, cudaStream_t stream) {
  current_scale_kernel<<<1, 1, 0, stream>>>(amax, f, scale);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

void fp8_delayed_update(float* history, float* scale, const float* fp8_max, int64_t n, int64_t len, bool max_algo,
                        int margin, cudaStream_t stream) {
  delayed_update_kernel<<<blocks_for(n), kThreads, 0, stream>>>(history, scale, fp8_max, n, len, max_algo, margin);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

}  // namespace laoyao::kernels::cuda
