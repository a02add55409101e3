// Causal flash attention forward and backward (see attention_flash.hpp).
//
// Tiles: 64 queries x 64 keys per step, 4 warps, each warp owning 16 rows of the tile. Scores live
// in mma.sync accumulators; the softmax runs in the log2 domain (exp2 of scores * scale * log2 e).
// Fragment layouts of mma.m16n8k16 (g = lane / 4, t = lane % 4):
//   A (16x16): a0 (g, 2t..2t+1)  a1 (g+8, 2t..)  a2 (g, 2t+8..)  a3 (g+8, 2t+8..)
//   B (16x8):  b0 (k 2t..2t+1, n g)  b1 (k 2t+8.., n g)
//   C (16x8):  c0,c1 (g, 2t..2t+1)  c2,c3 (g+8, 2t..2t+1)
// so the accumulators of two adjacent 8-key n-tiles are exactly the A fragment of the next GEMM's
// 16-key k-step (FlashAttention-2's register reuse).
//
// Documents (key_start): query i sees keys [key_start[i], i]. As key_start never decreases along a
// sequence, a query tile's first row has the tile's earliest first key, so the forward and dQ loops
// start at that key's tile; the dK/dV loop ends at the last query whose document starts by the key
// tile's last key. Keys outside a row's range inside the tiles that remain are masked.
#include <array>
#include <cstdint>
#include <string>

#include "kernels/cuda/attention_flash.hpp"
#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/smem_attribute.hpp"

namespace laoyao::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr int kThreads = 128;  // 4 warps
constexpr int kTile = 64;      // queries (forward, dQ) or keys (dK/dV) per block
// Queries per step of the dK/dV kernel: 64 where the registers allow (head dim 64), else 32.
template <int D>
__host__ __device__ constexpr int q_tile() {
  return D == 64 ? 64 : 32;
}

struct FlashDims {
  int s, H, Q;        // sequence length, heads, heads per group
  int64_t row;        // width of a fused qkv row
  int64_t hd;         // H * D: width of a ctx row
  float scale;        // softmax scale
  float scale_log2;   // scale * log2(e)
  const int32_t* key_start;  // [b*s] each query's first key, or null (plain causal)
};

// This sequence's key_start (null without documents) and query q's first key.
__device__ __forceinline__ const int32_t* sequence_key_start(const FlashDims& p, int bi) {
  return p.key_start ? p.key_start + int64_t(bi) * p.s : nullptr;
}
__device__ __forceinline__ int first_key(const int32_t* ks, int q, int s) { return ks && q < s ? ks[q] : 0; }

__device__ __forceinline__ int64_t q_col(const FlashDims& p, int h, int D) {
  return (int64_t(h / p.Q) * (p.Q + 2) + h % p.Q) * D;
}
__device__ __forceinline__ int64_t k_col(const FlashDims& p, int g, int D) { return (int64_t(g) * (p.Q + 2) + p.Q) * D; }
__device__ __forceinline__ int64_t v_col(const FlashDims& p, int g, int D) {
  return (int64_t(g) * (p.Q + 2) + p.Q + 1) * D;
}

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

// Starts copying sm[r][0..D) = src[(row0 + r) * stride + 0..D) for rows < s (zeros beyond); the
// caller commits and waits. Smem rows are D + 8 elements (16 bytes of padding keep ldmatrix free
// of bank conflicts).
template <int D, int ROWS>
__device__ __forceinline__ void load_tile(bf16* sm, const bf16* src, int64_t stride, int row0, int s) {
  constexpr int kChunks = D / 8;
#pragma unroll
  for (int c = threadIdx.x; c < ROWS * kChunks; c += kThreads) {
    const int r = c / kChunks, k = (c % kChunks) * 8;
    const bool valid = row0 + r < s;
    cp_async16(sm + r * (D + 8) + k, src + (valid ? int64_t(row0 + r) * stride + k : 0), valid);
  }
}

// acc[16 rows of this warp x 8*NT columns] += A(rows of sA, k = D) * B(rows of sB as n, k = D)^T:
// both operands stored row-major with the reduction dimension contiguous (Q K^T, dO V^T, ...).
template <int D, int NT>
__device__ __forceinline__ void gemm_nt(float acc[NT][4], const bf16* sA, const bf16* sB) {
  constexpr int LD = D + 8;
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t a[4];
    ldsm_x4(a, sA + (lane & 15) * LD + kk * 16 + (lane >> 4) * 8);
#pragma unroll
    for (int n2 = 0; n2 < NT / 2; ++n2) {
      uint32_t b[4];
      ldsm_x4(b, sB + (n2 * 16 + (lane & 7) + (lane >> 4) * 8) * LD + kk * 16 + ((lane >> 3) & 1) * 8);
      mma(acc[2 * n2], a, b[0], b[1]);
      mma(acc[2 * n2 + 1], a, b[2], b[3]);
    }
  }
}

// The same with A already in registers (fragments of k-steps 0 .. D/16).
template <int D, int NT>
__device__ __forceinline__ void gemm_nt_reg(float acc[NT][4], const uint32_t a[D / 16][4], const bf16* sB) {
  constexpr int LD = D + 8;
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
    for (int n2 = 0; n2 < NT / 2; ++n2) {
      uint32_t b[4];
      ldsm_x4(b, sB + (n2 * 16 + (lane & 7) + (lane >> 4) * 8) * LD + kk * 16 + ((lane >> 3) & 1) * 8);
      mma(acc[2 * n2], a[kk], b[0], b[1]);
      mma(acc[2 * n2 + 1], a[kk], b[2], b[3]);
    }
}

// acc[16 x D] += A (register fragments, KS k-steps of 16) * sB (KS*16 rows x D, row-major).
template <int D, int KS>
__device__ __forceinline__ void gemm_rn(float acc[D / 8][4], const uint32_t a[KS][4], const bf16* sB) {
  constexpr int LD = D + 8;
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int kk = 0; kk < KS; ++kk)
#pragma unroll
    for (int d2 = 0; d2 < D / 16; ++d2) {
      uint32_t b[4];
      ldsm_x4_t(b, sB + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + d2 * 16 + (lane >> 4) * 8);
      mma(acc[2 * d2], a[kk], b[0], b[1]);
      mma(acc[2 * d2 + 1], a[kk], b[2], b[3]);
    }
}

// Accumulator element (n-tile j, slot e) -> A fragment of k-step j/2.
__device__ __forceinline__ void to_a(uint32_t a[][4], int j, float c0, float c1, float c2, float c3) {
  a[j >> 1][(j & 1) * 2] = pack_bf16(c0, c1);
  a[j >> 1][(j & 1) * 2 + 1] = pack_bf16(c2, c3);
}

template <int D>
__global__ void __launch_bounds__(kThreads) flash_forward_kernel(const bf16* __restrict__ qkv, bf16* __restrict__ ctx,
                                                                 float* __restrict__ lse, FlashDims p, DropoutSpec drop) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int LD = D + 8;
  bf16* sQ = reinterpret_cast<bf16*>(smem);
  bf16* sKV = sQ + kTile * LD;  // [2 stages][K tile, V tile]
  const int qb = gridDim.x - 1 - blockIdx.x;  // the longest rows first
  const int h = blockIdx.y, bi = blockIdx.z, grp = h / p.Q;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gq = lane >> 2, tq = lane & 3;
  const bf16* seq = qkv + int64_t(bi) * p.s * p.row;
  const int q0 = qb * kTile;
  const int row_lo = q0 + warp * 16 + gq, row_hi = row_lo + 8;
  const uint64_t base = uint64_t(bi * p.H + h) * p.s;
  const int32_t* ks = sequence_key_start(p, bi);
  const int kb0 = first_key(ks, q0, p.s) / kTile;
  const int first_lo = first_key(ks, row_lo, p.s), first_hi = first_key(ks, row_hi, p.s);
  auto load_kv = [&](int kb, int stage) {
    bf16* sK = sKV + stage * 2 * kTile * LD;
    load_tile<D, kTile>(sK, seq + k_col(p, grp, D), p.row, kb * kTile, p.s);
    load_tile<D, kTile>(sK + kTile * LD, seq + v_col(p, grp, D), p.row, kb * kTile, p.s);
  };
  load_tile<D, kTile>(sQ, seq + q_col(p, h, D), p.row, q0, p.s);
  load_kv(kb0, 0);
  cp_async_commit();

  uint32_t qf[D / 16][4];
  float o[D / 8][4] = {};
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.0f, l_hi = 0.0f;
  for (int kb = kb0; kb <= qb; ++kb) {
    const int stage = (kb - kb0) & 1;
    if (kb < qb) load_kv(kb + 1, stage ^ 1);  // the next tile streams in while this one is used
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    if (kb == kb0)
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk)
        ldsm_x4(qf[kk], sQ + (warp * 16 + (lane & 15)) * LD + kk * 16 + (lane >> 4) * 8);
    const bf16* sK = sKV + stage * 2 * kTile * LD;
    const bf16* sV = sK + kTile * LD;
    float sc[8][4] = {};
    gemm_nt_reg<D, 8>(sc, qf, sK);
    float mx_lo = m_lo, mx_hi = m_hi;
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = kb * kTile + j * 8 + tq * 2 + (e & 1);
        float x = sc[j][e] * p.scale_log2;
        // causal (and keys past the sequence), and keys of an earlier document
        if (key > (e < 2 ? row_lo : row_hi) || key < (e < 2 ? first_lo : first_hi)) x = -INFINITY;
        sc[j][e] = x;
        if (e < 2) mx_lo = fmaxf(mx_lo, x);
        else mx_hi = fmaxf(mx_hi, x);
      }
    mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 1));
    mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 2));
    mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 1));
    mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 2));
    // A row whose keys so far are all masked (its document starts in a later tile) has the maximum
    // -inf: exponents are then taken against 0, which keeps its terms exactly 0. Every row sees its
    // own key by tile qb, so its final maximum is finite.
    const float r_lo = mx_lo == -INFINITY ? 0.0f : mx_lo, r_hi = mx_hi == -INFINITY ? 0.0f : mx_hi;
    const float a_lo = exp2f(m_lo - r_lo), a_hi = exp2f(m_hi - r_hi);
    m_lo = mx_lo, m_hi = mx_hi;
    l_lo *= a_lo, l_hi *= a_hi;
#pragma unroll
    for (int d = 0; d < D / 8; ++d) o[d][0] *= a_lo, o[d][1] *= a_lo, o[d][2] *= a_hi, o[d][3] *= a_hi;
    uint32_t pf[4][4];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      float p0 = exp2f(sc[j][0] - r_lo), p1 = exp2f(sc[j][1] - r_lo);
      float p2 = exp2f(sc[j][2] - r_hi), p3 = exp2f(sc[j][3] - r_hi);
      l_lo += p0 + p1, l_hi += p2 + p3;
      if (drop.p > 0) {  // the probabilities that multiply V are dropped; the denominator is not
        const uint64_t key = uint64_t(kb * kTile + j * 8 + tq * 2);
        p0 *= dropout_factor(drop, (base + row_lo) * p.s + key);
        p1 *= dropout_factor(drop, (base + row_lo) * p.s + key + 1);
        p2 *= dropout_factor(drop, (base + row_hi) * p.s + key);
        p3 *= dropout_factor(drop, (base + row_hi) * p.s + key + 1);
      }
      to_a(pf, j, p0, p1, p2, p3);
    }
    gemm_rn<D, 4>(o, pf, sV);
    __syncthreads();  // every warp is done with this stage before it is refilled
  }
  l_lo += __shfl_xor_sync(0xffffffffu, l_lo, 1);
  l_lo += __shfl_xor_sync(0xffffffffu, l_lo, 2);
  l_hi += __shfl_xor_sync(0xffffffffu, l_hi, 1);
  l_hi += __shfl_xor_sync(0xffffffffu, l_hi, 2);
  const float inv_lo = 1.0f / l_lo, inv_hi = 1.0f / l_hi;
  bf16* out = ctx + int64_t(bi) * p.s * p.hd + int64_t(h) * D;
#pragma unroll
  for (int d = 0; d < D / 8; ++d) {
    const int col = d * 8 + tq * 2;
    if (row_lo < p.s)
      *reinterpret_cast<__nv_bfloat162*>(out + int64_t(row_lo) * p.hd + col) =
          __floats2bfloat162_rn(o[d][0] * inv_lo, o[d][1] * inv_lo);
    if (row_hi < p.s)
      *reinterpret_cast<__nv_bfloat162*>(out + int64_t(row_hi) * p.hd + col) =
          __floats2bfloat162_rn(o[d][2] * inv_hi, o[d][3] * inv_hi);
  }
  if (tq == 0) {
    if (row_lo < p.s) lse[base + row_lo] = (m_lo + log2f(l_lo)) * kLn2;
    if (row_hi < p.s) lse[base + row_hi] = (m_hi + log2f(l_hi)) * kLn2;
  }
}

// delta[b, h, i] = sum_d dctx[i, h*D + d] * ctx[i, h*D + d] (fp32): one warp per (row, head).
__global__ void flash_delta_kernel(const bf16* __restrict__ ctx, const bf16* __restrict__ dctx, float* __restrict__ delta,
                                   int64_t rows, int s, int H, int D) {
  const int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (w >= rows * H) return;
  const int64_t token = w / H;
  const int h = int(w % H);
  const bf16* a = ctx + token * H * D + h * D;
  const bf16* b = dctx + token * H * D + h * D;
  float acc = 0.0f;
  for (int d = lane; d < D; d += 32) acc += __bfloat162float(a[d]) * __bfloat162float(b[d]);
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0) delta[(token / s * H + h) * s + token % s] = acc;
}

// dQ for one (query block, head, batch): recompute P, dP, dS = P (dP - delta) scale, dQ += dS K.
template <int D>
__global__ void __launch_bounds__(kThreads) flash_dq_kernel(const bf16* __restrict__ qkv, const bf16* __restrict__ dctx,
                                                            const float* __restrict__ lse,
                                                            const float* __restrict__ delta, bf16* __restrict__ dqkv,
                                                            FlashDims p, DropoutSpec drop) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int LD = D + 8;
  bf16* sQ = reinterpret_cast<bf16*>(smem);
  bf16* sdO = sQ + kTile * LD;
  bf16* sKV = sdO + kTile * LD;  // [2 stages][K tile, V tile]
  const int qb = gridDim.x - 1 - blockIdx.x;
  const int h = blockIdx.y, bi = blockIdx.z, grp = h / p.Q;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gq = lane >> 2, tq = lane & 3;
  const bf16* seq = qkv + int64_t(bi) * p.s * p.row;
  const int q0 = qb * kTile;
  const int row_lo = q0 + warp * 16 + gq, row_hi = row_lo + 8;
  const uint64_t base = uint64_t(bi * p.H + h) * p.s;
  const int32_t* ks = sequence_key_start(p, bi);
  const int kb0 = first_key(ks, q0, p.s) / kTile;
  const int first_lo = first_key(ks, row_lo, p.s), first_hi = first_key(ks, row_hi, p.s);
  auto load_kv = [&](int kb, int stage) {
    bf16* sK = sKV + stage * 2 * kTile * LD;
    load_tile<D, kTile>(sK, seq + k_col(p, grp, D), p.row, kb * kTile, p.s);
    load_tile<D, kTile>(sK + kTile * LD, seq + v_col(p, grp, D), p.row, kb * kTile, p.s);
  };
  load_tile<D, kTile>(sQ, seq + q_col(p, h, D), p.row, q0, p.s);
  load_tile<D, kTile>(sdO, dctx + int64_t(bi) * p.s * p.hd + int64_t(h) * D, p.hd, q0, p.s);
  load_kv(kb0, 0);
  cp_async_commit();
  const float lse_lo = row_lo < p.s ? lse[base + row_lo] * kLog2e : 0.0f;
  const float lse_hi = row_hi < p.s ? lse[base + row_hi] * kLog2e : 0.0f;
  const float del_lo = row_lo < p.s ? delta[base + row_lo] : 0.0f;
  const float del_hi = row_hi < p.s ? delta[base + row_hi] : 0.0f;

  float dq[D / 8][4] = {};
  for (int kb = kb0; kb <= qb; ++kb) {
    const int stage = (kb - kb0) & 1;
    if (kb < qb) load_kv(kb + 1, stage ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const bf16* sK = sKV + stage * 2 * kTile * LD;
    const bf16* sV = sK + kTile * LD;
    float sc[8][4] = {}, dp[8][4] = {};
    gemm_nt<D, 8>(sc, sQ + warp * 16 * LD, sK);
    gemm_nt<D, 8>(dp, sdO + warp * 16 * LD, sV);
    uint32_t dsf[4][4];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      float ds[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = kb * kTile + j * 8 + tq * 2 + (e & 1);
        const int row = e < 2 ? row_lo : row_hi;
        const bool seen = key <= row && key >= (e < 2 ? first_lo : first_hi);
        const float P = seen ? exp2f(sc[j][e] * p.scale_log2 - (e < 2 ? lse_lo : lse_hi)) : 0.0f;
        float g = dp[j][e];
        if (drop.p > 0) g *= dropout_factor(drop, (base + row) * p.s + key);
        ds[e] = P * (g - (e < 2 ? del_lo : del_hi)) * p.scale;
      }
      to_a(dsf, j, ds[0], ds[1], ds[2], ds[3]);
    }
    gemm_rn<D, 4>(dq, dsf, sK);
    __syncthreads();
  }
  bf16* out = dqkv + int64_t(bi) * p.s * p.row + q_col(p, h, D);
#pragma unroll
  for (int d = 0; d < D / 8; ++d) {
    const int col = d * 8 + tq * 2;
    if (row_lo < p.s)
      *reinterpret_cast<__nv_bfloat162*>(out + int64_t(row_lo) * p.row + col) = __floats2bfloat162_rn(dq[d][0], dq[d][1]);
    if (row_hi < p.s)
      *reinterpret_cast<__nv_bfloat162*>(out + int64_t(row_hi) * p.row + col) = __floats2bfloat162_rn(dq[d][2], dq[d][3]);
  }
}

// dK and dV for one (key block, query group, batch), over the group's heads in order and every
// query block at or after the keys: S^T = K Q^T, P^T, dV += P_dropped^T dO, dP^T = V dO^T,
// dS^T = P^T (dP^T mask - delta) scale, dK += dS^T Q.
template <int D>
__global__ void __launch_bounds__(kThreads) flash_dkdv_kernel(const bf16* __restrict__ qkv,
                                                              const bf16* __restrict__ dctx,
                                                              const float* __restrict__ lse,
                                                              const float* __restrict__ delta,
                                                              bf16* __restrict__ dqkv, FlashDims p, DropoutSpec drop) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int LD = D + 8, kQTile = q_tile<D>(), NT = kQTile / 8, KS = kQTile / 16;
  bf16* sK = reinterpret_cast<bf16*>(smem);
  bf16* sV = sK + kTile * LD;
  bf16* sQdO = sV + kTile * LD;                                        // [2 stages][Q tile, dO tile]
  float* sLD = reinterpret_cast<float*>(sQdO + 4 * kQTile * LD);      // [2 stages][lse, delta]
  int* sFirst = reinterpret_cast<int*>(sLD + 4 * kQTile);             // [2 stages][first key]
  const int kb = blockIdx.x, grp = blockIdx.y, bi = blockIdx.z;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gq = lane >> 2, tq = lane & 3;
  const bf16* seq = qkv + int64_t(bi) * p.s * p.row;
  const int key_lo = kb * kTile + warp * 16 + gq, key_hi = key_lo + 8;
  load_tile<D, kTile>(sK, seq + k_col(p, grp, D), p.row, kb * kTile, p.s);
  load_tile<D, kTile>(sV, seq + v_col(p, grp, D), p.row, kb * kTile, p.s);
  // The queries that see a key of this tile: from its first key up to (not including) q_end, the
  // first query whose document starts after the tile's last key (binary search: key_start never
  // decreases, and key_start[q] <= q keeps every query up to the last key in).
  const int32_t* ks = sequence_key_start(p, bi);
  const int q_first = kb * kTile, key_last = min(q_first + kTile, p.s) - 1;
  int q_end = p.s;
  if (ks) {
    int lo = key_last + 1, hi = p.s;  // q_end in [lo, hi]
    while (lo < hi) {
      const int mid = (lo + hi) >> 1;
      if (ks[mid] > key_last) hi = mid;
      else lo = mid + 1;
    }
    q_end = lo;
  }
  // The (head, query tile) steps of this block, in order: each group head, queries from the keys on.
  const int q_tiles = (q_end - q_first + kQTile - 1) / kQTile, steps = p.Q * q_tiles;
  auto load_q = [&](int step, int stage) {
    const int h = grp * p.Q + step / q_tiles, q0 = q_first + (step % q_tiles) * kQTile;
    bf16* sQ = sQdO + stage * 2 * kQTile * LD;
    load_tile<D, kQTile>(sQ, seq + q_col(p, h, D), p.row, q0, p.s);
    load_tile<D, kQTile>(sQ + kQTile * LD, dctx + int64_t(bi) * p.s * p.hd + int64_t(h) * D, p.hd, q0, p.s);
    if (threadIdx.x < kQTile) {
      const int q = q0 + threadIdx.x;
      const uint64_t base = uint64_t(bi * p.H + h) * p.s;
      sLD[stage * 2 * kQTile + threadIdx.x] = q < p.s ? lse[base + q] * kLog2e : 0.0f;
      sLD[stage * 2 * kQTile + kQTile + threadIdx.x] = q < p.s ? delta[base + q] : 0.0f;
      sFirst[stage * kQTile + threadIdx.x] = first_key(ks, q, p.s);
    }
  };
  load_q(0, 0);
  cp_async_commit();

  float dk[D / 8][4] = {}, dv[D / 8][4] = {};
  for (int step = 0; step < steps; ++step) {
    const int h = grp * p.Q + step / q_tiles, q0 = q_first + (step % q_tiles) * kQTile, stage = step & 1;
    const uint64_t base = uint64_t(bi * p.H + h) * p.s;
    if (step + 1 < steps) load_q(step + 1, stage ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const bf16* sQ = sQdO + stage * 2 * kQTile * LD;
    const bf16* sdO = sQ + kQTile * LD;
    const float* sL = sLD + stage * 2 * kQTile;
    const float* sD = sL + kQTile;
    const int* sF = sFirst + stage * kQTile;
    {
      float st[NT][4] = {}, dpt[NT][4] = {};
      gemm_nt<D, NT>(st, sK + warp * 16 * LD, sQ);
      gemm_nt<D, NT>(dpt, sV + warp * 16 * LD, sdO);
      uint32_t pf[KS][4], dsf[KS][4];
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        float pd[4], ds[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int qi = j * 8 + tq * 2 + (e & 1), q = q0 + qi;
          const int key = e < 2 ? key_lo : key_hi;
          const bool valid = q >= key && q < p.s && sF[qi] <= key;
          const float P = valid ? exp2f(st[j][e] * p.scale_log2 - sL[qi]) : 0.0f;
          const float mask = drop.p > 0 && valid ? dropout_factor(drop, (base + q) * p.s + key) : 1.0f;
          pd[e] = P * mask;
          ds[e] = P * (dpt[j][e] * mask - sD[qi]) * p.scale;
        }
        to_a(pf, j, pd[0], pd[1], pd[2], pd[3]);
        to_a(dsf, j, ds[0], ds[1], ds[2], ds[3]);
      }
      gemm_rn<D, KS>(dv, pf, sdO);
      gemm_rn<D, KS>(dk, dsf, sQ);
    }
    __syncthreads();
  }
  bf16* out_k = dqkv + int64_t(bi) * p.s * p.row + k_col(p, grp, D);
  bf16* out_v = dqkv + int64_t(bi) * p.s * p.row + v_col(p, grp, D);
#pragma unroll
  for (int d = 0; d < D / 8; ++d) {
    const int col = d * 8 + tq * 2;
    if (key_lo < p.s) {
      *reinterpret_cast<__nv_bfloat162*>(out_k + int64_t(key_lo) * p.row + col) = __floats2bfloat162_rn(dk[d][0], dk[d][1]);
      *reinterpret_cast<__nv_bfloat162*>(out_v + int64_t(key_lo) * p.row + col) = __floats2bfloat162_rn(dv[d][0], dv[d][1]);
    }
    if (key_hi < p.s) {
      *reinterpret_cast<__nv_bfloat162*>(out_k + int64_t(key_hi) * p.row + col) = __floats2bfloat162_rn(dk[d][2], dk[d][3]);
      *reinterpret_cast<__nv_bfloat162*>(out_v + int64_t(key_hi) * p.row + col) = __floats2bfloat162_rn(dv[d][2], dv[d][3]);
    }
  }
}

FlashDims dims_of(const AttentionShape& a) {
  if (!attention_flash_supports(a))
    throw Error("attention_flash: unsupported shape b=" + std::to_string(a.b) + " s=" + std::to_string(a.s) +
                " H=" + std::to_string(a.H) + " G=" + std::to_string(a.G) + " D=" + std::to_string(a.D) +
                " (head dims 64 and 128, H a multiple of G)");
  FlashDims p;
  p.s = int(a.s);
  p.H = int(a.H);
  p.Q = int(a.H / a.G);
  p.row = a.G * (p.Q + 2) * a.D;
  p.hd = a.H * a.D;
  p.scale = a.scale;
  p.scale_log2 = a.scale * kLog2e;
  p.key_start = a.key_start;
  return p;
}

template <int D>
void forward(const bf16* qkv, bf16* ctx, float* lse, const AttentionShape& a, const DropoutSpec& drop,
             cudaStream_t stream) {
  const FlashDims p = dims_of(a);
  const size_t smem = size_t(5) * kTile * (D + 8) * sizeof(bf16);  // Q + 2 stages of K, V
  static SmemSite site;
  site.once([&] { allow_smem(flash_forward_kernel<D>, smem); });
  const dim3 grid(unsigned((a.s + kTile - 1) / kTile), unsigned(a.H), unsigned(a.b));
  flash_forward_kernel<D><<<grid, kThreads, smem, stream>>>(qkv, ctx, lse, p, drop);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

template <int D>
void backward(const bf16* qkv, const bf16* ctx, const bf16* dctx, const float* lse, float* delta, bf16* dqkv,
              const AttentionShape& a, const DropoutSpec& drop, cudaStream_t stream) {
  const FlashDims p = dims_of(a);
  const int64_t rows = a.b * a.s;
  flash_delta_kernel<<<unsigned((rows * a.H * 32 + 255) / 256), 256, 0, stream>>>(ctx, dctx, delta, rows, p.s, p.H,
                                                                                  int(a.D));
  LAOYAO_CUDA_CHECK(cudaGetLastError());
  const size_t smem_dq = size_t(6) * kTile * (D + 8) * sizeof(bf16);  // Q, dO + 2 stages of K, V
  // K, V + 2 stages of (Q, dO, lse, delta, first key)
  constexpr int kQTile = q_tile<D>();
  const size_t smem_kv =
      size_t(2 * kTile + 4 * kQTile) * (D + 8) * sizeof(bf16) + 4 * kQTile * sizeof(float) + 2 * kQTile * sizeof(int);
  static SmemSite site;
  site.once([&] { allow_smem(flash_dq_kernel<D>, smem_dq), allow_smem(flash_dkdv_kernel<D>, smem_kv); });
  const unsigned blocks = unsigned((a.s + kTile - 1) / kTile);
  flash_dq_kernel<D><<<dim3(blocks, unsigned(a.H), unsigned(a.b)), kThreads, smem_dq, stream>>>(qkv, dctx, lse, delta,
                                                                                               dqkv, p, drop);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
  flash_dkdv_kernel<D><<<dim3(blocks, unsigned(a.G), unsigned(a.b)), kThreads, smem_kv, stream>>>(qkv, dctx, lse,
                                                                                                 delta, dqkv, p, drop);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

bool attention_flash_supports(const AttentionShape& a) {
  return (a.D == 64 || a.D == 128) && a.b > 0 && a.s > 0 && a.H > 0 && a.G > 0 && a.H % a.G == 0 &&
         a.s < (int64_t(1) << 31) && a.b <= 65535 && a.H <= 65535;
}

void attention_flash_forward(const bf16* qkv, bf16* ctx, float* lse, const AttentionShape& shape,
                             const DropoutSpec& drop, cudaStream_t stream) {
  if (shape.D == 64) return forward<64>(qkv, ctx, lse, shape, drop, stream);
  forward<128>(qkv, ctx, lse, shape, drop, stream);
}

void attention_flash_backward(const bf16* qkv, const bf16* ctx, const bf16* dctx, const float* lse, float* delta,
                              bf16* dqkv, const AttentionShape& shape, const DropoutSpec& drop, cudaStream_t stream) {
  if (shape.D == 64) return backward<64>(qkv, ctx, dctx, lse, delta, dqkv, shape, drop, stream);
  backward<128>(qkv, ctx, dctx, lse, delta, dqkv, shape, drop, stream);
}

}  // namespace laoyao::kernels::cuda
