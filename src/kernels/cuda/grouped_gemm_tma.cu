// The grouped GEMMs (grouped_gemm.hpp; bf16, and the FP8 forms, whose stages hold 128 FP8
// elements a row: the same bytes) with their operands brought by the Tensor Memory Accelerator: a producer warp issues one TMA copy a 64-wide box (128-byte swizzle, exactly the
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
// Epilogues: a whole output tile is staged in shared memory in the maps' swizzle and leaves by TMA
// bulk stores (dW: bulk reductions, the add done in L2), issued by one thread; a group's last,
// partial row tile is stored by the threads (its rows past the group are the next group's).
// Where the output is 128 x 256 tiles, one block an SM walks them (rows_kernel_tma_persistent):
// the producer loads the next tile while the epilogue of this one runs from its own buffer.
//
// Measured on an H200 (bench/grouped_gemm_bench.cpp, 64 experts x 1024 rows, TFLOP/s fc1 fwd /
// fc2 fwd / fc2 dgrad / fc1 dgrad / fc1 wgrad / fc2 wgrad; cuBLASLt on one dense GEMM of the same
// work: ~720 / 620 / 620 / 720 / 710 / 630):
//   these (persistent 256-wide, bulk epilogues): 617-621 / 491-492 / 490-500 / 604-610 / 396-401 / 369-371
//   a block a tile, bulk epilogues:              579-582 / 390-391 / 496-500 / 548-556 / 396-401 / 369-371
//   a block a tile, the threads' epilogues:       562-576 / 386-388 / 480-491 / 542-546 / 367-376 / 324-326
//   128 x 128 tiles only:                      523-540 / 390-401 / 478-495 / 489-521 / 353-373 / 317-330
//   the cp.async kernels, same calls:          462-474 / 356-366 / 423-433 / 432-451 / 313-328 / 286-303
// The wgrad blocks longest first (fifteenth session; same bench, 64 experts, one hot expert at 8x
// the mean rows as the flagship's busiest on mock data, fc1 / fc2 wgrad, matrix order -> longest
// first): 482 / 366 -> 581 / 529 at 262144 rows, 387 / 300 -> 382 / 354 at 65536; even groups
// unchanged (536 / 516 -> 570 / 559, call noise); the flagship at 8 micro-batches of 8 x 4096
// 571.3 -> 557.9 ms a step (same call).
// Tried and dropped (the same bench, one call each):
//   persistent blocks (two an SM walking the tiles, the producer loading the next tile while the
//     epilogue stores straight from the accumulators): 427 / 284 / 419 / 399 / 372 / 338;
//   persistent wgrad (128 x 128 tiles, 4 stages + fp32 staging, bulk reductions): 392 / 361 at
//     1024 rows an expert, but 377 / 295 against 424 / 364 with uneven groups (166..3270 rows):
//     tiles taken in a fixed order cannot balance reductions of unequal length, and the flagship's
//     step was slower (617.4 against 608.7 ms at 16 x 4096 tokens);
//   256-wide wgrad tiles (dW's K a multiple of 256): fc1 wgrad 376 against 373;
//   SwiGLU in fc1's epilogue (gate and linear rows paired in one tile) and its backward in fc2
//     dgrad's: 0.95x and 1.02x the GEMM followed by the SwiGLU kernel, the flagship's step within
//     noise (627.5 against 632.2 ms at 16 x 4096 tokens).
#include <cuda.h>

#include <array>
#include <climits>
#include <cstdint>
#include <string>

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
__device__ __forceinline__ void tma_load(void* dst, const CUtensorMap& map, uint64_t* bar, int x, int y) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n" ::"r"(
          smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(&map)), "r"(smem_u32(bar)), "r"(x), "r"(y)
      : "memory");
}
__device__ __forceinline__ void tma_load(void* dst, const CUtensorMap& map, uint64_t* bar, int x, int y, int z) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], "
      "[%2];\n" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(&map)), "r"(smem_u32(bar)), "r"(x), "r"(y), "r"(z)
      : "memory");
}

// Bulk tensor stores (PTX "cp.async.bulk.tensor", shared -> global, and "cp.reduce.async.bulk.tensor"
// .add): a shared-memory box written into, or added to, a map's tensor, elements outside its dims
// skipped. (The f32 add may flush subnormals, like red.add.f32: the threads' epilogue may differ
// from it there, in bits no training step can see.) The issuing thread commits them as a bulk group and waits only until they have been read
// out of shared memory: the global writes finish after the block has gone, beside the next block's
// loads (the threads' own stores and, for dW, loads would hold the block until they retire).
__device__ __forceinline__ void tma_store(const CUtensorMap& map, const void* src, int x, int y) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(
                   reinterpret_cast<uint64_t>(&map)),
               "r"(smem_u32(src)), "r"(x), "r"(y)
               : "memory");
}
__device__ __forceinline__ void tma_store(const CUtensorMap& map, const void* src, int x, int y, int z) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
                   reinterpret_cast<uint64_t>(&map)),
               "r"(smem_u32(src)), "r"(x), "r"(y), "r"(z)
               : "memory");
}
__device__ __forceinline__ void tma_reduce_add(const CUtensorMap& map, const void* src, int x, int y, int z) {
  asm volatile("cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
                   reinterpret_cast<uint64_t>(&map)),
               "r"(smem_u32(src)), "r"(x), "r"(y), "r"(z)
               : "memory");
}
// Until every committed bulk group of this thread has been read out of shared memory.
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }

// A tile staged for bulk stores: boxes of BM rows x 128 bytes (32 floats or 64 bf16) one after
// another along the columns, each in the maps' 128-byte swizzle (16-byte chunk c of row r at
// c ^ (r % 8)), so that a warp's fragment stores meet every bank equally. Byte offset of (row, col):
template <class T>
__device__ __forceinline__ uint32_t staged_offset(int row, int col) {
  constexpr int kPerRow = 128 / int(sizeof(T));
  const uint32_t byte = uint32_t(col % kPerRow) * uint32_t(sizeof(T));
  return uint32_t(col / kPerRow) * (BM * 128u) + uint32_t(row) * 128u + ((((byte >> 4) ^ uint32_t(row & 7)) << 4) | (byte & 15u));
}

// The accumulators (W = 2 NA columns of the block's 128 rows) into such boxes, as T (float, or
// bf16 rounded once), made visible to the bulk copies; the caller then syncs the computing threads.
template <class T, int NA>
__device__ __forceinline__ void stage_for_bulk(const float (&acc)[NA], unsigned char* smem) {
  const int lane = threadIdx.x & 31, gq = lane >> 2, tq = lane & 3;
  const int row = (threadIdx.x >> 5) * 16 + gq;  // warp w of the block: rows 16 w .. 16 w + 15
#pragma unroll
  for (int j = 0; j < NA / 4; ++j) {
    const int c = j * 8 + 2 * tq;
    if constexpr (sizeof(T) == 4) {
      *reinterpret_cast<float2*>(smem + staged_offset<T>(row, c)) = make_float2(acc[4 * j], acc[4 * j + 1]);
      *reinterpret_cast<float2*>(smem + staged_offset<T>(row + 8, c)) = make_float2(acc[4 * j + 2], acc[4 * j + 3]);
    } else {
      *reinterpret_cast<uint32_t*>(smem + staged_offset<T>(row, c)) = pack_bf16(acc[4 * j], acc[4 * j + 1]);
      *reinterpret_cast<uint32_t*>(smem + staged_offset<T>(row + 8, c)) = pack_bf16(acc[4 * j + 2], acc[4 * j + 3]);
    }
  }
  fence_proxy_async();
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

// What a kernel's MMAs read. A stage is 128-byte rows either way: BK = 64 bf16 elements (Bf16Mma,
// either operand K- or MN-major) or 128 FP8 ones (Fp8Mma: E4M3 or E5M2 A, E4M3 B, both K-major),
// whose epilogue multiplies by the operands' scale_invs. kSplit: Transformer Engine's split
// accumulator (its FP8 backward GEMMs' use_split_accumulator): each stage's MMAs into partial sums
// added to the fp32 accumulators by the threads, since the tensor cores' FP8 accumulation keeps
// fewer bits than fp32 over a long reduction; without it (the forward's fast accumulation) they
// accumulate in place.
struct Bf16Mma {
  static constexpr int kStep = BK;
  static constexpr bool kFp8 = false, kSplit = false;
  template <int TA, int TB, int W>
  static __device__ __forceinline__ void stage(float (&acc)[W / 2], uint32_t a, uint32_t b, bool) {
    mma_stage<TA, TB, W>(acc, a, b);
  }
};
template <int FA, bool Split>
struct Fp8Mma {
  static constexpr int kStep = 2 * BK;
  static constexpr bool kFp8 = true, kSplit = Split;
  template <int TA, int TB, int W>
  static __device__ __forceinline__ void stage(float (&acc)[W / 2], uint32_t a, uint32_t b, bool fresh) {
    static_assert(TA == 0 && TB == 0, "FP8 operands are K-major");
    mma_stage_fp8<FA, 0, W>(acc, a, b, fresh);
  }
};

// Blocks an SM: the split accumulator's partial sums double the accumulators' registers, more
// than two blocks of 288 threads have.
template <class Mma, int W>
constexpr int blocks_per_sm() {
  return Mma::kSplit ? 1 : Tile<W>::kBlocksPerSm;
}

// The split accumulator's turns (named barriers 4 and 5 over both computing warpgroups): the
// warpgroups issue each step's MMAs one after the other, which the tensor cores run in that order,
// so one warpgroup adds its partial sums while the other's MMAs run; were they issued together,
// both would wait for their MMAs at once and the tensor cores would stand idle during the adds.
// Warpgroup wg waits at barrier 4 + wg for its turn and passes it at 5 - wg.
__device__ __forceinline__ void turn_wait(int wg) {
  if (wg == 0)
    asm volatile("bar.sync 4, %0;\n" ::"n"(kMathThreads) : "memory");
  else
    asm volatile("bar.sync 5, %0;\n" ::"n"(kMathThreads) : "memory");
}
__device__ __forceinline__ void turn_pass(int wg) {
  if (wg == 0)
    asm volatile("bar.arrive 5, %0;\n" ::"n"(kMathThreads) : "memory");
  else
    asm volatile("bar.arrive 4, %0;\n" ::"n"(kMathThreads) : "memory");
}

// The computing warpgroups' loop: for each step, wait for its stage, prepare(stage A, kt) (the
// wgrad's zeroing), issue its MMAs, then retire the previous step's and free that stage (split:
// issue in turn, retire this step's and add its partial sums).
template <int TA, int TB, int W, class Mma, class Prepare>
__device__ __forceinline__ void consume(Ring<Tile<W>::kStages>& ring, float (&acc)[W / 2], bf16* smem, int KT,
                                        const Prepare& prepare) {
  constexpr int kStages = Tile<W>::kStages, kStage = Tile<W>::kStage;
  const int wg = threadIdx.x / 128;
  const uint32_t wg_off = uint32_t(wg) * 8192u;  // this warpgroup's 64 rows of A (both layouts)
  const uint32_t base = smem_u32(smem);
  const bool lane0 = (threadIdx.x & 31) == 0;
  [[maybe_unused]] float part[Mma::kSplit ? W / 2 : 1];
  if constexpr (Mma::kSplit) {
#pragma unroll
    for (int i = 0; i < W / 2; ++i) part[i] = 0.0f;
  }
  for (int kt = 0; kt < KT; ++kt) {
    const int s = kt % kStages;
    mbar_wait(&ring.full[s], uint32_t((kt / kStages) & 1));
    prepare(smem + s * kStage, kt);
    const uint32_t a = base + uint32_t(s * kStage) * 2u;
    if constexpr (Mma::kSplit) {
      // Warpgroup 0 goes first; each barrier is waited at as often as it is passed.
      if (wg == 1 || kt > 0) turn_wait(wg);
      Mma::template stage<TA, TB, W>(part, a + wg_off, a + Tile<W>::kTileA * 2u, true);
      if (wg == 0 || kt + 1 < KT) turn_pass(wg);
      wait<0>();
      fence_acc(part);
      if (lane0) mbar_arrive(&ring.empty[s]);
#pragma unroll
      for (int i = 0; i < W / 2; ++i) acc[i] += part[i];
    } else {
      Mma::template stage<TA, TB, W>(acc, a + wg_off, a + Tile<W>::kTileA * 2u, false);
      wait<1>();
      if (kt > 0 && lane0) mbar_arrive(&ring.empty[(kt - 1) % kStages]);
    }
  }
  wait<0>();
  fence_acc(acc);
  sync_math();  // both warpgroups' MMAs done: the stages may hold the epilogue's tile
}

// A rows kernel's boxes for reduction step kt into stage (sA, sB): A's rows r0.. and B's W columns
// c0.. of weight matrix w (nt: one box of W rows; nn: W / 64 boxes of 64 columns).
template <int B_MN, int W, int kStep = BK>
__device__ __forceinline__ void load_rows_stage(bf16* sA, bf16* sB, const CUtensorMap& ta, const CUtensorMap& tb,
                                                uint64_t* full, int kt, int r0, int c0, int w) {
  tma_load(sA, ta, full, kt * kStep, r0);
  if constexpr (B_MN) {
#pragma unroll
    for (int b = 0; b < W / 64; ++b) tma_load(sB + b * 64 * BK, tb, full, c0 + 64 * b, kt * BK, w);
  } else {
    tma_load(sB, tb, full, kt * kStep, c0, w);
  }
}

// The FP8 epilogue's factor: group g's operands' scale_invs (one per weight matrix g % Gw).
__device__ __forceinline__ float fp8_factor(const Fp8GroupScales& sc, int w) {
  return sc.a[int64_t(w) * sc.a_stride] * sc.b[int64_t(w) * sc.b_stride];
}
template <int N>
__device__ __forceinline__ void scale_acc(float (&acc)[N], float f) {
#pragma unroll
  for (int i = 0; i < N; ++i) acc[i] *= f;
}

// Thread 0 of a rows kernel: a whole row tile staged by stage_for_bulk<bf16> (W / 64 boxes) into C
// at (r0, c0) through its map; one bulk group, committed.
template <int W>
__device__ __forceinline__ void issue_rows_tile(const CUtensorMap& tc, const unsigned char* staged, int r0, int c0,
                                                int64_t cols) {
#pragma unroll
  for (int b = 0; b < W / 64; ++b)
    if (c0 + 64 * b < cols) tma_store(tc, staged + b * BM * 128, c0 + 64 * b, r0);
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}

// nt (B_MN = 0) and nn (B_MN = 1), as rows_kernel of grouped_gemm.cu, with W-wide column tiles.
// ta: A [extent rows][red]; tb: B as [Gw][cols][red] (nt, boxes of W rows) or [Gw][red][cols]
// (nn, W / 64 boxes of 64 columns). FP8 (Fp8Mma): nt only, the output times `sc`'s factor.
template <int B_MN, int W, class Mma = Bf16Mma>
__global__ void __launch_bounds__(kThreads, blocks_per_sm<Mma, W>())
    rows_kernel_tma(const __grid_constant__ CUtensorMap ta, const __grid_constant__ CUtensorMap tb,
                    const __grid_constant__ CUtensorMap tc, bool bulk, bf16* __restrict__ C,
                    const int32_t* __restrict__ offsets, int G, int Gw, int col_tiles, int64_t cols, int64_t red,
                    Fp8GroupScales sc = {}) {
  extern __shared__ unsigned char smem_raw[];
  __shared__ Ring<Tile<W>::kStages> ring;
  bf16* smem = align_1024(smem_raw);
  const int tile = int(blockIdx.x / unsigned(col_tiles));
  const int c0 = int(blockIdx.x % unsigned(col_tiles)) * W;
  int g, r0, r_end;
  if (!find_row_tile<kThreads>(offsets, G, tile, g, r0, r_end)) return;
  const int w = g % Gw, KT = int((red + Mma::kStep - 1) / Mma::kStep);
  ring.init();
  if (threadIdx.x >= kMathThreads) {
    if (threadIdx.x == kMathThreads)
      produce<W>(ring, smem, KT, [&](bf16* sA, bf16* sB, uint64_t* full, int kt) {
        load_rows_stage<B_MN, W, Mma::kStep>(sA, sB, ta, tb, full, kt, r0, c0, w);
      });
    return;
  }
  float acc[W / 2];
#pragma unroll
  for (int i = 0; i < W / 2; ++i) acc[i] = 0.0f;
  consume<0, B_MN, W, Mma>(ring, acc, smem, KT, [](bf16*, int) {});
  if constexpr (Mma::kFp8) scale_acc(acc, fp8_factor(sc, w));
  if (bulk && r0 + BM <= r_end) {  // a whole row tile of its group: its rows are all C's to write
    stage_for_bulk<bf16>(acc, reinterpret_cast<unsigned char*>(smem));
    sync_math();
    if (threadIdx.x == 0) {
      issue_rows_tile<W>(tc, reinterpret_cast<const unsigned char*>(smem), r0, c0, cols);
      bulk_wait_read();
    }
  } else {
    store_rows_tile(acc, smem, C, r0, r_end, c0, cols, sync_math);
  }
}

// The persistent form of rows_kernel_tma for 128 x 256 tiles: one block an SM walks the tiles
// (tile t: row tile t / col_tiles, column tile t % col_tiles), the producer loading the next
// tile's stages while the computing warpgroups finish the current one and stage its epilogue in
// a buffer of its own (not the ring), from where bulk stores take it while the next tile's MMAs
// run. Row tiles map to groups through the groups' first tiles, a prefix sum in shared memory
// (G <= kMaxPersistentGroups).
constexpr int kPersistentStages = 3;  // 3 x 48 KiB ring + 64 KiB staging: one block an SM
constexpr int kMaxPersistentGroups = 1024;
constexpr size_t kPersistentStaging = size_t(BM) * 256 * sizeof(bf16);
constexpr size_t kPersistentSmem = size_t(kPersistentStages) * Tile<256>::kStage * sizeof(bf16) + kPersistentStaging + 1024;

// first_tile[g] = row tiles of the groups before g (g = 0..G); every thread of the block calls it.
__device__ __forceinline__ void group_first_tiles(const int32_t* __restrict__ offsets, int G, int* first_tile) {
  __shared__ int s_warp[kThreads / 32];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int per = (G + kThreads - 1) / kThreads;
  const int g0 = min(G, tid * per), g1 = min(G, g0 + per);
  int mine = 0;
  for (int g = g0; g < g1; ++g) mine += (max(offsets[g + 1] - offsets[g], 0) + BM - 1) / BM;
  int incl = mine;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const int v = __shfl_up_sync(0xffffffffu, incl, d);
    if (lane >= d) incl += v;
  }
  if (lane == 31) s_warp[warp] = incl;
  __syncthreads();
  int p = incl - mine;
  for (int w = 0; w < warp; ++w) p += s_warp[w];
  for (int g = g0; g < g1; ++g) {
    first_tile[g] = p;
    p += (max(offsets[g + 1] - offsets[g], 0) + BM - 1) / BM;
  }
  if (tid == kThreads - 1) first_tile[G] = p;  // the last thread's end: every group's tiles
  __syncthreads();
}

// Row tile rt's group: the last g with first_tile[g] <= rt (empty groups share their successor's).
__device__ __forceinline__ int group_of_tile(const int* first_tile, int G, int rt) {
  int lo = 0, hi = G;
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (first_tile[mid] <= rt)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

template <int B_MN>
__global__ void __launch_bounds__(kThreads, 1)
    rows_kernel_tma_persistent(const __grid_constant__ CUtensorMap ta, const __grid_constant__ CUtensorMap tb,
                               const __grid_constant__ CUtensorMap tc, bf16* __restrict__ C,
                               const int32_t* __restrict__ offsets, int G, int Gw, int col_tiles, int64_t cols,
                               int64_t red) {
  constexpr int W = 256, S = kPersistentStages, kStage = Tile<W>::kStage;
  extern __shared__ unsigned char smem_raw[];
  __shared__ Ring<S> ring;
  __shared__ int first_tile[kMaxPersistentGroups + 1];
  bf16* smem = align_1024(smem_raw);
  unsigned char* staging = reinterpret_cast<unsigned char*>(smem + S * kStage);
  group_first_tiles(offsets, G, first_tile);
  const int tiles = first_tile[G] * col_tiles, KT = int((red + BK - 1) / BK);
  ring.init();
  if (threadIdx.x >= kMathThreads) {
    if (threadIdx.x != kMathThreads) return;
    int it = 0;  // the ring's steps over all of this block's tiles
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
      const int rt = t / col_tiles, c0 = (t % col_tiles) * W;
      const int g = group_of_tile(first_tile, G, rt), w = g % Gw;
      const int r0 = offsets[g] + (rt - first_tile[g]) * BM;
      for (int kt = 0; kt < KT; ++kt, ++it) {
        const int s = it % S;
        if (it >= S) mbar_wait(&ring.empty[s], uint32_t((it / S - 1) & 1));
        mbar_expect_tx(&ring.full[s], Tile<W>::kStageBytes);
        bf16* sA = smem + s * kStage;
        load_rows_stage<B_MN, W>(sA, sA + Tile<W>::kTileA, ta, tb, &ring.full[s], kt, r0, c0, w);
      }
    }
    return;
  }
  const uint32_t wg_off = (threadIdx.x / 128) * 8192u, base = smem_u32(smem);
  const bool lane0 = (threadIdx.x & 31) == 0;
  int it = 0;
  for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int rt = t / col_tiles, c0 = (t % col_tiles) * W;
    const int g = group_of_tile(first_tile, G, rt);
    const int r0 = offsets[g] + (rt - first_tile[g]) * BM, r_end = offsets[g + 1];
    float acc[W / 2];
#pragma unroll
    for (int i = 0; i < W / 2; ++i) acc[i] = 0.0f;
    for (int kt = 0; kt < KT; ++kt, ++it) {
      const int s = it % S;
      mbar_wait(&ring.full[s], uint32_t((it / S) & 1));
      const uint32_t a = base + uint32_t(s * kStage) * 2u;
      mma_stage<0, B_MN, W>(acc, a + wg_off, a + Tile<W>::kTileA * 2u);
      wait<1>();
      if (kt > 0 && lane0) mbar_arrive(&ring.empty[(it - 1) % S]);
    }
    wait<0>();
    if (lane0) mbar_arrive(&ring.empty[(it - 1) % S]);  // the tile's last stage, free for the next tile
    fence_acc(acc);
    // The staging buffer is free once the previous tile's bulk stores have read it (and every
    // thread's copies from it are done: the barrier).
    if (threadIdx.x == 0) bulk_wait_read();
    sync_math();
    stage_for_bulk<bf16>(acc, staging);
    sync_math();
    if (r0 + BM <= r_end) {
      if (threadIdx.x == 0) issue_rows_tile<W>(tc, staging, r0, c0, cols);
    } else {  // the group's last, partial tile: its rows below r_end, 16 bytes a thread at a time
      constexpr int kChunks = W / 8;
      for (int i = threadIdx.x; i < BM * kChunks; i += kMathThreads) {
        const int r = i / kChunks, col = (i % kChunks) * 8;
        if (r0 + r < r_end && c0 + col < cols)
          *reinterpret_cast<uint4*>(C + int64_t(r0 + r) * cols + c0 + col) =
              *reinterpret_cast<const uint4*>(staging + staged_offset<bf16>(r, col));
      }
    }
  }
  if (threadIdx.x == 0) bulk_wait_read();
}

// The wgrad's reduction of a group's rows [begin, end): steps of kStep rows (64 bf16, 128 FP8)
// from begin rounded down to kAlign; none for an empty group.
template <int kStep, int kAlign>
__device__ __forceinline__ int group_steps(int begin, int end) {
  return end > begin ? (end - (begin & ~(kAlign - 1)) + kStep - 1) / kStep : 0;
}

// Weight matrix w's: its groups', group after group.
template <int kStep, int kAlign>
__device__ __forceinline__ int wgrad_steps(const int32_t* __restrict__ offsets, int G, int Gw, int w) {
  int KT = 0;
  for (int g = w; g < G; g += Gw) KT += group_steps<kStep, kAlign>(offsets[g], offsets[g + 1]);
  return KT;
}

// The wgrad blocks' order: longest reduction first. Routing is uneven (the flagship on mock data:
// its busiest expert takes about 8x the mean rows), and a block reduces all of its matrix's rows,
// so blocks in matrix order can leave a few SMs on the busiest expert's tiles long after the
// others are done. The hardware starts blocks in index order, so block rank r takes the matrix
// with the r-th most steps (ties by index: the order, and so every block's own sum, is fixed).
// Each warp finds it alone (no barrier): lane l holds the steps of matrices l, l + 32, ...;
// kLptSlots slots a lane, so up to 32 kLptSlots matrices (the host passes lpt = false above).
constexpr int kLptSlots = 8;
template <int kStep, int kAlign>
__device__ __forceinline__ int matrix_of_rank(const int32_t* __restrict__ offsets, int G, int Gw, int rank) {
  const int lane = threadIdx.x & 31;
  int steps[kLptSlots];
#pragma unroll
  for (int j = 0; j < kLptSlots; ++j) steps[j] = 32 * j + lane < Gw ? wgrad_steps<kStep, kAlign>(offsets, G, Gw, 32 * j + lane) : -1;
  int found = -1;
#pragma unroll
  for (int j = 0; j < kLptSlots; ++j) {
    if (32 * j >= Gw) break;  // uniform across the warp
    const int w = 32 * j + lane;
    int r = 0;  // matrices before w: more steps, or as many and a lower index
#pragma unroll
    for (int i = 0; i < kLptSlots; ++i) {
      if (32 * i >= Gw) break;
      for (int l = 0; l < 32; ++l) {
        const int sv = __shfl_sync(0xffffffffu, steps[i], l), v = 32 * i + l;
        r += sv > steps[j] || (sv == steps[j] && v < w);
      }
    }
    if (w < Gw && r == rank) found = w;
  }
  const unsigned hit = __ballot_sync(0xffffffffu, found >= 0);
  return __shfl_sync(0xffffffffu, found, __ffs(hit) - 1);
}

// Step kt's group: both roles ask for the steps in increasing order, so a cursor (group g, its
// first step, its first row rounded down to kAlign, the rows from there to its end, the rows before
// its first) moves forward only. at() returns the step's first row; `left` its group's rows from
// there on, `skip` the rows at its start that are the previous group's (its first step only).
template <int kStep, int kAlign>
struct WgradCursor {
  int g, step, row, len, before;
  __device__ void set(const int32_t* off, int group) {
    g = group;
    const int begin = off[g], end = off[g + 1];
    row = begin & ~(kAlign - 1);
    len = end > begin ? end - row : 0;
    before = len > 0 ? begin - row : 0;
  }
  __device__ static WgradCursor start(const int32_t* off, int w) {
    WgradCursor c{};
    c.set(off, w);
    return c;
  }
  __device__ int at(const int32_t* off, int Gw, int kt, int& left, int& skip) {
    while (kt >= step + (len + kStep - 1) / kStep) {
      step += (len + kStep - 1) / kStep;
      set(off, g + Gw);
    }
    const int done = (kt - step) * kStep;
    left = len - done;
    skip = done == 0 ? before : 0;
    return row + done;
  }
};

// Zeroed shared memory made visible to the warpgroup's wgmmas: the async proxy's fence, then a
// barrier over the warpgroup's 128 threads (fixed ids 2 and 3).
__device__ __forceinline__ void sync_warpgroup_after_zeroing(int wg) {
  fence_proxy_async();
  if (wg == 0)
    asm volatile("bar.sync 2, 128;\n" ::: "memory");
  else
    asm volatile("bar.sync 3, 128;\n" ::: "memory");
}

// A group's last, partial step: warpgroup wg's 64 columns of dY^T in stage A `sA` have reduction
// rows left.. from the next group (or past the operand): zero them (whole 128-byte rows, the
// swizzle permutes only within a row), then a barrier over the warpgroup (thread t of 128).
__device__ __forceinline__ void zero_rows_past_group(bf16* sA, int left, int wg, int t) {
  bf16* block = sA + wg * 64 * BK;
  for (int i = left * 8 + t; i < BK * 8; i += 128) reinterpret_cast<uint4*>(block)[i] = make_uint4(0, 0, 0, 0);
  sync_warpgroup_after_zeroing(wg);
}

// The FP8 wgrad's A is dY^T, K-major (the reduction's rows are its columns): warpgroup wg's 64 rows
// of stage A keep their bytes (columns) skip .. left - 1, the rows of this step's group, and the
// others, the previous or the next group's, are zeroed; a 16-byte chunk c of row r sits at chunk
// c ^ (r % 8).
__device__ __forceinline__ void zero_cols_outside_group(bf16* sA, int skip, int left, int wg, int t) {
  unsigned char* block = reinterpret_cast<unsigned char*>(sA) + wg * 64 * 128;
#pragma unroll
  for (int u = 0; u < 4; ++u) {  // 64 rows x 8 chunks, 4 a thread (every thread the same trip count)
    const int i = t + 128 * u, r = i >> 3, c = i & 7;
    const int lo = min(max(skip - c * 16, 0), 16), hi = min(max(left - c * 16, 0), 16);  // kept: [lo, hi)
    uint4* chunk = reinterpret_cast<uint4*>(block + r * 128 + ((c ^ (r & 7)) << 4));
    if (lo > 0 || hi < 16) {
      uint4 v = *chunk;
      uint32_t* w = reinterpret_cast<uint32_t*>(&v);
#pragma unroll
      for (int j = 0; j < 4; ++j)  // byte b of word j is byte 4 j + b of the chunk (little-endian)
#pragma unroll
        for (int b = 0; b < 4; ++b)
          if (4 * j + b < lo || 4 * j + b >= hi) w[j] &= ~(0xFFu << (8 * b));
      *chunk = v;
    }
  }
  __syncwarp();  // converged again before the warpgroup's .aligned wgmmas
  sync_warpgroup_after_zeroing(wg);
}

// Thread 0 of a wgrad block: the staged fp32 tile (stage_for_bulk's boxes of 32 columns) added to
// dW's tile (n0, m0) of matrix w through the map, or written over it; one bulk group, committed.
__device__ __forceinline__ void issue_wgrad_tile(const CUtensorMap& tw, const unsigned char* staged, int n0, int m0,
                                                 int w, int64_t K, bool accumulate) {
#pragma unroll
  for (int b = 0; b < BN / 32; ++b) {
    if (n0 + 32 * b >= K) break;
    if (accumulate)
      tma_reduce_add(tw, staged + b * BM * 128, n0 + 32 * b, m0, w);
    else
      tma_store(tw, staged + b * BM * 128, n0 + 32 * b, m0, w);
  }
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}

// wgrad, as wgrad_kernel of grouped_gemm.cu (128 x 128 tiles of dW). ta: dY [extent rows][N];
// tb: X [extent rows][K]. FP8 (Fp8Mma): their transposes, ta dY^T [N][extent], tb X^T [K][extent]
// (K-major: the rows are the columns), the tile times `sc`'s factor.
template <class Mma = Bf16Mma>
__global__ void __launch_bounds__(kThreads, blocks_per_sm<Mma, BN>())
    wgrad_kernel_tma(const __grid_constant__ CUtensorMap ta, const __grid_constant__ CUtensorMap tb,
                     const __grid_constant__ CUtensorMap tw, bool bulk, float* __restrict__ dW,
                     const int32_t* __restrict__ offsets, int G, int Gw, int m_tiles, int n_tiles, int64_t N,
                     int64_t K, bool accumulate, bool lpt, Fp8GroupScales sc = {}) {
  constexpr int kStep = Mma::kStep;
  extern __shared__ unsigned char smem_raw[];
  __shared__ Ring<Tile<BN>::kStages> ring;
  bf16* smem = align_1024(smem_raw);
  const unsigned b = blockIdx.x;
  const int n0 = int(b % unsigned(n_tiles)) * BN;                        // columns of dW: K
  const int m0 = int((b / unsigned(n_tiles)) % unsigned(m_tiles)) * BM;  // rows of dW: N
  const int rank = int(b / unsigned(n_tiles * m_tiles));
  // The FP8 wgrad's rows are its boxes' innermost coordinate, which TMA takes at 16-byte multiples
  // only (an unaligned one is an illegal instruction): a group's steps start at its first row
  // rounded down to 16.
  constexpr int kAlign = Mma::kFp8 ? 16 : 1;
  const int w = lpt ? matrix_of_rank<kStep, kAlign>(offsets, G, Gw, rank) : rank;
  const int KT = wgrad_steps<kStep, kAlign>(offsets, G, Gw, w);
  if (KT == 0 && accumulate) return;  // nothing to add
  float* Wg = dW + int64_t(w) * N * K;
  if (accumulate && !bulk)  // this block's dW tile into L2 now, read in the epilogue
    for (int i = threadIdx.x; i < BM * (BN / 32); i += kThreads) {
      const int64_t r = m0 + i / (BN / 32), c = n0 + (i % (BN / 32)) * 32;
      if (r < N && c < K) asm volatile("prefetch.global.L2 [%0];\n" ::"l"(Wg + r * K + c));
    }
  ring.init();
  WgradCursor<kStep, kAlign> cur = WgradCursor<kStep, kAlign>::start(offsets, w);
  if (threadIdx.x >= kMathThreads) {
    if (threadIdx.x == kMathThreads)
      produce<BN>(ring, smem, KT, [&](bf16* sA, bf16* sB, uint64_t* full, int kt) {
        int left, skip;
        const int row = cur.at(offsets, Gw, kt, left, skip);
        if constexpr (Mma::kFp8) {  // one box of 128 rows (dY^T's, X^T's) x 128 reduction columns each
          tma_load(sA, ta, full, row, m0);
          tma_load(sB, tb, full, row, n0);
        } else {
          tma_load(sA, ta, full, m0, row);
          tma_load(sA + 64 * BK, ta, full, m0 + 64, row);
          tma_load(sB, tb, full, n0, row);
          tma_load(sB + 64 * BK, tb, full, n0 + 64, row);
        }
      });
    return;
  }
  float acc[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;
  const int wg = threadIdx.x / 128, t = threadIdx.x % 128;
  constexpr int kT = Mma::kFp8 ? 0 : 1;  // bf16 reads both MN-major
  consume<kT, kT, BN, Mma>(ring, acc, smem, KT, [&](bf16* sA, int kt) {
    int left, skip;
    cur.at(offsets, Gw, kt, left, skip);
    if (left < kStep || skip > 0) {  // (skip: FP8 alone)
      if constexpr (Mma::kFp8)
        zero_cols_outside_group(sA, skip, left, wg, t);
      else
        zero_rows_past_group(sA, left, wg, t);
    }
  });
  if constexpr (Mma::kFp8) scale_acc(acc, fp8_factor(sc, w));
  if (bulk) {  // the tile added to dW (or written) by the bulk copies, in L2
    stage_for_bulk<float>(acc, reinterpret_cast<unsigned char*>(smem));
    sync_math();
    if (threadIdx.x == 0) {
      issue_wgrad_tile(tw, reinterpret_cast<const unsigned char*>(smem), n0, m0, w, K, accumulate);
      bulk_wait_read();
    }
  } else {
    add_wgrad_tile(acc, smem, Wg, m0, n0, N, K, accumulate, sync_math);
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }


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
  // C's map (whole tiles' boxes of 64 columns); C is 16-byte aligned (grouped_gemm.cu's checks)
  // and its rows are 16-byte multiples (cols % 8 == 0).
  const bool bulk = true;  // whole output tiles leave through TMA bulk stores
  const CUtensorMap tc = bulk ? bf16_tensor_map(C, {uint64_t(cols), extent}, {uint64_t(cols) * 2}, {64, BM}) : ta;
  if (nt) {
    const CUtensorMap tb = bf16_tensor_map(B, {uint64_t(red), uint64_t(cols), Gw},
                                           {uint64_t(red) * 2, uint64_t(red * cols) * 2}, {64, W, 1});
    static SmemSite site;
    site.once([&] { allow_smem(rows_kernel_tma<0, W>, smem); });
    rows_kernel_tma<0, W><<<unsigned(blocks), kThreads, smem, stream>>>(ta, tb, tc, bulk, C, g.offsets, G, int(Gw),
                                                                         int(col_tiles), cols, red);
  } else {
    const CUtensorMap tb = bf16_tensor_map(B, {uint64_t(cols), uint64_t(red), Gw},
                                           {uint64_t(cols) * 2, uint64_t(red * cols) * 2}, {64, 64, 1});
    static SmemSite site;
    site.once([&] { allow_smem(rows_kernel_tma<1, W>, smem); });
    rows_kernel_tma<1, W><<<unsigned(blocks), kThreads, smem, stream>>>(ta, tb, tc, bulk, C, g.offsets, G, int(Gw),
                                                                         int(col_tiles), cols, red);
  }
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

// The current device's SMs: the persistent kernels' grid.
int sm_count() {
  static std::array<int, 64> sms{};
  int dev = 0;
  LAOYAO_CUDA_CHECK(cudaGetDevice(&dev));
  int& n = sms[size_t(dev & 63)];
  if (n == 0) LAOYAO_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
  return n;
}

// The persistent kernel: as many blocks as SMs (fewer for fewer tiles). False where it does not
// serve (more groups than its table holds): the caller launches the grid kernels instead.
bool launch_rows_tma_persistent(bool nt, const bf16* A, const bf16* B, bf16* C, const RowGroups& g, int64_t cols,
                                int64_t red, cudaStream_t stream) {
  if (g.groups > kMaxPersistentGroups) return false;
  constexpr int W = 256;
  const int64_t col_tiles = (cols + W - 1) / W;
  const int64_t tiles_bound = col_tiles * ((g.rows + BM - 1) / BM + g.groups);
  if (tiles_bound > INT_MAX) throw Error("grouped_gemm: the problem is too large for one grid");
  const unsigned blocks = unsigned(tiles_bound < sm_count() ? tiles_bound : sm_count());
  const uint64_t extent = uint64_t(g.first + g.rows), Gw = uint64_t(g.weights);
  const CUtensorMap ta = bf16_tensor_map(A, {uint64_t(red), extent}, {uint64_t(red) * 2}, {64, BM});
  const CUtensorMap tc = bf16_tensor_map(C, {uint64_t(cols), extent}, {uint64_t(cols) * 2}, {64, BM});
  const int G = int(g.groups);
  if (nt) {
    const CUtensorMap tb = bf16_tensor_map(B, {uint64_t(red), uint64_t(cols), Gw},
                                           {uint64_t(red) * 2, uint64_t(red * cols) * 2}, {64, W, 1});
    static SmemSite site;
    site.once([&] { allow_smem(rows_kernel_tma_persistent<0>, kPersistentSmem); });
    rows_kernel_tma_persistent<0><<<blocks, kThreads, kPersistentSmem, stream>>>(ta, tb, tc, C, g.offsets, G, int(Gw),
                                                                                 int(col_tiles), cols, red);
  } else {
    const CUtensorMap tb = bf16_tensor_map(B, {uint64_t(cols), uint64_t(red), Gw},
                                           {uint64_t(cols) * 2, uint64_t(red * cols) * 2}, {64, 64, 1});
    static SmemSite site;
    site.once([&] { allow_smem(rows_kernel_tma_persistent<1>, kPersistentSmem); });
    rows_kernel_tma_persistent<1><<<blocks, kThreads, kPersistentSmem, stream>>>(ta, tb, tc, C, g.offsets, G, int(Gw),
                                                                                 int(col_tiles), cols, red);
  }
  LAOYAO_CUDA_CHECK(cudaGetLastError());
  return true;
}

}  // namespace

void grouped_rows_tma(bool nt, const bf16* A, const bf16* B, bf16* C, const RowGroups& g, int64_t cols, int64_t red,
                      bool wide, cudaStream_t stream) {
  if (wide && launch_rows_tma_persistent(nt, A, B, C, g, cols, red, stream)) return;
  if (wide)
    launch_rows_tma<256>(nt, A, B, C, g, cols, red, stream);
  else
    launch_rows_tma<128>(nt, A, B, C, g, cols, red, stream);
}

namespace {

template <int W, class Mma>
void launch_rows_fp8(const uint8_t* A, const uint8_t* B, bf16* C, const RowGroups& g, int64_t cols, int64_t red,
                     const Fp8GroupScales& sc, cudaStream_t stream) {
  const int64_t col_tiles = (cols + W - 1) / W;
  const int64_t blocks = col_tiles * ((g.rows + BM - 1) / BM + g.groups);
  if (blocks > INT_MAX) throw Error("grouped_gemm_fp8_nt: the problem is too large for one grid");
  const uint64_t extent = uint64_t(g.first + g.rows), Gw = uint64_t(g.weights);
  // 128 FP8 elements a box row: the bf16 kernels' 128-byte rows.
  const CUtensorMap ta = u8_tensor_map(A, {uint64_t(red), extent}, {uint64_t(red)}, {128, BM});
  const CUtensorMap tb =
      u8_tensor_map(B, {uint64_t(red), uint64_t(cols), Gw}, {uint64_t(red), uint64_t(red * cols)}, {128, W, 1});
  const CUtensorMap tc = bf16_tensor_map(C, {uint64_t(cols), extent}, {uint64_t(cols) * 2}, {64, BM});
  constexpr size_t smem = Tile<W>::template smem_bytes<bf16>();
  static SmemSite site;
  site.once([&] { allow_smem(rows_kernel_tma<0, W, Mma>, smem); });
  rows_kernel_tma<0, W, Mma><<<unsigned(blocks), kThreads, smem, stream>>>(
      ta, tb, tc, true, C, g.offsets, int(g.groups), int(Gw), int(col_tiles), cols, red, sc);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

// A wgrad launch over the operands' maps (ta, tb as wgrad_kernel_tma takes them): dW's map for
// the bulk reductions where dW is 16-byte aligned, the longest reductions' blocks first.
template <class Mma>
void launch_wgrad(const CUtensorMap& ta, const CUtensorMap& tb, float* dW, const RowGroups& g, int64_t N, int64_t K,
                  bool accumulate, const Fp8GroupScales& sc, cudaStream_t stream) {
  const int64_t m_tiles = (N + BM - 1) / BM, n_tiles = (K + BN - 1) / BN;
  const int64_t blocks = g.weights * m_tiles * n_tiles;
  if (blocks > INT_MAX) throw Error("grouped_gemm_wgrad: the problem is too large for one grid");
  // dW's map [Gw][N][K] fp32 (boxes of 32 columns): needs a 16-byte aligned dW (K % 8 == 0 already).
  const bool bulk = aligned16(dW);
  const CUtensorMap tw =
      bulk ? f32_tensor_map(dW, {uint64_t(K), uint64_t(N), uint64_t(g.weights)},
                            {uint64_t(K) * 4, uint64_t(N * K) * 4}, {32, BM, 1})
           : ta;
  constexpr size_t smem = Tile<BN>::smem_bytes<float>();
  static SmemSite site;
  site.once([&] { allow_smem(wgrad_kernel_tma<Mma>, smem); });
  const bool lpt = g.weights > 1 && g.weights <= 32 * kLptSlots;
  wgrad_kernel_tma<Mma><<<unsigned(blocks), kThreads, smem, stream>>>(ta, tb, tw, bulk, dW, g.offsets,
                                                                      int(g.groups), int(g.weights), int(m_tiles),
                                                                      int(n_tiles), N, K, accumulate, lpt, sc);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

// The FP8 wgrad's maps: the transposes, 128-element (byte) boxes of 128 rows.
template <class Mma>
void launch_wgrad_fp8(const uint8_t* dYt, const uint8_t* Xt, int64_t ld, float* dW, const RowGroups& g, int64_t N,
                      int64_t K, const Fp8GroupScales& sc, bool accumulate, cudaStream_t stream) {
  const uint64_t extent = uint64_t(g.first + g.rows);
  const CUtensorMap ta = u8_tensor_map(dYt, {extent, uint64_t(N)}, {uint64_t(ld)}, {128, BM});
  const CUtensorMap tb = u8_tensor_map(Xt, {extent, uint64_t(K)}, {uint64_t(ld)}, {128, BN});
  launch_wgrad<Mma>(ta, tb, dW, g, N, K, accumulate, sc, stream);
}

}  // namespace

void grouped_rows_tma_fp8(const uint8_t* A, Fp8Format fa, const uint8_t* B, bf16* C, const RowGroups& g,
                          int64_t cols, int64_t red, const Fp8GroupScales& sc, bool split, cudaStream_t stream) {
  const bool e5m2 = fa == Fp8Format::E5M2;
  if (split)  // the partial sums' registers beside the accumulators: 128-wide tiles
    return e5m2 ? launch_rows_fp8<128, Fp8Mma<1, true>>(A, B, C, g, cols, red, sc, stream)
                : launch_rows_fp8<128, Fp8Mma<0, true>>(A, B, C, g, cols, red, sc, stream);
  if (cols % 256 == 0)
    return e5m2 ? launch_rows_fp8<256, Fp8Mma<1, false>>(A, B, C, g, cols, red, sc, stream)
                : launch_rows_fp8<256, Fp8Mma<0, false>>(A, B, C, g, cols, red, sc, stream);
  return e5m2 ? launch_rows_fp8<128, Fp8Mma<1, false>>(A, B, C, g, cols, red, sc, stream)
              : launch_rows_fp8<128, Fp8Mma<0, false>>(A, B, C, g, cols, red, sc, stream);
}

void grouped_wgrad_tma_fp8(const uint8_t* dYt, Fp8Format fdy, const uint8_t* Xt, int64_t ld, float* dW,
                           const RowGroups& g, int64_t N, int64_t K, const Fp8GroupScales& sc, bool accumulate,
                           cudaStream_t stream) {
  if (fdy == Fp8Format::E5M2) return launch_wgrad_fp8<Fp8Mma<1, true>>(dYt, Xt, ld, dW, g, N, K, sc, accumulate, stream);
  launch_wgrad_fp8<Fp8Mma<0, true>>(dYt, Xt, ld, dW, g, N, K, sc, accumulate, stream);
}

void grouped_wgrad_tma(const bf16* dY, const bf16* X, float* dW, const RowGroups& g, int64_t N, int64_t K,
                       bool accumulate, cudaStream_t stream) {
  const uint64_t extent = uint64_t(g.first + g.rows);
  const CUtensorMap ta = bf16_tensor_map(dY, {uint64_t(N), extent}, {uint64_t(N) * 2}, {64, 64});
  const CUtensorMap tb = bf16_tensor_map(X, {uint64_t(K), extent}, {uint64_t(K) * 2}, {64, 64});
  launch_wgrad<Bf16Mma>(ta, tb, dW, g, N, K, accumulate, {}, stream);
}

}  // namespace laoyao::kernels::cuda
