// Megatron-Core MoE ops on the GPU (see moe.hpp), the functions of kernels/cpu/moe.cpp.
//  - Router forward/backward: one warp per token, its E scores in registers (kPer = E/32 rounded
//    up to a power of two per lane: expert i*32 + lane in slot i). Top-k is k rounds of a warp
//    arg-max ranking (higher score, then lower expert index), the CPU's tie rule. Softmaxes follow
//    the CPU's arithmetic (float max subtracted, exp and sum in double, rounded to float), and the
//    sigmoid rounds a double exp to float, which is glibc's expf almost always: the ranked values
//    are then the CPU's own, so the choices match it, ties included. The choices, and the
//    backward's routing gradient (nonzero at k experts), go through a per-warp row in shared memory.
//  - Aux-loss statistics: per-chunk partial sums of the scores and counts, then one block sums
//    the chunks, the losses and the z-loss in a fixed order: reproducible, no float atomics.
//  - Permutation: per-chunk expert counts, a scan in (expert, chunk) order, then one warp per
//    chunk hands out rows in entry order (warp match + a running cursor per expert): stable.
//  - Permute / unpermute: 16-byte bf16 vectors (H % 8 == 0), fp32 sums rounded once.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>

#include "core/counter_normal.hpp"
#include "core/error.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/moe.hpp"

namespace laoyao::kernels::cuda {
namespace {

constexpr unsigned kFull = 0xffffffffu;
constexpr float kSigmoidNormEps = 1e-20f;  // Megatron's epsilon in the sigmoid normalisations
constexpr int kRouterWarps = 4;            // tokens per router block (one per warp)
constexpr int kRouterMaxBlocks = 2048;     // router grids stride over the tokens beyond this
constexpr int kAuxChunk = 256;             // tokens per partial sum of the aux-loss statistics
constexpr int kFinishThreads = 512;        // the one block that finishes the losses
// Tokens per chunk of the permutation: a warp assigns a chunk's rows, 32 entries a step, so small
// chunks mean many warps and short loops (256 gave the flagship's 8192 tokens 32 warps of 64 steps:
// 58 us, at 6% occupancy, under Nsight Compute).
constexpr int kPermTokens = 16;
constexpr int kPermWarps = 4;              // chunks per block of the row assignment
constexpr int kThreads = 256;

// ---- device helpers

template <class V>
__device__ __forceinline__ V warp_sum(V v) {
  // A butterfly: both lanes of a pair add the same two values, so every lane ends bit-identical.
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFull, v, o));
  return v;
}

// The CPU's sigmoid, 1 / (1 + expf(-v)), with expf as a double exp rounded to float.
__device__ __forceinline__ float sigmoid(float v) {
  return 1.0f / (1.0f + static_cast<float>(exp(-static_cast<double>(v))));
}

// exp(z - m) / sum as the CPU's softmax_row: the float difference, exp in double, times 1/sum.
__device__ __forceinline__ float softmax_of(float z, float m, double inv) {
  return static_cast<float>(exp(static_cast<double>(z - m)) * inv);
}

// (v, e) ranks before (ov, oe): a higher value, then the lower expert; e < 0 is "none".
__device__ __forceinline__ bool ranks_before(float v, int e, float ov, int oe) {
  if (e < 0) return false;
  if (oe < 0) return true;
  return v > ov || (v == ov && e < oe);
}

// Inclusive scan over the block (blockDim.x a multiple of 32, at most 32 warps); `total` gets the
// block's sum. sh holds 32 ints; consecutive calls may reuse it.
__device__ int block_inclusive_scan(int v, int* sh, int& total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int o = 1; o < 32; o <<= 1) {
    const int n = __shfl_up_sync(kFull, v, o);
    if (lane >= o) v += n;
  }
  __syncthreads();  // an earlier call's readers are done with sh
  if (lane == 31) sh[warp] = v;
  __syncthreads();
  int before = 0, all = 0;
  for (int w = 0; w < warps; ++w) {
    const int s = sh[w];
    if (w < warp) before += s;
    all += s;
  }
  total = all;
  return v + before;
}

// Sum over the block in a fixed order; the result is valid in thread 0.
__device__ double block_sum(double v, double* sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  if (warp == 0) v = warp_sum(lane < int(blockDim.x >> 5) ? sh[lane] : 0.0);
  return v;
}

// 8 bf16 <-> 8 floats (one 16-byte vector).
__device__ __forceinline__ void unpack8(const uint4& u, float* f) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 p = __bfloat1622float2(h[i]);
    f[2 * i] = p.x, f[2 * i + 1] = p.y;
  }
}

__device__ __forceinline__ uint4 pack8(const float* f) {
  uint4 u;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
  return u;
}

struct RouterArgs {
  int E, k;
  bool sigmoid, pre_softmax;
  bool sqrt_softplus;  // with sigmoid: the gate score is sqrt(softplus), not the sigmoid
  float scale;  // the top-k scaling factor, 1 when none
  const float* bias = nullptr;  // the router's expert_bias (sigmoid-like only; forward only)
  int groups = 0, group_topk = 0;  // group-limited routing (forward only); 0: none
};

// The CPU's gate scores of the sigmoid-like score functions (kernels/cpu/moe.cpp): the sigmoid,
// or sqrt(softplus(v)) with PyTorch's softplus (v above 20; else log1p(exp(v)), each a double op
// rounded to float as glibc's float functions almost always give); and their derivatives.
__device__ __forceinline__ float gate_score(const RouterArgs& a, float v) {
  if (!a.sqrt_softplus) return sigmoid(v);
  const float e = static_cast<float>(exp(static_cast<double>(v)));
  return sqrtf(v > 20.0f ? v : static_cast<float>(log1p(static_cast<double>(e))));
}
__device__ __forceinline__ double gate_score_grad(const RouterArgs& a, float v) {
  if (!a.sqrt_softplus) {
    const double s = sigmoid(v);
    return s * (1.0 - s);
  }
  const double s = gate_score(a, v);
  return s > 0.0 ? (v > 20.0f ? 1.0 : static_cast<double>(sigmoid(v))) / (2.0 * s) : 0.0;
}

// ---- router forward

// A token's softmax statistics over its E logits (slot i of each lane holds expert i * 32 + lane):
// m = the row max (float, as the CPU's), and the sum of exp(z - m) in double over the warp.
template <int kPer>
__device__ __forceinline__ double softmax_stats(const float (&z)[kPer], int E, int lane, float& m) {
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < kPer; ++i)
    if (i * 32 + lane < E) mx = fmaxf(mx, z[i]);
  m = warp_max(mx);
  double sum = 0.0;
#pragma unroll
  for (int i = 0; i < kPer; ++i)
    if (i * 32 + lane < E) sum += exp(static_cast<double>(z[i] - m));
  return warp_sum(sum);
}

// A warp's top-k of n values held in registers (value i * 32 + lane in slot i of each lane), among
// the candidates `allowed` (bit i: slot i of this lane): round j takes the best one not taken yet
// (ranks_before: higher value, then lower index) and calls pick(j, index, value) on every lane.
template <int kPer, class Pick>
__device__ __forceinline__ void warp_topk(const float (&key)[kPer], int n, int k, int lane, unsigned allowed,
                                          Pick pick) {
  unsigned taken = 0;  // bit i: value i * 32 + lane is taken
  for (int j = 0; j < k; ++j) {
    float bv = 0.0f;
    int be = -1;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int e = i * 32 + lane;
      if (e < n && ((allowed & ~taken) >> i & 1u) && ranks_before(key[i], e, bv, be)) bv = key[i], be = e;
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(kFull, bv, o);
      const int oe = __shfl_xor_sync(kFull, be, o);
      if (ranks_before(ov, oe, bv, be)) bv = ov, be = oe;
    }
    // NaN scores are unordered and could leave the lanes disagreeing: lane 0 decides.
    bv = __shfl_sync(kFull, bv, 0);
    be = __shfl_sync(kFull, be, 0);
    if (be >= 0 && (be & 31) == lane) taken |= 1u << (be >> 5);
    pick(j, be, bv);
  }
}

// Group-limited routing (Megatron's group_limited_topk, the CPU's group_limited_topk_row): the
// groups of E / groups consecutive experts ranked by the fp32 sum of their k / group_topk best
// values (best first), the experts of the group_topk best groups allowed (bit i as warp_topk's).
template <int kPer>
__device__ __forceinline__ unsigned best_groups(const float (&key)[kPer], int E, int k, int groups, int group_topk,
                                                int lane) {
  const int per = E / groups, picks = k / group_topk;
  float group_score[kPer];  // group g in slot g / 32 of lane g % 32
#pragma unroll
  for (int i = 0; i < kPer; ++i) group_score[i] = 0.0f;
  for (int g = 0; g < groups; ++g) {
    unsigned in_group = 0;
#pragma unroll
    for (int i = 0; i < kPer; ++i) in_group |= static_cast<unsigned>((i * 32 + lane) / per == g) << i;
    float sum = 0.0f;
    warp_topk<kPer>(key, E, picks, lane, in_group, [&](int, int, float v) { sum += v; });
#pragma unroll
    for (int i = 0; i < kPer; ++i)
      if (i * 32 + lane == g) group_score[i] = sum;
  }
  unsigned allowed = 0;
  warp_topk<kPer>(group_score, groups, group_topk, lane, ~0u, [&](int, int g, float) {
#pragma unroll
    for (int i = 0; i < kPer; ++i)
      if ((i * 32 + lane) / per == g) allowed |= 1u << i;
  });
  return allowed;
}

template <int kPer>
__global__ void __launch_bounds__(kRouterWarps * 32)
    moe_router_forward_kernel(const float* __restrict__ logits, int64_t T, RouterArgs a, int32_t* __restrict__ topk_idx,
                              float* __restrict__ topk_probs, float* __restrict__ scores, float* __restrict__ lse,
                              int32_t* __restrict__ tokens_per_expert, int32_t* __restrict__ aux_idx,
                              int32_t* __restrict__ aux_tokens_per_expert) {
  __shared__ int hist[kPer * 32];  // this block's tokens per expert, one global atomic each at the end
  __shared__ int aux_hist[kPer * 32];  // and of the aux losses' unrestricted top-k (when kept apart)
  __shared__ int sel_e[kRouterWarps][kPer * 32];    // each warp's chosen experts, best first
  __shared__ float sel_v[kRouterWarps][kPer * 32];  // and their ranked values
  for (int i = threadIdx.x; i < a.E; i += blockDim.x) hist[i] = 0, aux_hist[i] = 0;
  __syncthreads();
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const int E = a.E, k = a.k;
  int* se = sel_e[w];
  float* sv = sel_v[w];
  // The full softmax serves pre_softmax's ranking, the softmax aux scores and the z-loss's lse.
  const bool full_softmax = (!a.sigmoid && (a.pre_softmax || scores)) || lse;
  for (int64_t t = int64_t(blockIdx.x) * kRouterWarps + w; t < T; t += int64_t(gridDim.x) * kRouterWarps) {
    const float* zr = logits + t * E;
    float z[kPer], key[kPer];
#pragma unroll
    for (int i = 0; i < kPer; ++i) z[i] = i * 32 + lane < E ? zr[i * 32 + lane] : 0.0f;

    float m = 0.0f;
    double inv = 0.0;
    if (full_softmax) {
      const double sum = softmax_stats<kPer>(z, E, lane, m);
      inv = 1.0 / sum;
      if (lse && lane == 0) lse[t] = static_cast<float>(static_cast<double>(m) + log(sum));
    }
    // The ranked values: the logits (softmax over the chosen k later), the full softmax, or sigmoids.
#pragma unroll
    for (int i = 0; i < kPer; ++i)
      key[i] = a.sigmoid ? gate_score(a, z[i]) : a.pre_softmax ? softmax_of(z[i], m, inv) : z[i];

    if (scores) {  // scores_for_aux_loss: softmax over E, or the sigmoids normalised over E
      float* sr = scores + t * E;
      if (a.sigmoid) {
        double sum = 0.0;
#pragma unroll
        for (int i = 0; i < kPer; ++i)
          if (i * 32 + lane < E) sum += key[i];
        const float denom = static_cast<float>(warp_sum(sum)) + kSigmoidNormEps;
#pragma unroll
        for (int i = 0; i < kPer; ++i)
          if (i * 32 + lane < E) sr[i * 32 + lane] = key[i] / denom;
      } else {
#pragma unroll
        for (int i = 0; i < kPer; ++i)
          if (i * 32 + lane < E) sr[i * 32 + lane] = softmax_of(z[i], m, inv);
      }
    }
    // The aux losses' top-k: unbiased and over every group (Megatron's
    // compute_routing_scores_for_aux_loss), kept apart when the routing's differs.
    if (aux_idx)
      warp_topk<kPer>(key, E, k, lane, ~0u, [&](int j, int be, float) {
        if (lane == 0) aux_idx[t * k + j] = be, atomicAdd(&aux_hist[be], 1);
      });
    if (a.bias) {  // the experts are chosen by sigmoid + bias (the CPU's float sum)
#pragma unroll
      for (int i = 0; i < kPer; ++i)
        if (i * 32 + lane < E) key[i] = key[i] + a.bias[i * 32 + lane];
    }
    const unsigned allowed = a.groups > 0 ? best_groups<kPer>(key, E, k, a.groups, a.group_topk, lane) : ~0u;

    // The routing's top-k (sv: the chosen's value without the bias, for its prob).
    warp_topk<kPer>(key, E, k, lane, allowed, [&](int j, int be, float bv) {
      if (lane == 0) se[j] = be, sv[j] = a.bias ? gate_score(a, zr[be]) : bv;
    });
    __syncwarp();

    // The probs of the chosen, lane by lane (j = lane, lane + 32, ...): sigmoids renormalised over
    // the k when k > 1, pre_softmax's scores as they are, or the softmax of the chosen logits (the
    // first is their max).
    const float mk = sv[0];
    double sum = 0.0;
    for (int j = lane; j < k; j += 32) sum += a.sigmoid ? static_cast<double>(sv[j]) : exp(static_cast<double>(sv[j] - mk));
    sum = warp_sum(sum);
    const float denom = k > 1 ? static_cast<float>(sum) + kSigmoidNormEps : 1.0f;
    const double inv_k = 1.0 / sum;
    for (int j = lane; j < k; j += 32) {
      float p = a.sigmoid ? (k > 1 ? sv[j] / denom : sv[j]) : a.pre_softmax ? sv[j] : softmax_of(sv[j], mk, inv_k);
      if (a.scale != 1.0f) p *= a.scale;
      topk_idx[t * k + j] = se[j];
      topk_probs[t * k + j] = p;
      atomicAdd(&hist[se[j]], 1);
    }
    __syncwarp();  // se and sv are read before the next token's rounds write them
  }
  __syncthreads();
  for (int i = threadIdx.x; i < E; i += blockDim.x) {
    if (hist[i]) atomicAdd(&tokens_per_expert[i], hist[i]);
    if (aux_hist[i]) atomicAdd(&aux_tokens_per_expert[i], aux_hist[i]);
  }
}

// ---- aux-loss-free balancing

__global__ void accumulate_load_kernel(const int32_t* __restrict__ counts, int32_t* __restrict__ load, int E) {
  for (int e = threadIdx.x; e < E; e += blockDim.x) load[e] += counts[e];
}

__global__ void update_expert_bias_kernel(int32_t* __restrict__ load, float* __restrict__ bias, int E, float rate) {
  __shared__ double mean;
  if (threadIdx.x == 0) {  // the CPU's order: the sum of load / E, expert by expert
    double m = 0.0;
    for (int e = 0; e < E; ++e) m += static_cast<double>(load[e]) / static_cast<double>(E);
    mean = m;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    const double offset = mean - static_cast<double>(load[e]);
    bias[e] += offset > 0 ? rate : offset < 0 ? -rate : 0.0f;
    load[e] = 0;
  }
}

// ---- router backward

// The aux losses' part: aux_grad[seq(t) * E + e] is d(losses)/d(scores[t, e]) per unit of dloss
// (moe_aux_losses_forward writes it), its row the token's sequence of aux_span tokens.
struct RouterGradArgs {
  const float* aux_grad;  // nullptr: no aux loss
  int64_t aux_span;
  float aux_scale;
  double z_unit;  // 2 * z_coeff * aux_scale / T; 0: no z-loss
};

template <int kPer>
__global__ void __launch_bounds__(kRouterWarps * 32)
    moe_router_backward_kernel(const float* __restrict__ logits, const int32_t* __restrict__ topk_idx,
                               const float* __restrict__ dprobs, const float* __restrict__ lse, int64_t T,
                               RouterArgs a, RouterGradArgs g, bf16* __restrict__ dlogits) {
  __shared__ float route[kRouterWarps][kPer * 32];  // each warp's routing gradient row
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const int E = a.E, k = a.k;
  float* rt = route[w];
  const bool full_softmax = !a.sigmoid && (a.pre_softmax || g.aux_grad);
  for (int64_t t = int64_t(blockIdx.x) * kRouterWarps + w; t < T; t += int64_t(gridDim.x) * kRouterWarps) {
    const float* zr = logits + t * E;
    float z[kPer];
#pragma unroll
    for (int i = 0; i < kPer; ++i) z[i] = i * 32 + lane < E ? zr[i * 32 + lane] : 0.0f;

    float m = 0.0f;
    double inv = 0.0;
    if (full_softmax) inv = 1.0 / softmax_stats<kPer>(z, E, lane, m);

    // The routing gradient (moe_router_topk_backward). The lanes take the choices j = lane,
    // lane + 32, ... (expert e_j, re-read from the token's rows; g_j = dprobs * scale) and first
    // reduce what the terms need:
    //   sigmoid:     q = sig / D (k > 1): d/dsig_j = (g_j - <g, q>) / D, times the gate score's
    //                derivative (sig (1 - sig) for the sigmoid itself);
    //   pre_softmax: probs = s[e_j]: dz = s * (G - <G, s>), G = g at the chosen experts;
    //   softmax:     probs = softmax of the chosen logits p: dz[e_j] = p_j (g_j - <g, p>).
    const int32_t* ti = topk_idx + t * k;
    const float* dp = dprobs + t * k;
    auto expert = [&](int j) {  // outside [0, E): skipped (the router never writes one)
      const int e = ti[j];
      return e >= 0 && e < E ? e : -1;
    };
    auto grad = [&](int j) { return static_cast<double>(dp[j]) * a.scale; };
    float denom = 1.0f, mk = 0.0f;
    double inv_k = 0.0, dot = 0.0;
    if (a.sigmoid) {
      if (k > 1) {
        double sum = 0.0;
        for (int j = lane; j < k; j += 32)
          if (const int e = expert(j); e >= 0) sum += gate_score(a, zr[e]);
        denom = static_cast<float>(warp_sum(sum)) + kSigmoidNormEps;
        for (int j = lane; j < k; j += 32)
          if (const int e = expert(j); e >= 0) dot += grad(j) * (gate_score(a, zr[e]) / denom);
      }
    } else if (a.pre_softmax) {
      for (int j = lane; j < k; j += 32)
        if (const int e = expert(j); e >= 0) dot += grad(j) * softmax_of(zr[e], m, inv);
    } else {
      float mx = -INFINITY;
      for (int j = lane; j < k; j += 32)
        if (const int e = expert(j); e >= 0) mx = fmaxf(mx, zr[e]);
      mk = warp_max(mx);
      double sum = 0.0;
      for (int j = lane; j < k; j += 32)
        if (const int e = expert(j); e >= 0) sum += exp(static_cast<double>(zr[e] - mk));
      inv_k = 1.0 / warp_sum(sum);
      for (int j = lane; j < k; j += 32)
        if (const int e = expert(j); e >= 0) dot += grad(j) * softmax_of(zr[e], mk, inv_k);
    }
    dot = warp_sum(dot);
    // Off the chosen experts: 0, or pre_softmax's -s <G, s>; then the chosen ones' terms (a
    // token's experts are distinct, so no two lanes write one element).
#pragma unroll
    for (int i = 0; i < kPer; ++i)
      if (i * 32 + lane < E)
        rt[i * 32 + lane] =
            a.pre_softmax && !a.sigmoid ? static_cast<float>(-static_cast<double>(softmax_of(z[i], m, inv)) * dot) : 0.0f;
    __syncwarp();
    for (int j = lane; j < k; j += 32) {
      const int e = expert(j);
      if (e < 0) continue;
      if (a.sigmoid) {
        rt[e] = static_cast<float>((grad(j) - dot) / denom * gate_score_grad(a, zr[e]));
      } else {
        const float s = a.pre_softmax ? softmax_of(zr[e], m, inv) : softmax_of(zr[e], mk, inv_k);
        rt[e] = static_cast<float>(s * (grad(j) - dot));
      }
    }
    __syncwarp();

    // The losses' part, dense over E, added to the routing gradient.
    float d[kPer];
#pragma unroll
    for (int i = 0; i < kPer; ++i) d[i] = i * 32 + lane < E ? rt[i * 32 + lane] : 0.0f;
    if (g.aux_grad) {
      // d/dlogits of sum_e G[e] * scores[t, e], G = aux_scale * the grad row: softmax:
      // s (G - <G, s>); sigmoid (q = sig / D): (G - <G, q>) / D * sig (1 - sig).
      const float* gr = g.aux_grad + (t / g.aux_span) * E;
      float sg[kPer];
      float D = 1.0f;
      if (a.sigmoid) {
        double sum = 0.0;
#pragma unroll
        for (int i = 0; i < kPer; ++i) {
          sg[i] = gate_score(a, z[i]);
          if (i * 32 + lane < E) sum += sg[i];
        }
        D = static_cast<float>(warp_sum(sum)) + kSigmoidNormEps;
      }
      double ge[kPer], gdot = 0.0;
      float sc[kPer];
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const bool on = i * 32 + lane < E;
        ge[i] = on ? static_cast<double>(g.aux_scale) * gr[i * 32 + lane] : 0.0;
        sc[i] = a.sigmoid ? sg[i] / D : softmax_of(z[i], m, inv);
        if (on) gdot += ge[i] * sc[i];
      }
      gdot = warp_sum(gdot);
#pragma unroll
      for (int i = 0; i < kPer; ++i)
        d[i] += a.sigmoid ? static_cast<float>((ge[i] - gdot) / D * gate_score_grad(a, z[i]))
                          : static_cast<float>(sc[i] * (ge[i] - gdot));
    }
    if (g.z_unit != 0.0) {  // z-loss: 2 coeff dloss / T * lse * softmax
      const double l = lse[t];
#pragma unroll
      for (int i = 0; i < kPer; ++i) d[i] += static_cast<float>(g.z_unit * l * exp(static_cast<double>(z[i]) - l));
    }
    bf16* out = dlogits + t * E;
#pragma unroll
    for (int i = 0; i < kPer; ++i)
      if (i * 32 + lane < E) out[i * 32 + lane] = __float2bfloat16(d[i]);
    __syncwarp();  // the row buffer is read before the next token writes it
  }
}

// ---- aux-loss statistics

// Block (chunk c, experts [32x, 32x + 32)): the sum of scores[t, e] over the chunk's tokens and
// the count of those tokens routed to e. Chunk c covers kAuxChunk tokens of row c / chunks (a
// sequence of `span` tokens).
__global__ void moe_aux_partials_kernel(const float* __restrict__ scores, const int32_t* __restrict__ topk_idx,
                                        int64_t E, int k, int64_t span, int64_t chunks, float* __restrict__ psum,
                                        float* __restrict__ pcount) {
  __shared__ float part[8][32];
  __shared__ int cnt[32];
  const int c = threadIdx.x, r = threadIdx.y, tid = r * 32 + c;
  const int64_t chunk = blockIdx.x, row = chunk / chunks;
  const int64_t t0 = row * span + (chunk % chunks) * kAuxChunk;
  const int64_t t1 = t0 + kAuxChunk < (row + 1) * span ? t0 + kAuxChunk : (row + 1) * span;
  const int64_t e0 = int64_t(blockIdx.y) * 32, e = e0 + c;
  if (tid < 32) cnt[tid] = 0;
  __syncthreads();
  float acc = 0.0f;
  if (e < E)
    for (int64_t t = t0 + r; t < t1; t += 8) acc += scores[t * E + e];
  part[r][c] = acc;
  for (int64_t i = t0 * k + tid; i < t1 * k; i += 256) {
    const int64_t x = topk_idx[i] - e0;
    if (x >= 0 && x < 32) atomicAdd(&cnt[x], 1);  // integer: order-free
  }
  __syncthreads();
  if (r == 0 && e < E) {
    float s = 0.0f;
    for (int i = 0; i < 8; ++i) s += part[i][c];
    psum[chunk * E + e] = s;
    pcount[chunk * E + e] = static_cast<float>(cnt[c]);
  }
}

struct AuxFinishArgs {
  int64_t T, E, rows, chunks;  // rows of `chunks` partials each (0 rows: no aux loss)
  bool aux, seq, z, global;
  double aux_unit, seq_unit, z_unit, global_unit;  // each loss per unit of its sum, coefficient included
  // Context parallelism: each row's counts [rows][E] and the tokens per expert [E], summed over the
  // CP ranks (moe_aux_counts_kernel, then the caller's sum), in place of the partials' and
  // tokens_per_expert; null without.
  const float* summed;
};

// Context parallelism: each row's counts (its chunks' summed) into counts[rows][E], then the
// tokens per expert as floats into counts[rows * E + e], for the sum over the CP ranks.
__global__ void moe_aux_counts_kernel(const float* __restrict__ pcount, const int32_t* __restrict__ tokens_per_expert,
                                      int64_t E, int64_t rows, int64_t chunks, float* __restrict__ counts) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < rows * E) {
    const int64_t row = i / E, e = i % E;
    float c = 0.0f;
    for (int64_t ch = row * chunks; ch < (row + 1) * chunks; ++ch) c += pcount[ch * E + e];
    counts[i] = c;
  } else if (i < (rows + 1) * E) {
    counts[i] = static_cast<float>(tokens_per_expert[i - rows * E]);
  }
}

// One block: per expert, the chunks' partials summed in chunk order (double) into P[row, e] and
// c[row, e]; the losses' sums over experts and tokens reduced in a fixed tree; grad[row, e]
// (per unit of dloss) for the backward; the values added to loss_sums by one thread.
__global__ void __launch_bounds__(kFinishThreads)
    moe_aux_finish_kernel(const float* __restrict__ psum, const float* __restrict__ pcount,
                          const int32_t* __restrict__ tokens_per_expert, const float* __restrict__ global_counts,
                          const float* __restrict__ lse, AuxFinishArgs a, float* __restrict__ grad,
                          float* __restrict__ loss_sums) {
  __shared__ double sh[32];
  double aux = 0.0, seq = 0.0, z = 0.0, global = 0.0;
  for (int64_t e = threadIdx.x; e < a.E && a.rows > 0; e += blockDim.x) {
    const double tpe = !a.aux ? 0.0
                       : a.summed ? static_cast<double>(a.summed[a.rows * a.E + e])
                                  : static_cast<double>(tokens_per_expert[e]);
    const double gc = a.global ? static_cast<double>(global_counts[e]) : 0.0;
    double total = 0.0;
    for (int64_t row = 0; row < a.rows; ++row) {
      double P = 0.0, c = 0.0;
      for (int64_t ch = row * a.chunks; ch < (row + 1) * a.chunks; ++ch) {
        P += psum[ch * a.E + e];
        if (!a.summed) c += pcount[ch * a.E + e];
      }
      if (a.summed) c = a.summed[row * a.E + e];
      if (a.seq && c != 0.0) seq += P * c;  // the CPU skips experts without tokens
      total += P;
      grad[row * a.E + e] =
          static_cast<float>(a.aux_unit * tpe + (a.seq ? a.seq_unit * c : 0.0) + a.global_unit * gc);
    }
    if (a.aux && tpe != 0.0) aux += total * tpe;
    global += total * gc;
  }
  if (a.z)
    for (int64_t t = threadIdx.x; t < a.T; t += blockDim.x) z += static_cast<double>(lse[t]) * lse[t];
  aux = block_sum(aux, sh);
  seq = block_sum(seq, sh);
  z = block_sum(z, sh);
  global = block_sum(global, sh);
  if (threadIdx.x == 0) {  // the only writer of loss_sums in this stream's order: no atomics
    if (a.aux) loss_sums[0] += static_cast<float>(aux * a.aux_unit);
    if (a.seq) loss_sums[1] += static_cast<float>(seq * a.seq_unit);
    if (a.z) loss_sums[2] += static_cast<float>(z * a.z_unit);
    if (a.global) loss_sums[3] += static_cast<float>(global * a.global_unit);
  }
}

__global__ void global_counts_kernel(const int32_t* __restrict__ counts, double* __restrict__ running,
                                     float* __restrict__ mean, int E, double steps) {
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    running[e] += static_cast<double>(counts[e]);
    mean[e] = static_cast<float>(running[e] / steps);
  }
}

// ---- permutation

// counts[e * chunks + c] = the entries (t, j) of chunk c (kPermTokens tokens) routed to expert e.
__global__ void moe_perm_count_kernel(const int32_t* __restrict__ topk_idx, int64_t T, int k, int E, int64_t chunks,
                                      int32_t* __restrict__ counts) {
  __shared__ int hist[kMoeMaxExperts];
  for (int i = threadIdx.x; i < E; i += blockDim.x) hist[i] = 0;
  __syncthreads();
  const int64_t c = blockIdx.x;
  const int64_t end = (c + 1) * kPermTokens < T ? (c + 1) * kPermTokens * k : T * k;
  for (int64_t i = c * kPermTokens * k + threadIdx.x; i < end; i += blockDim.x) {
    const int e = topk_idx[i];
    if (e >= 0 && e < E) atomicAdd(&hist[e], 1);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < E; i += blockDim.x) counts[i * chunks + c] = hist[i];
}

// Block e: offsets[e] = the rows of the experts before e (a sum of tokens_per_expert), and the
// counts of e's chunks turned into each chunk's first row (exclusive scan, carried over tiles).
__global__ void moe_perm_scan_kernel(const int32_t* __restrict__ tokens_per_expert, int E, int64_t chunks,
                                     int32_t* __restrict__ counts, int32_t* __restrict__ offsets) {
  __shared__ int sh[32];
  const int e = blockIdx.x;
  int part = 0;
  for (int i = threadIdx.x; i < e; i += blockDim.x) part += tokens_per_expert[i];
  int before = 0;
  block_inclusive_scan(part, sh, before);
  if (threadIdx.x == 0) {
    offsets[e] = before;
    if (e == E - 1) offsets[E] = before + tokens_per_expert[e];
  }
  int32_t* row = counts + int64_t(e) * chunks;
  int carry = before;
  for (int64_t c0 = 0; c0 < chunks; c0 += blockDim.x) {
    const int64_t c = c0 + threadIdx.x;
    const int v = c < chunks ? row[c] : 0;
    int tile = 0;
    const int incl = block_inclusive_scan(v, sh, tile);
    if (c < chunks) row[c] = carry + incl - v;
    carry += tile;
  }
}

// One warp per chunk: its entries in order, 32 at a time; the lanes with the same expert take
// consecutive rows from that expert's cursor in lane order, so rows follow the entry (= token)
// order within every expert.
__global__ void __launch_bounds__(kPermWarps * 32)
    moe_perm_assign_kernel(const int32_t* __restrict__ topk_idx, int64_t T, int k, int E, int64_t chunks,
                           const int32_t* __restrict__ first_row, int32_t* __restrict__ sorted_token,
                           int32_t* __restrict__ permuted_row) {
  __shared__ int cursor[kPermWarps][kMoeMaxExperts];
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const int64_t c = int64_t(blockIdx.x) * kPermWarps + w;
  if (c >= chunks) return;  // whole warps only; no block-wide barrier follows
  int* cur = cursor[w];
  for (int e = lane; e < E; e += 32) cur[e] = first_row[int64_t(e) * chunks + c];
  __syncwarp();
  const int64_t begin = c * kPermTokens * k;
  const int64_t end = (c + 1) * kPermTokens < T ? (c + 1) * kPermTokens * k : T * k;
  const unsigned below = (1u << lane) - 1u;
  for (int64_t i0 = begin; i0 < end; i0 += 32) {
    const int64_t i = i0 + lane;
    int e = i < end ? topk_idx[i] : -1;
    if (e >= E) e = -1;  // outside [0, E): no row (the router never writes one)
    const unsigned peers = __match_any_sync(kFull, e);
    const int r = e >= 0 ? cur[e] + __popc(peers & below) : 0;
    __syncwarp();  // every lane has read its cursor before the leaders move them
    if (e >= 0) {
      if ((peers & below) == 0) cur[e] += __popc(peers);
      sorted_token[r] = static_cast<int32_t>(i / k);
      permuted_row[i] = r;
    } else if (i < end) {
      permuted_row[i] = -1;  // a pair of no expert here (the all-gather dispatcher's other ranks')
    }
    __syncwarp();
  }
}

__global__ void moe_random_logits_kernel(float* __restrict__ logits, int64_t n, const uint64_t* __restrict__ key_at) {
  const uint64_t key = *key_at;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    logits[i] = counter_normal(key, static_cast<uint64_t>(i));
}

// ---- token dropping

__global__ void moe_scatter_probs_kernel(const float* __restrict__ probs, const int32_t* __restrict__ permuted_row,
                                         float* __restrict__ permuted_probs, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    permuted_probs[permuted_row[i]] = probs[i];
}

// One thread per (token, choice) pair: its rank among its expert's pairs of its share of the
// sequence (positions share * s / shares ..), in Megatron's token order (position-major: token t =
// batch * s + position sits at position * b + batch). An expert's rows are in our token order, so
// with one sequence (b = 1) and one share a row's place is its rank by position.
__global__ void moe_capacity_kernel(const int32_t* __restrict__ topk_idx, const int32_t* __restrict__ offsets,
                                    const int32_t* __restrict__ sorted_token, const int32_t* __restrict__ permuted_row,
                                    const float* __restrict__ permuted_probs, float* __restrict__ probs, int64_t n,
                                    int k, int s, int b, int shares, int64_t capacity, bool by_position,
                                    uint8_t* __restrict__ kept) {
  auto order = [s, b](int t) { return (t % s) * b + t / s; };
  const int width = s / shares;
  auto share = [s, width](int t) { return (t % s) / width; };
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int t = int(i / k), e = topk_idx[i], r = permuted_row[i], begin = offsets[e], me = order(t), mine = share(t);
    int64_t rank = r - begin;
    if (!by_position) {
      const float p = permuted_probs[r];
      rank = 0;
      for (int q = begin, end = offsets[e + 1]; q < end && rank < capacity; ++q) {
        const int u = sorted_token[q];
        const float o = permuted_probs[q];
        rank += share(u) == mine && (o > p || (o == p && order(u) < me));
      }
    } else if (b > 1 || shares > 1) {
      rank = 0;
      for (int q = begin, end = offsets[e + 1]; q < end && rank < capacity; ++q) {
        const int u = sorted_token[q];
        rank += share(u) == mine && order(u) < me;
      }
    }
    const bool keep = rank < capacity;
    kept[i] = keep ? 1 : 0;
    if (!keep) probs[i] = 0.0f;
  }
}

__global__ void moe_mask_dropped_kernel(float* __restrict__ dprobs, const uint8_t* __restrict__ kept, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    if (!kept[i]) dprobs[i] = 0.0f;
}

// ---- permute / unpermute (Hv = H / 8 vectors of 8 bf16 per row)

// One warp a row: the row's token read once, four of its vectors in flight a lane (a thread a
// vector, each dividing its index by Hv and reading its token before its vector, ran at 0.68 of a
// copy's speed at the flagship's shape).
__global__ void moe_permute_forward_kernel(const uint4* __restrict__ x, const int32_t* __restrict__ sorted_token,
                                           uint4* __restrict__ out, int64_t N, const int32_t* __restrict__ rows_end,
                                           int64_t Hv) {
  const int64_t r = int64_t(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32;
  if (r >= N || (rows_end && r >= *rows_end)) return;
  const uint4* src = x + int64_t(sorted_token[r]) * Hv;
  uint4* dst = out + r * Hv;
  int64_t v = threadIdx.x & 31;
  for (; v + 96 < Hv; v += 128) {
    const uint4 a = src[v], b = src[v + 32], c = src[v + 64], d = src[v + 96];
    dst[v] = a, dst[v + 32] = b, dst[v + 64] = c, dst[v + 96] = d;
  }
  for (; v < Hv; v += 32) dst[v] = src[v];
}

// dx[t] = (dx[t] if accumulate) + sum_j dpermuted[row(t, j)] (fp32, choice order), rounded once.
__global__ void moe_permute_backward_kernel(const uint4* __restrict__ dpermuted, const int32_t* __restrict__ permuted_row,
                                            uint4* __restrict__ dx, int64_t T, int k, int64_t Hv, bool accumulate) {
  const int64_t n = T * Hv, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t t = i / Hv, v = i - t * Hv;
    float acc[8], f[8];
    if (accumulate)
      unpack8(dx[i], acc);
    else
#pragma unroll
      for (int q = 0; q < 8; ++q) acc[q] = 0.0f;
    for (int j = 0; j < k; ++j) {
      const int32_t row = permuted_row[t * k + j];
      if (row < 0) continue;  // not here
      unpack8(dpermuted[int64_t(row) * Hv + v], f);
#pragma unroll
      for (int q = 0; q < 8; ++q) acc[q] += f[q];
    }
    dx[i] = pack8(acc);
  }
}

// y[t] = sum_j probs[t, j] * expert_out[row(t, j)] (+ addend[t]), fp32 in choice order, rounded once.
__global__ void moe_unpermute_forward_kernel(const uint4* __restrict__ expert_out,
                                             const int32_t* __restrict__ permuted_row, const float* __restrict__ probs,
                                             const uint4* __restrict__ addend, const uint4* __restrict__ residual,
                                             uint4* __restrict__ y, int64_t T, int k, int64_t Hv) {
  const int64_t n = T * Hv, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t t = i / Hv, v = i - t * Hv;
    float acc[8], f[8];
#pragma unroll
    for (int q = 0; q < 8; ++q) acc[q] = 0.0f;
    for (int j = 0; j < k; ++j) {
      const int32_t row = permuted_row[t * k + j];
      if (row < 0) continue;  // not here
      const float p = probs[t * k + j];
      unpack8(expert_out[int64_t(row) * Hv + v], f);
#pragma unroll
      for (int q = 0; q < 8; ++q) acc[q] += f[q] * p;
    }
    if (addend) {
      unpack8(addend[i], f);
#pragma unroll
      for (int q = 0; q < 8; ++q) acc[q] += f[q];
    }
    if (residual) {  // the branch rounded to bf16 first, as the separate residual add sees it
      float b[8];
      unpack8(pack8(acc), b);
      unpack8(residual[i], f);
#pragma unroll
      for (int q = 0; q < 8; ++q) acc[q] = f[q] + b[q];
    }
    y[i] = pack8(acc);
  }
}

// One warp per (t, j): dexpert_out[row] = probs[t, j] * dy[t] and dprobs[t, j] = <dy[t], expert_out[row]>
// (each lane's fp32 sum, then the warp's butterfly).
__global__ void moe_unpermute_backward_kernel(const uint4* __restrict__ expert_out,
                                              const int32_t* __restrict__ permuted_row,
                                              const float* __restrict__ probs, const uint4* __restrict__ dy,
                                              uint4* __restrict__ dexpert_out, float* __restrict__ dprobs, int64_t T,
                                              int k, int64_t Hv) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x >> 5);
  for (int64_t q = int64_t(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5); q < T * k; q += warps) {
    const int64_t t = q / k, r = permuted_row[q];
    if (r < 0) {  // not here: no row, no gradient
      if (dprobs && lane == 0) dprobs[q] = 0.0f;
      continue;
    }
    const float p = probs[q];
    float dot = 0.0f, gv[8], ov[8];
    for (int64_t v = lane; v < Hv; v += 32) {
      unpack8(dy[t * Hv + v], gv);
      if (dprobs) {
        unpack8(expert_out[r * Hv + v], ov);
#pragma unroll
        for (int i = 0; i < 8; ++i) dot += gv[i] * ov[i];
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) gv[i] *= p;
      dexpert_out[r * Hv + v] = pack8(gv);
    }
    if (dprobs) {
      dot = warp_sum(dot);
      if (lane == 0) dprobs[q] = dot;
    }
  }
}

// ---- host side

unsigned blocks_for(int64_t n, int64_t per_block = kThreads, int64_t cap = 65536) {
  const int64_t b = (n + per_block - 1) / per_block;
  return static_cast<unsigned>(b < cap ? (b > 0 ? b : 1) : cap);
}

void check_router(const char* op, int64_t T, const MoeRouterSpec& r) {
  const int64_t E = r.num_experts, k = r.topk;
  if (E < 1 || E > kMoeMaxExperts)
    throw Error(std::string(op) + ": num_experts must be in [1, " + std::to_string(kMoeMaxExperts) +
                "] (a token's scores are held in one warp's registers), got " + std::to_string(E));
  if (k < 1 || k > E)
    throw Error(std::string(op) + ": topk must be in [1, num_experts = " + std::to_string(E) + "], got " +
                std::to_string(k));
  if (T < 0 || T * k > int64_t(INT32_MAX))
    throw Error(std::string(op) + ": T * topk must be in [0, 2^31) (int32 indices), got T = " + std::to_string(T));
  if (r.sqrt_softplus && !r.sigmoid)
    throw Error(std::string(op) + ": sqrt_softplus is a sigmoid-like score function: set sigmoid too");
  const int64_t G = r.num_groups, g = r.group_topk;
  if ((G != 0 || g != 0) && (G < 1 || E % G != 0 || g < 1 || g > G || k < g || k > g * (E / G)))
    throw Error(std::string(op) + ": group-limited routing needs num_groups dividing the " + std::to_string(E) +
                " experts, 1 <= group_topk <= num_groups and group_topk <= topk <= group_topk * experts per group "
                "(got num_groups = " + std::to_string(G) + ", group_topk = " + std::to_string(g) + ")");
}

// Where the aux-loss statistics live: the token rows the losses' gradients differ by (one per
// sequence for seq_aux_loss, one for aux_loss alone, none without either) and their partials.
struct AuxLayout {
  int64_t rows = 0, span = 0, chunks = 0;  // chunks of kAuxChunk tokens per row
};

AuxLayout aux_layout(const char* op, int64_t T, const MoeAuxLossSpec& l) {
  AuxLayout a;
  if (l.seq_aux_coeff > 0.0f) {
    if (l.seq_length < 1 || T % l.seq_length != 0)
      throw Error(std::string(op) + ": seq_aux_loss needs a seq_length that divides the token count (T = " +
                  std::to_string(T) + ", seq_length = " + std::to_string(l.seq_length) + ")");
    a.rows = T / l.seq_length, a.span = l.seq_length;
  } else if ((l.aux_coeff > 0.0f || l.global_aux_coeff > 0.0f) && T > 0) {
    a.rows = 1, a.span = T;
  }
  a.chunks = (a.span + kAuxChunk - 1) / kAuxChunk;
  return a;
}

// Calls f(std::integral_constant<int, kPer>) with kPer = ceil(E / 32) rounded up to a power of two.
template <class F>
void with_slots(int64_t E, F&& f) {
  if (E <= 32)
    f(std::integral_constant<int, 1>{});
  else if (E <= 64)
    f(std::integral_constant<int, 2>{});
  else if (E <= 128)
    f(std::integral_constant<int, 4>{});
  else if (E <= 256)
    f(std::integral_constant<int, 8>{});
  else
    f(std::integral_constant<int, 16>{});
}

RouterArgs router_args(const MoeRouterSpec& r) {
  RouterArgs a{};
  a.E = static_cast<int>(r.num_experts), a.k = static_cast<int>(r.topk);
  a.sigmoid = r.sigmoid, a.pre_softmax = r.pre_softmax, a.sqrt_softplus = r.sqrt_softplus;
  a.scale = r.topk_scaling_factor != 0.0f ? r.topk_scaling_factor : 1.0f;
  return a;
}

void check_rows16(const char* op, int64_t H, std::initializer_list<const void*> ptrs) {
  if (H < 8 || H % 8 != 0)
    throw Error(std::string(op) + ": the hidden size must be a positive multiple of 8 (16-byte bf16 rows), got " +
                std::to_string(H));
  for (const void* p : ptrs)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0)
      throw Error(std::string(op) + ": bf16 buffers must be 16-byte aligned");
}

}  // namespace

void moe_random_logits(float* logits, int64_t n, const uint64_t* key, cudaStream_t stream) {
  if (n <= 0) return;
  moe_random_logits_kernel<<<blocks_for(n), kThreads, 0, stream>>>(logits, n, key);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

void moe_router_forward(const float* logits, int64_t T, const MoeRouterSpec& router, int32_t* topk_idx,
                        float* topk_probs, float* scores, float* lse, int32_t* tokens_per_expert, cudaStream_t stream,
                        const float* expert_bias, int32_t* aux_topk_idx, int32_t* aux_tokens_per_expert) {
  const char* op = "moe_router_forward";
  check_router(op, T, router);
  if (expert_bias && !router.sigmoid)
    throw Error("moe_router_forward: an expert bias needs the sigmoid or sqrtsoftplus router");
  if ((aux_topk_idx == nullptr) != (aux_tokens_per_expert == nullptr))
    throw Error("moe_router_forward: the aux losses' top-k needs both its choices and its counts");
  if (scores && (expert_bias || router.num_groups > 0) && !aux_topk_idx)
    throw Error("moe_router_forward: with an expert bias or group-limited routing the aux losses need their own "
                "top-k (aux_topk_idx, aux_tokens_per_expert)");
  LAOYAO_CUDA_CHECK(cudaMemsetAsync(tokens_per_expert, 0, sizeof(int32_t) * router.num_experts, stream));
  if (aux_tokens_per_expert)
    LAOYAO_CUDA_CHECK(cudaMemsetAsync(aux_tokens_per_expert, 0, sizeof(int32_t) * router.num_experts, stream));
  if (T == 0) return;
  RouterArgs a = router_args(router);
  a.bias = expert_bias;
  a.groups = static_cast<int>(router.num_groups), a.group_topk = static_cast<int>(router.group_topk);
  const unsigned blocks = blocks_for(T, kRouterWarps, kRouterMaxBlocks);
  with_slots(router.num_experts, [&](auto per) {
    moe_router_forward_kernel<decltype(per)::value><<<blocks, kRouterWarps * 32, 0, stream>>>(
        logits, T, a, topk_idx, topk_probs, scores, lse, tokens_per_expert, aux_topk_idx, aux_tokens_per_expert);
  });
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

void moe_accumulate_load(const int32_t* tokens_per_expert, int32_t* load, int64_t E, cudaStream_t stream) {
  if (E <= 0) return;
  accumulate_load_kernel<<<1, 512, 0, stream>>>(tokens_per_expert, load, static_cast<int>(E));
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

void moe_update_expert_bias(int32_t* load, float* bias, int64_t E, float rate, cudaStream_t stream) {
  if (E <= 0) return;
  update_expert_bias_kernel<<<1, 512, 0, stream>>>(load, bias, static_cast<int>(E), rate);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

size_t moe_aux_stats_floats(int64_t T, int64_t E, const MoeAuxLossSpec& losses) {
  const AuxLayout L = aux_layout("moe_aux_stats_floats", T, losses);
  // grad[rows][E], then the partial sums and counts [rows * chunks][E]; under context parallelism
  // the counts summed over the ranks, [rows + 1][E].
  const int64_t summed = losses.context_parallel_size > 1 && L.rows > 0 ? (L.rows + 1) * E : 0;
  return static_cast<size_t>(L.rows * E * (1 + 2 * L.chunks) + summed);
}

void moe_aux_losses_forward(const float* scores, const float* lse, const int32_t* topk_idx,
                            const int32_t* tokens_per_expert, int64_t T, const MoeRouterSpec& router,
                            const MoeAuxLossSpec& losses, float* stats, float* loss_sums, cudaStream_t stream,
                            const float* global_counts) {
  const char* op = "moe_aux_losses_forward";
  check_router(op, T, router);
  const AuxLayout L = aux_layout(op, T, losses);
  const bool aux = losses.aux_coeff > 0.0f, seq = losses.seq_aux_coeff > 0.0f, z = losses.z_coeff > 0.0f;
  const bool global = losses.global_aux_coeff > 0.0f && global_counts;
  if (T == 0 || !(aux || seq || z || global)) return;  // the CPU's losses are 0 without tokens
  if ((aux || seq || global) && (!scores || !stats))
    throw Error(std::string(op) + ": the aux losses need scores and stats");
  if (losses.data_parallel_size < 1)
    throw Error(std::string(op) + ": data_parallel_size must be at least 1");
  const int64_t cp = losses.context_parallel_size;
  if (cp < 1 || (cp > 1 && !losses.sum_over_context_parallel))
    throw Error(std::string(op) + ": context parallelism over " + std::to_string(cp) + " ranks needs the sum over them");
  if (z && !lse) throw Error(std::string(op) + ": the z-loss needs the logits' lse");
  const int64_t E = router.num_experts, k = router.topk;
  float* psum = stats + L.rows * E;
  float* pcount = psum + L.rows * L.chunks * E;
  float* summed = cp > 1 && L.rows > 0 ? pcount + L.rows * L.chunks * E : nullptr;
  if (L.rows > 0) {
    moe_aux_partials_kernel<<<dim3(unsigned(L.rows * L.chunks), unsigned((E + 31) / 32)), dim3(32, 8), 0, stream>>>(
        scores, topk_idx, E, static_cast<int>(k), L.span, L.chunks, psum, pcount);
    LAOYAO_CUDA_CHECK(cudaGetLastError());
  }
  if (summed) {  // every rank's tokens per expert (each rank's scores stay its own tokens')
    const int64_t n = (L.rows + 1) * E;
    moe_aux_counts_kernel<<<unsigned((n + 255) / 256), 256, 0, stream>>>(pcount, tokens_per_expert, E, L.rows,
                                                                        L.chunks, summed);
    LAOYAO_CUDA_CHECK(cudaGetLastError());
    losses.sum_over_context_parallel(summed, n, stream);
  }
  // The CPU's formulas: sum * E * coeff / (k * whole^2) / b (b = 1, whole = T * CP for aux_loss; a
  // sequence's whole length for seq_aux_loss), sum * coeff / (CP * T).
  AuxFinishArgs a{T, E, L.rows, L.chunks, aux, seq, z, global, 0.0, 0.0, 0.0, 0.0, summed};
  const double Ed = static_cast<double>(E), kd = static_cast<double>(k), Td = static_cast<double>(T),
               cpd = static_cast<double>(cp);
  if (aux) a.aux_unit = Ed * losses.aux_coeff / (kd * Td * cpd * Td * cpd);
  if (seq) {
    const double s = static_cast<double>(losses.seq_length) * cpd;
    a.seq_unit = Ed * losses.seq_aux_coeff / (kd * s * s) / static_cast<double>(L.rows);
  }
  if (z) a.z_unit = losses.z_coeff / cpd / Td;
  if (global) {  // E * coeff / (k * total^2), total = T * data_parallel_size
    const double total = Td * static_cast<double>(losses.data_parallel_size);
    a.global_unit = Ed * losses.global_aux_coeff / (kd * total * total);
  }
  moe_aux_finish_kernel<<<1, kFinishThreads, 0, stream>>>(psum, pcount, tokens_per_expert, global_counts, lse, a,
                                                          stats, loss_sums);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

void moe_global_counts_accumulate(const int32_t* counts, double* running, float* mean, int64_t E, int64_t steps,
                                  cudaStream_t stream) {
  if (E <= 0) return;
  if (steps < 1) throw Error("moe_global_counts_accumulate: steps must be at least 1");
  global_counts_kernel<<<1, 512, 0, stream>>>(counts, running, mean, static_cast<int>(E), static_cast<double>(steps));
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

void moe_router_backward(const float* logits, const int32_t* topk_idx, const float* dprobs, const float* lse,
                         const float* stats, int64_t T, const MoeRouterSpec& router, const MoeAuxLossSpec& losses,
                         float aux_scale, bf16* dlogits, cudaStream_t stream) {
  const char* op = "moe_router_backward";
  check_router(op, T, router);
  const AuxLayout L = aux_layout(op, T, losses);
  if (T == 0) return;
  const bool z = losses.z_coeff > 0.0f;
  if (L.rows > 0 && !stats) throw Error(std::string(op) + ": the aux losses need the forward's stats");
  if (z && !lse) throw Error(std::string(op) + ": the z-loss needs the forward's lse");
  RouterGradArgs g{L.rows > 0 ? stats : nullptr, L.span > 0 ? L.span : 1, aux_scale,
                   z ? 2.0 * losses.z_coeff / static_cast<double>(std::max<int64_t>(losses.context_parallel_size, 1)) *
                           aux_scale / static_cast<double>(T)
                     : 0.0};
  const RouterArgs a = router_args(router);
  const unsigned blocks = blocks_for(T, kRouterWarps, kRouterMaxBlocks);
  with_slots(router.num_experts, [&](auto per) {
    moe_router_backward_kernel<decltype(per)::value>
        <<<blocks, kRouterWarps * 32, 0, stream>>>(logits, topk_idx, dprobs, lse, T, a, g, dlogits);
  });
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

size_t moe_permutation_scratch_bytes(int64_t T, int64_t E) {
  const int64_t chunks = (T + kPermTokens - 1) / kPermTokens;
  return static_cast<size_t>(chunks * E) * sizeof(int32_t);  // per (expert, chunk): a count, then a first row
}

void moe_permutation(const int32_t* topk_idx, const int32_t* tokens_per_expert, int64_t T, int64_t E, int64_t k,
                     int32_t* offsets, int32_t* sorted_token, int32_t* permuted_row, void* scratch,
                     cudaStream_t stream) {
  // k may exceed E: the all-gather dispatcher sorts a token's k choices over this rank's El experts,
  // the others' ids -1.
  if (E < 1 || E > kMoeMaxExperts || k < 1 || T < 0 || T * k > int64_t(INT32_MAX))
    throw Error("moe_permutation: need 1 <= E <= " + std::to_string(kMoeMaxExperts) +
                ", k >= 1 and T * k < 2^31 (got E = " + std::to_string(E) + ", k = " + std::to_string(k) +
                ", T = " + std::to_string(T) + ")");
  if (T == 0) {  // offsets = 0 everywhere
    LAOYAO_CUDA_CHECK(cudaMemsetAsync(offsets, 0, sizeof(int32_t) * (E + 1), stream));
    return;
  }
  const int64_t chunks = (T + kPermTokens - 1) / kPermTokens;
  int32_t* counts = static_cast<int32_t*>(scratch);
  moe_perm_count_kernel<<<unsigned(chunks), kThreads, 0, stream>>>(topk_idx, T, int(k), int(E), chunks, counts);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
  moe_perm_scan_kernel<<<unsigned(E), kThreads, 0, stream>>>(tokens_per_expert, int(E), chunks, counts, offsets);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
  moe_perm_assign_kernel<<<unsigned((chunks + kPermWarps - 1) / kPermWarps), kPermWarps * 32, 0, stream>>>(
      topk_idx, T, int(k), int(E), chunks, counts, sorted_token, permuted_row);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

void moe_capacity_drop(const int32_t* topk_idx, const int32_t* offsets, const int32_t* sorted_token,
                       const int32_t* permuted_row, float* topk_probs, int64_t T, int64_t s, int64_t k,
                       int64_t capacity, bool by_position, uint8_t* kept, float* scratch, cudaStream_t stream,
                       int64_t shares) {
  const int64_t n = T * k;
  if (capacity < 0 || n >= (int64_t{1} << 31)) throw Error("moe_capacity_drop: a negative capacity or too many pairs");
  if (n <= 0) return;
  if (k < 1 || s < 1 || T % s != 0)
    throw Error("moe_capacity_drop: " + std::to_string(T) + " tokens are not whole sequences of " + std::to_string(s));
  if (shares < 1 || s % shares != 0)
    throw Error("moe_capacity_drop: " + std::to_string(shares) + " shares do not divide a sequence of " +
                std::to_string(s));
  moe_scatter_probs_kernel<<<blocks_for(n), kThreads, 0, stream>>>(topk_probs, permuted_row, scratch, n);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
  moe_capacity_kernel<<<blocks_for(n), kThreads, 0, stream>>>(topk_idx, offsets, sorted_token, permuted_row, scratch,
                                                               topk_probs, n, int(k), int(s), int(T / s),
                                                               int(shares), capacity, by_position, kept);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

void moe_mask_dropped(float* dprobs, const uint8_t* kept, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  moe_mask_dropped_kernel<<<blocks_for(n), kThreads, 0, stream>>>(dprobs, kept, n);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

void moe_permute_forward(const bf16* x, const int32_t* sorted_token, bf16* permuted, int64_t N, int64_t H,
                         cudaStream_t stream, const int32_t* rows_end) {
  check_rows16("moe_permute_forward", H, {x, permuted});
  if (N <= 0) return;
  const int64_t Hv = H / 8, rows_per_block = kThreads / 32, blocks = (N + rows_per_block - 1) / rows_per_block;
  if (blocks > int64_t(0x7fffffff)) throw Error("moe_permute_forward: too many rows for one launch");
  moe_permute_forward_kernel<<<unsigned(blocks), kThreads, 0, stream>>>(
      reinterpret_cast<const uint4*>(x), sorted_token, reinterpret_cast<uint4*>(permuted), N, rows_end, Hv);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

void moe_permute_backward(const bf16* dpermuted, const int32_t* permuted_row, bf16* dx, int64_t T, int64_t k,
                          int64_t H, bool accumulate, cudaStream_t stream) {
  check_rows16("moe_permute_backward", H, {dpermuted, dx});
  if (k < 1) throw Error("moe_permute_backward: topk must be >= 1");
  if (T <= 0) return;
  const int64_t Hv = H / 8;
  moe_permute_backward_kernel<<<blocks_for(T * Hv), kThreads, 0, stream>>>(
      reinterpret_cast<const uint4*>(dpermuted), permuted_row, reinterpret_cast<uint4*>(dx), T, int(k), Hv,
      accumulate);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

void moe_unpermute_forward(const bf16* expert_out, const int32_t* permuted_row, const float* probs,
                           const bf16* addend, bf16* y, int64_t T, int64_t k, int64_t H, cudaStream_t stream,
                           const bf16* residual) {
  check_rows16("moe_unpermute_forward", H, {expert_out, addend, y, residual});
  if (k < 1) throw Error("moe_unpermute_forward: topk must be >= 1");
  if (T <= 0) return;
  const int64_t Hv = H / 8;
  moe_unpermute_forward_kernel<<<blocks_for(T * Hv), kThreads, 0, stream>>>(
      reinterpret_cast<const uint4*>(expert_out), permuted_row, probs, reinterpret_cast<const uint4*>(addend),
      reinterpret_cast<const uint4*>(residual), reinterpret_cast<uint4*>(y), T, int(k), Hv);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

void moe_unpermute_backward(const bf16* expert_out, const int32_t* permuted_row, const float* probs, const bf16* dy,
                            bf16* dexpert_out, float* dprobs, int64_t T, int64_t k, int64_t H, cudaStream_t stream) {
  check_rows16("moe_unpermute_backward", H, {expert_out, dy, dexpert_out});
  if (k < 1) throw Error("moe_unpermute_backward: topk must be >= 1");
  if (T <= 0) return;
  const int64_t Hv = H / 8;
  moe_unpermute_backward_kernel<<<blocks_for(T * k * 32), kThreads, 0, stream>>>(
      reinterpret_cast<const uint4*>(expert_out), permuted_row, probs, reinterpret_cast<const uint4*>(dy),
      reinterpret_cast<uint4*>(dexpert_out), dprobs, T, int(k), Hv);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

}  // namespace laoyao::kernels::cuda
