// Grouped GEMMs of the routed experts (see grouped_gemm.hpp): tensor-core kernels on
// mma.sync.m16n8k16 bf16 -> fp32, fed from shared memory by ldmatrix (.trans where an operand's
// reduction dimension is not contiguous) through a multi-stage cp.async pipeline.
//
// Block tiles are 128 x 128 (BM x BN) by BK = 32 reduction elements a stage; the warp layout is a
// per-kernel Tiling, chosen on an H200 among 8 variants on the flagship shapes
// (bench/grouped_gemm_bench.cpp, 64 experts x 512 rows):
//   nt, nn: 4 warps of 64 x 64 (4 m16 x 8 n8 tiles, 128 accumulators a thread), 3 stages: 240-293
//     TFLOP/s, against 218-267 for 8 warps of 64 x 32 (BK 32 or 64) and 194-255 for 128 x 256 or
//     256 x 128 tiles (cuBLASLt on one dense GEMM of the same size: 555-665);
//   wgrad: 8 warps of 64 x 32 (4 x 4 tiles), 4 stages: 145-155 TFLOP/s, against 105-112 for 4 warps
//     of 64 x 64 (its fp32 read-modify-write epilogue wants more warps to overlap it).
// Shared-memory tiles are padded by 8 elements (16 bytes) a row, which keeps ldmatrix (8 rows of
// 16 bytes each) free of bank conflicts:
//   K-major tile (reduction contiguous: X, dY as A of nt/nn; W as B of nt): [128][BK + 8]
//   MN-major tile (output dim contiguous: W as B of nn; dY, X in wgrad):     [BK][128 + 8]
// Fragment layouts of mma.m16n8k16 (g = lane / 4, t = lane % 4):
//   A (16x16): a0 (g, 2t..2t+1)  a1 (g+8, 2t..)  a2 (g, 2t+8..)  a3 (g+8, 2t+8..)
//   B (16x8):  b0 (k 2t..2t+1, n g)  b1 (k 2t+8.., n g)
//   C (16x8):  c0,c1 (g, 2t..2t+1)  c2,c3 (g+8, 2t..2t+1)
// ldmatrix.trans of a tile stored [k][m] hands thread (g, t) the elements (k 2t..2t+1, m g), i.e. the
// same fragments as the plain ldmatrix of a [m][k] tile.
//
// Work assignment, from the device offsets alone:
//   nt / nn: one block per (row tile, column tile); the row tiles are counted group by group (a
//     group of c rows has ceil(c / BM) tiles, none when empty), so the grid holds
//     ceil(rows / BM) + G row tiles (each group adds at most one partial tile) and a block whose
//     index is past the last tile exits. Each block finds its group with a block-wide prefix sum
//     of the groups' tile counts (G + 1 offsets read, a few hundred cycles).
//   wgrad: one block per (group, BM x BN tile of dW_g), looping over the group's rows (the
//     reduction); each dW element belongs to exactly one block, which adds its sum in the
//     epilogue (fp32 read-modify-write): deterministic, no atomics. An empty group's blocks exit.
// Partial tiles (rows of a group, N or K not multiples of the tile) are zero-filled by cp.async
// (src-size 0) and masked in the epilogue.
#include <array>
#include <climits>
#include <cstdlib>
#include <cstdint>
#include <string>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/grouped_gemm.hpp"

namespace laoyao::kernels::cuda {
namespace {

// A tiling: WarpsM x WarpsN warps, each owning MT m16 tiles by NT n8 tiles of the block's BM x BN
// output; BK_ reduction elements a pipeline stage, Stages stages; MinBlocks: blocks an SM should
// hold (__launch_bounds__).
template <int WarpsM, int WarpsN, int MT, int NT, int BK_, int Stages, int MinBlocks>
struct Tiling {
  static constexpr int kWarpsM = WarpsM, kWarpsN = WarpsN;
  static constexpr int kMT = MT, kNT = NT;
  static constexpr int BK = BK_, kStages = Stages, kMinBlocks = MinBlocks;
  static constexpr int kThreads = 32 * kWarpsM * kWarpsN;
  static constexpr int BM = 16 * kMT * kWarpsM, BN = 8 * kNT * kWarpsN;
  static constexpr int kLdK = BK + 8;  // row of a K-major shared tile (elements)
  static constexpr int kLdC = BN + 8;  // row of the bf16 output staging tile
  static_assert(kNT % 2 == 0 && BK % 16 == 0, "B fragments come in pairs of n8 tiles; k steps of 16");

  // Elements of one shared tile of an operand whose output dimension is W wide (BM for A, BN for
  // B): K-major [W][kLdK], MN-major [BK][W + 8].
  template <bool KMajor, int W>
  __host__ __device__ static constexpr int tile_elems() {
    return KMajor ? W * kLdK : BK * (W + 8);
  }
  template <bool AK, bool BKm>
  __host__ __device__ static constexpr int stage_elems() {
    return tile_elems<AK, BM>() + tile_elems<BKm, BN>();
  }
  template <bool AK, bool BKm>
  static constexpr size_t smem_bytes() {
    constexpr size_t pipe = size_t(kStages) * stage_elems<AK, BKm>() * sizeof(bf16);
    constexpr size_t out = size_t(BM) * kLdC * sizeof(bf16);
    return pipe > out ? pipe : out;
  }
};
using RowsTiling = Tiling<2, 2, 4, 8, 32, 3, 2>;   // nt, nn: 128 x 128, 4 warps of 64 x 64
using WgradTiling = Tiling<2, 4, 4, 4, 32, 4, 2>;  // wgrad: 128 x 128, 8 warps of 64 x 32

__device__ __forceinline__ void ldsm_x4(uint32_t r[4], const bf16* p) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t r[4], const bf16* p) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
__device__ __forceinline__ void mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (lower address, lower column) = lo
  return *reinterpret_cast<uint32_t*>(&v);
}

// 16-byte asynchronous copy global -> shared; an invalid source is not read and zero-fills.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// The copies of one thread into a K-major tile s[W][BK] (padded rows of kLdK): rows r0 + r of a
// row-major matrix (leading dimension ld; rows >= r_end zero), columns k0 + 0..BK (columns >= k_end
// zero; k_end a multiple of 8). This thread moves 8 columns from (tid % (BK / 8)) * 8 of rows
// tid / (BK / 8) + i * kRows; its source pointers are computed once, each step only adds k0.
template <class T, int W>
struct KMajorLoader {
  static constexpr int BK = T::BK, kThreads = T::kThreads, kLdK = T::kLdK;
  static constexpr int kRows = kThreads / (BK / 8);  // rows a pass covers
  static_assert(kThreads % (BK / 8) == 0 && W % kRows == 0, "whole passes");
  const bf16* p[W / kRows];
  bool row_ok[W / kRows];
  int r, k;
  __device__ __forceinline__ KMajorLoader(const bf16* src, int64_t ld, int64_t r0, int64_t r_end) {
    r = threadIdx.x / (BK / 8);
    k = (threadIdx.x % (BK / 8)) * 8;
#pragma unroll
    for (int i = 0; i < W / kRows; ++i) {
      row_ok[i] = r0 + r + i * kRows < r_end;
      p[i] = row_ok[i] ? src + (r0 + r + i * kRows) * ld + k : src;
    }
  }
  __device__ __forceinline__ void load(bf16* s, int64_t k0, int64_t k_end) const {
    const bool k_ok = k0 + k < k_end;
#pragma unroll
    for (int i = 0; i < W / kRows; ++i) {
      const bool valid = row_ok[i] && k_ok;
      cp_async16(s + (r + i * kRows) * kLdK + k, valid ? p[i] + k0 : p[i], valid);
    }
  }
};

// The copies of one thread into an MN-major tile s[BK][W] (padded rows of W + 8): reduction rows
// kbase + dk + 0..BK of a row-major matrix (leading dimension ld; rows from kbase + k_len on zero),
// columns c0 + 0..W (columns >= c_end zero; c_end a multiple of 8). This thread moves 8 columns
// from (tid % (W / 8)) * 8 of rows tid / (W / 8) + i * kRows; its source pointer is computed once.
template <class T, int W>
struct MNMajorLoader {
  static constexpr int BK = T::BK, kThreads = T::kThreads;
  static constexpr int kRows = kThreads / (W / 8);
  static_assert(kThreads % (W / 8) == 0 && BK % kRows == 0, "whole passes");
  const bf16* p;  // row `k` of the tile at k0 = 0
  int ld;         // < 2^31 (checked on the host)
  bool col_ok;
  int k, col;
  __device__ __forceinline__ MNMajorLoader(const bf16* src, int64_t ld_, int64_t kbase, int64_t c0, int64_t c_end)
      : ld(int(ld_)) {
    k = threadIdx.x / (W / 8);
    col = (threadIdx.x % (W / 8)) * 8;
    col_ok = c0 + col < c_end;
    p = col_ok ? src + (kbase + k) * ld + c0 + col : src;
  }
  __device__ __forceinline__ void load(bf16* s, int dk, int k_len) const {
#pragma unroll
    for (int i = 0; i < BK / kRows; ++i) {
      const int kk = dk + k + i * kRows;
      const bool valid = col_ok && kk < k_len;
      cp_async16(s + (k + i * kRows) * (W + 8) + col, valid ? p + int64_t(dk + i * kRows) * ld : p, valid);
    }
  }
};

// acc (this warp's 16 kMT x 8 kNT) += the stage's A (BM x BK) x B (BK x BN) on the warp's rows
// and columns. AK: A stored [m][k] (else [k][m], loaded transposed); BKm: B stored [n][k] (else
// [k][n], loaded transposed).
template <class T, bool AK, bool BKm>
__device__ __forceinline__ void mma_stage(float acc[T::kMT][T::kNT][4], const bf16* sA, const bf16* sB, int wm,
                                          int wn, int lane) {
  constexpr int kMT = T::kMT, kNT = T::kNT, BK = T::BK, BM = T::BM, BN = T::BN, kLdK = T::kLdK;
#pragma unroll
  for (int kk = 0; kk < BK / 16; ++kk) {
    uint32_t a[kMT][4];
#pragma unroll
    for (int i = 0; i < kMT; ++i) {
      const int m0 = (wm * kMT + i) * 16;
      if constexpr (AK)
        ldsm_x4(a[i], sA + (m0 + (lane & 15)) * kLdK + kk * 16 + (lane >> 4) * 8);
      else
        ldsm_x4_t(a[i], sA + (kk * 16 + (lane & 7) + (lane >> 4) * 8) * (BM + 8) + m0 + ((lane >> 3) & 1) * 8);
    }
    uint32_t b[kNT / 2][4];
#pragma unroll
    for (int j = 0; j < kNT / 2; ++j) {
      const int n0 = (wn * kNT + 2 * j) * 8;
      if constexpr (BKm)
        ldsm_x4(b[j], sB + (n0 + (lane & 7) + (lane >> 4) * 8) * kLdK + kk * 16 + ((lane >> 3) & 1) * 8);
      else
        ldsm_x4_t(b[j], sB + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * (BN + 8) + n0 + (lane >> 4) * 8);
    }
#pragma unroll
    for (int i = 0; i < kMT; ++i)
#pragma unroll
      for (int j = 0; j < kNT / 2; ++j) {
        mma(acc[i][2 * j], a[i], b[j][0], b[j][1]);
        mma(acc[i][2 * j + 1], a[i], b[j][2], b[j][3]);
      }
  }
}

// The pipelined main loop over kt = 0 .. KT: load(stage_A, stage_B, kt) starts the copies of
// reduction tile kt. One barrier per step: at step kt every thread has finished computing on the
// stage that the prefetch of tile kt + kStages - 1 overwrites (consumed at step kt - 1).
template <class T, bool AK, bool BKm, class Load>
__device__ __forceinline__ void main_loop(float acc[T::kMT][T::kNT][4], bf16* smem, int KT, const Load& load) {
  constexpr int kStages = T::kStages, kA = T::template tile_elems<AK, T::BM>();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int wm = warp / T::kWarpsN, wn = warp % T::kWarpsN;
  constexpr int kStage = T::template stage_elems<AK, BKm>();
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < KT) load(smem + s * kStage, smem + s * kStage + kA, s);
    cp_async_commit();
  }
  for (int kt = 0; kt < KT; ++kt) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    const int next = kt + kStages - 1;
    if (next < KT) {
      bf16* st = smem + (next % kStages) * kStage;
      load(st, st + kA, next);
    }
    cp_async_commit();
    const bf16* st = smem + (kt % kStages) * kStage;
    mma_stage<T, AK, BKm>(acc, st, st + kA, wm, wn, lane);
  }
  cp_async_wait<0>();
  __syncthreads();  // the shared memory may be reused by the epilogue
}

// The block's row tile among the groups' row tiles (tile counted group by group, ceil(c / BM) a
// group of c rows): true with its group, first row and the group's end row; false (for the whole
// block) when `tile` is past the last one.
template <int kThreads, int BM>
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

// nt (B_KMAJOR) and nn: C[r, 0..cols) = A[r, 0..red) @ op(B_g) for the rows r of each group;
// A [rows, red]; B_g = B + g * cols * red, stored [cols][red] (nt) or [red][cols] (nn).
template <class T, bool B_KMAJOR>
__global__ void __launch_bounds__(T::kThreads, T::kMinBlocks)
    grouped_rows_kernel(const bf16* __restrict__ A, const bf16* __restrict__ B, bf16* __restrict__ C,
                        const int32_t* __restrict__ offsets, int G, int col_tiles, int64_t cols, int64_t red) {
  constexpr int BM = T::BM, BN = T::BN, BK = T::BK, kMT = T::kMT, kNT = T::kNT, kLdC = T::kLdC;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* smem = reinterpret_cast<bf16*>(smem_raw);
  const int tile = int(blockIdx.x / unsigned(col_tiles));
  const int64_t c0 = int64_t(blockIdx.x % unsigned(col_tiles)) * BN;
  int g, r0i, r_endi;
  if (!find_row_tile<T::kThreads, T::BM>(offsets, G, tile, g, r0i, r_endi)) return;
  const int64_t r0 = r0i, r_end = r_endi;
  const bf16* Bg = B + int64_t(g) * cols * red;

  float acc[kMT][kNT][4];
#pragma unroll
  for (int i = 0; i < kMT; ++i)
#pragma unroll
    for (int j = 0; j < kNT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

  const int KT = int((red + BK - 1) / BK);
  const KMajorLoader<T, BM> la(A, red, r0, r_end);
  if constexpr (B_KMAJOR) {
    const KMajorLoader<T, BN> lb(Bg, red, c0, cols);
    main_loop<T, true, true>(acc, smem, KT, [&](bf16* sA, bf16* sB, int kt) {
      la.load(sA, int64_t(kt) * BK, red);
      lb.load(sB, int64_t(kt) * BK, red);
    });
  } else {
    const MNMajorLoader<T, BN> lb(Bg, cols, 0, c0, cols);
    main_loop<T, true, false>(acc, smem, KT, [&](bf16* sA, bf16* sB, int kt) {
      la.load(sA, int64_t(kt) * BK, red);
      lb.load(sB, kt * BK, int(red));
    });
  }

  // Epilogue: round to bf16 into a shared tile, then 16-byte stores of the valid rows and columns.
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int wm = warp / T::kWarpsN, wn = warp % T::kWarpsN, gq = lane >> 2, tq = lane & 3;
  bf16* sC = smem;
#pragma unroll
  for (int i = 0; i < kMT; ++i)
#pragma unroll
    for (int j = 0; j < kNT; ++j) {
      const int r = (wm * kMT + i) * 16 + gq, c = (wn * kNT + j) * 8 + 2 * tq;
      *reinterpret_cast<uint32_t*>(sC + r * kLdC + c) = pack_bf16(acc[i][j][0], acc[i][j][1]);
      *reinterpret_cast<uint32_t*>(sC + (r + 8) * kLdC + c) = pack_bf16(acc[i][j][2], acc[i][j][3]);
    }
  __syncthreads();
  constexpr int kChunks = BN / 8;
#pragma unroll
  for (int c = threadIdx.x; c < BM * kChunks; c += T::kThreads) {
    const int r = c / kChunks, col = (c % kChunks) * 8;
    if (r0 + r < r_end && c0 + col < cols)
      *reinterpret_cast<uint4*>(C + (r0 + r) * cols + c0 + col) = *reinterpret_cast<const uint4*>(sC + r * kLdC + col);
  }
}

// wgrad: dW_g[n, k] += sum over the group's rows r of dY[r, n] * X[r, k].
template <class T>
__global__ void __launch_bounds__(T::kThreads, T::kMinBlocks)
    grouped_wgrad_kernel(const bf16* __restrict__ dY, const bf16* __restrict__ X, float* __restrict__ dW,
                         const int32_t* __restrict__ offsets, int m_tiles, int n_tiles, int64_t N, int64_t K) {
  constexpr int BM = T::BM, BN = T::BN, BK = T::BK, kMT = T::kMT, kNT = T::kNT;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* smem = reinterpret_cast<bf16*>(smem_raw);
  const unsigned b = blockIdx.x;
  const int64_t n0 = int64_t(b % unsigned(n_tiles)) * BN;                   // columns of dW: K
  const int64_t m0 = int64_t((b / unsigned(n_tiles)) % unsigned(m_tiles)) * BM;  // rows of dW: N
  const int g = int(b / unsigned(n_tiles * m_tiles));
  const int64_t r_begin = offsets[g], r_end = offsets[g + 1];
  if (r_end <= r_begin) return;  // an empty group adds nothing

  float acc[kMT][kNT][4];
#pragma unroll
  for (int i = 0; i < kMT; ++i)
#pragma unroll
    for (int j = 0; j < kNT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

  const int len = int(r_end - r_begin);
  const int KT = int((len + BK - 1) / BK);
  const MNMajorLoader<T, BM> la(dY, N, r_begin, m0, N);
  const MNMajorLoader<T, BN> lb(X, K, r_begin, n0, K);
  main_loop<T, false, false>(acc, smem, KT, [&](bf16* sA, bf16* sB, int kt) {
    la.load(sA, kt * BK, len);
    lb.load(sB, kt * BK, len);
  });

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int wm = warp / T::kWarpsN, wn = warp % T::kWarpsN, gq = lane >> 2, tq = lane & 3;
  float* Wg = dW + int64_t(g) * N * K;
#pragma unroll
  for (int i = 0; i < kMT; ++i)
#pragma unroll
    for (int j = 0; j < kNT; ++j) {
      const int64_t c = n0 + (wn * kNT + j) * 8 + 2 * tq;
      if (c >= K) continue;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t r = m0 + (wm * kMT + i) * 16 + gq + h * 8;
        if (r >= N) continue;
        float2* p = reinterpret_cast<float2*>(Wg + r * K + c);
        float2 v = *p;
        v.x += acc[i][j][2 * h];
        v.y += acc[i][j][2 * h + 1];
        *p = v;
      }
    }
}

// ---------------------------------------------------------------------------------------------
// Hopper path: warpgroup MMA (wgmma.mma_async) reading both operands from 128B-swizzled shared
// memory through matrix descriptors, fed by the same cp.async pipeline (the swizzle is applied by
// the copies' destination addresses, so no TMA descriptor is needed and every tile can stop at its
// group's last row: cp.async zero-fills the rest).
namespace wg {

constexpr int kThreads = 256;  // 2 warpgroups; warpgroup w computes rows 64 w .. 64 w + 63 of the tile
constexpr int BM = 128;        // block tile rows (per warpgroup: one m64 wgmma)
constexpr int BK = 64;         // reduction a stage: 64 bf16 = one 128-byte swizzle row

// BN: block tile columns (the n of each warpgroup's wgmma); Stages: shared-memory stages;
// InFlight: wgmma groups left running while the next stage is issued (a stage is refilled only
// InFlight + 1 steps after it was consumed); MinBlocks: blocks an SM should hold.
template <int BN_, int Stages, int InFlight, int MinBlocks>
struct Config {
  static constexpr int BN = BN_, kStages = Stages, kInFlight = InFlight, kMinBlocks = MinBlocks;
  static constexpr int kDist = Stages - 1 - InFlight;  // tiles being loaded ahead of the one consumed
  static_assert(kDist >= 1 && (BN == 128 || BN == 256), "a stage ahead; wgmma n of 128 or 256");
  static constexpr int kTileA = BM * BK, kTileB = BN * BK, kStage = kTileA + kTileB;  // elements
  static constexpr size_t kPipeBytes = size_t(kStages) * kStage * sizeof(bf16);
  // Dynamic shared memory: the pipeline or the epilogue's staging tile, plus 1 KiB to align the
  // swizzle atoms (8 rows of 128 bytes) on 1024-byte boundaries.
  static constexpr size_t smem_bytes(size_t epilogue) {
    return (kPipeBytes > epilogue ? kPipeBytes : epilogue) + 1024;
  }
};

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ bf16* align_1024(unsigned char* p) {
  return reinterpret_cast<bf16*>(p + ((1024u - (smem_u32(p) & 1023u)) & 1023u));
}

// Shared-memory matrix descriptor (PTX ISA "Matrix Descriptor Format"), 128-byte swizzle:
// start address, leading and stride byte offsets, all in 16-byte units.
__device__ __forceinline__ uint64_t sw128_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t(lbo >> 4) << 16) | (uint64_t(sbo >> 4) << 32) | (1ull << 62);
}

__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from touching the accumulators before the wgmma that writes them has retired.
template <int N>
__device__ __forceinline__ void fence_acc(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// D (64 x n, fp32, this warpgroup's fragments) += A (64 x 16) B (16 x n), bf16 from shared memory.
// TA / TB: 1 when A / B is MN-major (transposed), 0 when K-major. Accumulator fragment of thread
// (warp q of the warpgroup, g = lane / 4, t = lane % 4): d[4j + 0, 1] = D[16q + g][8j + 2t + 0, 1],
// d[4j + 2, 3] = D[16q + g + 8][8j + 2t + 0, 1] (the mma.m16n8 C layout, n8 tile j).
template <int TA, int TB>
__device__ __forceinline__ void wgmma_n128(float (&d)[64], uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, %64, %65, p, 1, 1, %67, %68;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(da), "l"(db), "r"(1), "n"(TA), "n"(TB));
}

template <int TA, int TB>
__device__ __forceinline__ void wgmma_n256(float (&d)[128], uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
      "}, %128, %129, p, 1, 1, %131, %132;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(da), "l"(db), "r"(1), "n"(TA), "n"(TB));
}

template <int N, int TA, int TB>
__device__ __forceinline__ void wgmma(float (&d)[N / 2], uint64_t da, uint64_t db) {
  if constexpr (N == 128)
    wgmma_n128<TA, TB>(d, da, db);
  else
    wgmma_n256<TA, TB>(d, da, db);
}

// Shared tiles, 128B-swizzled (16-byte chunk c of a 128-byte row r stored at chunk c ^ (r % 8)):
//   K-major [W rows][64] (reduction contiguous: X, dY of nt/nn; W of nt): row r at 128 r bytes;
//     descriptor: 8-row groups 1024 bytes apart (SBO), a k16 step is +32 bytes.
//   MN-major [W / 64][64 reduction rows][64] (output dim contiguous: W of nn; dY, X of wgrad):
//     64-wide column blocks 8 KiB apart (LBO), 8-row groups 1024 bytes apart (SBO), a k16 step
//     is 16 rows (+2048 bytes).
// The copies of one thread into a K-major tile: rows r0 + 0..W of a row-major matrix (leading
// dimension ld; rows >= r_end zero), columns k0 + 0..64 (columns >= k_end zero).
template <int W>
struct SwKLoader {
  static constexpr int kPasses = W / (kThreads / 8);  // a pass: 32 rows of 8 chunks
  const bf16* p[kPasses];
  bool row_ok[kPasses];
  int r, c, dst;  // first row, chunk, destination offset (elements) of the first pass
  __device__ __forceinline__ SwKLoader(const bf16* src, int64_t ld, int64_t r0, int64_t r_end) {
    r = threadIdx.x / 8;
    c = threadIdx.x % 8;
    dst = r * BK + ((c ^ (r & 7)) * 8);  // later passes add 32 rows: same r % 8
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      const int64_t row = r0 + r + i * (kThreads / 8);
      row_ok[i] = row < r_end;
      p[i] = row_ok[i] ? src + row * ld + c * 8 : src;
    }
  }
  __device__ __forceinline__ void load(bf16* s, int64_t k0, int64_t k_end) const {
    const bool k_ok = k0 + c * 8 < k_end;
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      const bool valid = row_ok[i] && k_ok;
      cp_async16(s + dst + i * (kThreads / 8) * BK, valid ? p[i] + k0 : p[i], valid);
    }
  }
};

// The copies of one thread into an MN-major tile: reduction rows kbase + dk + 0..64 of a row-major
// matrix (leading dimension ld; rows from kbase + k_len on zero), columns c0 + 0..W (columns >=
// c_end zero).
template <int W>
struct SwMNLoader {
  static constexpr int kChunks = W / 8, kRows = kThreads / kChunks, kPasses = BK / kRows;
  static_assert(kRows % 8 == 0, "a pass covers whole swizzle rows groups");
  const bf16* p;
  int ld, k, dst;
  bool col_ok;
  __device__ __forceinline__ SwMNLoader(const bf16* src, int64_t ld_, int64_t kbase, int64_t c0, int64_t c_end)
      : ld(int(ld_)) {
    k = threadIdx.x / kChunks;
    const int cc = threadIdx.x % kChunks;
    dst = (cc / 8) * (BK * 64) + k * 64 + (((cc % 8) ^ (k & 7)) * 8);
    col_ok = c0 + cc * 8 < c_end;
    p = col_ok ? src + (kbase + k) * ld_ + c0 + cc * 8 : src;
  }
  __device__ __forceinline__ void load(bf16* s, int dk, int k_len) const {
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      const bool valid = col_ok && dk + k + i * kRows < k_len;
      cp_async16(s + dst + i * kRows * 64, valid ? p + int64_t(dk + i * kRows) * ld : p, valid);
    }
  }
};

// The pipelined main loop over kt = 0 .. KT: load(stage_A, stage_B, kt) starts the copies of
// reduction tile kt. Each step: wait for tile kt's copies, make them visible to the async proxy
// (wgmma reads shared memory through it), one barrier, refill the stage consumed InFlight + 1
// steps ago (every warpgroup has retired its wgmmas on it before the barrier), then issue the four
// k16 wgmmas on tile kt.
template <class C, int TA, int TB, class Load>
__device__ __forceinline__ void main_loop(float (&acc)[C::BN / 2], bf16* smem, int KT, const Load& load) {
  constexpr int S = C::kStages, D = C::kDist, kStage = C::kStage, kTileA = C::kTileA;
  const uint32_t wg_off = (threadIdx.x / 128) * 8192u;  // this warpgroup's 64 rows of A (both layouts)
  const uint32_t base = smem_u32(smem);
#pragma unroll
  for (int s = 0; s < D; ++s) {
    if (s < KT) load(smem + s * kStage, smem + s * kStage + kTileA, s);
    cp_async_commit();
  }
  for (int kt = 0; kt < KT; ++kt) {
    cp_async_wait<D - 1>();
    fence_proxy_async();
    __syncthreads();
    const int next = kt + D;
    if (next < KT) {
      bf16* st = smem + (next % S) * kStage;
      load(st, st + kTileA, next);
    }
    cp_async_commit();
    const uint32_t a = base + uint32_t((kt % S) * kStage) * 2u + wg_off, b = base + uint32_t((kt % S) * kStage + kTileA) * 2u;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      const uint64_t da = TA ? sw128_desc(a + kk * 2048, 8192, 1024) : sw128_desc(a + kk * 32, 16, 1024);
      const uint64_t db = TB ? sw128_desc(b + kk * 2048, 8192, 1024) : sw128_desc(b + kk * 32, 16, 1024);
      wgmma<C::BN, TA, TB>(acc, da, db);
    }
    wgmma_commit();
    wgmma_wait<C::kInFlight>();
  }
  wgmma_wait<0>();
  fence_acc(acc);
  cp_async_wait<0>();
  __syncthreads();  // the shared memory may be reused by the epilogue
}

// nt (B_MN = 0) and nn (B_MN = 1): C[r, 0..cols) = A[r, 0..red) @ op(B_g) for the rows r of each
// group; A [rows, red]; B_g = B + g * cols * red, stored [cols][red] (nt) or [red][cols] (nn).
template <class Cfg, int B_MN>
__global__ void __launch_bounds__(kThreads, Cfg::kMinBlocks)
    rows_kernel(const bf16* __restrict__ A, const bf16* __restrict__ B, bf16* __restrict__ C,
                const int32_t* __restrict__ offsets, int G, int col_tiles, int64_t cols, int64_t red) {
  constexpr int BN = Cfg::BN, kLdC = BN + 8;
  extern __shared__ unsigned char smem_raw[];
  bf16* smem = align_1024(smem_raw);
  const int tile = int(blockIdx.x / unsigned(col_tiles));
  const int64_t c0 = int64_t(blockIdx.x % unsigned(col_tiles)) * BN;
  int g, r0i, r_endi;
  if (!find_row_tile<kThreads, BM>(offsets, G, tile, g, r0i, r_endi)) return;
  const int64_t r0 = r0i, r_end = r_endi;
  const bf16* Bg = B + int64_t(g) * cols * red;

  float acc[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;
  const int KT = int((red + BK - 1) / BK);
  const SwKLoader<BM> la(A, red, r0, r_end);
  if constexpr (B_MN) {
    const SwMNLoader<BN> lb(Bg, cols, 0, c0, cols);
    main_loop<Cfg, 0, 1>(acc, smem, KT, [&](bf16* sA, bf16* sB, int kt) {
      la.load(sA, int64_t(kt) * BK, red);
      lb.load(sB, kt * BK, int(red));
    });
  } else {
    const SwKLoader<BN> lb(Bg, red, c0, cols);
    main_loop<Cfg, 0, 0>(acc, smem, KT, [&](bf16* sA, bf16* sB, int kt) {
      la.load(sA, int64_t(kt) * BK, red);
      lb.load(sB, int64_t(kt) * BK, red);
    });
  }

  // Epilogue: round to bf16 into a shared tile (rows padded by 16 bytes: conflict-free fragment
  // stores), then 16-byte stores of the valid rows and columns.
  const int lane = threadIdx.x & 31, gq = lane >> 2, tq = lane & 3;
  const int row = (threadIdx.x >> 5) * 16 + gq;  // warp w of the block: rows 16 w .. 16 w + 15
  bf16* sC = smem;
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) {
    const int c = j * 8 + 2 * tq;
    *reinterpret_cast<uint32_t*>(sC + row * kLdC + c) = pack_bf16(acc[4 * j], acc[4 * j + 1]);
    *reinterpret_cast<uint32_t*>(sC + (row + 8) * kLdC + c) = pack_bf16(acc[4 * j + 2], acc[4 * j + 3]);
  }
  __syncthreads();
  constexpr int kChunks = BN / 8;
#pragma unroll 4
  for (int c = threadIdx.x; c < BM * kChunks; c += kThreads) {
    const int r = c / kChunks, col = (c % kChunks) * 8;
    if (r0 + r < r_end && c0 + col < cols)
      *reinterpret_cast<uint4*>(C + (r0 + r) * cols + c0 + col) = *reinterpret_cast<const uint4*>(sC + r * kLdC + col);
  }
}
template <class Cfg>
constexpr size_t rows_smem() {
  return Cfg::smem_bytes(size_t(BM) * (Cfg::BN + 8) * sizeof(bf16));
}

// wgrad: dW_g[n, k] += sum over the group's rows r of dY[r, n] * X[r, k]; a block owns one
// BM x BN tile of dW_g (rows m0.., columns n0..) and reduces over all the group's rows.
template <class Cfg>
__global__ void __launch_bounds__(kThreads, Cfg::kMinBlocks)
    wgrad_kernel(const bf16* __restrict__ dY, const bf16* __restrict__ X, float* __restrict__ dW,
                 const int32_t* __restrict__ offsets, int m_tiles, int n_tiles, int64_t N, int64_t K) {
  constexpr int BN = Cfg::BN, kLdW = BN + 8;
  extern __shared__ unsigned char smem_raw[];
  bf16* smem = align_1024(smem_raw);
  const unsigned b = blockIdx.x;
  const int64_t n0 = int64_t(b % unsigned(n_tiles)) * BN;                        // columns of dW: K
  const int64_t m0 = int64_t((b / unsigned(n_tiles)) % unsigned(m_tiles)) * BM;  // rows of dW: N
  const int g = int(b / unsigned(n_tiles * m_tiles));
  const int64_t r_begin = offsets[g], r_end = offsets[g + 1];
  if (r_end <= r_begin) return;  // an empty group adds nothing
  float* Wg = dW + int64_t(g) * N * K;

  // Pull this block's dW tile into L2 now, so that the epilogue's read-modify-write reads hit L2
  // while the HBM reads overlap the main loop (its 128-byte lines: BN / 32 a row).
  for (int i = threadIdx.x; i < BM * (BN / 32); i += kThreads) {
    const int64_t r = m0 + i / (BN / 32), c = n0 + (i % (BN / 32)) * 32;
    if (r < N && c < K) asm volatile("prefetch.global.L2 [%0];\n" ::"l"(Wg + r * K + c));
  }

  float acc[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;
  const int len = int(r_end - r_begin);
  const int KT = (len + BK - 1) / BK;
  const SwMNLoader<BM> la(dY, N, r_begin, m0, N);
  const SwMNLoader<BN> lb(X, K, r_begin, n0, K);
  main_loop<Cfg, 1, 1>(acc, smem, KT, [&](bf16* sA, bf16* sB, int kt) {
    la.load(sA, kt * BK, len);
    lb.load(sB, kt * BK, len);
  });

  // Epilogue: the fp32 sums into a shared tile (rows padded by 8 floats: conflict-free float2
  // stores), then the read-modify-write of dW in coalesced 8-byte pieces (dW is only 8-byte
  // aligned), 16 loads in flight a thread before their stores.
  const int lane = threadIdx.x & 31, gq = lane >> 2, tq = lane & 3;
  const int row = (threadIdx.x >> 5) * 16 + gq;
  float* sW = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) {
    const int c = j * 8 + 2 * tq;
    *reinterpret_cast<float2*>(sW + row * kLdW + c) = make_float2(acc[4 * j], acc[4 * j + 1]);
    *reinterpret_cast<float2*>(sW + (row + 8) * kLdW + c) = make_float2(acc[4 * j + 2], acc[4 * j + 3]);
  }
  __syncthreads();
  constexpr int kRowF2 = BN / 2, kPer = BM * kRowF2 / kThreads, kBatch = 16;
  static_assert(kPer % kBatch == 0, "whole batches");
#pragma unroll 1
  for (int b0 = 0; b0 < kPer; b0 += kBatch) {
    float2 v[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int idx = threadIdx.x + (b0 + u) * kThreads, r = idx / kRowF2, c = (idx % kRowF2) * 2;
      v[u] = m0 + r < N && n0 + c < K ? *reinterpret_cast<const float2*>(Wg + (m0 + r) * K + n0 + c)
                                      : make_float2(0.0f, 0.0f);
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int idx = threadIdx.x + (b0 + u) * kThreads, r = idx / kRowF2, c = (idx % kRowF2) * 2;
      if (m0 + r < N && n0 + c < K) {
        const float2 s = *reinterpret_cast<const float2*>(sW + r * kLdW + c);
        *reinterpret_cast<float2*>(Wg + (m0 + r) * K + n0 + c) = make_float2(v[u].x + s.x, v[u].y + s.y);
      }
    }
  }
}
template <class Cfg>
constexpr size_t wgrad_smem() {
  return Cfg::smem_bytes(size_t(BM) * (Cfg::BN + 8) * sizeof(float));
}

}  // namespace wg

// The shared-memory attribute belongs to a kernel on one device: true the first time the calling
// site runs on the current device (`laoyao doctor` runs the kernels on every GPU in one process).
bool first_on_this_device(std::array<bool, 64>& seen) {
  int dev = 0;
  LAOYAO_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 0 || dev >= int(seen.size()) || seen[size_t(dev)]) return dev >= int(seen.size());
  seen[size_t(dev)] = true;
  return true;
}

template <class Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  LAOYAO_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

bool aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

void check_args(const char* fn, const void* a, const void* b, const void* c, uintptr_t c_align,
                const int32_t* offsets, int64_t G, int64_t rows, int64_t N, int64_t K) {
  const std::string f = std::string(fn) + ": ";
  if (G < 1 || G > INT_MAX / 2)
    throw Error(f + "the number of groups G must be at least 1 (and below 2^30), got " + std::to_string(G));
  if (rows < 0 || rows > INT_MAX)
    throw Error(f + "rows must be in [0, 2^31) (the offsets are int32), got " + std::to_string(rows));
  if (N < 0 || K < 0 || N > INT_MAX || K > INT_MAX)
    throw Error(f + "N and K must be in [0, 2^31), got N=" + std::to_string(N) + " K=" + std::to_string(K));
  if (N % 8 != 0 || K % 8 != 0)
    throw Error(f + "N and K must be multiples of 8 (16-byte rows), got N=" + std::to_string(N) +
                " K=" + std::to_string(K));
  if (!offsets) throw Error(f + "offsets is null");
  if (!aligned(a, 16) || !aligned(b, 16) || !aligned(c, c_align))
    throw Error(f + "the operands must be 16-byte aligned (the output " + std::to_string(c_align) + "-byte)");
}

void launch_rows(bool nt, const bf16* A, const bf16* B, bf16* C, const int32_t* offsets, int64_t G, int64_t rows,
                 int64_t cols, int64_t red, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  using T = RowsTiling;
  const int64_t col_tiles = (cols + T::BN - 1) / T::BN;
  const int64_t blocks = col_tiles * ((rows + T::BM - 1) / T::BM + G);
  if (blocks > INT_MAX) throw Error("grouped_gemm: the problem is too large for one grid");
  if (nt) {
    constexpr size_t smem = T::smem_bytes<true, true>();
    static std::array<bool, 64> seen{};
    if (first_on_this_device(seen)) allow_smem(grouped_rows_kernel<T, true>, smem);
    grouped_rows_kernel<T, true><<<unsigned(blocks), T::kThreads, smem, stream>>>(A, B, C, offsets, int(G),
                                                                                 int(col_tiles), cols, red);
  } else {
    constexpr size_t smem = T::smem_bytes<true, false>();
    static std::array<bool, 64> seen{};
    if (first_on_this_device(seen)) allow_smem(grouped_rows_kernel<T, false>, smem);
    grouped_rows_kernel<T, false><<<unsigned(blocks), T::kThreads, smem, stream>>>(A, B, C, offsets, int(G),
                                                                                  int(col_tiles), cols, red);
  }
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

template <class Cfg>
void launch_wg_rows(bool nt, const bf16* A, const bf16* B, bf16* C, const int32_t* offsets, int64_t G, int64_t rows,
                    int64_t cols, int64_t red, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const int64_t col_tiles = (cols + Cfg::BN - 1) / Cfg::BN;
  const int64_t blocks = col_tiles * ((rows + wg::BM - 1) / wg::BM + G);
  if (blocks > INT_MAX) throw Error("grouped_gemm: the problem is too large for one grid");
  constexpr size_t smem = wg::rows_smem<Cfg>();
  if (nt) {
    static std::array<bool, 64> seen{};
    if (first_on_this_device(seen)) allow_smem(wg::rows_kernel<Cfg, 0>, smem);
    wg::rows_kernel<Cfg, 0><<<unsigned(blocks), wg::kThreads, smem, stream>>>(A, B, C, offsets, int(G),
                                                                            int(col_tiles), cols, red);
  } else {
    static std::array<bool, 64> seen{};
    if (first_on_this_device(seen)) allow_smem(wg::rows_kernel<Cfg, 1>, smem);
    wg::rows_kernel<Cfg, 1><<<unsigned(blocks), wg::kThreads, smem, stream>>>(A, B, C, offsets, int(G),
                                                                            int(col_tiles), cols, red);
  }
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

template <class Cfg>
void launch_wg_wgrad(const bf16* dY, const bf16* X, float* dW, const int32_t* offsets, int64_t G, int64_t N,
                     int64_t K, cudaStream_t stream) {
  const int64_t m_tiles = (N + wg::BM - 1) / wg::BM, n_tiles = (K + Cfg::BN - 1) / Cfg::BN;
  const int64_t blocks = G * m_tiles * n_tiles;
  if (blocks > INT_MAX) throw Error("grouped_gemm_wgrad: the problem is too large for one grid");
  constexpr size_t smem = wg::wgrad_smem<Cfg>();
  static std::array<bool, 64> seen{};
  if (first_on_this_device(seen)) allow_smem(wg::wgrad_kernel<Cfg>, smem);
  wg::wgrad_kernel<Cfg><<<unsigned(blocks), wg::kThreads, smem, stream>>>(dY, X, dW, offsets, int(m_tiles),
                                                                        int(n_tiles), N, K);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

// TEMPORARY exploration switch: LAOYAO_GG_VARIANT (0: the mma.sync kernels; 1..5 wgmma configs).
int gg_variant() {
  static const int v = [] {
    const char* e = std::getenv("LAOYAO_GG_VARIANT");
    return e ? std::atoi(e) : 1;
  }();
  return v;
}
using Cfg1 = wg::Config<128, 3, 0, 2>;
using Cfg2 = wg::Config<128, 3, 1, 2>;
using Cfg3 = wg::Config<256, 4, 1, 1>;
using Cfg4 = wg::Config<128, 6, 1, 1>;
using Cfg5 = wg::Config<256, 4, 0, 1>;

void dispatch_rows(bool nt, const bf16* A, const bf16* B, bf16* C, const int32_t* offsets, int64_t G, int64_t rows,
                   int64_t cols, int64_t red, cudaStream_t stream) {
  switch (gg_variant()) {
    case 0: return launch_rows(nt, A, B, C, offsets, G, rows, cols, red, stream);
    case 2: return launch_wg_rows<Cfg2>(nt, A, B, C, offsets, G, rows, cols, red, stream);
    case 3: return launch_wg_rows<Cfg3>(nt, A, B, C, offsets, G, rows, cols, red, stream);
    case 4: return launch_wg_rows<Cfg4>(nt, A, B, C, offsets, G, rows, cols, red, stream);
    case 5: return launch_wg_rows<Cfg5>(nt, A, B, C, offsets, G, rows, cols, red, stream);
    default: return launch_wg_rows<Cfg1>(nt, A, B, C, offsets, G, rows, cols, red, stream);
  }
}

}  // namespace

void grouped_gemm_nt(const bf16* X, const bf16* W, bf16* Y, const int32_t* offsets, int64_t G, int64_t rows,
                     int64_t N, int64_t K, cudaStream_t stream) {
  check_args("grouped_gemm_nt", X, W, Y, 16, offsets, G, rows, N, K);
  dispatch_rows(true, X, W, Y, offsets, G, rows, N, K, stream);
}

void grouped_gemm_nn(const bf16* dY, const bf16* W, bf16* dX, const int32_t* offsets, int64_t G, int64_t rows,
                     int64_t N, int64_t K, cudaStream_t stream) {
  check_args("grouped_gemm_nn", dY, W, dX, 16, offsets, G, rows, N, K);
  dispatch_rows(false, dY, W, dX, offsets, G, rows, K, N, stream);
}

void grouped_gemm_wgrad(const bf16* dY, const bf16* X, float* dW, const int32_t* offsets, int64_t G, int64_t rows,
                        int64_t N, int64_t K, cudaStream_t stream) {
  check_args("grouped_gemm_wgrad", dY, X, dW, 8, offsets, G, rows, N, K);
  if (rows == 0 || N == 0 || K == 0) return;
  switch (gg_variant()) {
    case 0: break;
    case 2: return launch_wg_wgrad<Cfg2>(dY, X, dW, offsets, G, N, K, stream);
    case 3: return launch_wg_wgrad<Cfg3>(dY, X, dW, offsets, G, N, K, stream);
    case 4: return launch_wg_wgrad<Cfg4>(dY, X, dW, offsets, G, N, K, stream);
    case 5: return launch_wg_wgrad<Cfg5>(dY, X, dW, offsets, G, N, K, stream);
    default: return launch_wg_wgrad<Cfg1>(dY, X, dW, offsets, G, N, K, stream);
  }
  using T = WgradTiling;
  const int64_t m_tiles = (N + T::BM - 1) / T::BM, n_tiles = (K + T::BN - 1) / T::BN;
  const int64_t blocks = G * m_tiles * n_tiles;
  if (blocks > INT_MAX) throw Error("grouped_gemm_wgrad: the problem is too large for one grid");
  constexpr size_t smem = T::smem_bytes<false, false>();
  static std::array<bool, 64> seen{};
  if (first_on_this_device(seen)) allow_smem(grouped_wgrad_kernel<T>, smem);
  grouped_wgrad_kernel<T><<<unsigned(blocks), T::kThreads, smem, stream>>>(dY, X, dW, offsets, int(m_tiles),
                                                                          int(n_tiles), N, K);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

}  // namespace laoyao::kernels::cuda
