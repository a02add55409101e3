// The grouped GEMMs' portable kernels (grouped_gemm.hpp): the same three problems with the same
// device-side group offsets, on warp-level tensor-core MMAs (nvcuda::wmma, bf16 in, fp32
// accumulation) that every GPU from sm_80 on runs, for the GPUs the Hopper-only wgmma/TMA kernels
// do not serve (Blackwell) and, chosen explicitly, for checking them on a Hopper GPU. Plain and
// unpipelined (each step's tiles loaded, then multiplied): correct first; the vendor-tuned path on
// Blackwell is a later step (docs/blackwell.md).
//
// A block owns a 64 x 64 tile of the output (4 warps, each 32 x 32: 2 x 2 fragments of 16 x 16),
// stepping through the reduction 32 at a time. Operands reach shared memory in their own layout
// (16-byte vectors along their contiguous dimension, zeros past a group's rows or a matrix's
// columns) and the fragments are loaded row- or column-major to match, so no operand is transposed.
#include <cuda_bf16.h>
#include <mma.h>

#include <climits>
#include <cstdint>
#include <string>
#include <type_traits>

#include "core/error.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/grouped_gemm_portable.hpp"

namespace laoyao::kernels::cuda {
namespace {

namespace wmma = nvcuda::wmma;

constexpr int kBM = 64, kBN = 64, kBK = 32, kThreads = 128, kPad = 8;

// A tile of R rows x C columns (C a multiple of 8) of a matrix with leading dimension ld, rows
// [row0, row_end) and columns [col0, col_end) valid (col_end a multiple of 8), the rest zeros, into
// shared memory with rows of C + kPad elements.
template <int R, int C>
__device__ __forceinline__ void load_tile(bf16* __restrict__ s, const bf16* __restrict__ g, int64_t ld, int64_t row0,
                                          int64_t row_end, int64_t col0, int64_t col_end) {
  constexpr int kVecs = R * C / 8;
  for (int i = threadIdx.x; i < kVecs; i += kThreads) {
    const int r = i / (C / 8), c = (i % (C / 8)) * 8;
    const int64_t gr = row0 + r, gc = col0 + c;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (gr < row_end && gc < col_end) v = *reinterpret_cast<const uint4*>(g + gr * ld + gc);
    *reinterpret_cast<uint4*>(s + r * (C + kPad) + c) = v;
  }
}

using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// One reduction step of kBK on the shared tiles: each warp's 2 x 2 fragments. LayoutA/LayoutB: how
// the tiles sit (row_major A: [kBM][kBK]; col_major A: [kBK][kBM]; col_major B: [kBN][kBK];
// row_major B: [kBK][kBN]).
template <class LayoutA, class LayoutB>
__device__ __forceinline__ void mma_step(const bf16* sA, const bf16* sB, FragC (&acc)[2][2]) {
  const int warp = threadIdx.x / 32, wm = (warp / 2) * 32, wn = (warp % 2) * 32;
  constexpr bool a_row = std::is_same_v<LayoutA, wmma::row_major>, b_row = std::is_same_v<LayoutB, wmma::row_major>;
  constexpr int lda = a_row ? kBK + kPad : kBM + kPad, ldb = b_row ? kBN + kPad : kBK + kPad;
#pragma unroll
  for (int kk = 0; kk < kBK; kk += 16) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, LayoutA> a[2];
    wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, LayoutB> b[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int m = wm + 16 * i, n = wn + 16 * i;
      wmma::load_matrix_sync(a[i], a_row ? sA + m * lda + kk : sA + kk * lda + m, lda);
      wmma::load_matrix_sync(b[i], b_row ? sB + kk * ldb + n : sB + n * ldb + kk, ldb);
    }
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
  }
}

// The accumulators into a shared [kBM][kBN + 4] fp32 tile (each warp its 32 x 32).
__device__ __forceinline__ void stage_acc(FragC (&acc)[2][2], float* sC) {
  const int warp = threadIdx.x / 32, wm = (warp / 2) * 32, wn = (warp % 2) * 32;
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j)
      wmma::store_matrix_sync(sC + (wm + 16 * i) * (kBN + 4) + wn + 16 * j, acc[i][j], kBN + 4, wmma::mem_row_major);
}

// nt (kNn false): C[r, c] = sum_k A[r, k] B_w[c, k]; nn (kNn true): C[r, c] = sum_k A[r, k] B_w[k, c];
// for the rows r of each group g, w = g % Gw, A [rows][red], C [rows][cols]. Block x: (row tile,
// column tile), the row tiles counted group by group, ceil(rows of g / kBM) each.
template <bool kNn>
__global__ void __launch_bounds__(kThreads)
    portable_rows_kernel(const bf16* __restrict__ A, const bf16* __restrict__ B, bf16* __restrict__ C,
                         const int32_t* __restrict__ offsets, int G, int Gw, int col_tiles, int64_t cols,
                         int64_t red) {
  __shared__ __align__(16) bf16 sA[kBM * (kBK + kPad)];
  __shared__ __align__(16) bf16 sB[kBK * (kBN + kPad) > kBN * (kBK + kPad) ? kBK * (kBN + kPad) : kBN * (kBK + kPad)];
  __shared__ __align__(16) float sC[kBM * (kBN + 4)];
  __shared__ int found[3];
  const int tile = int(blockIdx.x / unsigned(col_tiles));
  const int64_t c0 = int64_t(blockIdx.x % unsigned(col_tiles)) * kBN;
  if (threadIdx.x == 0) {  // (G is the experts, or ranks x local experts: a scan is cheap)
    found[0] = -1;
    int p = 0;
    for (int g = 0; g < G; ++g) {
      const int begin = offsets[g], end = offsets[g + 1], t = (max(end - begin, 0) + kBM - 1) / kBM;
      if (tile < p + t) {
        found[0] = g, found[1] = begin + (tile - p) * kBM, found[2] = end;
        break;
      }
      p += t;
    }
  }
  __syncthreads();
  if (found[0] < 0) return;
  const int64_t r0 = found[1], r_end = found[2];
  const bf16* Bg = B + int64_t(found[0] % Gw) * cols * red;

  FragC acc[2][2];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);
  for (int64_t k0 = 0; k0 < red; k0 += kBK) {
    load_tile<kBM, kBK>(sA, A, red, r0, r_end, k0, red);
    if constexpr (kNn)
      load_tile<kBK, kBN>(sB, Bg, cols, k0, red, c0, cols);
    else
      load_tile<kBN, kBK>(sB, Bg, red, c0, cols, k0, red);
    __syncthreads();
    if constexpr (kNn)
      mma_step<wmma::row_major, wmma::row_major>(sA, sB, acc);
    else
      mma_step<wmma::row_major, wmma::col_major>(sA, sB, acc);
    __syncthreads();
  }
  stage_acc(acc, sC);
  __syncthreads();
  for (int i = threadIdx.x; i < kBM * kBN; i += kThreads) {
    const int r = i / kBN, c = i % kBN;
    if (r0 + r < r_end && c0 + c < cols) C[(r0 + r) * cols + c0 + c] = __float2bfloat16(sC[r * (kBN + 4) + c]);
  }
}

// wgrad: dW_w[n, k] (+)= sum over the rows r of the groups w, w + Gw, ... of dY[r, n] X[r, k]; a
// block owns a kBM x kBN tile of dW_w and reduces over those rows kBK at a time, group by group
// (zeros past a group's end in both operands).
__global__ void __launch_bounds__(kThreads)
    portable_wgrad_kernel(const bf16* __restrict__ dY, const bf16* __restrict__ X, float* __restrict__ dW,
                          const int32_t* __restrict__ offsets, int G, int Gw, int m_tiles, int n_tiles, int64_t N,
                          int64_t K, bool accumulate) {
  __shared__ __align__(16) bf16 sA[kBK * (kBM + kPad)];
  __shared__ __align__(16) bf16 sB[kBK * (kBN + kPad)];
  __shared__ __align__(16) float sC[kBM * (kBN + 4)];
  const unsigned b = blockIdx.x;
  const int64_t n0 = int64_t(b % unsigned(n_tiles)) * kBN;                         // columns of dW: K
  const int64_t m0 = int64_t((b / unsigned(n_tiles)) % unsigned(m_tiles)) * kBM;  // rows of dW: N
  const int w = int(b / unsigned(n_tiles * m_tiles));
  bool any = false;
  for (int g = w; g < G; g += Gw) any = any || offsets[g + 1] > offsets[g];
  if (!any && accumulate) return;  // nothing to add
  FragC acc[2][2];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);
  for (int g = w; g < G; g += Gw) {
    const int64_t begin = offsets[g], end = offsets[g + 1];
    for (int64_t r = begin; r < end; r += kBK) {
      load_tile<kBK, kBM>(sA, dY, N, r, end, m0, N);  // dY^T: the tile [rows][N columns], column-major A
      load_tile<kBK, kBN>(sB, X, K, r, end, n0, K);
      __syncthreads();
      mma_step<wmma::col_major, wmma::row_major>(sA, sB, acc);
      __syncthreads();
    }
  }
  stage_acc(acc, sC);
  __syncthreads();
  float* Wg = dW + int64_t(w) * N * K;
  for (int i = threadIdx.x; i < kBM * kBN; i += kThreads) {
    const int r = i / kBN, c = i % kBN;
    if (m0 + r < N && n0 + c < K) {
      float* out = Wg + (m0 + r) * K + n0 + c;
      *out = (accumulate ? *out : 0.0f) + sC[r * (kBN + 4) + c];
    }
  }
}

}  // namespace

void grouped_rows_portable(bool nt, const bf16* A, const bf16* B, bf16* C, const RowGroups& g, int64_t cols,
                           int64_t red, cudaStream_t stream) {
  const int64_t col_tiles = (cols + kBN - 1) / kBN;
  const int64_t blocks = col_tiles * ((g.rows + kBM - 1) / kBM + g.groups);
  if (blocks > INT_MAX) throw Error("grouped_gemm (portable): the problem is too large for one grid");
  const int G = int(g.groups), Gw = int(g.weights);
  if (nt)
    portable_rows_kernel<false><<<unsigned(blocks), kThreads, 0, stream>>>(A, B, C, g.offsets, G, Gw, int(col_tiles),
                                                                           cols, red);
  else
    portable_rows_kernel<true><<<unsigned(blocks), kThreads, 0, stream>>>(A, B, C, g.offsets, G, Gw, int(col_tiles),
                                                                          cols, red);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

void grouped_wgrad_portable(const bf16* dY, const bf16* X, float* dW, const RowGroups& g, int64_t N, int64_t K,
                            bool accumulate, cudaStream_t stream) {
  const int64_t m_tiles = (N + kBM - 1) / kBM, n_tiles = (K + kBN - 1) / kBN;
  const int64_t blocks = g.weights * m_tiles * n_tiles;
  if (blocks > INT_MAX) throw Error("grouped_gemm_wgrad (portable): the problem is too large for one grid");
  portable_wgrad_kernel<<<unsigned(blocks), kThreads, 0, stream>>>(dY, X, dW, g.offsets, int(g.groups),
                                                                   int(g.weights), int(m_tiles), int(n_tiles), N, K,
                                                                   accumulate);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

}  // namespace laoyao::kernels::cuda
