#include "kernels/cuda/fp8_cast.hpp"

#include <cuda_fp8.h>

#include <algorithm>
#include <cfloat>
#include <climits>
#include <cstdint>
#include <string>

#include "core/error.hpp"
#include "kernels/cuda/cuda_check.hpp"

namespace laoyao::kernels::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ uint8_t to_fp8(float v, Fp8Format f) {
  return f == Fp8Format::E4M3 ? __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3)
                              : __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E5M2);
}

// Two values to FP8 at once (one cvt of a pair on Hopper), as to_fp8 casts each.
__device__ __forceinline__ uint16_t to_fp8x2(float a, float b, Fp8Format f) {
  const float2 v = make_float2(a, b);
  return f == Fp8Format::E4M3 ? __nv_cvt_float2_to_fp8x2(v, __NV_SATFINITE, __NV_E4M3)
                              : __nv_cvt_float2_to_fp8x2(v, __NV_SATFINITE, __NV_E5M2);
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

// vec (n a multiple of 8, x 16-byte and q 8-byte aligned): 8 values a thread at a time.
__global__ void cast_kernel(const __nv_bfloat16* __restrict__ x, int64_t n, const float* __restrict__ scale,
                            Fp8Format f, uint8_t* __restrict__ q, float* __restrict__ scale_inv, float* amax,
                            bool vec) {
  const float s = scale ? *scale : 1.0f;
  float m = 0.0f;
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  if (vec) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n / 8; i += step) {
      const uint4 raw = reinterpret_cast<const uint4*>(x)[i];
      const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
      __align__(8) uint8_t b[8];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 v = __bfloat1622float2(h[j]);
        m = fmaxf(m, fmaxf(fabsf(v.x), fabsf(v.y)));
        const uint16_t pair = to_fp8x2(v.x * s, v.y * s, f);
        b[2 * j] = uint8_t(pair & 0xFF), b[2 * j + 1] = uint8_t(pair >> 8);
      }
      if (q) reinterpret_cast<uint2*>(q)[i] = *reinterpret_cast<const uint2*>(b);
    }
  } else {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += step) {
      const float v = __bfloat162float(x[i]);
      m = fmaxf(m, fabsf(v));
      if (q) q[i] = to_fp8(v * s, f);
    }
  }
  if (amax) block_amax(m, amax);
  if (scale_inv && blockIdx.x == 0 && threadIdx.x == 0) *scale_inv = 1.0f / s;
}

// Tiles of 64 rows x 64 columns, kThreads threads a block (fp8_cast_transpose and the batched and
// grouped casts): a thread loads 8 bf16 of a row (16 bytes) and stores their 8 FP8 bytes, and the
// transpose goes out 16 rows of a column (16 bytes) a thread, through a shared-memory tile. The
// vector loads and stores only where alignment allows them (Tiles::vec_x, vec_t), byte by byte
// otherwise.
constexpr int kTile = 64, kVec = 8, kRowsPerPass = kThreads / (kTile / kVec), kChunk = 16;
static_assert(2 * kRowsPerPass == kTile && kThreads / kTile * kChunk == kTile, "two passes of loads, one of stores");

// Where a launch's rows come from. Dense (offsets null): matrix blockIdx.z of a batch (x, q, qt
// one [extent][cols] matrix after another, ld = extent), every row its matrix's scale. Grouped:
// rows begin..extent of one matrix, row r of group g (offsets[g] <= r < offsets[g + 1]) cast with
// weight matrix g % Gw's scale; a row before first or past offsets[G] is no group's (its q row
// left, its transposed column written 0: the FP8 wgrad's boxes read those).
struct Tiles {
  int64_t cols = 0, begin = 0, first = 0, extent = 0, ld = 0;
  int64_t col_tiles = 1;  // a band's tiles (blockIdx.x: band x col_tiles + tile)
  const int32_t* offsets = nullptr;
  int G = 0, Gw = 1;
  bool vec_x = false, vec_t = false;  // x and q rows 16 / 8-byte aligned; qt's columns 16-byte aligned
};

// The groups' offsets a block searches: in shared memory up to kSharedGroups groups (one load
// for the block rather than a dependent global load per step of each row's search).
constexpr int kSharedGroups = 1024;

__device__ __forceinline__ int group_of_row(const int32_t* offsets, const Tiles& tl, int64_t r) {
  if (r < tl.first || r >= tl.extent || r < offsets[0] || r >= offsets[tl.G]) return -1;
  int lo = 0, hi = tl.G;  // the last g with offsets[g] <= r
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (offsets[mid] <= r) lo = mid; else hi = mid;
  }
  return lo;
}

// scale null: the amaxes alone (grouped), a cast with scale 1 (dense). amax: the matrix's max |x|
// (dense), or each run of a tile's rows of one group max-ed into that group's weight matrix's slot
// (grouped). Blocks run a band's column tiles one after another: together they read whole rows.
__global__ void __launch_bounds__(kThreads) cast_transpose_tiles(const __nv_bfloat16* __restrict__ x, Tiles tl,
                                                                 Fp8Slots sl, Fp8Format f, uint8_t* __restrict__ q,
                                                                 uint8_t* __restrict__ qt) {
  __shared__ __align__(16) uint8_t tile[kTile][kTile + kVec];
  __shared__ int row_group[kTile];
  __shared__ float row_scale[kTile], row_amax[kTile];
  __shared__ int32_t shared_offsets[kSharedGroups + 1];
  const bool grouped = tl.offsets != nullptr;
  const bool cast = !grouped || sl.scale;  // (a dense cast without a scale casts with 1)
  const int t = threadIdx.x;
  const int64_t z = blockIdx.z, band = int64_t(blockIdx.x) / tl.col_tiles;
  const int64_t r0 = tl.begin + band * kTile, c0 = (int64_t(blockIdx.x) - band * tl.col_tiles) * kTile;
  if (!grouped) {
    const int64_t elems = tl.extent * tl.cols;
    x += z * elems;
    if (q) q += z * elems;
    if (qt) qt += z * elems;
  }
  // The loads first (every row below extent is in x), the rows' groups while they are in flight.
  const int tr = t / (kTile / kVec), tc = (t % (kTile / kVec)) * kVec;
  const int64_t c = c0 + tc;
  uint4 raw[2];
  float v[2][kVec];
#pragma unroll
  for (int p = 0; p < 2; ++p) {
    const int64_t r = r0 + tr + p * kRowsPerPass;
    if (tl.vec_x) {
      raw[p] = r < tl.extent && c < tl.cols ? *reinterpret_cast<const uint4*>(x + r * tl.cols + c)
                                            : make_uint4(0, 0, 0, 0);
    } else {
#pragma unroll
      for (int j = 0; j < kVec; ++j)
        v[p][j] = r < tl.extent && c + j < tl.cols ? __bfloat162float(x[r * tl.cols + c + j]) : 0.0f;
    }
  }
  const int32_t* offsets = tl.offsets;
  if (grouped && tl.G <= kSharedGroups) {
    for (int i = t; i <= tl.G; i += kThreads) shared_offsets[i] = tl.offsets[i];
    offsets = shared_offsets;
    __syncthreads();
  }
  if (t < kTile) {
    const int64_t r = r0 + t;
    const int g = grouped ? group_of_row(offsets, tl, r) : (r < tl.extent ? 0 : -1);
    const float* s = sl.scale ? sl.scale + (grouped ? int64_t(g % tl.Gw) : z) * sl.scale_stride : nullptr;
    row_group[t] = g;
    row_scale[t] = g < 0 ? 0.0f : s ? *s : 1.0f;
  }
  if (sl.scale_inv && blockIdx.x == 0) {
    if (!grouped && t == 0) sl.scale_inv[z * sl.inv_stride] = 1.0f / (sl.scale ? sl.scale[z * sl.scale_stride] : 1.0f);
    if (grouped)
      for (int w = t; w < tl.Gw; w += kThreads)
        sl.scale_inv[int64_t(w) * sl.inv_stride] = 1.0f / sl.scale[int64_t(w) * sl.scale_stride];
  }
  if (tl.vec_x)
#pragma unroll
    for (int p = 0; p < 2; ++p) {
      const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw[p]);
#pragma unroll
      for (int j = 0; j < kVec / 2; ++j) {
        const float2 f2 = __bfloat1622float2(h[j]);
        v[p][2 * j] = f2.x, v[p][2 * j + 1] = f2.y;
      }
    }
  __syncthreads();
  float m[2] = {0.0f, 0.0f};
#pragma unroll
  for (int p = 0; p < 2; ++p) {
    const int lr = tr + p * kRowsPerPass;
    const int64_t r = r0 + lr;
    __align__(8) uint8_t b[kVec] = {};
    if (row_group[lr] >= 0) {
      const float s = row_scale[lr];
#pragma unroll
      for (int j = 0; j < kVec; ++j) m[p] = fmaxf(m[p], fabsf(v[p][j]));  // (columns past cols hold 0)
      if (cast)
#pragma unroll
        for (int j = 0; j < kVec; j += 2) {
          const uint16_t pair = to_fp8x2(v[p][j] * s, v[p][j + 1] * s, f);
          b[j] = c + j < tl.cols ? uint8_t(pair & 0xFF) : 0;
          b[j + 1] = c + j + 1 < tl.cols ? uint8_t(pair >> 8) : 0;
        }
      if (q && cast && c < tl.cols) {
        if (tl.vec_x)
          *reinterpret_cast<uint2*>(q + r * tl.cols + c) = *reinterpret_cast<const uint2*>(b);
        else
          for (int j = 0; j < kVec && c + j < tl.cols; ++j) q[r * tl.cols + c + j] = b[j];
      }
    }
    *reinterpret_cast<uint2*>(&tile[lr][tc]) = *reinterpret_cast<const uint2*>(b);
  }
  if (qt) {
    __syncthreads();
    const int lc = t % kTile, chunk = t / kTile;  // (kThreads / kTile chunks of kChunk rows)
    const int64_t col = c0 + lc, rr = r0 + chunk * kChunk;
    if (col < tl.cols && rr < tl.extent) {
      __align__(16) uint8_t b[kChunk];
#pragma unroll
      for (int i = 0; i < kChunk; ++i) b[i] = tile[chunk * kChunk + i][lc];
      uint8_t* to = qt + col * tl.ld + rr;
      if (tl.vec_t && rr + kChunk <= tl.extent)
        *reinterpret_cast<uint4*>(to) = *reinterpret_cast<const uint4*>(b);
      else
        for (int i = 0; i < kChunk && rr + i < tl.extent; ++i) to[i] = b[i];
    }
  }
  if (!sl.amax) return;
  if (!grouped) {
    block_amax(fmaxf(m[0], m[1]), sl.amax + z * sl.amax_stride);
    return;
  }
  // Each row's max over the kTile / kVec lanes that share it, then each run of one group's rows.
#pragma unroll
  for (int p = 0; p < 2; ++p) {
    float a = m[p];
    for (int o = 1; o < kTile / kVec; o <<= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
    if (t % (kTile / kVec) == 0) row_amax[tr + p * kRowsPerPass] = a;
  }
  __syncthreads();
  if (t < kTile) {
    const int g = row_group[t];
    if (g >= 0 && (t == 0 || row_group[t - 1] != g)) {
      float a = 0.0f;
      for (int lr = t; lr < kTile && row_group[lr] == g; ++lr) a = fmaxf(a, row_amax[lr]);
      if (a > 0.0f) atomic_max_nonnegative(sl.amax + int64_t(g % tl.Gw) * sl.amax_stride, a);
    }
  }
}

__device__ float fp8_max_of(Fp8Format f) { return f == Fp8Format::E4M3 ? 448.0f : 57344.0f; }

__global__ void current_scale_kernel(const float* amax, int64_t amax_stride, int64_t n, Fp8Format f, float* scale,
                                     int64_t scale_stride) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float a = amax[i * amax_stride];
  float s = 1.0f;
  if (isfinite(a) && a > 0.0f) {
    s = __fdiv_rn(fp8_max_of(f), a);
    if (isinf(s)) s = FLT_MAX;
  }
  scale[i * scale_stride] = s;
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

bool aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

void launch_cast(const __nv_bfloat16* x, int64_t n, const float* scale, Fp8Format f, uint8_t* q, float* scale_inv,
                 float* amax, cudaStream_t stream) {
  const bool vec = n % 8 == 0 && aligned(x, 16) && aligned(q, 8);
  cast_kernel<<<blocks_for(vec ? n / 8 : n), kThreads, 0, stream>>>(x, n, scale, f, q, scale_inv, amax, vec);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

// The tiles' grid: in x, bands of kTile rows from tl.begin to tl.extent (at least one: a launch
// writes the scale_invs), each band's column tiles one after another; matrices in z.
void launch_tiles(const __nv_bfloat16* x, Tiles tl, int64_t batch, const Fp8Slots& slots, Fp8Format f, uint8_t* q,
                  uint8_t* qt, cudaStream_t stream) {
  tl.vec_x = tl.cols % kVec == 0 && aligned(x, 16) && aligned(q, 8);
  tl.vec_t = tl.ld % kChunk == 0 && tl.begin % kChunk == 0 && aligned(qt, 16);
  const int64_t bands = std::max<int64_t>(1, (tl.extent - tl.begin + kTile - 1) / kTile);
  tl.col_tiles = std::max<int64_t>(1, (tl.cols + kTile - 1) / kTile);
  if (bands * tl.col_tiles > INT32_MAX || batch > 65535)
    throw Error("fp8 casts: at most 2^31 tiles of 64 x 64 a matrix and 65535 matrices, got " +
                std::to_string(tl.extent - tl.begin) + " x " + std::to_string(tl.cols) + " x " + std::to_string(batch));
  const dim3 grid(static_cast<unsigned>(bands * tl.col_tiles), 1, static_cast<unsigned>(batch));
  cast_transpose_tiles<<<grid, kThreads, 0, stream>>>(x, tl, slots, f, q, qt);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void fp8_cast(const __nv_bfloat16* x, int64_t n, const float* scale, Fp8Format f, uint8_t* q, float* scale_inv,
              float* amax, cudaStream_t stream) {
  launch_cast(x, n, scale, f, q, scale_inv, amax, stream);
}

void fp8_amax(const __nv_bfloat16* x, int64_t n, float* amax, cudaStream_t stream) {
  launch_cast(x, n, nullptr, Fp8Format::E4M3, nullptr, nullptr, amax, stream);
}

void fp8_cast_transpose(const __nv_bfloat16* x, int64_t rows, int64_t cols, const float* scale, Fp8Format f,
                        uint8_t* q, uint8_t* qt, float* scale_inv, float* amax, cudaStream_t stream) {
  fp8_batched_cast_transpose(x, 1, rows, cols, Fp8Slots{scale, 0, scale_inv, 0, amax, 0}, f, q, qt, stream);
}

void fp8_batched_cast_transpose(const __nv_bfloat16* x, int64_t batch, int64_t rows, int64_t cols, const Fp8Slots& slots,
                                Fp8Format f, uint8_t* q, uint8_t* qt, cudaStream_t stream) {
  if (batch <= 0 || rows <= 0 || cols <= 0) return;
  Tiles tl;
  tl.cols = cols, tl.extent = rows, tl.ld = rows;
  launch_tiles(x, tl, batch, slots, f, q, qt, stream);
}

void fp8_grouped_cast_transpose(const __nv_bfloat16* x, int64_t cols, const RowGroups& g, const Fp8Slots& slots,
                                Fp8Format f, uint8_t* q, uint8_t* qt, int64_t ld, cudaStream_t stream) {
  if (g.groups < 1 || g.weights < 1 || g.groups % g.weights != 0 || g.rows < 0 || g.first < 0 || cols < 0 ||
      !g.offsets || (qt && ld < g.first + g.rows))
    throw Error("fp8_grouped_cast_transpose: bad arguments (groups " + std::to_string(g.groups) + ", weights " +
                std::to_string(g.weights) + ", rows " + std::to_string(g.rows) + ", cols " + std::to_string(cols) +
                ", ld " + std::to_string(ld) + ")");
  if (!slots.scale && (q || qt || slots.scale_inv)) throw Error("fp8_grouped_cast_transpose: a cast needs its scales");
  // No rows: a launch still writes every matrix's scale_inv (the GEMMs read them all).
  if ((g.rows == 0 || cols == 0) && !slots.scale_inv && !(qt && g.first % kChunk != 0)) return;
  // The bands start at first rounded down to 16: the transpose's columns from there to first are
  // read by the FP8 wgrad's first box (TMA starts a box's innermost coordinate at 16-byte multiples
  // only), and the kernel writes them zero, as any row that is no group's.
  Tiles tl;
  tl.cols = cols, tl.begin = g.first / kChunk * kChunk, tl.first = g.first;
  tl.extent = g.first + (cols == 0 ? 0 : g.rows);
  tl.ld = ld, tl.offsets = g.offsets, tl.G = int(g.groups), tl.Gw = int(g.weights);
  launch_tiles(x, tl, 1, slots, f, q, qt, stream);
}

void fp8_grouped_amax(const __nv_bfloat16* x, int64_t cols, const RowGroups& g, float* amax, int64_t stride,
                      cudaStream_t stream) {
  fp8_grouped_cast_transpose(x, cols, g, Fp8Slots{nullptr, 0, nullptr, 0, amax, stride}, Fp8Format::E4M3, nullptr,
                             nullptr, 0, stream);
}

void fp8_current_scale(const float* amax, Fp8Format f, float* scale, cudaStream_t stream) {
  fp8_current_scales(amax, 0, 1, f, scale, 0, stream);
}

void fp8_current_scales(const float* amax, int64_t amax_stride, int64_t n, Fp8Format f, float* scale,
                        int64_t scale_stride, cudaStream_t stream) {
  if (n <= 0) return;
  current_scale_kernel<<<blocks_for(n), kThreads, 0, stream>>>(amax, amax_stride, n, f, scale, scale_stride);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

void fp8_delayed_update(float* history, float* scale, const float* fp8_max, int64_t n, int64_t len, bool max_algo,
                        int margin, cudaStream_t stream) {
  delayed_update_kernel<<<blocks_for(n), kThreads, 0, stream>>>(history, scale, fp8_max, n, len, max_algo, margin);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

}  // namespace laoyao::kernels::cuda
