// What the grouped GEMMs' kernels share whichever way their operands arrive (grouped_gemm.cu:
// cp.async from every thread; grouped_gemm_tma.cu: TMA from a producer warp): the block tile, the
// search for a block's row tile among the groups, and the two epilogues. 256 computing threads
// (2 warpgroups, warpgroup w owning rows 64 w .. 64 w + 63 of a 128-row tile, 128 or 256 columns
// wide) hold the accumulators; `sync` is a barrier over exactly those threads.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace laoyao::kernels::cuda::grouped {

using bf16 = __nv_bfloat16;
using wgmma::BK;
using wgmma::BN;
constexpr int BM = 128;            // block tile rows (a warpgroup: one m64 wgmma)
constexpr int kMathThreads = 256;  // the threads holding the accumulators: 2 warpgroups

// Shared memory the epilogue stages a tile of W columns in: BM rows of (W + 8) elements.
template <class Staged, int W = BN>
constexpr size_t staged_tile_bytes() {
  return size_t(BM) * (W + 8) * sizeof(Staged);
}

// The block's row tile among the groups' row tiles (tile counted group by group, ceil(c / BM) a
// group of c rows): true with its group, first row and the group's end row; false (for the whole
// block) when `tile` is past the last one. Every one of the block's kThreads threads calls it.
template <int kThreads>
__device__ __forceinline__ bool find_row_tile(const int32_t* __restrict__ offsets, int G, int tile, int& group,
                                              int& row0, int& row_end) {
  __shared__ int s_warp[kThreads / 32];
  __shared__ int s_found[3];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int per = (G + kThreads - 1) / kThreads;
  const int g0 = min(G, tid * per), g1 = min(G, g0 + per);
  int mine = 0;
  for (int g = g0; g < g1; ++g) mine += (max(offsets[g + 1] - offsets[g], 0) + BM - 1) / BM;
  int incl = mine;  // inclusive scan over the warp, then over the warps
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const int v = __shfl_up_sync(0xffffffffu, incl, d);
    if (lane >= d) incl += v;
  }
  if (lane == 31) s_warp[warp] = incl;
  if (tid == 0) s_found[0] = -1;
  __syncthreads();
  int before = incl - mine;
  for (int w = 0; w < warp; ++w) before += s_warp[w];
  if (tile >= before && tile < before + mine) {  // exactly one thread
    int p = before;
    for (int g = g0; g < g1; ++g) {
      const int begin = offsets[g], end = offsets[g + 1];
      const int t = (max(end - begin, 0) + BM - 1) / BM;
      if (tile < p + t) {
        s_found[0] = g;
        s_found[1] = begin + (tile - p) * BM;
        s_found[2] = end;
        break;
      }
      p += t;
    }
  }
  __syncthreads();
  group = s_found[0];
  row0 = s_found[1];
  row_end = s_found[2];
  return group >= 0;
}

// The nt / nn epilogue: the tile's rows r0.. (those below r_end) and W = 2 NA columns c0.. (those
// below cols) of C [rows][cols] from the accumulators, rounded to bf16 through a shared tile (rows padded
// by 16 bytes: conflict-free fragment stores), then 16-byte stores. `smem` must be free for all
// the computing threads when they call it.
template <int NA, class Sync>
__device__ __forceinline__ void store_rows_tile(const float (&acc)[NA], bf16* smem, bf16* __restrict__ C,
                                                int64_t r0, int64_t r_end, int64_t c0, int64_t cols, Sync sync) {
  constexpr int W = 2 * NA, kLdC = W + 8;
  const int lane = threadIdx.x & 31, gq = lane >> 2, tq = lane & 3;
  const int row = (threadIdx.x >> 5) * 16 + gq;  // warp w of the block: rows 16 w .. 16 w + 15
  bf16* sC = smem;
#pragma unroll
  for (int j = 0; j < W / 8; ++j) {
    const int c = j * 8 + 2 * tq;
    *reinterpret_cast<uint32_t*>(sC + row * kLdC + c) = pack_bf16(acc[4 * j], acc[4 * j + 1]);
    *reinterpret_cast<uint32_t*>(sC + (row + 8) * kLdC + c) = pack_bf16(acc[4 * j + 2], acc[4 * j + 3]);
  }
  sync();
  constexpr int kChunks = W / 8;
#pragma unroll 4
  for (int c = threadIdx.x; c < BM * kChunks; c += kMathThreads) {
    const int r = c / kChunks, col = (c % kChunks) * 8;
    if (r0 + r < r_end && c0 + col < cols)
      *reinterpret_cast<uint4*>(C + (r0 + r) * cols + c0 + col) = *reinterpret_cast<const uint4*>(sC + r * kLdC + col);
  }
}

// The wgrad epilogue: the tile's rows m0.. and columns n0.. of Wg [N][K] (fp32) plus (accumulate)
// or replaced by the accumulators, through a shared tile (rows padded by 8 floats: conflict-free
// float2 stores), then the read-modify-write of dW in coalesced 8-byte pieces (dW is only 8-byte
// aligned), 16 loads in flight a thread before their stores.
template <class Sync>
__device__ __forceinline__ void add_wgrad_tile(const float (&acc)[BN / 2], bf16* smem, float* __restrict__ Wg,
                                               int64_t m0, int64_t n0, int64_t N, int64_t K, bool accumulate,
                                               Sync sync) {
  constexpr int kLdW = BN + 8;
  const int lane = threadIdx.x & 31, gq = lane >> 2, tq = lane & 3;
  const int row = (threadIdx.x >> 5) * 16 + gq;
  float* sW = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) {
    const int c = j * 8 + 2 * tq;
    *reinterpret_cast<float2*>(sW + row * kLdW + c) = make_float2(acc[4 * j], acc[4 * j + 1]);
    *reinterpret_cast<float2*>(sW + (row + 8) * kLdW + c) = make_float2(acc[4 * j + 2], acc[4 * j + 3]);
  }
  sync();
  constexpr int kRowF2 = BN / 2, kPer = BM * kRowF2 / kMathThreads, kBatch = 16;
  static_assert(kPer % kBatch == 0, "whole batches");
#pragma unroll 1
  for (int b0 = 0; b0 < kPer; b0 += kBatch) {
    float2 v[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int idx = threadIdx.x + (b0 + u) * kMathThreads, r = idx / kRowF2, c = (idx % kRowF2) * 2;
      v[u] = accumulate && m0 + r < N && n0 + c < K ? *reinterpret_cast<const float2*>(Wg + (m0 + r) * K + n0 + c)
                                                    : make_float2(0.0f, 0.0f);
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int idx = threadIdx.x + (b0 + u) * kMathThreads, r = idx / kRowF2, c = (idx % kRowF2) * 2;
      if (m0 + r < N && n0 + c < K) {
        const float2 s = *reinterpret_cast<const float2*>(sW + r * kLdW + c);
        *reinterpret_cast<float2*>(Wg + (m0 + r) * K + n0 + c) = make_float2(v[u].x + s.x, v[u].y + s.y);
      }
    }
  }
}

}  // namespace laoyao::kernels::cuda::grouped
