#include "kernels/cuda/fp8_cast.hpp"

#include <cuda_fp8.h>

#include <algorithm>
#include <cfloat>

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

// Matrix blockIdx.z of a batch (x, q, qt one matrix after another; its scale, scale_inv and amax at
// z times their strides).
__global__ void cast_transpose_kernel(const __nv_bfloat16* __restrict__ x, int64_t rows, int64_t cols, Fp8Slots sl,
                                      Fp8Format f, uint8_t* __restrict__ q, uint8_t* __restrict__ qt) {
  __shared__ uint8_t tile[kTile][kTile + 4];
  const int64_t z = blockIdx.z, elems = rows * cols;
  x += z * elems;
  if (q) q += z * elems;
  if (qt) qt += z * elems;
  float* scale_inv = sl.scale_inv ? sl.scale_inv + z * sl.inv_stride : nullptr;
  float* amax = sl.amax ? sl.amax + z * sl.amax_stride : nullptr;
  const float s = sl.scale ? sl.scale[z * sl.scale_stride] : 1.0f;
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

// The grouped cast (fp8_grouped_cast_transpose): a block takes a band of kTile rows from `first`,
// every column in kTile-wide tiles. Row r of group g (offsets[g] <= r < offsets[g + 1]) takes
// matrix w = g % Gw's scale; a row past offsets[G] none (its transposed column written 0, its q
// row left). scale null: the amaxes alone. Each row's amax (a warp's lanes share a row) is max-ed
// into its matrix's slot once per run of the band's rows of one group.
__global__ void grouped_cast_kernel(const __nv_bfloat16* __restrict__ x, int64_t cols, const int32_t* __restrict__ offsets,
                                    int G, int Gw, int64_t first, int64_t extent, Fp8Slots sl, Fp8Format f,
                                    uint8_t* __restrict__ q, uint8_t* __restrict__ qt, int64_t ld) {
  const float* scale = sl.scale;
  __shared__ uint8_t tile[kTile][kTile + 4];
  __shared__ int row_group[kTile];
  __shared__ float row_scale[kTile], row_amax[kTile];
  const int64_t r0 = first + int64_t(blockIdx.x) * kTile;
  const int tx = threadIdx.x, ty = threadIdx.y;
  if (ty == 0) {
    const int64_t r = r0 + tx;
    int g = -1;
    if (r < extent && r >= offsets[0] && r < offsets[G]) {  // the last g with offsets[g] <= r
      int lo = 0, hi = G;
      while (hi - lo > 1) {
        const int mid = (lo + hi) >> 1;
        if (offsets[mid] <= r) lo = mid; else hi = mid;
      }
      g = lo;
    }
    row_group[tx] = g;
    row_scale[tx] = g >= 0 && scale ? scale[int64_t(g % Gw) * sl.scale_stride] : 0.0f;
  }
  if (sl.scale_inv && blockIdx.x == 0 && ty == 0)
    for (int w = tx; w < Gw; w += kTile) sl.scale_inv[int64_t(w) * sl.inv_stride] = 1.0f / scale[int64_t(w) * sl.scale_stride];
  __syncthreads();
  float m[kTile / kRowsPerPass] = {};
  for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
#pragma unroll
    for (int p = 0; p < kTile / kRowsPerPass; ++p) {
      const int dr = ty + p * kRowsPerPass;
      const int64_t r = r0 + dr, c = c0 + tx;
      uint8_t b = 0;
      if (row_group[dr] >= 0 && c < cols) {
        const float v = __bfloat162float(x[r * cols + c]);
        m[p] = fmaxf(m[p], fabsf(v));
        if (scale) {
          b = to_fp8(v * row_scale[dr], f);
          if (q) q[r * cols + c] = b;
        }
      }
      tile[dr][tx] = b;
    }
    if (!qt) continue;
    __syncthreads();
    for (int dc = ty; dc < kTile; dc += kRowsPerPass) {
      const int64_t c = c0 + dc, r = r0 + tx;
      if (r < extent && c < cols) qt[c * ld + r] = tile[tx][dc];
    }
    __syncthreads();
  }
  if (!sl.amax) return;
#pragma unroll
  for (int p = 0; p < kTile / kRowsPerPass; ++p) {
    float v = m[p];
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (tx == 0) row_amax[ty + p * kRowsPerPass] = v;
  }
  __syncthreads();
  if (ty == 0) {  // thread tx: the run of rows of one group that starts at row tx
    const int g = row_group[tx];
    if (g >= 0 && (tx == 0 || row_group[tx - 1] != g)) {
      float v = 0.0f;
      for (int dr = tx; dr < kTile && row_group[dr] == g; ++dr) v = fmaxf(v, row_amax[dr]);
      if (v > 0.0f) atomic_max_nonnegative(sl.amax + int64_t(g % Gw) * sl.amax_stride, v);
    }
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
  const Fp8Slots slots{scale, 0, scale_inv, 0, amax, 0};
  cast_transpose_kernel<<<grid, dim3(kTile, kRowsPerPass), 0, stream>>>(x, rows, cols, slots, f, q, qt);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

void fp8_batched_cast_transpose(const __nv_bfloat16* x, int64_t batch, int64_t rows, int64_t cols, const Fp8Slots& slots,
                                Fp8Format f, uint8_t* q, uint8_t* qt, cudaStream_t stream) {
  if (batch <= 0 || rows <= 0 || cols <= 0) return;
  if (batch > 65535 || (rows + kTile - 1) / kTile > 65535)
    throw Error("fp8_batched_cast_transpose: at most 65535 matrices of at most 65535 x 32 rows, got " +
                std::to_string(batch) + " of " + std::to_string(rows));
  const dim3 grid(static_cast<unsigned>((cols + kTile - 1) / kTile), static_cast<unsigned>((rows + kTile - 1) / kTile),
                  static_cast<unsigned>(batch));
  cast_transpose_kernel<<<grid, dim3(kTile, kRowsPerPass), 0, stream>>>(x, rows, cols, slots, f, q, qt);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

void fp8_grouped_cast_transpose(const __nv_bfloat16* x, int64_t cols, const RowGroups& g, const Fp8Slots& slots,
                                Fp8Format f, uint8_t* q, uint8_t* qt, int64_t ld, cudaStream_t stream) {
  if (g.groups < 1 || g.weights < 1 || g.groups % g.weights != 0 || g.rows < 0 || g.first < 0 || cols < 0 ||
      !g.offsets || (qt && ld < g.first + g.rows))
    throw Error("fp8_grouped_cast_transpose: bad arguments (groups " + std::to_string(g.groups) + ", weights " +
                std::to_string(g.weights) + ", rows " + std::to_string(g.rows) + ", cols " + std::to_string(cols) +
                ", ld " + std::to_string(ld) + ")");
  if (!slots.scale && (q || qt || slots.scale_inv)) throw Error("fp8_grouped_cast_transpose: a cast needs its scales");
  // The transpose's columns from first rounded down to 16 bytes are read by the FP8 wgrad's first
  // box (TMA starts a box's innermost coordinate at 16-byte multiples only): zeros, not garbage.
  if (qt && g.first % 16 != 0 && cols > 0)
    LAOYAO_CUDA_CHECK(cudaMemset2DAsync(qt + g.first / 16 * 16, static_cast<size_t>(ld), 0,
                                        static_cast<size_t>(g.first % 16), static_cast<size_t>(cols), stream));
  // No rows: a launch still writes every matrix's scale_inv (the GEMMs read them all).
  const int64_t rows = cols == 0 ? 0 : g.rows;
  if (rows == 0 && !slots.scale_inv) return;
  const unsigned bands = static_cast<unsigned>(std::max<int64_t>(1, (rows + kTile - 1) / kTile));
  grouped_cast_kernel<<<bands, dim3(kTile, kRowsPerPass), 0, stream>>>(
      x, cols, g.offsets, int(g.groups), int(g.weights), g.first, g.first + rows, slots, f, q, qt, ld);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
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
