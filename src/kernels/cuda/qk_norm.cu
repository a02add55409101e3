// QK layernorm (RMSNorm per q head and per k over head_dim) on the fused QKV rows, for BF16 (see
// qk_norm.hpp). Why its own kernels: the rows to normalise are short (D = 64 or 128) and strided
// inside the fused row, with v slots in between, so neither the hidden-width RMSNorm kernels nor a
// reshape serve; one pass over the fused buffer does the norm of q and k and the copy of v.
//
// The fused buffer is viewed as T * (H + 2G) rows of D contiguous values in memory order (per
// token: group 0's q heads, its k, its v, group 1's ...), so consecutive rows are consecutive
// memory. Each row is handled by kLanes lanes of a warp (D/8 rounded up to a power of two: 8 lanes
// for D = 64, 16 for D = 128, a whole warp for D = 256), each lane holding one 16-byte pack of 8 bf16
// in registers: one read of x (and dy), sums by shuffles inside the lane group, no block barrier
// in the row work. The weights (1 + gamma for zero-centred ones) are staged in shared memory as
// fp32, so their parameter offsets need no alignment.
//
// Weight gradients without atomics: every block of the backward owns a fixed chunk of tokens; each
// thread adds dy * xhat for its 8 columns over the rows it handles (q and k apart), the block sums
// its threads in a fixed order into one partial per chunk in `scratch`, and add_chunk_partials
// adds the chunks in a fixed order into the fp32 main grads. The same bits every run.
//
// With a RoPE table (rope_pack.cuh) the rotation of q and k joins the norm: the forward rotates the
// normalised values before their one rounding, the backward applies the transpose rotation to dy
// as it loads it. One pass over the fused rows instead of two each way.
#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>

#include "core/error.hpp"
#include "kernels/cuda/chunk_reduce.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/qk_norm.hpp"
#include "kernels/cuda/rope_pack.cuh"

namespace laoyao::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kThreads = 256;             // threads per block (a multiple of 32)
constexpr int kMaxD = 256;                // 32 lanes x 8 values
// Tokens per block of the backward (one weight-gradient partial each): 8, not 16, so that the
// flagship's 8192 tokens make 2.6 waves of short blocks rather than 1.3 of long ones.
constexpr int64_t kTokensPerChunk = 8;

struct alignas(16) Pack8 {
  bf16 v[8];
};

// Sum over the kLanes lanes of one row's group (groups are aligned to kLanes inside the warp, so
// xor offsets below kLanes stay inside the group). Every lane of the warp must call it.
template <int kLanes>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int o = kLanes / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The effective weights in fp32: sg[0] q, sg[1] k. Ends with a barrier.
__device__ __forceinline__ void stage_gammas(float (*sg)[kMaxD], const bf16* __restrict__ q_gamma,
                                             const bf16* __restrict__ k_gamma, int D, bool zero_centered) {
  for (int i = threadIdx.x; i < D; i += blockDim.x) {
    const float q = __bfloat162float(q_gamma[i]), k = __bfloat162float(k_gamma[i]);
    sg[0][i] = zero_centered ? 1.0f + q : q;
    sg[1][i] = zero_centered ? 1.0f + k : k;
  }
  __syncthreads();
}

// What fused row `row` (of T * slots) is: kind 0 a q head, 1 a k, 2 a v; stat its index in rstd;
// split its row in QkvRows::Split (T the tokens).
struct RowKind {
  int kind;
  int64_t stat, token, split;
};

// In 32-bit arithmetic (the host checks that T * slots fits): a 64-bit division is a long
// software sequence, and these kernels do one or two a row.
__device__ __forceinline__ RowKind row_kind(int64_t row, int H, int G, int64_t T) {
  const unsigned Q = unsigned(H / G), slots = unsigned(G) * (Q + 2u);
  const unsigned r = unsigned(row), t = r / slots, s = r - t * slots, g = s / (Q + 2u), j = s - g * (Q + 2u);
  if (j < Q) return {0, int64_t(t) * (H + G) + g * Q + j, int64_t(t), int64_t(t) * H + g * Q + j};
  return {j == Q ? 1 : 2, int64_t(t) * (H + G) + H + g, int64_t(t),
          T * H + 2 * (int64_t(t) * G + g) + (j - Q)};
}

// Where a row sits in the layout kSplit names.
template <bool kSplit>
__device__ __forceinline__ int64_t placed(int64_t row, const RowKind& k) {
  return kSplit ? k.split : row;
}

// A token's position in its sequence of s (32-bit, as row_kind).
__device__ __forceinline__ int64_t position_of(int64_t token, int64_t s) { return unsigned(token) % unsigned(s); }

// y = x * rstd * gamma for q and k rows (then rotated with kRope); v rows copied (unless out ==
// qkv). qkv and out may alias (not with kSplit: out is then in QkvRows::Split).
template <int kLanes, bool kRope, bool kSplit>
__global__ void __launch_bounds__(kThreads)
    qk_rmsnorm_forward_kernel(const bf16* qkv, const bf16* __restrict__ q_gamma, const bf16* __restrict__ k_gamma,
                              bf16* out, float* __restrict__ rstd, int64_t T, int H, int G, int D, float eps,
                              bool zero_centered, RopeDeviceTable rope, int64_t s) {
  const int64_t rows = T * (H + 2 * G);
  __shared__ float sg[2][kMaxD];
  const int lane = threadIdx.x % kLanes, packs = D / 8;
  const int64_t row = int64_t(blockIdx.x) * (kThreads / kLanes) + threadIdx.x / kLanes;
  const bool live = row < rows && lane < packs;
  Pack8 xv{};
  if (live) xv = reinterpret_cast<const Pack8*>(qkv + row * D)[lane];  // on its way during the staging
  stage_gammas(sg, q_gamma, k_gamma, D, zero_centered);
  float sq = 0.0f;
  if (live) {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float x = __bfloat162float(xv.v[e]);
      sq += x * x;
    }
  }
  const float r = 1.0f / sqrtf(group_sum<kLanes>(sq) / float(D) + eps);  // every lane: the shuffle needs them all
  if (row >= rows) return;
  const RowKind k = row_kind(row, H, G, T);
  bf16* dst = out + placed<kSplit>(row, k) * D;
  if (k.kind == 2) {  // v passes through
    if (live && (kSplit || out != qkv)) reinterpret_cast<Pack8*>(dst)[lane] = xv;
    return;
  }
  if (lane == 0) rstd[k.stat] = r;
  float v[8] = {};
  if (live) {
    const float* g = sg[k.kind] + lane * 8;
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = __bfloat162float(xv.v[e]) * r * g[e];
  }
  if (kRope)
    rope_pack<kLanes, false>(v, lane, group_mask<kLanes>(int(threadIdx.x & 31)), rope, position_of(k.token, s));
  if (!live) return;
  Pack8 y;
#pragma unroll
  for (int e = 0; e < 8; ++e) y.v[e] = __float2bfloat16(v[e]);
  reinterpret_cast<Pack8*>(dst)[lane] = y;
}

// dx = rstd * (g*dy - xhat * mean(g*dy*xhat)) for q and k rows (dy first rotated back with
// kRope), v rows passed through (unless in place); per-chunk partials of sum dy*xhat per column
// into partial[chunk][2][D] (q then k). dout and dqkv may alias: each row is read whole before it
// is written, and rows are disjoint (not with kSplit: dout is then in QkvRows::Split).
// Four blocks an SM (64 registers, a few spilled with RoPE): 80 registers held it to three, and
// Nsight Compute found it latency-bound (0.058 -> 0.056 ms at the flagship's shape).
template <int kLanes, bool kRope, bool kSplit>
__global__ void __launch_bounds__(kThreads, 4)
    qk_rmsnorm_backward_kernel(const bf16* dout, const bf16* __restrict__ qkv, const bf16* __restrict__ q_gamma,
                               const bf16* __restrict__ k_gamma, const float* __restrict__ rstd, bf16* dqkv,
                               float* __restrict__ partial, int64_t T, int H, int G, int D, bool zero_centered,
                               RopeDeviceTable rope, int64_t s) {
  constexpr int kGroups = kThreads / kLanes;  // rows in flight per block
  __shared__ float sg[2][kMaxD];
  __shared__ float red[2][kGroups][kLanes * 8];
  stage_gammas(sg, q_gamma, k_gamma, D, zero_centered);
  const int lane = threadIdx.x % kLanes, grp = threadIdx.x / kLanes, packs = D / 8;
  const int slots = H + 2 * G;
  const int64_t chunk = blockIdx.x, t0 = chunk * kTokensPerChunk;
  const int64_t t1 = t0 + kTokensPerChunk < T ? t0 + kTokensPerChunk : T;
  const int64_t row0 = t0 * slots, nrows = (t1 - t0) * slots;
  float accq[8], acck[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) accq[e] = acck[e] = 0.0f;
  // Every thread runs the same number of iterations (the shuffle needs the whole warp).
  for (int64_t base = 0; base < nrows; base += kGroups) {
    const bool live_row = base + grp < nrows;
    const int64_t row = row0 + base + grp;
    const RowKind k = live_row ? row_kind(row, H, G, T) : RowKind{2, 0, 0, 0};
    const bool live = live_row && lane < packs, norm = live && k.kind < 2;
    Pack8 xv{}, dv{};
    float r = 0.0f, s2 = 0.0f, d[8];
    // The row's loads together: one trip to memory per row.
    if (live) dv = reinterpret_cast<const Pack8*>(dout + placed<kSplit>(row, k) * D)[lane];
    if (norm) {
      xv = reinterpret_cast<const Pack8*>(qkv + row * D)[lane];
      r = rstd[k.stat];
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) d[e] = __bfloat162float(dv.v[e]);
    // The group's row is a q or k row (or not) for all its lanes alike, as the shuffle needs.
    if (kRope && live_row && k.kind < 2)
      rope_pack<kLanes, true>(d, lane, group_mask<kLanes>(int(threadIdx.x & 31)), rope, position_of(k.token, s));
    if (norm) {
      const float* g = sg[k.kind] + lane * 8;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float xhat = __bfloat162float(xv.v[e]) * r;
        s2 += d[e] * g[e] * xhat;
        if (k.kind == 0)
          accq[e] += d[e] * xhat;
        else
          acck[e] += d[e] * xhat;
      }
    }
    const float b = group_sum<kLanes>(s2) / float(D);
    if (norm) {
      const float* g = sg[k.kind] + lane * 8;
      Pack8 dx;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float xhat = __bfloat162float(xv.v[e]) * r;
        dx.v[e] = __float2bfloat16(r * (d[e] * g[e] - xhat * b));
      }
      reinterpret_cast<Pack8*>(dqkv + row * D)[lane] = dx;
    } else if (live && (kSplit || dqkv != dout)) {  // v's gradient passes through
      reinterpret_cast<Pack8*>(dqkv + row * D)[lane] = dv;
    }
  }
  // The block's partial: threads (row groups) summed in group order, per column.
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    red[0][grp][lane * 8 + e] = accq[e];
    red[1][grp][lane * 8 + e] = acck[e];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < 2 * D; i += kThreads) {
    const int which = i / D, c = i - which * D;
    float s = 0.0f;
    for (int gi = 0; gi < kGroups; ++gi) s += red[which][gi][c];
    partial[chunk * 2 * D + i] = s;
  }
}

int64_t chunks_for(int64_t T) { return (T + kTokensPerChunk - 1) / kTokensPerChunk; }

// Lanes per row for head dim D, after checking the shapes and pointers; throws laoyao::Error.
int lanes_for(const char* op, int64_t T, int64_t H, int64_t G, int64_t D, std::initializer_list<const void*> rows) {
  if (D <= 0 || D % 8 != 0 || D > kMaxD)
    throw Error(std::string(op) + ": head dim D = " + std::to_string(D) +
                " is not supported (a multiple of 8 up to " + std::to_string(kMaxD) + ")");
  if (H <= 0 || G <= 0 || H % G != 0 || H + 2 * G > int64_t(1) << 30)
    throw Error(std::string(op) + ": num_attention_heads (" + std::to_string(H) +
                ") must be a positive multiple of num_query_groups (" + std::to_string(G) + ")");
  for (const void* p : rows)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0)
      throw Error(std::string(op) + ": the fused QKV rows must be 16-byte aligned");
  if (T * (H + 2 * G) > int64_t(0xffffffff))  // row_kind's 32-bit arithmetic
    throw Error(std::string(op) + ": " + std::to_string(T) + " tokens of " + std::to_string(H + 2 * G) +
                " head rows each are more rows than one launch handles (2^32)");
  int lanes = 1;
  while (lanes < D / 8) lanes *= 2;
  return lanes;
}

// The table the kernels get (rot_dim 0: no rotation), after checking that the pack path serves it.
RopeDeviceTable rope_for(const char* op, const RopeDeviceTable* rope, int64_t s, int64_t D) {
  if (!rope || rope->rot_dim == 0) return RopeDeviceTable{};
  if (!rope_packable(*rope) || rope->rot_dim > D || s <= 0 || s > rope->max_positions)
    throw Error(std::string(op) + ": RoPE with rot_dim " + std::to_string(rope->rot_dim) + " at sequence length " +
                std::to_string(s) + " cannot join the QK norm of head dim " + std::to_string(D) +
                " (rot_dim at most the head dim, rot_dim / 2 a multiple of 8, 16-byte aligned tables, s within "
                "the table's " + std::to_string(rope->max_positions) + " positions)");
  return *rope;
}

// Calls f(std::integral_constant<int, L>{}) for the lanes a row takes (lanes_for's power of two).
template <typename F>
void with_lanes(int lanes, F&& f) {
  switch (lanes) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 8: f(std::integral_constant<int, 8>{}); break;
    case 16: f(std::integral_constant<int, 16>{}); break;
    default: f(std::integral_constant<int, 32>{}); break;
  }
}

// Calls f(rope, split) as compile-time booleans.
template <typename F>
void with_flags(bool rope, bool split, F&& f) {
  if (rope && split) f(std::true_type{}, std::true_type{});
  else if (rope) f(std::true_type{}, std::false_type{});
  else if (split) f(std::false_type{}, std::true_type{});
  else f(std::false_type{}, std::false_type{});
}

}  // namespace

void qk_rmsnorm_forward(const bf16* qkv, const bf16* q_gamma, const bf16* k_gamma, bf16* out, float* rstd, int64_t T,
                        int64_t H, int64_t G, int64_t D, float eps, bool zero_centered_gamma, cudaStream_t stream,
                        const RopeDeviceTable* rope, int64_t s, QkvRows out_layout) {
  const int lanes = lanes_for("qk_rmsnorm_forward", T, H, G, D, {qkv, out});
  const RopeDeviceTable rt = rope_for("qk_rmsnorm_forward", rope, s, D);
  const bool split = out_layout == QkvRows::Split;
  if (split && out == qkv) throw Error("qk_rmsnorm_forward: the split layout cannot be written in place");
  if (T <= 0) return;
  const int64_t rows = T * (H + 2 * G);
  with_lanes(lanes, [&](auto lanes_c) {
    constexpr int kLanes = decltype(lanes_c)::value;
    const int64_t blocks = (rows + kThreads / kLanes - 1) / (kThreads / kLanes);
    if (blocks > int64_t(0x7fffffff)) throw Error("qk_rmsnorm_forward: too many rows for one launch");
    with_flags(rt.rot_dim > 0, split, [&](auto rope_c, auto split_c) {
      qk_rmsnorm_forward_kernel<kLanes, decltype(rope_c)::value, decltype(split_c)::value>
          <<<unsigned(blocks), kThreads, 0, stream>>>(qkv, q_gamma, k_gamma, out, rstd, T, int(H), int(G), int(D),
                                                      eps, zero_centered_gamma, rt, rt.rot_dim > 0 ? s : 1);
    });
  });
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

size_t qk_rmsnorm_backward_scratch_floats(int64_t T, int64_t H, int64_t G, int64_t D) {
  (void)H, (void)G;  // one partial per chunk of tokens, whatever the head counts
  return T <= 0 || D <= 0 ? 0 : size_t(chunks_for(T)) * 2 * size_t(D);
}

void qk_rmsnorm_backward(const bf16* dout, const bf16* qkv, const bf16* q_gamma, const bf16* k_gamma,
                         const float* rstd, bf16* dqkv, float* dq_gamma, float* dk_gamma, float* scratch, int64_t T,
                         int64_t H, int64_t G, int64_t D, bool zero_centered_gamma, cudaStream_t stream,
                         const RopeDeviceTable* rope, int64_t s, QkvRows dout_layout) {
  const int lanes = lanes_for("qk_rmsnorm_backward", T, H, G, D, {dout, qkv, dqkv});
  const RopeDeviceTable rt = rope_for("qk_rmsnorm_backward", rope, s, D);
  const bool split = dout_layout == QkvRows::Split;
  if (split && dqkv == dout) throw Error("qk_rmsnorm_backward: the split layout cannot be read in place");
  if (T <= 0) return;
  const int64_t chunks = chunks_for(T);
  if (chunks > int64_t(0x7fffffff)) throw Error("qk_rmsnorm_backward: too many tokens for one launch");
  with_lanes(lanes, [&](auto lanes_c) {
    with_flags(rt.rot_dim > 0, split, [&](auto rope_c, auto split_c) {
      qk_rmsnorm_backward_kernel<decltype(lanes_c)::value, decltype(rope_c)::value, decltype(split_c)::value>
          <<<unsigned(chunks), kThreads, 0, stream>>>(dout, qkv, q_gamma, k_gamma, rstd, dqkv, scratch, T, int(H),
                                                      int(G), int(D), zero_centered_gamma, rt,
                                                      rt.rot_dim > 0 ? s : 1);
    });
  });
  LAOYAO_CUDA_CHECK(cudaGetLastError());
  add_chunk_partials(scratch, dq_gamma, dk_gamma, chunks, D, stream);
}

}  // namespace laoyao::kernels::cuda
