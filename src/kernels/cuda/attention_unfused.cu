// Unfused causal attention (see attention_unfused.hpp): layout kernels, softmax forward/backward,
// and the batched GEMMs between them.
#include <cstdint>
#include <string>

#include "kernels/cuda/attention_unfused.hpp"
#include "kernels/cuda/cuda_check.hpp"

namespace laoyao::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;
constexpr int kThreads = 256;

struct Dims {
  int64_t b, s, H, G, D, Q, row;  // Q heads per group, row = width of a fused qkv row
};

Dims dims_of(const AttentionShape& a) {
  if (a.b <= 0 || a.s <= 0 || a.H <= 0 || a.G <= 0 || a.D <= 0 || a.H % a.G != 0)
    throw Error("attention: unsupported shape b=" + std::to_string(a.b) + " s=" + std::to_string(a.s) +
                " H=" + std::to_string(a.H) + " G=" + std::to_string(a.G) + " D=" + std::to_string(a.D));
  const int64_t Q = a.H / a.G;
  return {a.b, a.s, a.H, a.G, a.D, Q, a.G * (Q + 2) * a.D};
}

unsigned grid_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 65536 ? (b > 0 ? b : 1) : 65536);
}

// Column of q head h / group g's k and v inside a fused row (kernels/cpu/qkv_layout.hpp).
__device__ __forceinline__ int64_t q_col(const Dims& d, int64_t h) { return ((h / d.Q) * (d.Q + 2) + h % d.Q) * d.D; }
__device__ __forceinline__ int64_t k_col(const Dims& d, int64_t g) { return (g * (d.Q + 2) + d.Q) * d.D; }
__device__ __forceinline__ int64_t v_col(const Dims& d, int64_t g) { return (g * (d.Q + 2) + d.Q + 1) * d.D; }

// One thread per element of [b, H, s, D]: gather q, k, v (k and v of the head's group).
__global__ void split_qkv_kernel(const bf16* qkv, bf16* q, bf16* k, bf16* v, Dims d) {
  const int64_t n = d.b * d.H * d.s * d.D;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t x = e % d.D, t = (e / d.D) % d.s, h = (e / (d.D * d.s)) % d.H, bi = e / (d.D * d.s * d.H);
    const bf16* row = qkv + (bi * d.s + t) * d.row;
    q[e] = row[q_col(d, h) + x];
    k[e] = row[k_col(d, h / d.Q) + x];
    v[e] = row[v_col(d, h / d.Q) + x];
  }
}

// [b, H, s, D] <-> [b*s, H*D]. to_heads: ctx -> heads; else heads -> ctx.
__global__ void heads_layout_kernel(const bf16* in, bf16* out, Dims d, bool to_heads) {
  const int64_t n = d.b * d.H * d.s * d.D;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t x = e % d.D, t = (e / d.D) % d.s, h = (e / (d.D * d.s)) % d.H, bi = e / (d.D * d.s * d.H);
    const int64_t flat = (bi * d.s + t) * d.H * d.D + h * d.D + x;
    if (to_heads)
      out[e] = in[flat];
    else
      out[flat] = in[e];
  }
}

// One thread per element of dqkv: q slots copy dq; a group's k/v slot sums its heads in head order.
__global__ void merge_qkv_grad_kernel(const bf16* dq, const bf16* dk, const bf16* dv, bf16* dqkv, Dims d) {
  const int64_t n = d.b * d.s * d.row;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t col = e % d.row, token = e / d.row, bi = token / d.s, t = token % d.s;
    const int64_t x = col % d.D, slot = (col / d.D) % (d.Q + 2), g = col / (d.D * (d.Q + 2));
    auto at = [&](int64_t h) { return ((bi * d.H + h) * d.s + t) * d.D + x; };
    if (slot < d.Q) {
      dqkv[e] = dq[at(g * d.Q + slot)];
    } else {
      const bf16* src = slot == d.Q ? dk : dv;
      float sum = 0.0f;
      for (int64_t j = 0; j < d.Q; ++j) sum += __bfloat162float(src[at(g * d.Q + j)]);
      dqkv[e] = __float2bfloat16(sum);
    }
  }
}

__device__ float block_reduce(float v, float* sh, bool is_max) {
  for (int o = 16; o > 0; o >>= 1) {
    const float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, w) : v + w;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  v = lane < int(blockDim.x >> 5) ? sh[lane] : (is_max ? -INFINITY : 0.0f);
  for (int o = 16; o > 0; o >>= 1) {
    const float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, w) : v + w;
  }
  return v;
}

// The first key query row `row` ((batch*H + head)*s + i) attends: its key_start, or 0.
__device__ __forceinline__ int64_t first_key(const int32_t* key_start, int64_t row, int64_t s, int64_t H) {
  return key_start ? key_start[row / (s * H) * s + row % s] : 0;
}

// One block per query row (bh, i): probs over keys j0 <= j <= i from the scaled scores; zeros
// elsewhere (the future, and other documents' keys).
__global__ void softmax_forward_kernel(const float* scores, bf16* probs, bf16* dropped, int64_t s, int64_t H,
                                       const int32_t* key_start, DropoutSpec drop) {
  __shared__ float sh[32];
  const int64_t row = blockIdx.x, i = row % s, j0 = first_key(key_start, row, s, H);
  const float* x = scores + row * s;
  float m = -INFINITY;
  for (int64_t j = j0 + threadIdx.x; j <= i; j += blockDim.x) m = fmaxf(m, x[j]);
  m = block_reduce(m, sh, true);
  float sum = 0.0f;
  for (int64_t j = j0 + threadIdx.x; j <= i; j += blockDim.x) sum += expf(x[j] - m);
  sum = block_reduce(sum, sh, false);
  const float inv = 1.0f / sum;
  for (int64_t j = threadIdx.x; j < s; j += blockDim.x) {
    const float p = j >= j0 && j <= i ? expf(x[j] - m) * inv : 0.0f;
    probs[row * s + j] = __float2bfloat16(p);
    if (dropped) dropped[row * s + j] = __float2bfloat16(p * dropout_factor(drop, uint64_t(row * s + j)));
  }
}

// One block per row: dP = dPd * mask; dS = scale * P (dP - sum_j P dP), written over probs.
__global__ void softmax_backward_kernel(const float* dpd, bf16* probs_ds, int64_t s, int64_t H,
                                        const int32_t* key_start, float scale, DropoutSpec drop) {
  __shared__ float sh[32];
  const int64_t row = blockIdx.x, i = row % s, j0 = first_key(key_start, row, s, H);
  const float* g = dpd + row * s;
  bf16* p = probs_ds + row * s;
  auto dP = [&](int64_t j) {
    float v = g[j];
    if (drop.p > 0) v *= dropout_factor(drop, uint64_t(row * s + j));
    return v;
  };
  float dot = 0.0f;
  for (int64_t j = j0 + threadIdx.x; j <= i; j += blockDim.x) dot += __bfloat162float(p[j]) * dP(j);
  dot = block_reduce(dot, sh, false);
  for (int64_t j = threadIdx.x; j < s; j += blockDim.x)
    p[j] = __float2bfloat16(j >= j0 && j <= i ? scale * __bfloat162float(p[j]) * (dP(j) - dot) : 0.0f);
}

}  // namespace

int64_t attention_heads_elems(const AttentionShape& a) { return a.b * a.H * a.s * a.D; }
int64_t attention_probs_elems(const AttentionShape& a) { return a.b * a.H * a.s * a.s; }

void attention_unfused_forward(CublasLtGemm& gemm, const bf16* qkv, bf16* ctx, const UnfusedAttentionBuffers& saved,
                               const UnfusedAttentionScratch& scratch, const AttentionShape& shape,
                               const DropoutSpec& drop, cudaStream_t stream) {
  const Dims d = dims_of(shape);
  const int64_t bh = d.b * d.H, n_heads = bh * d.s * d.D;
  if (drop.p > 0 && !saved.probs_dropped) throw Error("attention_unfused_forward: dropout needs probs_dropped");
  split_qkv_kernel<<<grid_for(n_heads), kThreads, 0, stream>>>(qkv, saved.q, saved.k, saved.v, d);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
  gemm.matmul_rm(saved.q, false, saved.k, true, scratch.scores, true, d.s, d.s, d.D, shape.scale, 0.0f, bh, stream);
  bf16* dropped = drop.p > 0 ? saved.probs_dropped : nullptr;
  softmax_forward_kernel<<<static_cast<unsigned>(bh * d.s), kThreads, 0, stream>>>(
      scratch.scores, saved.probs, dropped, d.s, d.H, shape.key_start, drop);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
  gemm.matmul_rm(dropped ? dropped : saved.probs, false, saved.v, false, scratch.heads, false, d.s, d.D, d.s, 1.0f,
                 0.0f, bh, stream);
  heads_layout_kernel<<<grid_for(n_heads), kThreads, 0, stream>>>(scratch.heads, ctx, d, false);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

void attention_unfused_backward(CublasLtGemm& gemm, const bf16* dctx, bf16* dqkv, const UnfusedAttentionBuffers& saved,
                                const UnfusedAttentionScratch& scratch, const AttentionShape& shape,
                                const DropoutSpec& drop, cudaStream_t stream) {
  const Dims d = dims_of(shape);
  const int64_t bh = d.b * d.H, n_heads = bh * d.s * d.D;
  bf16* dO = scratch.heads;
  heads_layout_kernel<<<grid_for(n_heads), kThreads, 0, stream>>>(dctx, dO, d, true);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
  const bf16* pv = drop.p > 0 ? saved.probs_dropped : saved.probs;
  gemm.matmul_rm(pv, true, dO, false, scratch.dv, false, d.s, d.D, d.s, 1.0f, 0.0f, bh, stream);      // dV = Pd^T dO
  gemm.matmul_rm(dO, false, saved.v, true, scratch.scores, true, d.s, d.s, d.D, 1.0f, 0.0f, bh, stream);  // dPd
  softmax_backward_kernel<<<static_cast<unsigned>(bh * d.s), kThreads, 0, stream>>>(
      scratch.scores, saved.probs, d.s, d.H, shape.key_start, shape.scale, drop);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
  const bf16* dS = saved.probs;
  gemm.matmul_rm(dS, false, saved.k, false, scratch.dq, false, d.s, d.D, d.s, 1.0f, 0.0f, bh, stream);  // dQ = dS K
  gemm.matmul_rm(dS, true, saved.q, false, scratch.dk, false, d.s, d.D, d.s, 1.0f, 0.0f, bh, stream);   // dK = dS^T Q
  merge_qkv_grad_kernel<<<grid_for(d.b * d.s * d.row), kThreads, 0, stream>>>(scratch.dq, scratch.dk, scratch.dv,
                                                                               dqkv, d);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

}  // namespace laoyao::kernels::cuda
