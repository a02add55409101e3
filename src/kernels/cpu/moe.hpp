// CPU reference ops of Megatron-Core's Mixture-of-Experts layer (MoELayer at EP = ETP = TP = 1,
// dropless): the TopKRouter (megatron/core/transformer/moe/router.py, moe_utils.py), its
// load-balancing and z losses, the token dispatcher's permute / unpermute, the routed experts
// (SequentialMLP / TEGroupedMLP: one MLP per expert over its slice of permuted tokens, no biases)
// and the shared expert. fp32, the conventions of ops.hpp: row-major [T, C] with T = b*s tokens,
// token t = batch*s + position; weights [out, in]; backward ACCUMULATES (+=) into parameter
// gradients and OVERWRITES input gradients, unless a function says otherwise (the aux/z-loss
// backwards ADD into a d(logits) buffer, since several losses meet there).
//
// Indices (expert ids, token ids, permuted rows) are int64_t. A token's routing is held as
// topk_idx[T, k] (its k experts, in descending score order) and topk_probs[T, k]; Megatron's dense
// routing_map[T, E] / routing_probs[T, E] are the same information scattered over E columns.
// Top-k ties: equal scores are ranked by the LOWER expert index first (torch.topk on CPU does so;
// on GPU its tie order is unspecified), so the choice is deterministic.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "kernels/cpu/ops.hpp"

namespace laoyao::kernels::cpu {

// ---- router: top-k routing with a score function (topk_routing_with_score_function / the older
// topk_softmax_with_capacity, dropless, no group-limited routing).
// --moe-router-score-function. sqrtsoftplus (DeepSeek-V4's) scores sqrt(softplus(logit)) and is
// otherwise sigmoid's: the k renormalised, an expert bias allowed, the aux scores normalised.
enum class MoeScoreFunction { Softmax, Sigmoid, SqrtSoftplus };

struct MoeRouterParams {
  MoeScoreFunction score_function = MoeScoreFunction::Softmax;
  bool pre_softmax = false;                 // --moe-router-pre-softmax (softmax only)
  std::optional<float> topk_scaling_factor;  // --moe-router-topk-scaling-factor (None or 0: no scaling)
  // Group-limited routing (--moe-router-num-groups G, --moe-router-group-topk g; 0: off, DeepSeek's
  // device-limited routing): the E experts form G consecutive groups; each group scores the sum of
  // its k/g largest routing scores, the g best groups are kept (ties: the lower group), and the
  // top-k runs over their experts only. The scores are what the top-k ranks: the logits (softmax
  // without pre_softmax), softmax(logits) (pre_softmax), sigmoid(logits) + expert_bias (sigmoid).
  int64_t num_groups = 0, group_topk = 0;
};

// logits[T, E] = x[T, H] @ router.weight[E, H]^T are computed by the caller with linear_forward
// (Megatron's router_gating_linear; the router runs in fp32 here, as --moe-router-dtype fp32).
// From logits, per token (k = --moe-router-topk, 1 <= k <= E):
//   Softmax, pre_softmax = false: (vals, idx) = topk(logits, k); probs = softmax(vals) over the k.
//   Softmax, pre_softmax = true:  s = softmax(logits) over E; (probs, idx) = topk(s, k) (not renormalised).
//   Sigmoid: s = sigmoid(logits); idx = topk(s + expert_bias, k); p = s[idx];
//            probs = p / (sum(p) + 1e-20) if k > 1 else p.
//   then probs *= topk_scaling_factor if it is set.
// expert_bias[E] (router.expert_bias, aux-loss-free balancing; nullable) only chooses the experts,
// it never enters probs; it is allowed only with Sigmoid (Megatron's config check), else
// laoyao::Error. Softmaxes subtract the row max and sum in double. topk_idx[T, k] and
// topk_probs[T, k] are written; backward needs only logits and topk_idx (it recomputes the rest).
void moe_router_topk_forward(const float* logits, const float* expert_bias, int64_t* topk_idx, float* topk_probs,
                             int64_t T, int64_t E, int64_t k, const MoeRouterParams& params);
// dlogits[T, E] overwritten with d(sum dprobs * probs)/dlogits. The expert choice is piecewise
// constant (no gradient through idx; none through expert_bias): non-selected experts get 0, except
// with pre_softmax, where the full softmax spreads the gradient over all E. With Softmax and
// pre_softmax = false and k = 1 the prob is identically 1, so dlogits = 0 (as in Megatron: such a
// router learns only from the aux losses). Then d(x), d(router.weight) come from linear_backward.
void moe_router_topk_backward(const float* logits, const int64_t* topk_idx, const float* dprobs, float* dlogits,
                              int64_t T, int64_t E, int64_t k, const MoeRouterParams& params);

// ---- load-balancing losses (compute_routing_scores_for_aux_loss, switch_load_balancing_loss_func,
// sequence_load_balancing_loss_func) and the router z-loss (z_loss_func). Megatron attaches them
// to the graph with MoEAuxLossAutoScaler: the value is not part of `lm loss`, and backward gives
// each loss the gradient main_loss_backward_scale (the `dloss` arguments below).
//
// scores_for_aux_loss[T, E] (fp32), independent of pre_softmax, expert_bias and the scaling factor:
//   Softmax: softmax(logits) over all E;  Sigmoid: sigmoid(logits) / (sum_e sigmoid(logits) + 1e-20).
// aux_topk_idx[T, k] = topk(scores_for_aux_loss, k): the aux losses' own routing map. It equals the
// routing's top-k set for Softmax (either pre_softmax) and for Sigmoid without expert_bias (the
// score functions are monotonic); with an expert_bias it is the UNBIASED top-k, as in Megatron.
void moe_aux_loss_scores(const float* logits, float* scores, int64_t* aux_topk_idx, int64_t T, int64_t E, int64_t k,
                         MoeScoreFunction score_function);

// aux_loss (--moe-router-load-balancing-type aux_loss, "switch"), over all T tokens:
//   tokens_per_expert[i] = #{t : i in aux_topk_idx[t]}   (a constant: no gradient)
//   aux = E * coeff / (k * T^2) * sum_i (sum_t scores[t, i]) * tokens_per_expert[i]
// A perfectly balanced map (tokens_per_expert = T*k/E for all i) gives aux = coeff, whatever the
// scores (their rows sum to 1). Returned as fp32 (accumulated in double).
float moe_aux_loss_forward(const float* scores, const int64_t* aux_topk_idx, int64_t T, int64_t E, int64_t k,
                           float coeff);
// dlogits[T, E] += dloss * d(aux)/dlogits, through the score function (Softmax uses the saved
// scores; Sigmoid recomputes sigmoid(logits), so both are passed).
void moe_aux_loss_backward(const float* logits, const float* scores, const int64_t* aux_topk_idx, int64_t T,
                           int64_t E, int64_t k, MoeScoreFunction score_function, float coeff, float dloss,
                           float* dlogits);

// seq_aux_loss: the same loss per sequence, averaged over the b sequences of s tokens each
// (T = b*s, sequence j = tokens [j*s, (j+1)*s) in this batch-major order; Megatron's [s, b] order
// holds the same tokens):
//   c[j, i] = #{t in sequence j : i in aux_topk_idx[t]},  P[j, i] = sum_{t in sequence j} scores[t, i]
//   seq_aux = 1/b * sum_j E * coeff / (k * s^2) * sum_i P[j, i] * c[j, i]
// (Megatron: cost_coeff = c / (s*k/E); (cost_coeff * P / s).sum(experts).mean(batch) * coeff.)
// b = 1, s = T is aux_loss.
float moe_seq_aux_loss_forward(const float* scores, const int64_t* aux_topk_idx, int64_t b, int64_t s, int64_t E,
                               int64_t k, float coeff);
void moe_seq_aux_loss_backward(const float* logits, const float* scores, const int64_t* aux_topk_idx, int64_t b,
                               int64_t s, int64_t E, int64_t k, MoeScoreFunction score_function, float coeff,
                               float dloss, float* dlogits);  // dlogits += dloss * d(seq_aux)/dlogits
// c[j*E + i] above, as doubles (this rank's tokens).
std::vector<double> moe_sequence_counts(const int64_t* aux_topk_idx, int64_t b, int64_t s, int64_t E, int64_t k);
// The same with the counts given: under context parallelism a rank holds s of each sequence's
// `whole` tokens, and Megatron sums the counts over the TP x CP group (its
// get_tokens_per_expert_and_token_count) while the scores stay this rank's:
//   seq_aux_r = 1/b * sum_j E * coeff / (k * whole^2) * sum_i P_r[j, i] * counts[j, i]
// so the ranks' values sum to the whole sequences' loss, and each rank's gradient is the whole
// loss's on its tokens. whole = s with this rank's own counts is the function above.
float moe_seq_aux_loss_forward(const float* scores, const double* counts, int64_t b, int64_t s, int64_t whole,
                               int64_t E, int64_t k, float coeff);
void moe_seq_aux_loss_backward(const float* logits, const float* scores, const double* counts, int64_t b, int64_t s,
                               int64_t whole, int64_t E, int64_t k, MoeScoreFunction score_function, float coeff,
                               float dloss, float* dlogits);

// global_aux_loss: the aux loss with the per-expert counts and the token total given (Megatron's
// _apply_global_aux_loss: counts = the running mean over the step's micro-batches of the tokens per
// expert summed over the data-parallel ranks, total = T times the data-parallel size); the scores
// are this rank's T tokens':
//   global_aux = E * coeff / (k * total^2) * sum_i (sum_t scores[t, i]) * counts[i]
float moe_global_aux_loss_forward(const float* scores, const double* counts, int64_t T, double total, int64_t E,
                                  int64_t k, float coeff);
void moe_global_aux_loss_backward(const float* logits, const float* scores, const double* counts, int64_t T,
                                  double total, int64_t E, int64_t k, MoeScoreFunction score_function, float coeff,
                                  float dloss, float* dlogits);  // dlogits += dloss * d(global_aux)/dlogits

// z-loss (--moe-z-loss-coeff; Megatron divides the coefficient by the TP x CP size: the layer
// passes coeff / CP, its TP ranks each computing the whole gathered sequence's):
//   z = coeff * mean_t (logsumexp_e logits[t, e])^2, on the router logits (before any score function).
float moe_z_loss_forward(const float* logits, int64_t T, int64_t E, float coeff);
// dlogits[t, e] += dloss * coeff * 2 * lse[t] / T * softmax(logits[t])[e].
void moe_z_loss_backward(const float* logits, int64_t T, int64_t E, float coeff, float dloss, float* dlogits);

// ---- dispatch / combine (moe_utils.permute / unpermute, dropless, at EP = 1).
// Capacity (--moe-expert-capacity-factor f; Megatron's topk_softmax_with_capacity): each expert
// takes at most capacity = ceil(T*k / E * f) of the (token, choice) pairs routed to it; kept[T, k]
// (1 kept, 0 dropped) keeps, per expert, the pairs with the largest topk_probs (ties: the earlier
// token) under drop policy "probs", the earliest tokens under "position". A dropped pair adds
// nothing to the layer's output and its prob gets no gradient (Megatron masks the probs with the
// capacity map); --moe-pad-expert-input-to-capacity only pads the experts' inputs with zero-prob
// rows, which changes no value.
int64_t moe_expert_capacity(int64_t T, int64_t E, int64_t k, double capacity_factor);
void moe_capacity_mask(const int64_t* topk_idx, const float* topk_probs, int64_t T, int64_t E, int64_t k,
                       int64_t capacity, bool by_position, uint8_t* kept);
// The same over `shares` shares of the sequence, each with its own capacity: tensor parallelism
// with sequence parallelism, where Megatron's router runs on each TP rank's share of the [s, b]
// hidden states, positions [r s / shares, (r + 1) s / shares) of every sequence flattened position
// by position, and drops within it (capacity from its b s / shares tokens). The T = b s tokens
// here are in our order (t = batch * s + position); s must divide by shares. kept as above.
void moe_capacity_mask_by_share(const int64_t* topk_idx, const float* topk_probs, int64_t b, int64_t s,
                                int64_t shares, int64_t E, int64_t k, double capacity_factor, bool by_position,
                                uint8_t* kept);

// moe_permutation: Megatron's permute() index maps for the N = T*k (token, choice) pairs.
//   tokens_per_expert[E]: tokens routed to each expert (routing_map.sum(0)).
//   sorted_indices[N]: the token of each permuted row; rows are grouped by expert in ascending
//     expert order and, within an expert, in ascending token order (stable; masked_select over the
//     transposed routing map).
//   permuted_row[T, k]: the permuted row of (t, choice j), the inverse map.
// Expert ids must be in [0, E) and distinct within a token (laoyao::Error otherwise).
void moe_permutation(const int64_t* topk_idx, int64_t T, int64_t E, int64_t k, int64_t* tokens_per_expert,
                     int64_t* sorted_indices, int64_t* permuted_row);
// Dispatch: permuted[r, :] = x[sorted_indices[r], :], r < N.
void moe_permute_forward(const float* x, const int64_t* sorted_indices, float* permuted, int64_t N, int64_t H);
// dx[t, :] = sum_j dpermuted[permuted_row[t, j], :] (overwritten; summed in ascending row order).
void moe_permute_backward(const float* dpermuted, const int64_t* permuted_row, float* dx, int64_t T, int64_t k,
                          int64_t H);
// Combine: y[t, :] = sum_j probs[t, j] * expert_out[permuted_row[t, j], :] (overwritten; products
// rounded to fp32 and added in ascending row order, as unpermute's multiply and scatter_add_).
// Recent Megatron applies the probs inside the experts instead (activation_func_with_probs:
// act(fc1) * prob before fc2); without an fc2 bias that is the same function.
void moe_unpermute_forward(const float* expert_out, const int64_t* permuted_row, const float* probs, float* y,
                           int64_t T, int64_t k, int64_t H);
// dexpert_out[N, H] = probs * dy[token] (overwritten; every row is some (t, j)), dprobs[T, k] =
// <dy[t], expert_out[row]> (overwritten; nullptr to skip).
void moe_unpermute_backward(const float* expert_out, const int64_t* permuted_row, const float* probs, const float* dy,
                            float* dexpert_out, float* dprobs, int64_t T, int64_t k, int64_t H);

// ---- routed experts: E MLPs, expert e on its tokens_per_expert[e] consecutive permuted rows.
// SwiGlu: Megatron-Core's gated linear_fc1 [2F, H] = [gate ; up], act = silu(gate) * up (swiglu_forward);
// GeluTanh / GeluErf: linear_fc1 [F, H], act = gelu (the bias_gelu tanh form or the exact erf form).
// linear_fc2 [H, F]. No biases (Megatron MoE experts with --disable-bias-linear).
enum class MoeActivation { SwiGlu, GeluTanh, GeluErf };
inline int64_t moe_fc1_rows(MoeActivation act, int64_t F) { return act == MoeActivation::SwiGlu ? 2 * F : F; }

// A LoRA adapter pair shared by every row an experts' call computes (Megatron-Bridge's
// ParallelLinearAdapter on a grouped expert linear, share_expert_adapters on): linear_fc1's output
// rows += scale * B1 A1 x, linear_fc2's += scale * B2 A2 a (x a row's input, a its activation).
// A [dim, in], B [out, dim]; a null pair is no adapter; gradients accumulated (null: skipped).
struct MoeAdapters {
  const float *fc1_a = nullptr, *fc1_b = nullptr, *fc2_a = nullptr, *fc2_b = nullptr;
  float *dfc1_a = nullptr, *dfc1_b = nullptr, *dfc2_a = nullptr, *dfc2_b = nullptr;
  int64_t dim = 0;
  float scale = 1.0f;
};

// FP8 GEMMs of the experts (Transformer Engine's GroupedLinear under fp8_autocast, one quantizer per
// GEMM; a shared expert's Linear the same with one expert): the FP8 operands of expert e's linear
// (0: linear_fc1, 1: linear_fc2) as the model's FP8 state casts them (model/cpu/fp8_linears_cpu:
// each cast records its amax and takes its scale). A forward casts every expert's weights, rows or
// not, as GroupedLinear casts all of its weights; an expert without rows casts no input.
class MoeExpertsFp8 {
 public:
  virtual ~MoeExpertsFp8() = default;
  // Each of a [rows][cols] tensor: a forward's input, the weight's copy, the backward's input, the
  // output gradient (model/cpu/fp8_linears_cpu.hpp's CpuFp8Linears says how each is cast).
  virtual Fp8Operand input(int linear, int64_t e, const float* x, int64_t rows, int64_t cols) = 0;
  virtual Fp8Operand weight(int linear, int64_t e, const float* w, int64_t rows, int64_t cols) = 0;
  virtual Fp8Operand saved_input(int linear, int64_t e, const float* x, int64_t rows, int64_t cols) = 0;
  virtual Fp8GradOperands output_grad(int linear, int64_t e, const float* dy, int64_t rows, int64_t cols) = 0;
};

// fc1_weight[E, F1, H] and fc2_weight[E, H, F] hold the experts' weights one after another
// (local_experts.{e}.linear_fc1.weight, TEGroupedMLP's weight{e}), F1 = moe_fc1_rows(act, F).
// With N = sum_e tokens_per_expert[e]: permuted_x[N, H]; fc1_out[N, F1] and act_out[N, F] are
// saved for backward; y[N, H] overwritten. One MLP of T tokens (the shared expert, a dense MLP)
// is the case E = 1, tokens_per_expert = {T}. fp8: the GEMMs in FP8 (null: fp32); not with lora.
void moe_experts_forward(const float* permuted_x, const int64_t* tokens_per_expert, const float* fc1_weight,
                         const float* fc2_weight, float* fc1_out, float* act_out, float* y, int64_t E, int64_t H,
                         int64_t F, MoeActivation act, const MoeAdapters* lora = nullptr,
                         MoeExpertsFp8* fp8 = nullptr);
// dx[N, H] overwritten (nullptr to skip); dfc1_weight[E, F1, H], dfc2_weight[E, H, F] accumulated.
// dact[N, F] and dfc1_out[N, F1] are scratch the caller provides (any contents).
void moe_experts_backward(const float* permuted_x, const int64_t* tokens_per_expert, const float* fc1_weight,
                          const float* fc2_weight, const float* fc1_out, const float* act_out, const float* dy,
                          float* dact, float* dfc1_out, float* dx, float* dfc1_weight, float* dfc2_weight, int64_t E,
                          int64_t H, int64_t F, MoeActivation act, const MoeAdapters* lora = nullptr,
                          MoeExpertsFp8* fp8 = nullptr);

// ---- the whole MoE layer (MoELayer.forward: router -> permute -> experts -> unpermute, + shared
// expert): y[T, H] = sum_j probs[t, j] * expert_{idx[t, j]}(x[t]) + shared_expert(x[t]).
// The residual add and the pre-MLP norm stay outside, as in Megatron's TransformerLayer.
struct MoeLayerConfig {
  int64_t hidden_size = 0;                      // H
  int64_t num_experts = 0;                      // E, --num-experts
  int64_t topk = 2;                             // k, --moe-router-topk
  int64_t ffn_hidden_size = 0;                  // F, --moe-ffn-hidden-size
  int64_t shared_expert_intermediate_size = 0;  // --moe-shared-expert-intermediate-size; 0: none
  MoeActivation activation = MoeActivation::SwiGlu;  // routed and shared experts alike
  MoeRouterParams router;
  // Load balancing: each loss is on when its coefficient is > 0 (Megatron accepts a list of
  // --moe-router-load-balancing-type with one --moe-aux-loss-coeff each).
  float aux_loss_coeff = 0.0f;      // aux_loss
  float seq_aux_loss_coeff = 0.0f;  // seq_aux_loss (needs seq_length)
  float z_loss_coeff = 0.0f;        // --moe-z-loss-coeff (None: 0)
  // global_aux_loss: on in training forwards (global_aux_training) when > 0. Each such forward adds
  // its aux tokens per expert, summed over the data-parallel ranks by sum_over_data_parallel (null:
  // one rank), to the state's running counts; the loss uses their mean over the forwards since
  // moe_global_aux_reset and a token total of T * data_parallel_size.
  float global_aux_loss_coeff = 0.0f;
  bool global_aux_training = false;
  int64_t data_parallel_size = 1;
  std::function<void(double* counts, int64_t n)> sum_over_data_parallel;
  int64_t seq_length = 0;           // s, for seq_aux_loss: T must be a multiple
  // Context parallelism: the T tokens are this rank's s of each sequence's s * context_parallel_size.
  // The aux and seq-aux losses' tokens per expert are summed over the CP ranks by
  // sum_over_context_parallel (and their token totals are the whole sequences'); the z-loss's
  // coefficient is divided by the CP size (Megatron's tp_cp group: each rank's share of the mean).
  int64_t context_parallel_size = 1;
  std::function<void(double* counts, int64_t n)> sum_over_context_parallel;
  // Each token's row in the random logits stream of force_load_balancing (null: t): under context
  // parallelism its place in the whole micro-batch, so the ranks draw one rank's logits.
  const int64_t* random_logits_rows = nullptr;
  // --moe-router-force-load-balancing: logits[i] = counter_normal(random_logits_key, i) in place of
  // the router's (the backward treats them as the logits: a straight-through gradient).
  bool force_load_balancing = false;
  uint64_t random_logits_key = 0;
  // --moe-router-dtype unset with --bf16: Megatron's router linear runs in bf16, so the logits
  // (router's or random) are rounded to bf16 before the scores, and the routing probabilities take
  // the logits' type (rounded, their gradient straight through); else both stay fp32 (fp32, fp64).
  bool router_bf16_logits = false;
  // --moe-expert-capacity-factor (none: dropless) and --moe-token-drop-policy position (else probs).
  std::optional<double> capacity_factor;
  bool drop_by_position = false;
  // Tensor parallelism's shares of the sequence to drop within (moe_capacity_mask_by_share; needs
  // seq_length); 1: the T tokens as one. With seq_length set the pairs are taken in Megatron's
  // token order ([s, b] flattened: position by position), else in ours (t = batch * s + position).
  int64_t capacity_shares = 1;
};

struct MoeLayerWeights {
  const float* router_weight = nullptr;      // [E, H] router.weight
  const float* router_bias = nullptr;        // [E] nullable (Megatron's router has none by default)
  const float* expert_bias = nullptr;        // [E] router.expert_bias buffer, nullable (Sigmoid only)
  const float* fc1_weight = nullptr;         // [E, F1, H] experts' linear_fc1
  const float* fc2_weight = nullptr;         // [E, H, F] experts' linear_fc2
  const float* shared_fc1_weight = nullptr;  // [F1s, H] shared_experts.linear_fc1 (if a shared expert)
  const float* shared_fc2_weight = nullptr;  // [H, Fs] shared_experts.linear_fc2
  // PEFT: the adapters on the routed experts (without a stage) and on the shared expert; nullable.
  const MoeAdapters* expert_lora = nullptr;
  const MoeAdapters* shared_lora = nullptr;
  // FP8: the routed experts' GEMMs (here or in the stage, keyed by the stage's own experts) and the
  // shared expert's; nullable.
  MoeExpertsFp8* expert_fp8 = nullptr;
  MoeExpertsFp8* shared_fp8 = nullptr;
};

struct MoeLayerGrads {  // accumulated (+=); nullptr skips that gradient
  float* router_weight = nullptr;
  float* router_bias = nullptr;
  float* fc1_weight = nullptr;
  float* fc2_weight = nullptr;
  float* shared_fc1_weight = nullptr;
  float* shared_fc2_weight = nullptr;
};

// Everything forward saves for backward, and backward's scratch: owned by the caller, one per
// layer, reused step after step (vectors are resized only when T changes).
struct MoeLayerState {
  std::vector<float> logits;               // [T, E]
  std::vector<double> global_tokens_per_expert;  // [E] global_aux_loss: summed since the last reset
  int64_t global_steps = 0;                       // training forwards since the last reset
  std::vector<double> global_counts;              // [E] the mean counts the last forward used (empty: none)
  float global_aux_loss = 0.0f;
  std::vector<uint8_t> kept;               // [T, k] with a capacity factor (moe_capacity_mask)
  std::vector<int64_t> topk_idx;           // [T, k]
  std::vector<float> topk_probs;           // [T, k]
  std::vector<float> scores_for_aux_loss;  // [T, E] (when an aux loss is on)
  std::vector<int64_t> aux_topk_idx;       // [T, k]
  std::vector<double> aux_counts, seq_aux_counts;  // [E], [b, E]: tokens per expert (over the CP ranks)
  std::vector<int64_t> tokens_per_expert;  // [E] (the routing's, for logging / expert-bias updates)
  std::vector<int64_t> sorted_indices;     // [T*k]
  std::vector<int64_t> permuted_row;       // [T, k]
  std::vector<float> permuted_x, fc1_out, act_out, expert_out;  // [T*k, H | F1 | F | H]
  std::vector<float> shared_fc1_out, shared_act_out, shared_out;  // [T, F1s | Fs | H]
  // backward scratch
  std::vector<float> dlogits, dprobs, dexpert_out, dpermuted_x, dact, dfc1_out, dx_part;
  // The last forward's loss values, coefficients included (0 when off). Megatron logs aux/coeff.
  float aux_loss = 0.0f, seq_aux_loss = 0.0f, z_loss = 0.0f;
};

// The routed experts' stage of the layer: by default moe_experts_forward/backward over all E
// experts here. Expert parallelism replaces it (model/moe_expert_parallel.hpp): the rows go to the
// ranks that hold their experts and their outputs come back. forward: expert_out[N, H] from
// permuted_x[N, H], whose rows are grouped by expert as tokens_per_expert[E] says; backward:
// dpermuted_x[N, H] (overwritten) from dexpert_out[N, H] of the same forward, accumulating the
// experts' weight gradients wherever the stage keeps them. fp8 (nullable): the GEMMs of the experts
// the stage runs in FP8, each keyed by its index among the weights that stage holds (the backward
// takes the forward's).
class MoeExpertsStage {
 public:
  virtual ~MoeExpertsStage() = default;
  // row_tokens[N]: the token (row of the layer's input) each permuted row copies.
  virtual void forward(const float* permuted_x, const int64_t* row_tokens, const int64_t* tokens_per_expert, int64_t N,
                       float* expert_out, MoeExpertsFp8* fp8) = 0;
  virtual void backward(const float* dexpert_out, int64_t N, float* dpermuted_x, MoeExpertsFp8* fp8) = 0;
};

// E experts here, whole: moe_experts_forward/backward with the forward's input and activations
// kept for the backward. The expert-parallel stage runs its local experts through one; whole
// experts under TP without expert parallelism run all of them through one.
class MoeLocalExpertsStage final : public MoeExpertsStage {
 public:
  MoeLocalExpertsStage(int64_t num_experts, int64_t H, int64_t F, MoeActivation act)
      : E_(num_experts), H_(H), F_(F), act_(act) {}
  // The experts' weights [E][F1][H], [E][H][F] and their gradients (accumulated).
  void set_weights(const float* fc1, const float* fc2, float* dfc1, float* dfc2) {
    fc1_ = fc1, fc2_ = fc2, dfc1_ = dfc1, dfc2_ = dfc2;
  }
  void set_lora(const MoeAdapters* lora) { lora_ = lora; }  // PEFT's adapter on every expert (nullable)
  void forward(const float* permuted_x, const int64_t* row_tokens, const int64_t* tokens_per_expert, int64_t N,
               float* expert_out, MoeExpertsFp8* fp8) override;
  void backward(const float* dexpert_out, int64_t N, float* dpermuted_x, MoeExpertsFp8* fp8) override;

 private:
  int64_t E_, H_, F_;
  MoeActivation act_;
  const float *fc1_ = nullptr, *fc2_ = nullptr;
  float *dfc1_ = nullptr, *dfc2_ = nullptr;
  const MoeAdapters* lora_ = nullptr;
  int64_t N_ = 0;
  std::vector<int64_t> tpe_;
  std::vector<float> x_, fc1_out_, act_out_, dact_, dfc1_out_;
};

// Checks the config (laoyao::Error: sizes < 1, k > E, expert_bias without Sigmoid, seq_aux_loss
// without a seq_length dividing T, a shared expert without weights) and runs the layer; y[T, H] overwritten.
// With `experts` the routed experts run there (w.fc1_weight / fc2_weight are then unused).
void moe_layer_forward(const MoeLayerConfig& cfg, const MoeLayerWeights& w, const float* x, float* y, int64_t T,
                       MoeLayerState& state, MoeExpertsStage* experts = nullptr);
// dx[T, H] overwritten (the router's, the experts' and the shared expert's contributions); grads
// accumulated. aux_loss_scale is the gradient each aux / z loss receives (Megatron's
// MoEAuxLossAutoScaler.main_loss_backward_scale, e.g. 1/num_microbatches); it must be the same
// forward's state.
// Starts global_aux_loss's running counts over (Megatron's reset_global_aux_loss_tracker, after
// each step).
void moe_global_aux_reset(MoeLayerState& st);

void moe_layer_backward(const MoeLayerConfig& cfg, const MoeLayerWeights& w, const float* x, const float* dy,
                        float* dx, const MoeLayerGrads& grads, int64_t T, MoeLayerState& state,
                        float aux_loss_scale = 1.0f, MoeExpertsStage* experts = nullptr);

}  // namespace laoyao::kernels::cpu
