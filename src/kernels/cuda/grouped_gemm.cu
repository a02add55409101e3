// Grouped GEMMs of the routed experts (see grouped_gemm.hpp): the public functions (argument checks,
// the choice between these kernels and the TMA-fed ones of grouped_gemm_tma.cu, the default) and
// the cp.async-fed kernels (LAOYAO_GROUPED_GEMM=cp_async): Hopper warpgroup MMAs (wgmma.mma_async
// m64n128k16, bf16 -> fp32) reading both operands from 128-byte-swizzled shared memory through
// matrix descriptors, fed by a multi-stage cp.async pipeline. The copies apply the swizzle through
// their destination addresses (no TMA descriptors), so that every tile stops at its group's last
// row: cp.async zero-fills rows past it, and partial N / K tiles likewise.
//
// One configuration for all three (block tile BM x BN = 128 x 128, BK = 64, 2 warpgroups each
// owning 64 rows, 3 stages = 96 KiB so that 2 blocks share an SM and one's epilogue overlaps the
// other's MMAs), chosen on an H200 (bench/grouped_gemm_bench.cpp, 64 experts x 512 rows, TFLOP/s
// fc1 fwd / fc2 fwd / fc2 dgrad / fc1 dgrad / fc1 wgrad / fc2 wgrad):
//   this one:                                          461-465 / 342 / 401-411 / 423 / 246 / 220
//   128 x 256 tiles (m64n256), 4 stages, 1 block an SM: 415 / 309 / 336 / 427 / 228 / 184
//   6 stages, 1 block an SM:                            419 / 281 / 372 / 377 / 234 / 212
//   persistent, warp-specialized (a third warpgroup doing the epilogue of the previous tile
//   while the next one is computed): 378 / 283 / 337 / 340 / 263 / 237 (wgrad: +6% with 512
//   rows an expert, 2-6% slower with 1024 or imbalanced groups; not worth its complexity);
//   the previous mma.sync m16n8k16 kernels: 287 / 237 / 280 / 292 / 153 / 143.
//
// Shared tiles and accumulator fragments: wgmma.cuh.
//
// Work assignment, from the device offsets alone:
//   nt / nn: one block per (row tile, column tile); the row tiles are counted group by group (a
//     group of c rows has ceil(c / BM) tiles, none when empty), so the grid holds
//     ceil(rows / BM) + G row tiles (each group adds at most one partial tile) and a block whose
//     index is past the last tile exits. Each block finds its group with a block-wide prefix sum
//     of the groups' tile counts (G + 1 offsets read, a few hundred cycles).
//   wgrad: one block per (weight matrix w, BM x BN tile of dW_w), looping over the rows of the
//     groups w, w + Gw, w + 2 Gw, ... (the reduction; each group's rows start a new 64-row step);
//     each dW element belongs to exactly one block, which adds its sum in the epilogue (fp32
//     read-modify-write, its reads pulled into L2 at the block's start) or writes it:
//     deterministic, no atomics. Accumulating, the blocks of a matrix without rows exit.
#include <array>
#include <atomic>
#include <climits>
#include <cstdint>
#include <string>

#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/cuda_check.hpp"
#include "core/runtime_options.hpp"
#include "kernels/cuda/smem_attribute.hpp"
#include "kernels/cuda/grouped_gemm.hpp"
#include "kernels/cuda/grouped_gemm_portable.hpp"
#include "kernels/cuda/grouped_gemm_tma.hpp"
#include "kernels/cuda/grouped_gemm_tiles.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace laoyao::kernels::cuda {
namespace {

using namespace wgmma;
using namespace grouped;

constexpr int kThreads = kMathThreads;  // every thread loads and computes
constexpr int kStages = 3;     // tiles loaded ahead of the one consumed: kStages - 1
constexpr int kMinBlocks = 2;  // blocks an SM (96 KiB of pipeline each)
constexpr int kTileA = BM * BK, kTileB = BN * BK, kStage = kTileA + kTileB;  // elements
// Dynamic shared memory: the pipeline or the epilogue's staging tile of BM rows of (BN + 8)
// elements, plus 1 KiB to align the swizzle atoms (8 rows of 128 bytes) on 1024-byte boundaries.
template <class Staged>
constexpr size_t smem_bytes() {
  constexpr size_t pipe = size_t(kStages) * kStage * sizeof(bf16), out = staged_tile_bytes<Staged>();
  return (pipe > out ? pipe : out) + 1024;
}


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

// The copies of one thread into an MN-major tile: reduction rows row0 + 0..64 of a row-major
// matrix (leading dimension ld; rows from row0 + left on zero), columns c0 + 0..W (columns >=
// c_end zero).
template <int W>
struct SwMNLoader {
  static constexpr int kChunks = W / 8, kRows = kThreads / kChunks, kPasses = BK / kRows;
  static_assert(kRows % 8 == 0, "a pass covers whole 8-row swizzle groups");
  const bf16* p;  // this thread's column chunk in row k
  int64_t ld;
  int k, dst;
  bool col_ok;
  __device__ __forceinline__ SwMNLoader(const bf16* src, int64_t ld_, int64_t c0, int64_t c_end) : ld(ld_) {
    k = threadIdx.x / kChunks;
    const int cc = threadIdx.x % kChunks;
    dst = (cc / 8) * (BK * 64) + k * 64 + (((cc % 8) ^ (k & 7)) * 8);
    col_ok = c0 + cc * 8 < c_end;
    p = col_ok ? src + k * ld_ + c0 + cc * 8 : src;
  }
  __device__ __forceinline__ void load(bf16* s, int64_t row0, int64_t left) const {
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      const bool valid = col_ok && k + i * kRows < left;
      cp_async16(s + dst + i * kRows * 64, valid ? p + (row0 + i * kRows) * ld : p, valid);
    }
  }
};

// The pipelined main loop over kt = 0 .. KT: load(stage_A, stage_B, kt) starts the copies of
// reduction tile kt. Each step: wait for tile kt's copies, make them visible to the async proxy,
// one barrier (after which every warpgroup has retired its wgmmas on the stage consumed at step
// kt - 1), refill that stage with tile kt + kStages - 1, then the four k16 wgmmas on tile kt,
// waited for before the next step (2 blocks an SM keep the tensor cores busy meanwhile).
template <int TA, int TB, class Load>
__device__ __forceinline__ void main_loop(float (&acc)[BN / 2], bf16* smem, int KT, const Load& load) {
  constexpr int D = kStages - 1;
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
      bf16* st = smem + (next % kStages) * kStage;
      load(st, st + kTileA, next);
    }
    cp_async_commit();
    const uint32_t a = base + uint32_t((kt % kStages) * kStage) * 2u;
    mma_stage<TA, TB>(acc, a + wg_off, a + kTileA * 2u);
    wait<0>();
  }
  fence_acc(acc);
  cp_async_wait<0>();
  __syncthreads();  // the shared memory may be reused by the epilogue
}

// nt (B_MN = 0) and nn (B_MN = 1): C[r, 0..cols) = A[r, 0..red) @ op(B_w) for the rows r of each
// group g, w = g % Gw; A [rows, red]; B_w = B + w * cols * red, stored [cols][red] (nt) or
// [red][cols] (nn).
template <int B_MN>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    rows_kernel(const bf16* __restrict__ A, const bf16* __restrict__ B, bf16* __restrict__ C,
                const int32_t* __restrict__ offsets, int G, int Gw, int col_tiles, int64_t cols, int64_t red) {
  extern __shared__ unsigned char smem_raw[];
  bf16* smem = align_1024(smem_raw);
  const int tile = int(blockIdx.x / unsigned(col_tiles));
  const int64_t c0 = int64_t(blockIdx.x % unsigned(col_tiles)) * BN;
  int g, r0i, r_endi;
  if (!find_row_tile<kThreads>(offsets, G, tile, g, r0i, r_endi)) return;
  const int64_t r0 = r0i, r_end = r_endi;
  const bf16* Bg = B + int64_t(g % Gw) * cols * red;

  float acc[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;
  const int KT = int((red + BK - 1) / BK);
  const SwKLoader<BM> la(A, red, r0, r_end);
  if constexpr (B_MN) {
    const SwMNLoader<BN> lb(Bg, cols, c0, cols);
    main_loop<0, 1>(acc, smem, KT, [&](bf16* sA, bf16* sB, int kt) {
      la.load(sA, int64_t(kt) * BK, red);
      lb.load(sB, int64_t(kt) * BK, red - int64_t(kt) * BK);
    });
  } else {
    const SwKLoader<BN> lb(Bg, red, c0, cols);
    main_loop<0, 0>(acc, smem, KT, [&](bf16* sA, bf16* sB, int kt) {
      la.load(sA, int64_t(kt) * BK, red);
      lb.load(sB, int64_t(kt) * BK, red);
    });
  }

  store_rows_tile(acc, smem, C, r0, r_end, c0, cols, [] { __syncthreads(); });
}

// wgrad: dW_w[n, k] (+)= sum over the rows r of the groups w, w + Gw, ... of dY[r, n] * X[r, k]; a
// block owns one BM x BN tile of dW_w (rows m0.., columns n0..) and reduces over all those rows.
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    wgrad_kernel(const bf16* __restrict__ dY, const bf16* __restrict__ X, float* __restrict__ dW,
                 const int32_t* __restrict__ offsets, int G, int Gw, int m_tiles, int n_tiles, int64_t N, int64_t K,
                 bool accumulate) {
  extern __shared__ unsigned char smem_raw[];
  bf16* smem = align_1024(smem_raw);
  const unsigned b = blockIdx.x;
  const int64_t n0 = int64_t(b % unsigned(n_tiles)) * BN;                        // columns of dW: K
  const int64_t m0 = int64_t((b / unsigned(n_tiles)) % unsigned(m_tiles)) * BM;  // rows of dW: N
  const int w = int(b / unsigned(n_tiles * m_tiles));
  // The reduction's 64-row steps: each group's rows in ceil(rows / BK) of them, group after group.
  int KT = 0;
  for (int g = w; g < G; g += Gw) KT += int((int64_t(offsets[g + 1]) - offsets[g] + BK - 1) / BK);
  if (KT == 0 && accumulate) return;  // nothing to add
  float* Wg = dW + int64_t(w) * N * K;

  // Pull this block's dW tile into L2 now, so that the epilogue's read-modify-write reads hit L2
  // while the HBM reads overlap the main loop (its 128-byte lines: BN / 32 a row).
  if (accumulate)
    for (int i = threadIdx.x; i < BM * (BN / 32); i += kThreads) {
      const int64_t r = m0 + i / (BN / 32), c = n0 + (i % (BN / 32)) * 32;
      if (r < N && c < K) asm volatile("prefetch.global.L2 [%0];\n" ::"l"(Wg + r * K + c));
    }

  float acc[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;
  const SwMNLoader<BM> la(dY, N, m0, N);
  const SwMNLoader<BN> lb(X, K, n0, K);
  // The group of step kt: the main loop asks for the steps in increasing order, so a cursor
  // (group g, its first step, first row, rows) moves forward only.
  int g = w, g_step = 0;
  int64_t g_row = offsets[w], g_len = offsets[w + 1] - g_row;
  main_loop<1, 1>(acc, smem, KT, [&](bf16* sA, bf16* sB, int kt) {
    while (kt >= g_step + (g_len + BK - 1) / BK) {
      g_step += int((g_len + BK - 1) / BK);
      g += Gw;
      g_row = offsets[g];
      g_len = offsets[g + 1] - g_row;
    }
    const int64_t done = int64_t(kt - g_step) * BK;
    la.load(sA, g_row + done, g_len - done);
    lb.load(sB, g_row + done, g_len - done);
  });

  add_wgrad_tile(acc, smem, Wg, m0, n0, N, K, accumulate, [] { __syncthreads(); });
}

bool tma_kernels() { return grouped_gemm_kernels() == GroupedGemmKernels::kTma; }
bool portable_kernels() { return grouped_gemm_kernels() == GroupedGemmKernels::kPortable; }
bool wide_tiles(int64_t cols) { return cols % 256 == 0; }

bool aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

void check_args(const char* fn, const void* a, const void* b, const void* c, uintptr_t c_align, const RowGroups& g,
                int64_t N, int64_t K) {
  const std::string f = std::string(fn) + ": ";
  if (g.weights < 1 || g.groups < 1 || g.groups > INT_MAX / 2 || g.groups % g.weights != 0)
    throw Error(f + "the number of groups G must be at least 1 (and below 2^30) and a multiple of the weight "
                    "matrices Gw >= 1, got G=" + std::to_string(g.groups) + " Gw=" + std::to_string(g.weights));
  if (g.rows < 0 || g.first < 0 || g.first + g.rows > INT_MAX)
    throw Error(f + "first and rows must be non-negative, first + rows below 2^31 (the offsets are int32), got first=" +
                std::to_string(g.first) + " rows=" + std::to_string(g.rows));
  if (N < 0 || K < 0 || N > INT_MAX || K > INT_MAX)
    throw Error(f + "N and K must be in [0, 2^31), got N=" + std::to_string(N) + " K=" + std::to_string(K));
  if (N % 8 != 0 || K % 8 != 0)
    throw Error(f + "N and K must be multiples of 8 (16-byte rows), got N=" + std::to_string(N) +
                " K=" + std::to_string(K));
  if (!g.offsets) throw Error(f + "offsets is null");
  if (!aligned(a, 16) || !aligned(b, 16) || !aligned(c, c_align))
    throw Error(f + "the operands must be 16-byte aligned (the output " + std::to_string(c_align) + "-byte)");
}

// The nt / nn problems no kernel needs to run: no rows or no output columns (nothing to write), or
// an empty reduction (the groups' rows of C [first + rows][cols] become zeros). True when done.
bool rows_done(bf16* C, const RowGroups& g, int64_t cols, int64_t red, cudaStream_t stream) {
  if (g.rows == 0 || cols == 0) return true;
  if (red > 0) return false;
  LAOYAO_CUDA_CHECK(cudaMemsetAsync(C + g.first * cols, 0, size_t(g.rows * cols) * sizeof(bf16), stream));
  return true;
}

void launch_rows(bool nt, const bf16* A, const bf16* B, bf16* C, const RowGroups& g, int64_t cols, int64_t red,
                 cudaStream_t stream) {
  const int64_t col_tiles = (cols + BN - 1) / BN;
  const int64_t blocks = col_tiles * ((g.rows + BM - 1) / BM + g.groups);
  if (blocks > INT_MAX) throw Error("grouped_gemm: the problem is too large for one grid");
  constexpr size_t smem = smem_bytes<bf16>();
  const int G = int(g.groups), Gw = int(g.weights);
  if (nt) {
    static SmemSite site;
    site.once([&] { allow_smem(rows_kernel<0>, smem); });
    rows_kernel<0><<<unsigned(blocks), kThreads, smem, stream>>>(A, B, C, g.offsets, G, Gw, int(col_tiles), cols, red);
  } else {
    static SmemSite site;
    site.once([&] { allow_smem(rows_kernel<1>, smem); });
    rows_kernel<1><<<unsigned(blocks), kThreads, smem, stream>>>(A, B, C, g.offsets, G, Gw, int(col_tiles), cols, red);
  }
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

// The current device's compute capability (10 major + minor), asked once a device: every grouped
// GEMM call asks.
int device_cc() {
  static std::array<std::atomic<int>, 64> known{};
  int device = 0;
  LAOYAO_CUDA_CHECK(cudaGetDevice(&device));
  int cc = device < 64 ? known[size_t(device)].load(std::memory_order_relaxed) : 0;
  if (cc == 0) {
    int major = 0, minor = 0;
    LAOYAO_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    LAOYAO_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    cc = 10 * major + minor;
    if (device < 64) known[size_t(device)].store(cc, std::memory_order_relaxed);
  }
  return cc;
}

}  // namespace

// LAOYAO_GROUPED_GEMM (core/runtime_options.hpp) picks the kernels: "tma" the TMA-fed ones with
// 128 x 256 tiles walked by one block an SM where the output's columns are a multiple of 256
// (128 x 128 tiles, a block each, elsewhere and for the weight gradients), "cp_async" these,
// "portable" grouped_gemm_portable.cu's; "auto" (the default) the TMA-fed ones on a Hopper GPU
// (compute capability 9.0, the only one wgmma runs on) and the portable ones elsewhere.
GroupedGemmKernels grouped_gemm_kernels() {
  const int cc = device_cc();
  const int major = cc / 10, minor = cc % 10;
  const bool hopper = cc == 90;
  switch (runtime_options().grouped_gemm) {
    case RuntimeOptions::GroupedGemm::kPortable:
      return GroupedGemmKernels::kPortable;
    case RuntimeOptions::GroupedGemm::kAuto:
      return hopper ? GroupedGemmKernels::kTma : GroupedGemmKernels::kPortable;
    case RuntimeOptions::GroupedGemm::kTma:
    case RuntimeOptions::GroupedGemm::kCpAsync:
      if (!hopper)
        throw UsageError("LAOYAO_GROUPED_GEMM=" +
                         std::string(runtime_options().grouped_gemm == RuntimeOptions::GroupedGemm::kTma ? "tma"
                                                                                                          : "cp_async") +
                         ": these kernels run on Hopper (compute capability 9.0) only, this GPU is " +
                         std::to_string(major) + "." + std::to_string(minor) + " (accepted here: auto, portable)");
      return runtime_options().grouped_gemm == RuntimeOptions::GroupedGemm::kTma ? GroupedGemmKernels::kTma
                                                                                 : GroupedGemmKernels::kCpAsync;
  }
  return GroupedGemmKernels::kPortable;
}

const char* grouped_gemm_kernels_name(GroupedGemmKernels k) {
  switch (k) {
    case GroupedGemmKernels::kTma: return "tma (Hopper wgmma, TMA-fed)";
    case GroupedGemmKernels::kCpAsync: return "cp_async (Hopper wgmma, cp.async-fed)";
    case GroupedGemmKernels::kPortable: return "portable (warp-level MMA, sm_80 and later)";
  }
  return "?";
}

void grouped_gemm_nt(const bf16* X, const bf16* W, bf16* Y, const RowGroups& groups, int64_t N, int64_t K,
                     cudaStream_t stream) {
  check_args("grouped_gemm_nt", X, W, Y, 16, groups, N, K);
  if (rows_done(Y, groups, N, K, stream)) return;
  if (tma_kernels()) return grouped_rows_tma(true, X, W, Y, groups, N, K, wide_tiles(N), stream);
  if (portable_kernels()) return grouped_rows_portable(true, X, W, Y, groups, N, K, stream);
  launch_rows(true, X, W, Y, groups, N, K, stream);
}

void grouped_gemm_nn(const bf16* dY, const bf16* W, bf16* dX, const RowGroups& groups, int64_t N, int64_t K,
                     cudaStream_t stream) {
  check_args("grouped_gemm_nn", dY, W, dX, 16, groups, N, K);
  if (rows_done(dX, groups, K, N, stream)) return;
  if (tma_kernels()) return grouped_rows_tma(false, dY, W, dX, groups, K, N, wide_tiles(K), stream);
  if (portable_kernels()) return grouped_rows_portable(false, dY, W, dX, groups, K, N, stream);
  launch_rows(false, dY, W, dX, groups, K, N, stream);
}

void grouped_gemm_wgrad(const bf16* dY, const bf16* X, float* dW, const RowGroups& groups, int64_t N, int64_t K,
                        bool accumulate, cudaStream_t stream) {
  check_args("grouped_gemm_wgrad", dY, X, dW, 8, groups, N, K);
  if (N == 0 || K == 0) return;
  if (groups.rows == 0) {  // nothing to add; writing, zeros (no kernel reads an empty operand)
    if (!accumulate)
      LAOYAO_CUDA_CHECK(cudaMemsetAsync(dW, 0, size_t(groups.weights * N * K) * sizeof(float), stream));
    return;
  }
  if (tma_kernels()) return grouped_wgrad_tma(dY, X, dW, groups, N, K, accumulate, stream);
  if (portable_kernels()) return grouped_wgrad_portable(dY, X, dW, groups, N, K, accumulate, stream);
  const int64_t m_tiles = (N + BM - 1) / BM, n_tiles = (K + BN - 1) / BN;
  const int64_t blocks = groups.weights * m_tiles * n_tiles;
  if (blocks > INT_MAX) throw Error("grouped_gemm_wgrad: the problem is too large for one grid");
  constexpr size_t smem = smem_bytes<float>();
  static SmemSite site;
  site.once([&] { allow_smem(wgrad_kernel, smem); });
  wgrad_kernel<<<unsigned(blocks), kThreads, smem, stream>>>(dY, X, dW, groups.offsets, int(groups.groups),
                                                             int(groups.weights), int(m_tiles), int(n_tiles), N, K,
                                                             accumulate);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

namespace {

void check_fp8_args(const char* fn, const void* a, const void* b, const void* c, const RowGroups& g, int64_t N,
                    int64_t K) {
  check_args(fn, a, b, c, 8, g, N, K);
  if (N % 16 != 0 || K % 16 != 0)
    throw Error(std::string(fn) + ": FP8 needs N and K multiples of 16, got N=" + std::to_string(N) +
                " K=" + std::to_string(K));
  const int cc = device_cc();
  if (cc != 90)
    throw UsageError(std::string(fn) + ": the FP8 grouped GEMMs run on Hopper (compute capability 9.0) only, this GPU is " +
                     std::to_string(cc / 10) + "." + std::to_string(cc % 10));
}

}  // namespace

bool grouped_gemm_fp8_supported() { return device_cc() == 90; }

void grouped_gemm_fp8_nt(const uint8_t* X, Fp8Format fx, const uint8_t* W, bf16* Y, const RowGroups& groups, int64_t N,
                         int64_t K, const Fp8GroupScales& scales, bool split_accumulator, cudaStream_t stream) {
  check_fp8_args("grouped_gemm_fp8_nt", X, W, Y, groups, N, K);
  if (!scales.a || !scales.b) throw Error("grouped_gemm_fp8_nt: the scale_invs are null");
  if (rows_done(Y, groups, N, K, stream)) return;
  grouped_rows_tma_fp8(X, fx, W, Y, groups, N, K, scales, split_accumulator, stream);
}

void grouped_gemm_fp8_wgrad(const uint8_t* dYt, Fp8Format fdy, const uint8_t* Xt, int64_t ld, float* dW,
                            const RowGroups& groups, int64_t N, int64_t K, const Fp8GroupScales& scales,
                            bool accumulate, cudaStream_t stream) {
  check_fp8_args("grouped_gemm_fp8_wgrad", dYt, Xt, dW, groups, N, K);
  if (!scales.a || !scales.b) throw Error("grouped_gemm_fp8_wgrad: the scale_invs are null");
  if (ld < groups.first + groups.rows || ld % 16 != 0)
    throw Error("grouped_gemm_fp8_wgrad: the transposes' pitch ld must be a multiple of 16 and at least first + rows (" +
                std::to_string(groups.first + groups.rows) + "), got " + std::to_string(ld));
  if (N == 0 || K == 0) return;
  if (groups.rows == 0) {
    if (!accumulate)
      LAOYAO_CUDA_CHECK(cudaMemsetAsync(dW, 0, size_t(groups.weights * N * K) * sizeof(float), stream));
    return;
  }
  grouped_wgrad_tma_fp8(dYt, fdy, Xt, ld, dW, groups, N, K, scales, accumulate, stream);
}

}  // namespace laoyao::kernels::cuda
