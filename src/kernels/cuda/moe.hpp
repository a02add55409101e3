// GPU ops of Megatron-Core's Mixture-of-Experts layer (dropless, EP = 1), each the CPU reference's
// (kernels/cpu/moe.hpp) on bf16 activations, with the router's math in fp32. Nothing here
// synchronises with the host: the per-expert token counts and the permutation stay on the device,
// and the grouped expert GEMMs (grouped_gemm.hpp) read the offsets from there. Dropless routing
// gives exactly N = T*k permuted rows, so every buffer size is known on the host.
//
// Indices are int32 on the device (T*k < 2^31 is checked by the callers' sizes).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>

namespace laoyao::kernels::cuda {

using bf16 = __nv_bfloat16;

// The router kernels hold a token's E scores in one warp's registers.
constexpr int64_t kMoeMaxExperts = 512;

struct MoeRouterSpec {
  int64_t num_experts = 0;  // E
  int64_t topk = 0;         // k, 1 <= k <= E
  bool sigmoid = false;     // --moe-router-score-function sigmoid or sqrtsoftplus (else softmax)
  bool sqrt_softplus = false;  // with sigmoid: sqrtsoftplus, the sigmoid's routing on sqrt(softplus) scores
  bool pre_softmax = false;  // --moe-router-pre-softmax (softmax only)
  float topk_scaling_factor = 0.0f;  // --moe-router-topk-scaling-factor; 0: none
  int64_t num_groups = 0, group_topk = 0;  // --moe-router-num-groups / --moe-router-group-topk; 0: none
};

// The load-balancing and z losses that are on (coefficient > 0), as kernels/cpu/moe.hpp defines
// them; the aux losses count the unbiased top-k over every group (moe_router_forward's aux top-k
// when an expert bias or group-limited routing makes the routing's differ).
struct MoeAuxLossSpec {
  float aux_coeff = 0.0f;           // aux_loss
  float seq_aux_coeff = 0.0f;       // seq_aux_loss
  float z_coeff = 0.0f;             // --moe-z-loss-coeff
  int64_t seq_length = 0;           // s for seq_aux_loss: T = b * s tokens, batch-major
  float global_aux_coeff = 0.0f;    // global_aux_loss (with the counts moe_global_counts_accumulate keeps)
  int64_t data_parallel_size = 1;   // global_aux_loss's token total is T times this
  // Context parallelism (the CPU's MoeLayerConfig): T is this rank's share, seq_length its tokens of
  // each sequence of seq_length * context_parallel_size. The aux and seq-aux losses' tokens per
  // expert (fp32 counts, exact below 2^24) are summed over the CP ranks on the stream by
  // sum_over_context_parallel (required when the size is above 1), their token totals the whole
  // sequences'; the z-loss's coefficient is divided by the CP size (Megatron's tp_cp group).
  int64_t context_parallel_size = 1;
  std::function<void(float* counts, int64_t n, cudaStream_t stream)> sum_over_context_parallel;
};

// --moe-router-force-load-balancing: logits[i] = counter_normal(*key, i) for i < n (core/counter_normal.hpp,
// the CPU's values), in place of the router's. The key is read on the device, so that a step
// captured as a CUDA graph draws each micro-batch's own logits.
void moe_random_logits(float* logits, int64_t n, const uint64_t* key, cudaStream_t stream);

// From the router's fp32 logits[T, E], per token (one warp each): topk_idx[T, k] (descending score,
// equal scores by the lower expert index, as the CPU reference), topk_probs[T, k] (the score
// function, the renormalisation and the scaling factor of moe_router_topk_forward),
// scores[T, E] = scores_for_aux_loss (nullable: only when an aux loss is on), lse[T] = logsumexp of
// the logits (nullable: only for the z-loss), and tokens_per_expert[E] (required; overwritten:
// zeroed, then counted). expert_bias[E] (fp32, nullable; sigmoid only): aux-loss-free balancing's
// router.expert_bias, added to the sigmoids to choose the experts, not to their probs (the scores
// stay unbiased). With router.num_groups the experts come from the best groups only (the CPU's
// group-limited routing). The aux losses count the unbiased top-k over all experts: with an expert
// bias or groups and the aux scores on, it goes to aux_topk_idx[T, k] and aux_tokens_per_expert[E]
// (required then, else nullable). laoyao::Error unless 1 <= E <= kMoeMaxExperts, 1 <= k <= E,
// T * k < 2^31 and the groups split as the CPU's check_groups asks.
void moe_router_forward(const float* logits, int64_t T, const MoeRouterSpec& router, int32_t* topk_idx,
                        float* topk_probs, float* scores, float* lse, int32_t* tokens_per_expert, cudaStream_t stream,
                        const float* expert_bias = nullptr, int32_t* aux_topk_idx = nullptr,
                        int32_t* aux_tokens_per_expert = nullptr);
// Aux-loss-free balancing (GptModel::update_expert_bias on the CPU): load[E] += tokens_per_expert
// after a training forward; after the step's micro-batches (load summed over the data-parallel
// ranks) bias[e] += rate * sign(mean(load) - load[e]) in fp32, the mean summed in double as the
// CPU does, and load zeroed.
void moe_accumulate_load(const int32_t* tokens_per_expert, int32_t* load, int64_t E, cudaStream_t stream);
void moe_update_expert_bias(int32_t* load, float* bias, int64_t E, float rate, cudaStream_t stream);

// Floats of the statistics moe_aux_losses_forward keeps for moe_router_backward (0 without an aux
// loss): per token row (a sequence for seq_aux_loss, else all T) the losses' d/d(scores) per unit
// of dloss [rows][E], then the forward's per-chunk partial sums and counts. It depends on T, so
// the forward and the backward of one step must be given the same T (a buffer sized for a larger
// T is big enough). laoyao::Error when seq_aux_loss is on and seq_length does not divide T.
size_t moe_aux_stats_floats(int64_t T, int64_t E, const MoeAuxLossSpec& losses);
// The enabled losses' values (coefficients included, fp32) ADDED to losses[0..4) = {aux, seq_aux,
// z, global_aux} on the device, so that a step's layers and micro-batches sum there until the host
// reads them for the log; `stats` gets what the backward needs (per-expert and per-sequence
// counts). Reads scores (aux losses), lse (z-loss), topk_idx and tokens_per_expert of
// moe_router_forward. global_aux_loss (kernels/cpu moe_global_aux_loss_forward, total = T *
// data_parallel_size) is on when its coefficient is and global_counts[E] (the running mean of the
// step's counts) is given; null global_counts (an evaluation forward) leaves it out.
void moe_aux_losses_forward(const float* scores, const float* lse, const int32_t* topk_idx,
                            const int32_t* tokens_per_expert, int64_t T, const MoeRouterSpec& router,
                            const MoeAuxLossSpec& losses, float* stats, float* loss_sums, cudaStream_t stream,
                            const float* global_counts = nullptr);
// global_aux_loss's running counts (Megatron's global_tokens_per_expert / ga_steps): running[e] +=
// counts[e] (a training forward's aux tokens per expert, already summed over the data-parallel
// ranks), then mean[e] = running[e] / steps (steps: the training forwards since the running sums
// were zeroed, this one included).
void moe_global_counts_accumulate(const int32_t* counts, double* running, float* mean, int64_t E, int64_t steps,
                                  cudaStream_t stream);

// dlogits[T, E] (bf16, overwritten, ready for the router's two GEMMs): the gradient of
// sum(dprobs * topk_probs) through the routing (moe_router_topk_backward), plus aux_scale times the
// gradients of the enabled losses (moe_aux/seq_aux/z_loss_backward with dloss = aux_scale).
// Recomputes the scores from the logits; reads the forward's topk_idx, lse and stats.
void moe_router_backward(const float* logits, const int32_t* topk_idx, const float* dprobs, const float* lse,
                         const float* stats, int64_t T, const MoeRouterSpec& router, const MoeAuxLossSpec& losses,
                         float aux_scale, bf16* dlogits, cudaStream_t stream);

// Megatron's permute() maps (moe_permutation): offsets[E + 1] (offsets[e] = first permuted row of
// expert e, offsets[E] = N = T*k), sorted_token[N] (the token of each permuted row: experts in
// ascending order, tokens ascending within an expert) and permuted_row[T, k] (the row of token t's
// j-th choice). `scratch` holds moe_permutation_scratch_bytes(T, E) bytes. tokens_per_expert must
// be topk_idx's counts (the router's); expert ids distinct within a token, in [0, E), as the router
// writes them, or negative: such a pair (the all-gather dispatcher's pair of another rank's expert,
// moe_ep.hpp) gets no row and permuted_row -1, offsets[E] counting the others (k may then exceed
// E); E <= kMoeMaxExperts.
size_t moe_permutation_scratch_bytes(int64_t T, int64_t E);
void moe_permutation(const int32_t* topk_idx, const int32_t* tokens_per_expert, int64_t T, int64_t E, int64_t k,
                     int32_t* offsets, int32_t* sorted_token, int32_t* permuted_row, void* scratch,
                     cudaStream_t stream);

// Token dropping (--moe-expert-capacity-factor; kernels/cpu/moe.hpp's moe_capacity_mask_by_share,
// the same choices): from the permutation of topk_idx (offsets, sorted_token, permuted_row),
// kept[T, k] = 1 for the pairs each expert keeps (at most `capacity`: the largest probs, ties to
// the earlier token, or the earliest tokens when by_position), and the dropped pairs' topk_probs
// set to 0 in place. "Earlier" is in Megatron's token order: its router sees the [s, b] hidden
// states flattened, position by position, where our T = b s tokens are batch-major (t = batch * s
// + position); s must divide T. scratch: T*k floats. Each pair counts the pairs of its expert
// before it: O(sum of squared expert loads), fine for the loads of a micro-batch. shares > 1
// (tensor parallelism's shares of the sequence): pairs compete only within their share (positions
// share * s / shares ..), each share's experts keeping at most `capacity` (its tokens' capacity).
void moe_capacity_drop(const int32_t* topk_idx, const int32_t* offsets, const int32_t* sorted_token,
                       const int32_t* permuted_row, float* topk_probs, int64_t T, int64_t s, int64_t k,
                       int64_t capacity, bool by_position, uint8_t* kept, float* scratch, cudaStream_t stream,
                       int64_t shares = 1);
// dprobs[i] = 0 where kept[i] == 0 (a dropped pair's prob gets no gradient).
void moe_mask_dropped(float* dprobs, const uint8_t* kept, int64_t n, cudaStream_t stream);

// The four row ops move 16-byte vectors: H must be a multiple of 8 and the bf16 buffers 16-byte
// aligned (laoyao::Error otherwise). A pair whose permuted_row is negative (no row here) is left
// out of the three that take permuted_row: unpermute_backward gives it dprobs 0.
// Dispatch: permuted[r, :] = x[sorted_token[r], :] for r < N, and r < *rows_end (on the device)
// where rows_end is given (the all-gather dispatcher: N bounds the rows, the device knows them).
void moe_permute_forward(const bf16* x, const int32_t* sorted_token, bf16* permuted, int64_t N, int64_t H,
                         cudaStream_t stream, const int32_t* rows_end = nullptr);
// dx[t, :] = sum_j dpermuted[permuted_row[t, j], :] summed in fp32, rounded once; with `accumulate`
// dx's bf16 contents are added in that fp32 sum (the router's and the shared expert's parts).
void moe_permute_backward(const bf16* dpermuted, const int32_t* permuted_row, bf16* dx, int64_t T, int64_t k,
                          int64_t H, bool accumulate, cudaStream_t stream);
// Combine: y[t, :] = sum_j probs[t, j] * expert_out[permuted_row[t, j], :] (+ addend[t, :] when
// non-null: the shared expert's output), fp32, rounded once. With `residual` (the layer's residual
// add without dropout, fused): y = bf16(residual + that rounded sum), the bits of the combine
// followed by residual_dropout_add (elementwise.hpp).
void moe_unpermute_forward(const bf16* expert_out, const int32_t* permuted_row, const float* probs,
                           const bf16* addend, bf16* y, int64_t T, int64_t k, int64_t H, cudaStream_t stream,
                           const bf16* residual = nullptr);
// dexpert_out[permuted_row[t, j], :] = probs[t, j] * dy[t, :] (bf16, every pair's row written) and
// dprobs[t, j] = <dy[t, :], expert_out[permuted_row[t, j], :]> (fp32; nullptr to skip).
void moe_unpermute_backward(const bf16* expert_out, const int32_t* permuted_row, const float* probs, const bf16* dy,
                            bf16* dexpert_out, float* dprobs, int64_t T, int64_t k, int64_t H, cudaStream_t stream);

}  // namespace laoyao::kernels::cuda
