// LayerNorm forward and backward for BF16 tensors (see layernorm.hpp). One thread block per row for
// the row-wise work (statistics, dx); the row is re-read from global memory for each pass, which
// the L1/L2 caches serve (rows are a few KiB). The parameter gradients use a two-kernel reduction:
// a [column tile x row chunk] grid writes partial sums, then one thread per column adds the chunks
// in chunk order. Every reduction has a fixed order, so results do not vary between runs.
#include <cstdint>
#include <string>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/layernorm.hpp"

namespace laoyao::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kRowThreads = 256;      // threads per row in the row-wise kernels (a multiple of 32)
constexpr int kColTile = 32;          // columns per block in the parameter-gradient kernel (one warp wide)
constexpr int kColRows = 8;           // rows of threads per block there
constexpr int64_t kRowsPerChunk = 128;  // rows summed into one partial: bounds fp32 error growth and scratch

// Sum over the block in a fixed order (shuffle tree, then the warp sums by one warp). `sh` holds
// 32 floats; the leading barrier lets a caller reuse `sh` for consecutive sums.
__device__ float block_sum(float v, float* sh) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  v = lane < int(blockDim.x >> 5) ? sh[lane] : 0.0f;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;  // every thread holds the block's sum
}

__device__ __forceinline__ float gamma_at(const bf16* gamma, int64_t c, bool zero_centered) {
  const float g = __bfloat162float(gamma[c]);
  return zero_centered ? 1.0f + g : g;
}

__global__ void layernorm_forward_kernel(const bf16* __restrict__ x, const bf16* __restrict__ gamma,
                                         const bf16* __restrict__ beta, bf16* __restrict__ y,
                                         float* __restrict__ mean, float* __restrict__ rstd, int64_t C, float eps,
                                         bool zero_centered) {
  __shared__ float sh[32];
  const int64_t t = blockIdx.x;
  const bf16* xr = x + t * C;
  float s = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += __bfloat162float(xr[c]);
  const float m = block_sum(s, sh) / float(C);
  // Two-pass variance (as the CPU reference): no cancellation for rows with a large mean.
  float sq = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float d = __bfloat162float(xr[c]) - m;
    sq += d * d;
  }
  const float r = 1.0f / sqrtf(block_sum(sq, sh) / float(C) + eps);  // not rsqrtf: keep rstd correctly rounded-ish
  if (threadIdx.x == 0) {
    mean[t] = m;
    rstd[t] = r;
  }
  bf16* yr = y + t * C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
    yr[c] = __float2bfloat16((__bfloat162float(xr[c]) - m) * r * gamma_at(gamma, c, zero_centered) +
                             __bfloat162float(beta[c]));
}

// dx = rstd * (g*dy - mean(g*dy) - xhat * mean(g*dy*xhat)), one block per row.
__global__ void layernorm_dx_kernel(const bf16* __restrict__ dy, const bf16* __restrict__ x,
                                    const bf16* __restrict__ gamma, const float* __restrict__ mean,
                                    const float* __restrict__ rstd, bf16* __restrict__ dx, int64_t C,
                                    bool zero_centered) {
  __shared__ float sh[32];
  const int64_t t = blockIdx.x;
  const bf16* xr = x + t * C;
  const bf16* dyr = dy + t * C;
  const float m = mean[t], r = rstd[t];
  float s1 = 0.0f, s2 = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float xhat = (__bfloat162float(xr[c]) - m) * r;
    const float dxhat = __bfloat162float(dyr[c]) * gamma_at(gamma, c, zero_centered);
    s1 += dxhat;
    s2 += dxhat * xhat;
  }
  const float a = block_sum(s1, sh) / float(C);
  const float b = block_sum(s2, sh) / float(C);
  bf16* dxr = dx + t * C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float xhat = (__bfloat162float(xr[c]) - m) * r;
    const float dxhat = __bfloat162float(dyr[c]) * gamma_at(gamma, c, zero_centered);
    dxr[c] = __float2bfloat16(r * (dxhat - a - xhat * b));
  }
}

// Partial sums over one chunk of rows: partial[chunk][0][c] = sum dy*xhat, partial[chunk][1][c] =
// sum dy. Block (kColTile, kColRows): a warp reads kColTile consecutive columns of one row.
__global__ void layernorm_param_partial_kernel(const bf16* __restrict__ dy, const bf16* __restrict__ x,
                                               const float* __restrict__ mean, const float* __restrict__ rstd,
                                               float* __restrict__ partial, int64_t T, int64_t C) {
  __shared__ float sg[kColRows][kColTile], sb[kColRows][kColTile];
  const int64_t c = int64_t(blockIdx.x) * kColTile + threadIdx.x;
  const int64_t chunk = blockIdx.y;
  const int64_t end = (chunk + 1) * kRowsPerChunk, t1 = end < T ? end : T;
  float g = 0.0f, b = 0.0f;
  if (c < C) {
    for (int64_t t = chunk * kRowsPerChunk + threadIdx.y; t < t1; t += kColRows) {
      const float d = __bfloat162float(dy[t * C + c]);
      g += d * ((__bfloat162float(x[t * C + c]) - mean[t]) * rstd[t]);
      b += d;
    }
  }
  sg[threadIdx.y][threadIdx.x] = g;
  sb[threadIdx.y][threadIdx.x] = b;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    for (int i = 1; i < kColRows; ++i) {  // fixed order
      g += sg[i][threadIdx.x];
      b += sb[i][threadIdx.x];
    }
    partial[(chunk * 2 + 0) * C + c] = g;
    partial[(chunk * 2 + 1) * C + c] = b;
  }
}

// dgamma[c] += sum over chunks (in chunk order) of the partials; same for dbeta.
__global__ void layernorm_param_reduce_kernel(const float* __restrict__ partial, float* __restrict__ dgamma,
                                              float* __restrict__ dbeta, int64_t chunks, int64_t C) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float g = 0.0f, b = 0.0f;
  for (int64_t k = 0; k < chunks; ++k) {
    g += partial[(k * 2 + 0) * C + c];
    b += partial[(k * 2 + 1) * C + c];
  }
  dgamma[c] += g;
  dbeta[c] += b;
}

int64_t chunks_for(int64_t T) { return (T + kRowsPerChunk - 1) / kRowsPerChunk; }

void check_rows(int64_t T, const char* op) {
  // One block per row along grid.x (limit 2^31 - 1).
  if (T > int64_t(0x7fffffff)) throw Error(std::string(op) + ": too many rows for one launch");
}

}  // namespace

void layernorm_forward(const bf16* x, const bf16* gamma, const bf16* beta, bf16* y, float* mean, float* rstd,
                       int64_t T, int64_t C, float eps, bool zero_centered_gamma, cudaStream_t stream) {
  if (T <= 0 || C <= 0) return;
  check_rows(T, "layernorm_forward");
  layernorm_forward_kernel<<<unsigned(T), kRowThreads, 0, stream>>>(x, gamma, beta, y, mean, rstd, C, eps,
                                                                    zero_centered_gamma);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

size_t layernorm_backward_scratch_floats(int64_t T, int64_t C) {
  return T <= 0 || C <= 0 ? 0 : size_t(chunks_for(T)) * 2 * size_t(C);
}

void layernorm_backward(const bf16* dy, const bf16* x, const bf16* gamma, const float* mean, const float* rstd,
                        bf16* dx, float* dgamma, float* dbeta, float* scratch, int64_t T, int64_t C,
                        bool zero_centered_gamma, cudaStream_t stream) {
  if (T <= 0 || C <= 0) return;
  check_rows(T, "layernorm_backward");
  const int64_t chunks = chunks_for(T);
  if (chunks > 65535) throw Error("layernorm_backward: too many row chunks for grid.y");
  layernorm_dx_kernel<<<unsigned(T), kRowThreads, 0, stream>>>(dy, x, gamma, mean, rstd, dx, C, zero_centered_gamma);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
  const dim3 grid(unsigned((C + kColTile - 1) / kColTile), unsigned(chunks));
  layernorm_param_partial_kernel<<<grid, dim3(kColTile, kColRows), 0, stream>>>(dy, x, mean, rstd, scratch, T, C);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
  layernorm_param_reduce_kernel<<<unsigned((C + 255) / 256), 256, 0, stream>>>(scratch, dgamma, dbeta, chunks, C);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

}  // namespace laoyao::kernels::cuda
