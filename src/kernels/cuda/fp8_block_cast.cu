#include "kernels/cuda/fp8_block_cast.hpp"

#include <cuda_fp8.h>

#include <cfloat>
#include <cstdint>
#include <string>

#include "core/error.hpp"
#include "kernels/cuda/cuda_check.hpp"

namespace laoyao::kernels::cuda {
namespace {

// One thread block a 128 x 128 tile of x, staged in shared memory. Along rows, its 8 warps take 16
// of the tile's rows each, a lane 4 values of a row, so that one warp's max is one 1 x 128 block's
// amax. Along columns, two threads a column (64 rows each, their amaxes met in shared memory),
// consecutive threads on consecutive columns so that a warp's reads of the tile hit distinct banks,
// each writing its 64 bytes of qt 16 at a time.
constexpr int kBlock = 128, kThreads = 256, kWarps = kThreads / 32, kLines = kBlock / kWarps, kPad = 8;
constexpr int kLoads = kBlock * (kBlock / 8) / kThreads, kHalf = kBlock / 2, kRun = 16;
static_assert(kBlock == 32 * 4, "a lane's 4 values of a 128-value line");
static_assert(kThreads == 2 * kBlock && kHalf % kRun == 0, "two threads a column, runs of 16 bytes");

// The power of two at or below fp8_max / amax (current_scaling_scale with eps 0 and pow2): 1 for an
// amax of 0, infinity or NaN; FLT_MAX's power of two when the quotient overflows.
__device__ __forceinline__ float block_scale(float amax, float fp8_max) {
  if (!(amax > 0.0f) || isinf(amax)) return 1.0f;
  float s = fp8_max / amax;
  if (isinf(s)) s = FLT_MAX;
  return __int_as_float(__float_as_int(s) & 0xFF800000);
}

__device__ __forceinline__ uint32_t to_fp8x4(float a, float b, float c, float d, Fp8Format f) {
  const __nv_fp8_interpretation_t kind = f == Fp8Format::E4M3 ? __NV_E4M3 : __NV_E5M2;
  const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, kind);
  const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, kind);
  return lo | (hi << 16);
}

__device__ __forceinline__ float warp_max(float m) {
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  return m;
}

// The scale of a lane's 4 values of a line: the tile's (kTwoD), else the warp's 128 values' own.
template <bool kTwoD>
__device__ __forceinline__ float line_scale(const float (&v)[4], float tile_scale, float fp8_max) {
  if (kTwoD) return tile_scale;
  return block_scale(warp_max(fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])))), fp8_max);
}

// Four FP8 bytes to dst[0..3], those below `limit` (elements left in the line), one 4-byte store
// where all four fit and `aligned`.
__device__ __forceinline__ void store4(uint8_t* dst, uint32_t packed, int64_t limit, bool aligned) {
  if (aligned && limit >= 4) {
    *reinterpret_cast<uint32_t*>(dst) = packed;
    return;
  }
  for (int j = 0; j < 4 && j < limit; ++j) dst[j] = uint8_t(packed >> (8 * j));
}

// kTwoD: one scale for the tile; else one per row of the tile (q) and per column (qt).
template <bool kTwoD>
__global__ void __launch_bounds__(kThreads)
    block_cast_kernel(const __nv_bfloat16* __restrict__ x, int64_t rows, int64_t cols, Fp8Format f, float fp8_max,
                      Fp8BlockOut out, int64_t ld, int64_t ldt) {
  __shared__ __align__(16) __nv_bfloat16 tile[kBlock][kBlock + kPad];
  __shared__ float warp_amax[kWarps], col_amax[2][kBlock];
  const int t = threadIdx.x, lane = t % 32, warp = t / 32;
  const int64_t r0 = int64_t(blockIdx.y) * kBlock, c0 = int64_t(blockIdx.x) * kBlock;
  const bool vec = cols % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
  // The tile, zeros outside x (a zero changes no amax): a thread's loads all issued before its stores.
  uint4 v16[kLoads];
#pragma unroll
  for (int k = 0; k < kLoads; ++k) {
    const int i = t + k * kThreads, lr = i / (kBlock / 8), lc = (i % (kBlock / 8)) * 8;
    const int64_t r = r0 + lr, c = c0 + lc;
    v16[k] = make_uint4(0, 0, 0, 0);
    if (r < rows && c < cols) {
      if (vec) {
        v16[k] = *reinterpret_cast<const uint4*>(x + r * cols + c);
      } else {
        __align__(16) __nv_bfloat16 e[8];
        for (int j = 0; j < 8; ++j) e[j] = c + j < cols ? x[r * cols + c + j] : __float2bfloat16(0.0f);
        v16[k] = *reinterpret_cast<const uint4*>(e);
      }
    }
  }
#pragma unroll
  for (int k = 0; k < kLoads; ++k) {
    const int i = t + k * kThreads;
    *reinterpret_cast<uint4*>(&tile[i / (kBlock / 8)][(i % (kBlock / 8)) * 8]) = v16[k];
  }
  __syncthreads();
  float tile_scale = 1.0f;
  if (kTwoD) {
    float m = 0.0f;
    for (int i = t; i < kBlock * kBlock; i += kThreads) m = fmaxf(m, fabsf(__bfloat162float(tile[i / kBlock][i % kBlock])));
    m = warp_max(m);
    if (lane == 0) warp_amax[warp] = m;
    __syncthreads();
    m = 0.0f;
    for (int w = 0; w < kWarps; ++w) m = fmaxf(m, warp_amax[w]);
    tile_scale = block_scale(m, fp8_max);
    if (t == 0 && out.scale_inv) out.scale_inv[int64_t(blockIdx.y) * ld + blockIdx.x] = 1.0f / tile_scale;
    if (t == 0 && out.scale_inv_t) out.scale_inv_t[int64_t(blockIdx.x) * ldt + blockIdx.y] = 1.0f / tile_scale;
  }
  if (out.q)
    for (int k = 0; k < kLines; ++k) {  // rows: a lane's 4 columns
      const int lr = warp * kLines + k;
      const int64_t r = r0 + lr;
      if (r >= rows) break;  // (the same for the whole warp)
      const uint2 u = *reinterpret_cast<const uint2*>(&tile[lr][lane * 4]);
      const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.x)),
                   b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.y));
      const float v[4] = {a.x, a.y, b.x, b.y};
      const float s = line_scale<kTwoD>(v, tile_scale, fp8_max);
      const int64_t c = c0 + lane * 4;
      if (c < cols) store4(out.q + r * cols + c, to_fp8x4(v[0] * s, v[1] * s, v[2] * s, v[3] * s, f), cols - c, cols % 4 == 0);
      if (!kTwoD && lane == 0 && out.scale_inv) out.scale_inv[int64_t(blockIdx.x) * ld + r] = 1.0f / s;
    }
  if (out.qt) {  // columns: thread t column t % 128's rows from 64 (t / 128), written as a row of qt
    const int lc = t % kBlock, rb = t / kBlock * kHalf;
    const int64_t c = c0 + lc;
    float s = tile_scale;
    if (!kTwoD) {
      float m = 0.0f;
      for (int i = 0; i < kHalf; ++i) m = fmaxf(m, fabsf(__bfloat162float(tile[rb + i][lc])));
      col_amax[rb / kHalf][lc] = m;
      __syncthreads();
      s = block_scale(fmaxf(col_amax[0][lc], col_amax[1][lc]), fp8_max);
      if (rb == 0 && c < cols && out.scale_inv_t) out.scale_inv_t[int64_t(blockIdx.y) * ldt + c] = 1.0f / s;
    }
    const bool aligned = rows % kRun == 0 && reinterpret_cast<uintptr_t>(out.qt) % 16 == 0;
    for (int i = 0; i < kHalf && c < cols; i += kRun) {
      const int64_t r = r0 + rb + i;
      if (r >= rows) break;
      uint32_t w[kRun / 4];
      for (int j = 0; j < kRun / 4; ++j) {
        const int lr = rb + i + 4 * j;
        w[j] = to_fp8x4(__bfloat162float(tile[lr][lc]) * s, __bfloat162float(tile[lr + 1][lc]) * s,
                        __bfloat162float(tile[lr + 2][lc]) * s, __bfloat162float(tile[lr + 3][lc]) * s, f);
      }
      uint8_t* dst = out.qt + c * rows + r;
      if (aligned && rows - r >= kRun) {
        *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
      } else {
        for (int j = 0; j < kRun && r + j < rows; ++j) dst[j] = uint8_t(w[j / 4] >> (8 * (j % 4)));
      }
    }
  }
}

void launch(bool two_d, const __nv_bfloat16* x, int64_t rows, int64_t cols, Fp8Format f, const Fp8BlockOut& out,
            cudaStream_t stream) {
  const char* what = two_d ? "fp8_block_cast_2d" : "fp8_block_cast_1d";
  if (rows < 0 || cols < 0)
    throw Error(std::string(what) + ": a [" + std::to_string(rows) + ", " + std::to_string(cols) + "] tensor");
  if (rows == 0 || cols == 0) return;
  const int64_t row_tiles = (rows + kBlock - 1) / kBlock, col_tiles = (cols + kBlock - 1) / kBlock;
  if (row_tiles > 65535 || col_tiles > INT32_MAX)
    throw Error(std::string(what) + ": " + std::to_string(rows) + " rows exceed the grid's 65535 tiles of 128");
  const float fp8_max = static_cast<float>(laoyao::fp8_max(f));
  const dim3 grid(static_cast<unsigned>(col_tiles), static_cast<unsigned>(row_tiles));
  if (two_d)
    block_cast_kernel<true><<<grid, kThreads, 0, stream>>>(x, rows, cols, f, fp8_max, out, fp8_block_scale_ld(col_tiles),
                                                           fp8_block_scale_ld(row_tiles));
  else
    block_cast_kernel<false><<<grid, kThreads, 0, stream>>>(x, rows, cols, f, fp8_max, out, fp8_block_scale_ld(rows),
                                                            fp8_block_scale_ld(cols));
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void fp8_block_cast_1d(const __nv_bfloat16* x, int64_t rows, int64_t cols, Fp8Format f, const Fp8BlockOut& out,
                       cudaStream_t stream) {
  launch(false, x, rows, cols, f, out, stream);
}

void fp8_block_cast_2d(const __nv_bfloat16* x, int64_t rows, int64_t cols, Fp8Format f, const Fp8BlockOut& out,
                       cudaStream_t stream) {
  launch(true, x, rows, cols, f, out, stream);
}

}  // namespace laoyao::kernels::cuda
