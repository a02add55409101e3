// The grouped GEMMs (grouped_gemm.hpp) with their operands brought by the Tensor Memory
// Accelerator: a producer warp issues one TMA copy a 64-wide box (128-byte swizzle, exactly the
// layout the wgmma descriptors read, wgmma.cuh) into a ring of kStages stages, each guarded by a
// "full" mbarrier (the copies' bytes arrived) and an "empty" one (both warpgroups' MMAs on it have
// retired); the two computing warpgroups keep one stage's MMAs in flight while they issue the
// next. Against the cp.async kernels (grouped_gemm.cu) the computing threads issue no copies and
// no address arithmetic, and their tensor cores need not drain between stages.
//
// A box does not stop at a group's last row, where the cp.async copies zero-fill:
//   nt / nn: a row tile's rows past its group's end read the next group's rows (or zeros past
//     the operand); their output rows are computed and not stored.
//   wgrad: the rows are the reduction, so a group's last, partial step would add the next
//     group's rows: each warpgroup zeroes its A rows (dY) past the group's end in shared memory
//     before its MMAs on that stage.
// The maps' row extent is the operand's rows from its base (RowGroups::first + rows).
//
// Measured on an H200 (bench/grouped_gemm_bench.cpp, 64 experts x 1024 rows, TFLOP/s fc1 fwd /
// fc2 fwd / fc2 dgrad / fc1 dgrad / fc1 wgrad / fc2 wgrad; cuBLASLt on one dense GEMM of the same
// work: ~720 / 620 / 620 / 720 / 710 / 630):
//   these (256-wide where the columns allow): 562-576 / 386-388 / 480-491 / 543-546 / 368-376 / 324-326
//   128 x 128 tiles only (tma128):             523-540 / 390-401 / 478-495 / 489-521 / 353-373 / 317-330
//   the cp.async kernels, same calls:          462-474 / 356-366 / 423-433 / 432-451 / 313-328 / 286-303
// Tried and dropped (the same bench, one call each):
//   persistent blocks (two an SM walking the tiles, the producer loading the next tile while the
//     epilogue stores straight from the accumulators): 427 / 284 / 419 / 399 / 372 / 338;
//   256-wide wgrad tiles (dW's K a multiple of 256): fc1 wgrad 376 against 373;
//   SwiGLU in fc1's epilogue (gate and linear rows paired in one tile) and its backward in fc2
//     dgrad's: 0.95x and 1.02x the GEMM followed by the SwiGLU kernel, the flagship's step within
//     noise (627.5 against 632.2 ms at 16 x 4096 tokens).
#include <cuda.h>

#include <array>
#include <climits>
#include <cstdint>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/grouped_gemm_tiles.cuh"
#include "kernels/cuda/grouped_gemm_tma.hpp"
#include "kernels/cuda/smem_attribute.hpp"
#include "kernels/cuda/tensor_map.hpp"
#include "kernels/cuda/wgmma.cuh"

namespace laoyao::kernels::cuda {
namespace {

using namespace wgmma;
using namespace grouped;

constexpr int kThreads = kMathThreads + 32;  // the two computing warpgroups, then the producer warp
constexpr int kMathWarps = kMathThreads / 32;

// A block tile of BM x W: W = 128 (wgmma m64n128, 3 stages = 96 KiB: two blocks an SM, one's
// epilogue beside the other's MMAs) or 256 (m64n256: half the shared-memory reads of A per FLOP,
// 4 stages = 192 KiB, one block an SM).
template <int W>
struct Tile {
  static_assert(W == 128 || W == 256, "tile widths 128 and 256");
  static constexpr int kStages = W == 128 ? 3 : 4, kBlocksPerSm = W == 128 ? 2 : 1;
  static constexpr int kTileA = BM * BK, kStage = kTileA + W * BK;  // elements
  static constexpr uint32_t kStageBytes = kStage * sizeof(bf16);
  // Dynamic shared memory: the ring or the epilogue's staging tile, plus 1 KiB to align the
  // swizzle atoms (8 rows of 128 bytes) on 1024-byte boundaries.
  template <class Staged>
  static constexpr size_t smem_bytes() {
    constexpr size_t pipe = size_t(kStages) * kStage * sizeof(bf16), out = staged_tile_bytes<Staged, W>();
    return (pipe > out ? pipe : out) + 1024;
  }
};

// mbarriers (PTX ISA "Parallel Synchronization and Communication Instructions: mbarrier").
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}
// Waits for the completion of the barrier's phase of the given parity.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_u32(bar)), "r"(parity)
        : "memory");
  } while (!done);
}

// One box of a 2D / 3D tensor map into shared memory, completing `bar`'s transaction bytes.
__device__ __forceinline__ void tma_load(bf16* dst, const CUtensorMap& map, uint64_t* bar, int x, int y) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n" ::"r"(
          smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(&map)), "r"(smem_u32(bar)), "r"(x), "r"(y)
      : "memory");
}
__device__ __forceinline__ void tma_load(bf16* dst, const CUtensorMap& map, uint64_t* bar, int x, int y, int z) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], "
      "[%2];\n" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(&map)), "r"(smem_u32(bar)), "r"(x), "r"(y), "r"(z)
      : "memory");
}

// A barrier over the computing threads only (the producer warp may have left).
__device__ __forceinline__ void sync_math() { asm volatile("bar.sync 1, %0;\n" ::"n"(kMathThreads) : "memory"); }

// The ring's barriers: full[s] completes when stage s's boxes have landed (the producer's
// expect_tx arrival plus the bytes), empty[s] when every computing warp is done with it.
template <int kStages>
struct Ring {
  uint64_t full[kStages], empty[kStages];
  __device__ __forceinline__ void init() {
    if (threadIdx.x == 0) {
      for (int s = 0; s < kStages; ++s) mbar_init(&full[s], 1), mbar_init(&empty[s], kMathWarps);
      asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
  }
};

// The producer's loop: for each reduction step kt, wait until its stage is free, announce its
// bytes, then load(stage A, stage B, full barrier, kt) issues the boxes.
template <int W, class Load>
__device__ __forceinline__ void produce(Ring<Tile<W>::kStages>& ring, bf16* smem, int KT, const Load& load) {
  constexpr int kStages = Tile<W>::kStages, kStage = Tile<W>::kStage;
  for (int kt = 0; kt < KT; ++kt) {
    const int s = kt % kStages;
    if (kt >= kStages) mbar_wait(&ring.empty[s], uint32_t((kt / kStages - 1) & 1));
    mbar_expect_tx(&ring.full[s], Tile<W>::kStageBytes);
    bf16* st = smem + s * kStage;
    load(st, st + Tile<W>::kTileA, &ring.full[s], kt);
  }
}

// The computing warpgroups' loop: for each step, wait for its stage, prepare(stage A, kt) (the
// wgrad's zeroing), issue its MMAs, then retire the previous step's and free that stage.
template <int TA, int TB, int W, class Prepare>
__device__ __forceinline__ void consume(Ring<Tile<W>::kStages>& ring, float (&acc)[W / 2], bf16* smem, int KT,
                                        const Prepare& prepare) {
  constexpr int kStages = Tile<W>::kStages, kStage = Tile<W>::kStage;
  const uint32_t wg_off = (threadIdx.x / 128) * 8192u;  // this warpgroup's 64 rows of A (both layouts)
  const uint32_t base = smem_u32(smem);
  const bool lane0 = (threadIdx.x & 31) == 0;
  for (int kt = 0; kt < KT; ++kt) {
    const int s = kt % kStages;
    mbar_wait(&ring.full[s], uint32_t((kt / kStages) & 1));
    prepare(smem + s * kStage, kt);
    const uint32_t a = base + uint32_t(s * kStage) * 2u;
    mma_stage<TA, TB, W>(acc, a + wg_off, a + Tile<W>::kTileA * 2u);
    wait<1>();
    if (kt > 0 && lane0) mbar_arrive(&ring.empty[(kt - 1) % kStages]);
  }
  wait<0>();
  fence_acc(acc);
  sync_math();  // both warpgroups' MMAs done: the stages may hold the epilogue's tile
}

// nt (B_MN = 0) and nn (B_MN = 1), as rows_kernel of grouped_gemm.cu, with W-wide column tiles.
// ta: A [extent rows][red]; tb: B as [Gw][cols][red] (nt, boxes of W rows) or [Gw][red][cols]
// (nn, W / 64 boxes of 64 columns).
template <int B_MN, int W>
__global__ void __launch_bounds__(kThreads, Tile<W>::kBlocksPerSm)
    rows_kernel_tma(const __grid_constant__ CUtensorMap ta, const __grid_constant__ CUtensorMap tb,
                    bf16* __restrict__ C, const int32_t* __restrict__ offsets, int G, int Gw, int col_tiles,
                    int64_t cols, int64_t red) {
  extern __shared__ unsigned char smem_raw[];
  __shared__ Ring<Tile<W>::kStages> ring;
  bf16* smem = align_1024(smem_raw);
  const int tile = int(blockIdx.x / unsigned(col_tiles));
  const int c0 = int(blockIdx.x % unsigned(col_tiles)) * W;
  int g, r0, r_end;
  if (!find_row_tile<kThreads>(offsets, G, tile, g, r0, r_end)) return;
  const int w = g % Gw, KT = int((red + BK - 1) / BK);
  ring.init();
  if (threadIdx.x >= kMathThreads) {
    if (threadIdx.x == kMathThreads)
      produce<W>(ring, smem, KT, [&](bf16* sA, bf16* sB, uint64_t* full, int kt) {
        tma_load(sA, ta, full, kt * BK, r0);
        if constexpr (B_MN) {
#pragma unroll
          for (int b = 0; b < W / 64; ++b) tma_load(sB + b * 64 * BK, tb, full, c0 + 64 * b, kt * BK, w);
        } else {
          tma_load(sB, tb, full, kt * BK, c0, w);
        }
      });
    return;
  }
  float acc[W / 2];
#pragma unroll
  for (int i = 0; i < W / 2; ++i) acc[i] = 0.0f;
  consume<0, B_MN, W>(ring, acc, smem, KT, [](bf16*, int) {});
  store_rows_tile(acc, smem, C, r0, r_end, c0, cols, sync_math);
}

// wgrad, as wgrad_kernel of grouped_gemm.cu (128 x 128 tiles of dW). ta: dY [extent rows][N];
// tb: X [extent rows][K].
__global__ void __launch_bounds__(kThreads, Tile<BN>::kBlocksPerSm)
    wgrad_kernel_tma(const __grid_constant__ CUtensorMap ta, const __grid_constant__ CUtensorMap tb,
                     float* __restrict__ dW, const int32_t* __restrict__ offsets, int G, int Gw, int m_tiles,
                     int n_tiles, int64_t N, int64_t K, bool accumulate) {
  extern __shared__ unsigned char smem_raw[];
  __shared__ Ring<Tile<BN>::kStages> ring;
  bf16* smem = align_1024(smem_raw);
  const unsigned b = blockIdx.x;
  const int n0 = int(b % unsigned(n_tiles)) * BN;                        // columns of dW: K
  const int m0 = int((b / unsigned(n_tiles)) % unsigned(m_tiles)) * BM;  // rows of dW: N
  const int w = int(b / unsigned(n_tiles * m_tiles));
  int KT = 0;  // the reduction's 64-row steps: each group's rows in ceil(rows / BK), group after group
  for (int g = w; g < G; g += Gw) KT += (offsets[g + 1] - offsets[g] + BK - 1) / BK;
  if (KT == 0 && accumulate) return;  // nothing to add
  float* Wg = dW + int64_t(w) * N * K;
  if (accumulate)  // this block's dW tile into L2 now, read in the epilogue
    for (int i = threadIdx.x; i < BM * (BN / 32); i += kThreads) {
      const int64_t r = m0 + i / (BN / 32), c = n0 + (i % (BN / 32)) * 32;
      if (r < N && c < K) asm volatile("prefetch.global.L2 [%0];\n" ::"l"(Wg + r * K + c));
    }
  ring.init();
  // Step kt's group: both roles ask for the steps in increasing order, so a cursor (group g, its
  // first step, first row, rows) moves forward only. Returns the step's first row; `left` its
  // group's rows from there on.
  struct Cursor {
    int g, step = 0, row, len;
    __device__ int at(const int32_t* off, int Gw_, int kt, int& left) {
      while (kt >= step + (len + BK - 1) / BK) {
        step += (len + BK - 1) / BK;
        g += Gw_;
        row = off[g];
        len = off[g + 1] - row;
      }
      const int done = (kt - step) * BK;
      left = len - done;
      return row + done;
    }
  } cur{w, 0, offsets[w], offsets[w + 1] - offsets[w]};
  if (threadIdx.x >= kMathThreads) {
    if (threadIdx.x == kMathThreads)
      produce<BN>(ring, smem, KT, [&](bf16* sA, bf16* sB, uint64_t* full, int kt) {
        int left;
        const int row = cur.at(offsets, Gw, kt, left);
        tma_load(sA, ta, full, m0, row);
        tma_load(sA + 64 * BK, ta, full, m0 + 64, row);
        tma_load(sB, tb, full, n0, row);
        tma_load(sB + 64 * BK, tb, full, n0 + 64, row);
      });
    return;
  }
  float acc[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;
  const int wg = threadIdx.x / 128, t = threadIdx.x % 128;
  consume<1, 1, BN>(ring, acc, smem, KT, [&](bf16* sA, int kt) {
    int left;
    cur.at(offsets, Gw, kt, left);
    if (left >= BK) return;
    // This warpgroup's 64 columns of dY^T: reduction rows left.. are the next group's (or past
    // the operand): zero them (whole 128-byte rows, the swizzle permutes only within a row).
    bf16* block = sA + wg * 64 * BK;
    for (int i = left * 8 + t; i < BK * 8; i += 128) reinterpret_cast<uint4*>(block)[i] = make_uint4(0, 0, 0, 0);
    fence_proxy_async();
    if (wg == 0)  // a barrier over this warpgroup (fixed ids: 2 and 3)
      asm volatile("bar.sync 2, 128;\n" ::: "memory");
    else
      asm volatile("bar.sync 3, 128;\n" ::: "memory");
  });
  add_wgrad_tile(acc, smem, Wg, m0, n0, N, K, accumulate, sync_math);
}


template <int W>
void launch_rows_tma(bool nt, const bf16* A, const bf16* B, bf16* C, const RowGroups& g, int64_t cols, int64_t red,
                     cudaStream_t stream) {
  const int64_t col_tiles = (cols + W - 1) / W;
  const int64_t blocks = col_tiles * ((g.rows + BM - 1) / BM + g.groups);
  if (blocks > INT_MAX) throw Error("grouped_gemm: the problem is too large for one grid");
  const uint64_t extent = uint64_t(g.first + g.rows), Gw = uint64_t(g.weights);
  const CUtensorMap ta = bf16_tensor_map(A, {uint64_t(red), extent}, {uint64_t(red) * 2}, {64, BM});
  constexpr size_t smem = Tile<W>::template smem_bytes<bf16>();
  const int G = int(g.groups);
  if (nt) {
    const CUtensorMap tb = bf16_tensor_map(B, {uint64_t(red), uint64_t(cols), Gw},
                                           {uint64_t(red) * 2, uint64_t(red * cols) * 2}, {64, W, 1});
    static std::array<bool, 64> seen{};
    if (first_on_this_device(seen)) allow_smem(rows_kernel_tma<0, W>, smem);
    rows_kernel_tma<0, W><<<unsigned(blocks), kThreads, smem, stream>>>(ta, tb, C, g.offsets, G, int(Gw),
                                                                         int(col_tiles), cols, red);
  } else {
    const CUtensorMap tb = bf16_tensor_map(B, {uint64_t(cols), uint64_t(red), Gw},
                                           {uint64_t(cols) * 2, uint64_t(red * cols) * 2}, {64, 64, 1});
    static std::array<bool, 64> seen{};
    if (first_on_this_device(seen)) allow_smem(rows_kernel_tma<1, W>, smem);
    rows_kernel_tma<1, W><<<unsigned(blocks), kThreads, smem, stream>>>(ta, tb, C, g.offsets, G, int(Gw),
                                                                         int(col_tiles), cols, red);
  }
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void grouped_rows_tma(bool nt, const bf16* A, const bf16* B, bf16* C, const RowGroups& g, int64_t cols, int64_t red,
                      bool wide, cudaStream_t stream) {
  if (wide)
    launch_rows_tma<256>(nt, A, B, C, g, cols, red, stream);
  else
    launch_rows_tma<128>(nt, A, B, C, g, cols, red, stream);
}

void grouped_wgrad_tma(const bf16* dY, const bf16* X, float* dW, const RowGroups& g, int64_t N, int64_t K,
                       bool accumulate, cudaStream_t stream) {
  const int64_t m_tiles = (N + BM - 1) / BM, n_tiles = (K + BN - 1) / BN;
  const int64_t blocks = g.weights * m_tiles * n_tiles;
  if (blocks > INT_MAX) throw Error("grouped_gemm_wgrad: the problem is too large for one grid");
  const uint64_t extent = uint64_t(g.first + g.rows);
  const CUtensorMap ta = bf16_tensor_map(dY, {uint64_t(N), extent}, {uint64_t(N) * 2}, {64, 64});
  const CUtensorMap tb = bf16_tensor_map(X, {uint64_t(K), extent}, {uint64_t(K) * 2}, {64, 64});
  constexpr size_t smem = Tile<BN>::smem_bytes<float>();
  static std::array<bool, 64> seen{};
  if (first_on_this_device(seen)) allow_smem(wgrad_kernel_tma, smem);
  wgrad_kernel_tma<<<unsigned(blocks), kThreads, smem, stream>>>(ta, tb, dW, g.offsets, int(g.groups),
                                                                 int(g.weights), int(m_tiles), int(n_tiles), N, K,
                                                                 accumulate);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

}  // namespace laoyao::kernels::cuda
