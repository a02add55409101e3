// CPU reference ops (fp32, multi-threaded, OpenBLAS for GEMMs): the numerics every other backend
// is checked against. Each op has a naive fp64 twin in tests/kernels_cpu and its backward is
// checked by finite differences.
//
// Conventions: activations are row-major [T, C] with T = b*s tokens, token t = batch*s + position
// (batch-major; Megatron's [s, b, h] order changes nothing numerically). Weights are stored as
// Megatron/torch store them: a linear's weight is [out, in]. Backward functions ACCUMULATE (+=)
// into parameter gradients, and OVERWRITE input gradients unless stated otherwise.
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "kernels/cpu/yarn.hpp"

namespace laoyao::kernels::cpu {

// ---- linear: y[T,N] = x[T,K] @ w[N,K]^T (+ bias[N])
void linear_forward(const float* x, const float* w, const float* bias, float* y, int64_t T, int64_t K, int64_t N);
// dx[T,K] = dy @ w (overwrite; nullptr to skip); dw[N,K] += dy^T @ x; dbias[N] += sum_t dy (nullptr to skip).
void linear_backward(const float* x, const float* w, const float* dy, float* dx, float* dw, float* dbias,
                     int64_t T, int64_t K, int64_t N);
// y[T,N] += alpha * x[T,K] @ w[N,K]^T.
void linear_accumulate(const float* x, const float* w, float* y, int64_t T, int64_t K, int64_t N, float alpha);
// dw[N,K] += alpha * dy^T @ x (nullptr to skip), then dx[T,K] = alpha * dy @ w, or += with
// accumulate_dx (nullptr to skip; dx may be x, read before it is written).
void linear_backward_scaled(const float* x, const float* w, const float* dy, float* dx, float* dw, int64_t T,
                            int64_t K, int64_t N, float alpha, bool accumulate_dx);

// ---- FP8 linear layers, as cuBLASLt multiplies per-tensor scaled FP8 operands (core/fp8_scaling.hpp):
// an operand is its FP8 values (exact as floats, unscaled) and the factor that dequantizes them
// (scale_inv = 1 / the cast's scale); products are exact, sums fp32, the factors applied after.
// Under block scaling an operand's values are already dequantized block by block (scale_inv 1):
// its scales are powers of two, so the products are the same.
struct Fp8Operand {
  const float* q = nullptr;
  float scale_inv = 1.0f;
};
// The output gradient's operands: the data gradient's and the weight gradient's, one cast under the
// per-tensor recipes; under block scaling two, the weight gradient's in blocks along the tokens.
struct Fp8GradOperands {
  Fp8Operand dgrad, wgrad;
};
// y[T,N] = x.scale_inv * w.scale_inv * (x.q @ w.q^T) (+ bias[N]).
void fp8_linear_forward(Fp8Operand x, Fp8Operand w, const float* bias, float* y, int64_t T, int64_t K, int64_t N);
// dx[T,K] = dy.dgrad.scale_inv * w.scale_inv * (dy.dgrad.q @ w.q) (overwrite; nullptr to skip) and
// dw[N,K] += dy.wgrad.scale_inv * x.scale_inv * (dy.wgrad.q^T @ x.q) (nullptr to skip): the data and
// weight gradient GEMMs (a bias's gradient is the high-precision dy's, linear_backward's).
void fp8_linear_backward(Fp8Operand x, Fp8Operand w, Fp8GradOperands dy, float* dx, float* dw, int64_t T, int64_t K,
                         int64_t N);

// ---- norms over the last dimension C, statistics in fp32. mean/rstd [T] are saved for backward.
// zero_centered_gamma (Megatron --apply-layernorm-1p): the stored gamma is used as (1 + gamma).
void layernorm_forward(const float* x, const float* gamma, const float* beta, float* y, float* mean, float* rstd,
                       int64_t T, int64_t C, float eps, bool zero_centered_gamma);
// dx overwritten; dgamma, dbeta accumulated.
void layernorm_backward(const float* dy, const float* x, const float* gamma, const float* mean, const float* rstd,
                        float* dx, float* dgamma, float* dbeta, int64_t T, int64_t C, bool zero_centered_gamma);
// RMSNorm: y = x / sqrt(mean(x^2) + eps) * gamma; rstd [T] saved.
void rmsnorm_forward(const float* x, const float* gamma, float* y, float* rstd, int64_t T, int64_t C, float eps,
                     bool zero_centered_gamma);
void rmsnorm_backward(const float* dy, const float* x, const float* gamma, const float* rstd, float* dx,
                      float* dgamma, int64_t T, int64_t C, bool zero_centered_gamma);

// ---- activations (elementwise over n values)
enum class Gelu { Tanh, Erf };  // Tanh: Megatron's fused bias_gelu (0.79788456, 0.044715); Erf: F.gelu
void gelu_forward(const float* x, float* y, int64_t n, Gelu kind);
void gelu_backward(const float* x, const float* dy, float* dx, int64_t n, Gelu kind);  // dx overwritten
// SwiGLU on Megatron's linear_fc1 output: x[T, 2F] = [gate | linear]; y[T, F] = silu(gate) * linear.
void swiglu_forward(const float* x, float* y, int64_t T, int64_t F);
void swiglu_backward(const float* x, const float* dy, float* dx, int64_t T, int64_t F);  // dx[T, 2F] overwritten

// ---- causal self-attention on Megatron-Core's fused QKV layout.
// qkv[T, G*(H/G + 2)*D]: per token, G query groups each laid out [q (H/G heads x D), k (D), v (D)]
// (MHA, G = H: q0 k0 v0 q1 k1 v1 ...). ctx[T, H*D]: heads concatenated in head order.
// probs[b, H, s, s]: the softmax probabilities, saved for backward (this reference keeps the
// S x S matrix; the CUDA backend does not). Scores are scaled by `scale` (1/sqrt(D)); a key after
// the query is masked (Megatron fills -10000.0; in fp32 that is exactly a zero probability).
// Query head h reads the k/v of group h / (H/G) (GQA without materialising repeated k/v).
// H must be a positive multiple of G (checked: laoyao::Error).
// dropout_mask (nullable) [b, H, s, s] holds 0 or 1/(1-p): attention dropout on the probabilities
// (ctx = (probs * mask) V); probs keeps the undropped softmax, which backward needs.
// key_start (nullable) [b, s]: the first key each query may attend (--reset-attention-mask: the
// position after the last EOD before the query, so attention stays inside each document of a
// packed sequence; Megatron masks keys before it as it masks the future). Null: 0 (plain causal).
// Each entry must lie in [0, i] for query i (checked: laoyao::Error).
void attention_forward(const float* qkv, float* ctx, float* probs, int64_t b, int64_t s, int64_t H, int64_t G,
                       int64_t D, float scale, const float* dropout_mask = nullptr,
                       const int32_t* key_start = nullptr);
// dqkv[T, G*(H/G+2)*D] overwritten.
void attention_backward(const float* qkv, const float* probs, const float* dctx, float* dqkv, int64_t b, int64_t s,
                        int64_t H, int64_t G, int64_t D, float scale, const float* dropout_mask = nullptr,
                        const int32_t* key_start = nullptr);

// ---- a context-parallel rank's attention (fused QKV rows): its s queries of each sequence (rows of
// qkv [b*s, row]) against the whole sequence's keys and values (qkv_full [b*sk, row], every rank's
// rows in sequence order); query t sees keys 0 .. query_positions[t] (its place in the sequence,
// causal), or with documents key_start[t] (its document's first place, nullable) ..
// query_positions[t]. probs [b, H, s, sk]; dropout_mask (null: none) the same shape. The
// backward overwrites dqkv (the q slots;
// k and v slots zero) and dqkv_full (the k and v slots this rank's queries give every key; q slots
// zero): the ranks' dqkv_full summed, each rank adds its rows to its dqkv.
void context_parallel_attention_forward(const float* qkv, const float* qkv_full, float* ctx, float* probs, int64_t b,
                                        int64_t s, int64_t sk, int64_t H, int64_t G, int64_t D, float scale,
                                        const int32_t* query_positions, const float* dropout_mask = nullptr,
                                        const int32_t* key_start = nullptr);
void context_parallel_attention_backward(const float* qkv, const float* qkv_full, const float* probs,
                                         const float* dctx, float* dqkv, float* dqkv_full, int64_t b, int64_t s,
                                         int64_t sk, int64_t H, int64_t G, int64_t D, float scale,
                                         const int32_t* query_positions, const float* dropout_mask = nullptr,
                                         const int32_t* key_start = nullptr);

// ---- the same attention on separate q [T, H*Dqk], k [T, H*Dqk], v [T, H*Dv] (one k and v per
// head) into ctx [T, H*Dv]: multi-latent attention's, whose q/k and v head dims differ. probs,
// dropout_mask and key_start as above; the backward overwrites dq, dk, dv (shaped as q, k, v).
void separate_attention_forward(const float* q, const float* k, const float* v, float* ctx, float* probs, int64_t b,
                                int64_t s, int64_t H, int64_t Dqk, int64_t Dv, float scale,
                                const float* dropout_mask = nullptr, const int32_t* key_start = nullptr);
void separate_attention_backward(const float* q, const float* k, const float* v, const float* probs, const float* dctx,
                                 float* dq, float* dk, float* dv, int64_t b, int64_t s, int64_t H, int64_t Dqk,
                                 int64_t Dv, float scale, const float* dropout_mask = nullptr,
                                 const int32_t* key_start = nullptr);
// Its context-parallel form (as context_parallel_attention above): this rank's s queries of each
// sequence (q [b*s, H*Dqk]) against the whole sequence's keys and values (k_full [b*sk, H*Dqk],
// v_full [b*sk, H*Dv], every rank's rows in sequence order), query t seeing keys 0 (key_start[t]
// with documents) .. query_positions[t]; probs [b, H, s, sk]. The backward overwrites dq (this rank's queries) and
// dk_full, dv_full (what this rank's queries give every key and value: the ranks' summed).
void context_parallel_separate_attention_forward(const float* q, const float* k_full, const float* v_full, float* ctx,
                                                 float* probs, int64_t b, int64_t s, int64_t sk, int64_t H,
                                                 int64_t Dqk, int64_t Dv, float scale, const int32_t* query_positions,
                                                 const float* dropout_mask = nullptr, const int32_t* key_start = nullptr);
void context_parallel_separate_attention_backward(const float* q, const float* k_full, const float* v_full,
                                                  const float* probs, const float* dctx, float* dq, float* dk_full,
                                                  float* dv_full, int64_t b, int64_t s, int64_t sk, int64_t H,
                                                  int64_t Dqk, int64_t Dv, float scale, const int32_t* query_positions,
                                                  const float* dropout_mask = nullptr,
                                                  const int32_t* key_start = nullptr);

// ---- rotary position embedding (Megatron-Core RotaryEmbedding + _apply_rotary_pos_emb_bshd,
// non-interleaved "rotate_half" form), applied to the q heads and k of the fused QKV rows above.
// Megatron's fields and defaults (RotaryEmbedding / GPTModel / Bridge GPTModelProvider):
// rotary_base 10000, rotary_percent 1.0, rope_scaling False with rope_scaling_factor 8.0 (the
// Bridge provider's field default is 1.0; recipes that turn scaling on set it, e.g. Llama 3.2: 32),
// Llama 3.1 scaling constants low_freq_factor 1, high_freq_factor 4, original max positions 8192
// (fixed in Megatron's _apply_scaling; fields here so a caller can state them), and
// seq_len_interpolation_factor None.
struct RopeParams {
  double rotary_base = 10000.0;
  double rotary_percent = 1.0;
  bool rope_scaling = false;  // Llama 3.x frequency scaling (--use-rope-scaling)
  double rope_scaling_factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  double original_max_position_embeddings = 8192.0;
  std::optional<double> seq_len_interpolation_factor;  // linear interpolation: position / factor
  // YaRN instead of the plain (or Llama 3) frequencies: then dim is the whole kv_channels
  // (rotary_percent and seq_len_interpolation_factor are not read, as YarnRotaryEmbedding's
  // get_emb does not) and cos and sin are scaled by yarn_concentration_factor.
  std::optional<YarnParams> yarn;
};

// The fp32 tables Megatron builds, with every torch op's fp32 rounding reproduced (rope.cpp says
// which). dim = int(kv_channels * rotary_percent) if rotary_percent < 1 else kv_channels;
// inv_freq[i] = 1 / base^(2i / dim) for 2i < dim (then Llama 3 scaling); rot_dim = 2 * inv_freq
// count (= dim when dim is even; Megatron's arange(0, dim, 2) gives dim + 1 for an odd dim).
// The leading rot_dim values of each head rotate, values [rot_dim, D) pass through unchanged.
// cos/sin [max_positions, rot_dim / 2] hold cos/sin(angle[p, i]) with angle = fp32(position'
// * inv_freq[i]) (position' = p, or fl32(p * fl32(1 / interpolation factor))). Megatron's
// emb = cat(freqs, freqs), so column i serves both dims i and i + rot_dim / 2 of a head.
struct RopeTable {
  int64_t kv_channels = 0, dim = 0, rot_dim = 0, max_positions = 0;
  std::vector<float> inv_freq;  // [rot_dim / 2], as Megatron holds RotaryEmbedding.inv_freq
  std::vector<float> cos, sin;  // [max_positions, rot_dim / 2]
};
// Positions 0 .. max_positions - 1. Bad parameters (kv_channels or max_positions < 1 or a
// rotary_percent that leaves no dims, rot_dim > kv_channels, base <= 0, scaling factors that
// are not positive or high == low, an interpolation factor <= 0) throw laoyao::Error.
RopeTable rope_table(int64_t kv_channels, int64_t max_positions, const RopeParams& params);

// In place on qkv[T, G*(H/G + 2)*D] (the fused layout of attention_forward): every q head and
// every group's k of token t is rotated by the angles of position positions[t]; v untouched.
// Per head x (D values), half = rot_dim / 2, i < half:
//   out[i]        = x[i] * cos[p,i] - x[i + half] * sin[p,i]
//   out[i + half] = x[i + half] * cos[p,i] + x[i] * sin[p,i]
// i.e. x * cat(cos, cos) + rotate_half(x) * cat(sin, sin), rotate_half(x) = cat(-x2, x1).
// In Megatron pretraining the positions are 0 .. s-1 within each sequence (token t = batch*s +
// position gives positions[t] = t % s); the model ignores position_ids for RoPE.
// Throws laoyao::Error (before writing) for a position outside [0, table.max_positions),
// table.rot_dim > D, or H not a positive multiple of G.
void rope_forward_qkv(float* qkv, const int64_t* positions, const RopeTable& table, int64_t T, int64_t H, int64_t G,
                      int64_t D);
// In place on the gradient dqkv[T, row]: the transpose rotation of the q and k slots
// (dx[i] = dy[i] cos + dy[i + half] sin, dx[i + half] = dy[i + half] cos - dy[i] sin); the
// pass-through dims and the v slots are the identity, so they are left as they are.
void rope_backward_qkv(float* dqkv, const int64_t* positions, const RopeTable& table, int64_t T, int64_t H, int64_t G,
                       int64_t D);

// ---- multi-latent attention's query, key and value (kernels/cpu/mla.cpp says how, as Megatron-Core's
// MLASelfAttention builds them): from q [T, H*(dqk+dr)] (linear_q_proj / linear_q_up_proj), kv
// [T, H*(dqk+dv)] (linear_kv_up_proj) and k_pe (rows of k_pe_ld floats: linear_kv_down_proj's last
// dr columns), query and key [T, H*(dqk+dr)] = [no-pe part, RoPE'd part] per head (k's RoPE'd part
// shared by every head), value [T, H*dv]. The RoPE is MLA's interleaved form with the table's
// angles (rot_dim <= dr; the rest passes through). Positions outside the table: laoyao::Error.
void mla_qkv_forward(const float* q, const float* kv, const float* k_pe, int64_t k_pe_ld, const int64_t* positions,
                     const RopeTable& table, float* query, float* key, float* value, int64_t T, int64_t H, int64_t dqk,
                     int64_t dr, int64_t dv);
// Overwrites dq, dkv and dk_pe (its dr columns of each row of dk_pe_ld floats; the heads' sum).
void mla_qkv_backward(const float* dquery, const float* dkey, const float* dvalue, const int64_t* positions,
                      const RopeTable& table, float* dq, float* dkv, float* dk_pe, int64_t dk_pe_ld, int64_t T,
                      int64_t H, int64_t dqk, int64_t dr, int64_t dv);

// ---- QK layernorm (Megatron --qk-layernorm with RMSNorm, as Qwen3): each q head and each k of
// the fused rows is RMS-normalised over its own D (= kv_channels) values, eps = layernorm_epsilon,
// with weights q_gamma[D] (self_attention.q_layernorm.weight) shared by all q heads and k_gamma[D]
// (self_attention.k_layernorm.weight) shared by all groups' k. Megatron applies it right after the
// QKV split, BEFORE RoPE. y = x * rstd * gamma (zero_centered_gamma: 1 + gamma), rstd in fp32
// from a double sum of squares, as rmsnorm_forward.
// Out of place, because backward needs the un-normalised values (recovering them from the output
// would divide by gamma): out[T, row] receives the normalised q/k and a copy of v, a complete fused
// row for rope_forward_qkv (in place) and attention. qkv must stay alive for backward; out == qkv
// is allowed only when no backward follows. rstd[T, H + G] is saved: rstd[t*(H+G) + h] for q head
// h, rstd[t*(H+G) + H + g] for group g's k.
// Typical layer: linear -> qkv; qk_rmsnorm_forward(qkv -> out); rope_forward_qkv(out);
// attention(out). Backward: attention -> dqkv; rope_backward_qkv(dqkv); qk_rmsnorm_backward(dqkv,
// qkv, ..., dqkv) in place; linear backward.
void qk_rmsnorm_forward(const float* qkv, const float* q_gamma, const float* k_gamma, float* out, float* rstd,
                        int64_t T, int64_t H, int64_t G, int64_t D, float eps, bool zero_centered_gamma = false);
// dqkv[T, row] overwritten (q/k slots: the RMSNorm gradient; v slots: dout's v, passed through);
// dqkv may be the same buffer as dout (in place). dq_gamma[D], dk_gamma[D] accumulated (+=);
// qkv is the forward's input, rstd its saved statistics. H must be a positive multiple of G.
void qk_rmsnorm_backward(const float* dout, const float* qkv, const float* q_gamma, const float* k_gamma,
                         const float* rstd, float* dqkv, float* dq_gamma, float* dk_gamma, int64_t T, int64_t H,
                         int64_t G, int64_t D, bool zero_centered_gamma = false);

// ---- cross entropy over all V (padded) logits, as Megatron's vocab-parallel CE at TP=1:
// loss[t] = logsumexp(logits[t]) - logits[t][target[t]]. lse[T] saved for backward.
// targets must be in [0, V) (checked in forward and backward: laoyao::Error).
void cross_entropy_forward(const float* logits, const int64_t* targets, float* loss, float* lse, int64_t T, int64_t V);
// Overwrites logits with d(sum_t dloss[t]*loss[t]) / dlogits = (softmax - onehot) * dloss[t].
void cross_entropy_backward(float* logits, const int64_t* targets, const float* lse, const float* dloss, int64_t T,
                            int64_t V);

// ---- embedding: y[T, C] (+)= table[ids[t]]; ids must be in [0, rows) (checked: laoyao::Error).
void embedding_forward(const int64_t* ids, const float* table, float* y, int64_t T, int64_t C, int64_t rows,
                       bool accumulate);
// dtable[ids[t]] += dy[t]; ids are not re-checked here (the forward checked them).
void embedding_backward(const int64_t* ids, const float* dy, float* dtable, int64_t T, int64_t C);

// ---- elementwise helpers
// dst[r, 0:cols] = src[r, 0:cols] for rows of src_ld and dst_ld floats (a column slice copied).
void copy_columns(const float* src, int64_t src_ld, float* dst, int64_t dst_ld, int64_t rows, int64_t cols);
void add_inplace(float* y, const float* x, int64_t n);                     // y += x
void add_bias_inplace(float* y, const float* bias, int64_t T, int64_t C);  // y[t,:] += bias
void bias_grad_accumulate(const float* dy, float* dbias, int64_t T, int64_t C);  // dbias += sum_t dy[t,:]

}  // namespace laoyao::kernels::cpu
