// Simple exact causal attention (see attention_reference.hpp). Forward per query row i:
//   s_j = scale * q_i . k_j (j0 <= j <= i, j0 = key_start[i] or 0), lse_i = logsumexp_j s_j, ctx_i = sum_j exp(s_j - lse_i) v_j.
// Backward, with P_ij = exp(s_ij - lse_i) recomputed from the saved lse and
// delta_i = dctx_i . ctx_i (= sum_j P_ij dP_ij, the softmax backward's row term):
//   dP_ij = dctx_i . v_j,  dS_ij = P_ij (dP_ij - delta_i),
//   dq_i = scale * sum_j dS_ij k_j,  dk_j = scale * sum_{h in group, i >= j} dS_ij q_i,
//   dv_j = sum_{h in group, i >= j} P_ij dctx_i.
// dk/dv are summed over the group's heads inside one block, so there are no atomics and the result
// does not depend on scheduling.
#include <cmath>
#include <string>

#include "core/error.hpp"
#include "kernels/cuda/attention_reference.hpp"
#include "kernels/cuda/cuda_check.hpp"

namespace laoyao::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;

// Column offsets inside one token's fused QKV row (as kernels/cpu/attention.cpp).
struct QkvLayout {
  int H, G, D, hpg;  // hpg: heads per group
  int64_t row;       // elements per token
  __device__ int64_t q(int h) const { return int64_t(h / hpg) * (hpg + 2) * D + int64_t(h % hpg) * D; }
  __device__ int64_t k(int g) const { return (int64_t(g) * (hpg + 2) + hpg) * D; }
  __device__ int64_t v(int g) const { return (int64_t(g) * (hpg + 2) + hpg + 1) * D; }
};

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum (or max) over the block; every thread gets the result. Contains barriers: call from all threads.
template <bool kMax>
__device__ float block_reduce(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
  v = kMax ? warp_max(v) : warp_sum(v);
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float r = lane < nwarps ? partial[lane] : (kMax ? -INFINITY : 0.0f);
    r = kMax ? warp_max(r) : warp_sum(r);
    if (lane == 0) partial[0] = r;
  }
  __syncthreads();
  const float r = partial[0];
  __syncthreads();  // `partial` is reused by the next call
  return r;
}

// Grid (s, H, b), one block per query row; shared memory: q [D], p [s].
__global__ void forward_kernel(const bf16* __restrict__ qkv, bf16* __restrict__ ctx, float* __restrict__ lse, int s,
                               QkvLayout L, float scale, const int32_t* __restrict__ key_start) {
  extern __shared__ float smem[];
  float* q = smem;
  float* p = smem + L.D;
  const int i = blockIdx.x, h = blockIdx.y, bi = blockIdx.z, g = h / L.hpg;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
  const bf16* base = qkv + int64_t(bi) * s * L.row;
  const int j0 = key_start ? key_start[int64_t(bi) * s + i] : 0;
  for (int d = threadIdx.x; d < L.D; d += blockDim.x) q[d] = __bfloat162float(base[int64_t(i) * L.row + L.q(h) + d]);
  __syncthreads();
  // Scores, one warp per key (causal, within the document: keys j0..i only).
  for (int j = j0 + warp; j <= i; j += nwarps) {
    const bf16* k = base + int64_t(j) * L.row + L.k(g);
    float dot = 0.0f;
    for (int d = lane; d < L.D; d += 32) dot += q[d] * __bfloat162float(k[d]);
    dot = warp_sum(dot);
    if (lane == 0) p[j] = dot * scale;
  }
  __syncthreads();
  float m = -INFINITY;
  for (int j = j0 + threadIdx.x; j <= i; j += blockDim.x) m = fmaxf(m, p[j]);
  m = block_reduce<true>(m);
  float sum = 0.0f;
  for (int j = j0 + threadIdx.x; j <= i; j += blockDim.x) {
    const float e = expf(p[j] - m);
    p[j] = e;
    sum += e;
  }
  sum = block_reduce<false>(sum);  // its barriers also publish the p[j] writes
  const float inv = 1.0f / sum;
  const int64_t HD = int64_t(L.H) * L.D;
  for (int d = threadIdx.x; d < L.D; d += blockDim.x) {
    const bf16* v = base + L.v(g) + d;
    float acc = 0.0f;
    for (int j = j0; j <= i; ++j) acc += p[j] * __bfloat162float(v[int64_t(j) * L.row]);
    ctx[(int64_t(bi) * s + i) * HD + int64_t(h) * L.D + d] = __float2bfloat16(acc * inv);
  }
  if (threadIdx.x == 0) lse[(int64_t(bi) * L.H + h) * s + i] = m + logf(sum);
}

// delta[b, H, s] = rowsum(dctx * ctx) in fp32; one warp per (batch, head, query).
__global__ void delta_kernel(const bf16* __restrict__ ctx, const bf16* __restrict__ dctx, float* __restrict__ delta,
                             int64_t rows, int s, int H, int D) {
  const int lane = threadIdx.x % 32;
  const int64_t r = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (r >= rows) return;
  const int64_t i = r % s, h = (r / s) % H, bi = r / (int64_t(s) * H);
  const int64_t off = (bi * s + i) * int64_t(H) * D + h * D;
  float acc = 0.0f;
  for (int d = lane; d < D; d += 32) acc += __bfloat162float(ctx[off + d]) * __bfloat162float(dctx[off + d]);
  acc = warp_sum(acc);
  if (lane == 0) delta[r] = acc;
}

// dq, one block per query row; grid (s, H, b); shared memory: q [D], dO [D], dS [s].
__global__ void dq_kernel(const bf16* __restrict__ qkv, const bf16* __restrict__ dctx, const float* __restrict__ lse,
                          const float* __restrict__ delta, bf16* __restrict__ dqkv, int s, QkvLayout L, float scale,
                          const int32_t* __restrict__ key_start) {
  extern __shared__ float smem[];
  float* q = smem;
  float* dO = smem + L.D;
  float* dS = smem + 2 * L.D;
  const int i = blockIdx.x, h = blockIdx.y, bi = blockIdx.z, g = h / L.hpg;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
  const int64_t HD = int64_t(L.H) * L.D;
  const bf16* base = qkv + int64_t(bi) * s * L.row;
  const bf16* dOrow = dctx + (int64_t(bi) * s + i) * HD + int64_t(h) * L.D;
  for (int d = threadIdx.x; d < L.D; d += blockDim.x) {
    q[d] = __bfloat162float(base[int64_t(i) * L.row + L.q(h) + d]);
    dO[d] = __bfloat162float(dOrow[d]);
  }
  __syncthreads();
  const int64_t stat = (int64_t(bi) * L.H + h) * s + i;
  const float lse_i = lse[stat], delta_i = delta[stat];
  const int j0 = key_start ? key_start[int64_t(bi) * s + i] : 0;
  for (int j = j0 + warp; j <= i; j += nwarps) {
    const bf16* k = base + int64_t(j) * L.row + L.k(g);
    const bf16* v = base + int64_t(j) * L.row + L.v(g);
    float dot = 0.0f, dp = 0.0f;
    for (int d = lane; d < L.D; d += 32) {
      dot += q[d] * __bfloat162float(k[d]);
      dp += dO[d] * __bfloat162float(v[d]);
    }
    dot = warp_sum(dot);
    dp = warp_sum(dp);
    if (lane == 0) dS[j] = expf(dot * scale - lse_i) * (dp - delta_i);
  }
  __syncthreads();
  for (int d = threadIdx.x; d < L.D; d += blockDim.x) {
    const bf16* k = base + L.k(g) + d;
    float acc = 0.0f;
    for (int j = j0; j <= i; ++j) acc += dS[j] * __bfloat162float(k[int64_t(j) * L.row]);
    dqkv[int64_t(bi) * s * L.row + int64_t(i) * L.row + L.q(h) + d] = __float2bfloat16(scale * acc);
  }
}

// dk and dv, one block per key row j of one query group; grid (s, G, b); thread d owns column d
// (blockDim >= D). Shared memory: k [D], v [D], P [s], dS [s].
__global__ void dkdv_kernel(const bf16* __restrict__ qkv, const bf16* __restrict__ dctx, const float* __restrict__ lse,
                            const float* __restrict__ delta, bf16* __restrict__ dqkv, int s, QkvLayout L, float scale,
                            const int32_t* __restrict__ key_start) {
  extern __shared__ float smem[];
  float* k = smem;
  float* v = smem + L.D;
  float* P = smem + 2 * L.D;
  float* dS = P + s;
  const int j = blockIdx.x, g = blockIdx.y, bi = blockIdx.z;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
  const int64_t HD = int64_t(L.H) * L.D;
  const bf16* base = qkv + int64_t(bi) * s * L.row;
  for (int d = threadIdx.x; d < L.D; d += blockDim.x) {
    k[d] = __bfloat162float(base[int64_t(j) * L.row + L.k(g) + d]);
    v[d] = __bfloat162float(base[int64_t(j) * L.row + L.v(g) + d]);
  }
  __syncthreads();
  float dk = 0.0f, dv = 0.0f;
  const int d = threadIdx.x;
  for (int hh = 0; hh < L.hpg; ++hh) {
    const int h = g * L.hpg + hh;
    const int64_t stat0 = (int64_t(bi) * L.H + h) * s;
    for (int i = j + warp; i < s; i += nwarps) {  // causal: only queries i >= j see key j
      const bf16* q = base + int64_t(i) * L.row + L.q(h);
      const bf16* dO = dctx + (int64_t(bi) * s + i) * HD + int64_t(h) * L.D;
      float dot = 0.0f, dp = 0.0f;
      for (int e = lane; e < L.D; e += 32) {
        dot += __bfloat162float(q[e]) * k[e];
        dp += __bfloat162float(dO[e]) * v[e];
      }
      dot = warp_sum(dot);
      dp = warp_sum(dp);
      if (lane == 0) {  // a query of a later document does not see key j
        const bool sees = !key_start || key_start[int64_t(bi) * s + i] <= j;
        const float p = sees ? expf(dot * scale - lse[stat0 + i]) : 0.0f;
        P[i] = p;
        dS[i] = p * (dp - delta[stat0 + i]);
      }
    }
    __syncthreads();
    if (d < L.D) {
      for (int i = j; i < s; ++i) {
        const int64_t row = int64_t(i) * L.row;
        dv += P[i] * __bfloat162float(dctx[(int64_t(bi) * s + i) * HD + int64_t(h) * L.D + d]);
        dk += dS[i] * __bfloat162float(base[row + L.q(h) + d]);
      }
    }
    __syncthreads();  // P and dS are rewritten for the next head
  }
  if (d < L.D) {
    bf16* out = dqkv + int64_t(bi) * s * L.row + int64_t(j) * L.row;
    out[L.k(g) + d] = __float2bfloat16(scale * dk);
    out[L.v(g) + d] = __float2bfloat16(dv);
  }
}

QkvLayout check_shape(const AttentionShape& a, const char* what) {
  const bool ok = a.b > 0 && a.s > 0 && a.H > 0 && a.G > 0 && a.D > 0 && a.H % a.G == 0 && a.D <= 256 &&
                  a.b <= 65535 && a.H <= 65535 && a.s <= (int64_t{1} << 30);
  if (!ok)
    throw Error(std::string(what) + ": unsupported shape b=" + std::to_string(a.b) + " s=" + std::to_string(a.s) +
                " H=" + std::to_string(a.H) + " G=" + std::to_string(a.G) + " D=" + std::to_string(a.D) +
                " (need positive sizes, H a multiple of G, D <= 256)");
  QkvLayout L;
  L.H = static_cast<int>(a.H);
  L.G = static_cast<int>(a.G);
  L.D = static_cast<int>(a.D);
  L.hpg = L.H / L.G;
  L.row = int64_t(L.G) * (L.hpg + 2) * L.D;
  return L;
}

int threads_for(int64_t D) { return D <= 128 ? 128 : 256; }

// Kernels need O(s) dynamic shared memory; beyond the default 48 KB the limit must be raised first.
template <class Kernel>
void allow_shared_memory(Kernel kernel, size_t bytes) {
  if (bytes > 48 * 1024)
    LAOYAO_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

}  // namespace

void attention_reference_forward(const bf16* qkv, bf16* ctx, float* lse, const AttentionShape& a, cudaStream_t stream) {
  const QkvLayout L = check_shape(a, "attention_reference_forward");
  const size_t smem = (a.D + a.s) * sizeof(float);
  allow_shared_memory(forward_kernel, smem);
  const dim3 grid(static_cast<unsigned>(a.s), static_cast<unsigned>(a.H), static_cast<unsigned>(a.b));
  forward_kernel<<<grid, threads_for(a.D), smem, stream>>>(qkv, ctx, lse, static_cast<int>(a.s), L, a.scale,
                                                           a.key_start);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

void attention_reference_backward(const bf16* qkv, const bf16* ctx, const bf16* dctx, const float* lse, float* delta,
                                  bf16* dqkv, const AttentionShape& a, cudaStream_t stream) {
  const QkvLayout L = check_shape(a, "attention_reference_backward");
  const int s = static_cast<int>(a.s);
  const int64_t rows = a.b * a.H * a.s;
  constexpr int kDeltaThreads = 256;  // 8 rows a block
  delta_kernel<<<static_cast<unsigned>((rows + 7) / 8), kDeltaThreads, 0, stream>>>(ctx, dctx, delta, rows, s, L.H,
                                                                                      L.D);
  LAOYAO_CUDA_CHECK(cudaGetLastError());

  const size_t dq_smem = (2 * a.D + a.s) * sizeof(float);
  allow_shared_memory(dq_kernel, dq_smem);
  const dim3 dq_grid(static_cast<unsigned>(a.s), static_cast<unsigned>(a.H), static_cast<unsigned>(a.b));
  dq_kernel<<<dq_grid, threads_for(a.D), dq_smem, stream>>>(qkv, dctx, lse, delta, dqkv, s, L, a.scale, a.key_start);
  LAOYAO_CUDA_CHECK(cudaGetLastError());

  const size_t kv_smem = (2 * a.D + 2 * a.s) * sizeof(float);
  allow_shared_memory(dkdv_kernel, kv_smem);
  const dim3 kv_grid(static_cast<unsigned>(a.s), static_cast<unsigned>(a.G), static_cast<unsigned>(a.b));
  dkdv_kernel<<<kv_grid, threads_for(a.D), kv_smem, stream>>>(qkv, dctx, lse, delta, dqkv, s, L, a.scale,
                                                              a.key_start);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

}  // namespace laoyao::kernels::cuda
