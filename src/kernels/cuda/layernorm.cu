// LayerNorm forward and backward for BF16 tensors (see layernorm.hpp). One thread block per row for
// the row-wise work (statistics, dx); the row is re-read from global memory for each pass, which
// the L1/L2 caches serve (rows are a few KiB). The parameter gradients use a two-kernel reduction:
// partial sums per chunk of rows, then the chunks added in a fixed order. Where the rows fit a
// warp's registers (RMSNorm up to 2048 wide, LayerNorm up to 1024) the partials come from the dx
// kernel itself (one read of x and dy for both); otherwise a [column tile x row chunk] grid reads
// them again. Every reduction has a fixed order, so results do not vary between runs.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "kernels/cuda/chunk_reduce.hpp"
#include "core/runtime_options.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/elementwise.hpp"
#include "kernels/cuda/layernorm.hpp"
#include "kernels/cuda/smem_attribute.hpp"

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
      g += d * ((__bfloat162float(x[t * C + c]) - (mean ? mean[t] : 0.0f)) * rstd[t]);
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

// The row-wise kernels again with one warp per row and the row held in registers as 16-byte packs
// of 8 bf16 (C % 8 == 0, C <= 8 * 32 * kPacks): one read of x (and dy), reductions by warp
// shuffles, no block barriers. Same arithmetic as the block kernels above.
struct alignas(16) Pack8 {
  bf16 v[8];
};

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <int kPacks>
__global__ void layernorm_forward_warp_kernel(const bf16* __restrict__ x, const bf16* __restrict__ gamma,
                                              const bf16* __restrict__ beta, bf16* __restrict__ y,
                                              float* __restrict__ mean, float* __restrict__ rstd, int64_t T, int C,
                                              float eps, bool zero_centered) {
  const int64_t t = int64_t(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31, packs = C / 8;
  if (t >= T) return;
  Pack8 xv[kPacks];
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < kPacks; ++i) {
    const int p = lane + 32 * i;
    if (p < packs) {
      xv[i] = reinterpret_cast<const Pack8*>(x + t * C)[p];
#pragma unroll
      for (int e = 0; e < 8; ++e) s += __bfloat162float(xv[i].v[e]);
    }
  }
  const bool rms = beta == nullptr;  // RMSNorm: no centring, no bias
  const float m = rms ? 0.0f : warp_sum(s) / float(C);
  float sq = 0.0f;
#pragma unroll
  for (int i = 0; i < kPacks; ++i)
    if (lane + 32 * i < packs)
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float d = __bfloat162float(xv[i].v[e]) - m;
        sq += d * d;
      }
  const float r = 1.0f / sqrtf(warp_sum(sq) / float(C) + eps);
  if (lane == 0) {
    if (mean) mean[t] = m;
    rstd[t] = r;
  }
#pragma unroll
  for (int i = 0; i < kPacks; ++i) {
    const int p = lane + 32 * i;
    if (p >= packs) continue;
    const Pack8 g = reinterpret_cast<const Pack8*>(gamma)[p];
    const Pack8 b = rms ? Pack8{} : reinterpret_cast<const Pack8*>(beta)[p];
    Pack8 out;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float ge = zero_centered ? 1.0f + __bfloat162float(g.v[e]) : __bfloat162float(g.v[e]);
      out.v[e] = __float2bfloat16((__bfloat162float(xv[i].v[e]) - m) * r * ge + __bfloat162float(b.v[e]));
    }
    reinterpret_cast<Pack8*>(y + t * C)[p] = out;
  }
}

// Eight floats of shared memory as two 16-byte accesses (the address 32-byte aligned).
__device__ __forceinline__ void load8(const float* p, float (&v)[8]) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
__device__ __forceinline__ void store8(float* p, const float (&v)[8]) {
  reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
  reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
}

// One row's dx by one warp (the row in registers): dx = rstd * (g*dy - mean(g*dy) - xhat *
// mean(g*dy*xhat)), + dx's old value with accumulate. With kAcc, also adds dy * xhat into ga and
// (kBeta) dy into ba, this warp's rows of C floats in shared memory (each lane its own columns:
// no other lane touches them). Kept there, not in registers: 32 more registers a lane held the
// fused kernel to one block an SM (165 registers at 1024 wide). kSum adds the bf16 dx written
// into sa likewise (a bias gradient: layernorm.hpp's dx_colsum).
template <int kPacks, bool kAcc, bool kBeta, bool kSum = false>
__device__ __forceinline__ void norm_dx_row(const bf16* __restrict__ dy, const bf16* __restrict__ x,
                                            const bf16* __restrict__ gamma, const float* __restrict__ mean,
                                            const float* __restrict__ rstd, bf16* __restrict__ dx, int64_t t, int C,
                                            bool zero_centered, bool accumulate, float* ga, float* ba,
                                            float* sa = nullptr) {
  const int lane = threadIdx.x & 31, packs = C / 8;
  const bool rms = mean == nullptr;  // RMSNorm: xhat = x * rstd and no mean(dxhat) term
  const float m = rms ? 0.0f : mean[t], r = rstd[t];
  // ov: dx's old value (accumulate), loaded with the rest where the registers allow (up to 512
  // wide; wider rows load it after the sums: at 1024 a third pack array costs the fused kernel its
  // second block an SM).
  constexpr bool kEarlyOld = kPacks <= 2;
  Pack8 xv[kPacks], dv[kPacks], ov[kEarlyOld ? kPacks : 1];
  float s1 = 0.0f, s2 = 0.0f;
#pragma unroll
  for (int i = 0; i < kPacks; ++i) {
    const int p = lane + 32 * i;
    if (p < packs) {
      xv[i] = reinterpret_cast<const Pack8*>(x + t * C)[p];
      dv[i] = reinterpret_cast<const Pack8*>(dy + t * C)[p];
      if constexpr (kEarlyOld) ov[i] = accumulate ? reinterpret_cast<const Pack8*>(dx + t * C)[p] : Pack8{};
      const Pack8 g = reinterpret_cast<const Pack8*>(gamma)[p];
      float gsum[8], bsum[8];
      if constexpr (kAcc) load8(ga + p * 8, gsum);
      if constexpr (kAcc && kBeta) load8(ba + p * 8, bsum);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float ge = zero_centered ? 1.0f + __bfloat162float(g.v[e]) : __bfloat162float(g.v[e]);
        const float xhat = (__bfloat162float(xv[i].v[e]) - m) * r;
        const float d = __bfloat162float(dv[i].v[e]);
        const float dxhat = d * ge;
        s1 += dxhat;
        s2 += dxhat * xhat;
        if constexpr (kAcc) gsum[e] += d * xhat;
        if constexpr (kAcc && kBeta) bsum[e] += d;
      }
      if constexpr (kAcc) store8(ga + p * 8, gsum);
      if constexpr (kAcc && kBeta) store8(ba + p * 8, bsum);
    }
  }
  const float a = rms ? 0.0f : warp_sum(s1) / float(C), b = warp_sum(s2) / float(C);
#pragma unroll
  for (int i = 0; i < kPacks; ++i) {
    const int p = lane + 32 * i;
    if (p >= packs) continue;
    const Pack8 g = reinterpret_cast<const Pack8*>(gamma)[p];
    Pack8 old{};
    if constexpr (kEarlyOld)
      old = ov[i];
    else if (accumulate)
      old = reinterpret_cast<const Pack8*>(dx + t * C)[p];
    Pack8 out;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float ge = zero_centered ? 1.0f + __bfloat162float(g.v[e]) : __bfloat162float(g.v[e]);
      const float xhat = (__bfloat162float(xv[i].v[e]) - m) * r;
      const float dxhat = __bfloat162float(dv[i].v[e]) * ge;
      const float v = r * (dxhat - a - xhat * b);
      out.v[e] = __float2bfloat16(accumulate ? __bfloat162float(old.v[e]) + v : v);
    }
    reinterpret_cast<Pack8*>(dx + t * C)[p] = out;
    if constexpr (kSum) {
      float ssum[8];
      load8(sa + p * 8, ssum);
#pragma unroll
      for (int e = 0; e < 8; ++e) ssum[e] += __bfloat162float(out.v[e]);
      store8(sa + p * 8, ssum);
    }
  }
}

template <int kPacks>
__global__ void layernorm_dx_warp_kernel(const bf16* __restrict__ dy, const bf16* __restrict__ x,
                                         const bf16* __restrict__ gamma, const float* __restrict__ mean,
                                         const float* __restrict__ rstd, bf16* __restrict__ dx, int64_t T, int C,
                                         bool zero_centered, bool accumulate) {
  const int64_t t = int64_t(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (t >= T) return;
  norm_dx_row<kPacks, false, false>(dy, x, gamma, mean, rstd, dx, t, C, zero_centered, accumulate, nullptr, nullptr);
}

// dx as above, and the parameter-gradient partials of its chunk of kFusedWarps * rows_per_warp
// rows (partial[chunk][0][c] = sum dy*xhat, [1][c] = sum dy, not written for RMSNorm; with kSum,
// partial[chunk][3][C] and [2][c] = sum of the dx written): each warp adds its rows into its own
// rows of shared memory, the block then adds its warps in order (dynamic shared memory:
// kSums * kFusedWarps * C floats). Many warps a block, for more
// rows' loads in flight. With the sums in registers (eleventh session) the kernel took 165
// registers a lane at 1024 wide, one block an SM: 0.45 of cudaMemcpy's speed
// (bench/memory_ops_bench.cpp).
constexpr int kFusedWarps = 8;
// Rows a warp: at least 2, and enough that the grid is at most kFusedBlocks blocks (about two an
// SM of an H200, one wave): each block's fixed work (zeroing and adding its warps' sums, writing
// a partial row) and the partials' traffic then shrink as T grows. A function of T alone, so a
// result does not depend on the GPU. LAOYAO_NORM_ROWS_PER_WARP (2 to 4096) fixes it,
// for benchmarks.
constexpr int64_t kFusedBlocks = 256;
constexpr int64_t kFusedMinRowsPerWarp = 2;

int64_t fused_rows_per_warp(int64_t T) {
  // At least kFusedMinRowsPerWarp (runtime_options refuses less): the scratch is sized for it.
  if (const int64_t fixed = runtime_options().norm_rows_per_warp; fixed > 0) return fixed;
  const int64_t per_block = (T + kFusedBlocks - 1) / kFusedBlocks;
  const int64_t rows = (per_block + kFusedWarps - 1) / kFusedWarps;
  return rows > kFusedMinRowsPerWarp ? rows : kFusedMinRowsPerWarp;
}

template <bool kBeta, bool kSum>
constexpr int kSums = 1 + int(kBeta) + int(kSum);  // shared-memory sums: dy*xhat, dy, dx

template <int kPacks, bool kBeta, bool kSum>
__global__ void __launch_bounds__(kFusedWarps * 32, kPacks <= 4 ? 2 : 1)
    norm_backward_fused_kernel(const bf16* __restrict__ dy, const bf16* __restrict__ x,
                               const bf16* __restrict__ gamma, const float* __restrict__ mean,
                               const float* __restrict__ rstd, bf16* __restrict__ dx, float* __restrict__ partial,
                               int64_t T, int C, bool zero_centered, bool accumulate, int rows_per_warp) {
  extern __shared__ float red[];  // [kSums][kFusedWarps][C]: sums of dy*xhat, of dy (kBeta), of dx (kSum)
  constexpr int kOut = kSum ? 3 : 2;  // partial rows a chunk (add_chunk_partials3 or add_chunk_partials)
  const int warp = threadIdx.x >> 5;
  const int64_t chunk = blockIdx.x;
  float* ga = red + warp * C;
  float* ba = red + (kFusedWarps + warp) * C;
  float* sa = red + ((kBeta ? 2 : 1) * kFusedWarps + warp) * C;
  for (int c = threadIdx.x & 31; c < C; c += 32) {  // a warp's own rows: no barrier needed
    ga[c] = 0.0f;
    if constexpr (kBeta) ba[c] = 0.0f;
    if constexpr (kSum) sa[c] = 0.0f;
  }
  __syncwarp();
  for (int rr = 0; rr < rows_per_warp; ++rr) {
    const int64_t t = (chunk * rows_per_warp + rr) * kFusedWarps + warp;
    if (t >= T) break;
    norm_dx_row<kPacks, true, kBeta, kSum>(dy, x, gamma, mean, rstd, dx, t, C, zero_centered, accumulate, ga, ba, sa);
  }
  __syncthreads();
  for (int which = 0; which < kSums<kBeta, kSum>; ++which) {
    const int row = kSum && which == kSums<kBeta, kSum> - 1 ? 2 : which;  // the dx sums go to row 2
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
      float v = 0.0f;
      for (int w = 0; w < kFusedWarps; ++w) v += red[(which * kFusedWarps + w) * C + c];  // fixed order
      partial[(chunk * kOut + row) * C + c] = v;
    }
  }
}

// Packs per lane for the warp kernels (0: use the block kernels).
int warp_packs(int64_t C, const void* a, const void* b, const void* c, const void* d) {
  for (const void* p : {a, b, c, d})
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return 0;
  if (C % 8 != 0) return 0;
  const int64_t per_lane = (C / 8 + 31) / 32;
  for (int k : {1, 2, 4, 8, 16})
    if (per_lane <= k) return k;
  return 0;
}

template <template <int> class Launch, class... Args>
void dispatch_packs(int packs, Args... args) {
  switch (packs) {
    case 1: return Launch<1>::run(args...);
    case 2: return Launch<2>::run(args...);
    case 4: return Launch<4>::run(args...);
    case 8: return Launch<8>::run(args...);
    default: return Launch<16>::run(args...);
  }
}

constexpr int kWarpRows = 4;  // rows (warps) per block of the warp kernels

template <int P>
struct LaunchForward {
  static void run(const bf16* x, const bf16* gamma, const bf16* beta, bf16* y, float* mean, float* rstd, int64_t T,
                  int C, float eps, bool zc, cudaStream_t stream) {
    layernorm_forward_warp_kernel<P><<<unsigned((T + kWarpRows - 1) / kWarpRows), 32 * kWarpRows, 0, stream>>>(
        x, gamma, beta, y, mean, rstd, T, C, eps, zc);
  }
};

template <int P>
struct LaunchDx {
  static void run(const bf16* dy, const bf16* x, const bf16* gamma, const float* mean, const float* rstd, bf16* dx,
                  int64_t T, int C, bool zc, bool accumulate, cudaStream_t stream) {
    layernorm_dx_warp_kernel<P><<<unsigned((T + kWarpRows - 1) / kWarpRows), 32 * kWarpRows, 0, stream>>>(
        dy, x, gamma, mean, rstd, dx, T, C, zc, accumulate);
  }
};

template <int P, bool kBeta, bool kSum>
void launch_fused(const bf16* dy, const bf16* x, const bf16* gamma, const float* mean, const float* rstd, bf16* dx,
                  float* dgamma, float* dbeta, float* dx_colsum, float* partial, int64_t T, int C, bool zc,
                  bool accumulate, cudaStream_t stream) {
  const int64_t rows_per_warp = fused_rows_per_warp(T), rows = kFusedWarps * rows_per_warp;
  const int64_t chunks = (T + rows - 1) / rows;
  constexpr size_t kSmemRow = sizeof(float) * kSums<kBeta, kSum> * kFusedWarps;  // bytes a column
  static SmemSite site;  // one per instantiation: the attribute is the kernel's
  site.once([&] { allow_smem(norm_backward_fused_kernel<P, kBeta, kSum>, kSmemRow * 32 * 8 * P); });
  norm_backward_fused_kernel<P, kBeta, kSum><<<unsigned(chunks), kFusedWarps * 32, kSmemRow * size_t(C), stream>>>(
      dy, x, gamma, mean, rstd, dx, partial, T, C, zc, accumulate, int(rows_per_warp));
  LAOYAO_CUDA_CHECK(cudaGetLastError());
  // Without a mean (RMSNorm) the kernel writes no dbeta partials: none are read.
  if constexpr (kSum)
    add_chunk_partials3(partial, dgamma, kBeta ? dbeta : nullptr, dx_colsum, chunks, C, stream);
  else
    add_chunk_partials(partial, dgamma, kBeta ? dbeta : nullptr, chunks, C, stream);
}

using LaunchFused = void (*)(const bf16*, const bf16*, const bf16*, const float*, const float*, bf16*, float*, float*,
                             float*, float*, int64_t, int, bool, bool, cudaStream_t);
template <int P>
LaunchFused pick_fused(bool beta, bool sum) {
  if constexpr (P > 4) {  // RMSNorm only (fused_packs)
    return sum ? launch_fused<P, false, true> : launch_fused<P, false, false>;
  } else {
    if (beta) return sum ? launch_fused<P, true, true> : launch_fused<P, true, false>;
    return sum ? launch_fused<P, false, true> : launch_fused<P, false, false>;
  }
}

// The fused backward serves up to 8 packs a lane for RMSNorm (2048 wide) and 4 for LayerNorm (1024;
// its dbeta sums double the registers); 0: the separate kernels.
int fused_packs(int packs, bool beta) { return packs > 0 && packs <= (beta ? 4 : 8) ? packs : 0; }

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
  if (const int packs = warp_packs(C, x, gamma, beta, y))
    dispatch_packs<LaunchForward>(packs, x, gamma, beta, y, mean, rstd, T, int(C), eps, zero_centered_gamma, stream);
  else
    layernorm_forward_kernel<<<unsigned(T), kRowThreads, 0, stream>>>(x, gamma, beta, y, mean, rstd, C, eps,
                                                                      zero_centered_gamma);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

size_t layernorm_backward_scratch_floats(int64_t T, int64_t C) {
  // The fused kernel's chunks are the smaller: at least kFusedWarps * kFusedMinRowsPerWarp rows,
  // three partial rows each with dx_colsum; the other paths sum dx_colsum with bias_grad.
  const int64_t rows = kFusedWarps * kFusedMinRowsPerWarp;
  if (T <= 0 || C <= 0) return 0;
  return std::max(size_t((T + rows - 1) / rows) * 3 * size_t(C), bias_grad_scratch_floats(T, C));
}

void layernorm_backward(const bf16* dy, const bf16* x, const bf16* gamma, const float* mean, const float* rstd,
                        bf16* dx, float* dgamma, float* dbeta, float* scratch, int64_t T, int64_t C,
                        bool zero_centered_gamma, cudaStream_t stream, bool accumulate_dx, float* dx_colsum) {
  if (T <= 0 || C <= 0) return;
  check_rows(T, "layernorm_backward");
  const int64_t chunks = chunks_for(T);
  if (chunks > 65535) throw Error("layernorm_backward: too many row chunks for grid.y");
  const int packs = warp_packs(C, dy, x, gamma, dx);
  const bool beta = mean != nullptr;
  if (const int fp = fused_packs(packs, beta)) {
    const bool sum = dx_colsum != nullptr;
    const LaunchFused launch = fp == 1   ? pick_fused<1>(beta, sum)
                               : fp == 2 ? pick_fused<2>(beta, sum)
                               : fp == 4 ? pick_fused<4>(beta, sum)
                                         : pick_fused<8>(beta, sum);
    launch(dy, x, gamma, mean, rstd, dx, dgamma, dbeta, dx_colsum, scratch, T, int(C), zero_centered_gamma,
           accumulate_dx, stream);
    return;
  }
  if (packs) {
    dispatch_packs<LaunchDx>(packs, dy, x, gamma, mean, rstd, dx, T, int(C), zero_centered_gamma, accumulate_dx,
                             stream);
  } else if (!accumulate_dx && mean) {
    layernorm_dx_kernel<<<unsigned(T), kRowThreads, 0, stream>>>(dy, x, gamma, mean, rstd, dx, C, zero_centered_gamma);
  } else {
    throw Error(std::string(mean ? "layernorm_backward: accumulate_dx" : "rmsnorm_backward") +
                " needs C % 8 == 0, 16-byte aligned rows and C <= 4096");
  }
  LAOYAO_CUDA_CHECK(cudaGetLastError());
  const dim3 grid(unsigned((C + kColTile - 1) / kColTile), unsigned(chunks));
  layernorm_param_partial_kernel<<<grid, dim3(kColTile, kColRows), 0, stream>>>(dy, x, mean, rstd, scratch, T, C);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
  add_chunk_partials(scratch, dgamma, dbeta, chunks, C, stream);
  if (dx_colsum) bias_grad(dx, dx_colsum, scratch, T, C, stream);  // after the partials above (same scratch)
}

void rmsnorm_forward(const bf16* x, const bf16* gamma, bf16* y, float* rstd, int64_t T, int64_t C, float eps,
                     bool zero_centered_gamma, cudaStream_t stream) {
  if (T <= 0 || C <= 0) return;
  const int packs = warp_packs(C, x, gamma, y, x);
  if (!packs) throw Error("rmsnorm_forward: needs C % 8 == 0, 16-byte aligned rows and C <= 4096 (C = " +
                          std::to_string(C) + ")");
  dispatch_packs<LaunchForward>(packs, x, gamma, static_cast<const bf16*>(nullptr), y, static_cast<float*>(nullptr),
                                rstd, T, int(C), eps, zero_centered_gamma, stream);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

void rmsnorm_backward(const bf16* dy, const bf16* x, const bf16* gamma, const float* rstd, bf16* dx, float* dgamma,
                      float* scratch, int64_t T, int64_t C, bool zero_centered_gamma, cudaStream_t stream,
                      bool accumulate_dx, float* dx_colsum) {
  if (T <= 0 || C <= 0) return;
  layernorm_backward(dy, x, gamma, nullptr, rstd, dx, dgamma, nullptr, scratch, T, C, zero_centered_gamma, stream,
                     accumulate_dx, dx_colsum);
}

}  // namespace laoyao::kernels::cuda
