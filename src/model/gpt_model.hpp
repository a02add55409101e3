// Megatron-Core's GPTModel on the CPU reference backend: the parameter table, the fp32 weights and
// gradients, the parallel groups and what is computed over them (norms, zero counts, the gradient
// sums of finalize_grads). Forward and backward run the module tree (model/mcore/gpt_model.hpp)
// over the CPU backend's ops (model/cpu/cpu_backend.hpp), which keep what backward needs and
// accumulate into the gradients.
//
// Tensor parallelism (a group of several ranks): each rank holds Megatron-Core's shards of the
// parameters (model/gpt_tp.hpp) and runs its heads, ffn columns and vocabulary rows, summing over
// the group where Megatron-Core's layers do: every rank then sees every token's loss, and the
// shards' gradients are the single rank's, split. With sequence parallelism
// (config.sequence_parallel) the norms, dropout and residuals run on each rank's share of every
// sequence, between an all-gather and a reduce-scatter around the parallel layers.
//
// Expert parallelism (model/gpt_ep.hpp, an expert-parallel group of config.moe.expert_parallel
// ranks): each rank holds its share of every MoE layer's routed experts, and the routed tokens go
// to their experts' ranks and back (model/moe_expert_parallel.hpp).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/rng.hpp"
#include "dist/process_group.hpp"
#include "model/gpt_config.hpp"
#include "model/gpt_layout.hpp"
#include "model/cpu/cpu_backend.hpp"
#include "model/cpu/moe_layers_cpu.hpp"
#include "model/mcore/gpt_model.hpp"
#include "model/mtp_inputs.hpp"
#include "model/parameters.hpp"

namespace laoyao::model {

// One micro-batch: b sequences of s tokens, batch-major (token t = batch*s + position).
struct MicroBatch {
  int64_t b = 0, s = 0;
  const int64_t* tokens = nullptr;
  const int64_t* labels = nullptr;
  const int64_t* positions = nullptr;
  // [b*s] or null: the first key each query attends (documents of a packed sequence,
  // --reset-attention-mask); null is plain causal attention.
  const int32_t* key_start = nullptr;
  // [b*s] or null (all ones): which labels count. Multi-token prediction rolls it with the labels.
  const float* loss_mask = nullptr;
  // [b*s] or null: under context parallelism with documents, each token's place in its whole
  // sequence (key_start then in places too); null: Megatron's two chunks of the sequence.
  const int32_t* cp_places = nullptr;
  // The first micro-batch of a step or of an evaluation's iteration (Megatron's is_first_microbatch;
  // FP8 weight copies are made again).
  bool is_first_microbatch = true;
};

// Throws laoyao::Error unless mb.key_start (when set) is what documents give: along each sequence
// non-decreasing, with key_start[i] in [0, i] (i: the token's place, cp_places[i] when set). The
// fast attention kernels rely on it.
void check_key_start(const MicroBatch& mb);

// Where dropout masks come from: keyed by seed and a per-call counter, so a run is reproducible
// and the same micro-batch gets the same masks however the work is split.
struct DropoutKey {
  uint64_t seed = 0;
  uint64_t call = 0;  // e.g. iteration * 1e6 + micro-batch index
  bool training = false;
};

// The stream of layer l's random router logits in a micro-batch (--moe-router-force-load-balancing),
// the same on both backends.
inline uint64_t random_logits_key(const DropoutKey& key, int64_t layer) {
  return mcore::random_logits_key(key.seed, key.call, layer);
}

class GptModel {
 public:
  // tp: the tensor-parallel group (nullptr or one rank: the whole model here). ep: the
  // expert-parallel group, of cfg.moe.expert_parallel ranks when that is > 1 (else unused);
  // expert_dp: the ranks that hold the same experts (Megatron's expert data-parallel group,
  // nullptr for one), over which the trainer averages the experts' gradients.
  // host_state: fp32 weights and gradients in host memory (the CPU backend computes on them); a
  // GPU rank's model has none (its engine holds them on the device), and holds the weights alone
  // while a checkpoint passes through the host (hold_host_weights).
  explicit GptModel(const GptConfig& cfg, dist::ProcessGroup* tp = nullptr, dist::ProcessGroup* ep = nullptr,
                    dist::ProcessGroup* expert_dp = nullptr, bool host_state = true);
  ~GptModel();
  // (The module tree and the backend hold references into it: not copied or moved.)
  GptModel(const GptModel&) = delete;
  GptModel& operator=(const GptModel&) = delete;

  const GptConfig& config() const { return cfg_; }
  // This rank's shapes: heads, query groups, ffn and vocabulary divided by the TP size.
  const GptConfig& local_config() const { return lc_; }
  int64_t tp_size() const { return tp_size_; }
  int64_t tp_rank() const { return tp_rank_; }
  dist::ProcessGroup* tp_group() const { return tp_; }
  // Expert parallelism: the group (nullptr without), this rank in it, the expert data-parallel
  // group, and where the routed experts' parameters lie in the table (offset, count).
  dist::ProcessGroup* ep_group() const { return ep_size_ > 1 ? ep_ : nullptr; }
  int64_t ep_size() const { return ep_size_; }
  int64_t ep_rank() const { return ep_rank_; }
  // (Null with whole experts under tensor parallelism, finalize_grads summing their gradients,
  // unless EP is a multiple of TP.)
  dist::ProcessGroup* expert_dp_group() const { return expert_dp_; }
  bool experts_folded() const { return folded_; }
  // Whole experts with an EP group inside a TP group: the ranks holding the same experts (across
  // TP and data-parallel ranks), over which finalize_grads sums their gradients; null otherwise
  // (without EP finalize_grads sums them over the TP group).
  dist::ProcessGroup* folded_expert_dp_group() const { return ep_size_ > 1 ? folded_edp_ : nullptr; }
  const std::vector<std::pair<int64_t, int64_t>>& routed_expert_ranges() const { return routed_ranges_; }
  // The gradient norm over the whole model: the split parameters' squares summed over the groups
  // that split them (tensor-parallel shards over TP, routed experts over EP, experts under both
  // over TP then EP), the replicated ones (the same on every rank) counted once, as Megatron's
  // get_grad_norm_fp32. Every rank of the groups gets the same value.
  // (The trained parameters' gradients; every parameter's weights, frozen or not, as Megatron's
  // calc_params_l2_norm.)
  double grad_norm() const { return model_norm(grads_.data(), table_.trainable_offset); }
  double params_norm() const { return model_norm(weights_.data(), 0); }
  // Zero gradients over the whole model, counted as grad_norm sums (Megatron's num_zeros_in_grad).
  int64_t count_zero_grads() const;
  // After a step's micro-batches: sums over the tensor-parallel group the gradients that each rank
  // computed a part of: from its share of the sequence (sequence parallelism: the norms' weights and
  // biases, Megatron's finalize_model_grads), and LoRA's whole adapter halves and multi-latent
  // attention's down projections from its share of the layer (tp_partial_grads). Collective;
  // nothing to do on one rank.
  void finalize_grads();
  const ParameterTable& table() const { return table_; }
  float* weights() { return weights_.data(); }
  const float* weights() const { return weights_.data(); }
  // The trained parameters' gradients: table().trainable() of them, from trainable_offset on.
  float* grads() { return grads_.data(); }
  int64_t num_parameters() const { return table_.total; }
  int64_t num_trainable() const { return table_.trainable(); }
  void zero_grads();
  bool holds_host_weights() const { return static_cast<int64_t>(weights_.size()) == table_.total; }
  // Allocates the host weights (zeros) or frees them; the gradients are left as they are.
  void hold_host_weights(bool hold);

  // Per-token losses [b*s] (fp32, unmasked: the caller applies the loss mask). train_step: a
  // training micro-batch, whose backward follows (MoE's global_aux_loss counts only those tokens).
  void forward(const MicroBatch& mb, const DropoutKey& key, float* losses, bool train_step = false);
  // d(sum_t dloss[t] * loss[t]) accumulated into grads(); call right after forward() of the same batch.
  // MoE layers add their load-balancing and z losses' gradients, each scaled by the MoE aux-loss
  // scale (Megatron's MoEAuxLossAutoScaler: 1 / num_microbatches in training).
  void backward(const float* dloss);
  void set_moe_aux_loss_scale(float scale) { moe_aux_loss_scale_ = scale; }
  // FP8 linear layers' scaling state (null without GptConfig::fp8).
  const CpuFp8Linears* fp8_linears() const;
  // How multi-token prediction's losses are weighed and logged (model/mtp_inputs.hpp).
  void set_mtp_loss_scale(const MtpLossScale& scale) { mtp_scale_ = scale; }
  // Mixture of Experts: the load-balancing, sequence load-balancing and z losses, each divided by
  // its coefficient (as Megatron logs them) and summed over the MoE layers: of the last forward,
  // and of every forward that a backward followed (training) since the last take, which resets.
  using MoeLosses = model::MoeLosses;
  MoeLosses last_moe_losses() const { return moe_ ? moe_->last_losses() : MoeLosses{}; }
  MoeLosses take_moe_losses() { return moe_ ? moe_->take_losses() : MoeLosses{}; }
  // Multi-token prediction: each layer's loss (its masked mean per micro-batch, scaled by the MoE
  // aux-loss scale, as Megatron's MTPLossLoggingHelper sums them) over the training forwards since
  // the last take, which resets; empty without MTP layers.
  std::vector<double> take_mtp_losses() { return std::exchange(mtp_losses_, std::vector<double>(mtp_losses_.size())); }
  int64_t num_moe_layers() const;
  // The parameters one token uses: all but the routed experts', and topk / num_experts of those
  // (the shared experts and the routers whole); num_parameters() for a dense model.
  int64_t num_active_parameters() const;
  // The whole model's parameters (every rank's shards and experts under tensor or expert
  // parallelism, no buffers).
  int64_t num_whole_parameters() const;
  // Elements of the table that are buffers, not parameters (ParamSpec::buffer).
  int64_t num_buffer_elements() const;
  // Aux-loss-free balancing (config.moe.expert_bias): every MoE layer's expert_bias moves by
  // bias_update_rate toward balance, from the tokens each expert got in the training forwards
  // since the last call, summed over the data-parallel group dp (Megatron's
  // _update_router_expert_bias, after each step's backward); the counts restart. Collective over dp.
  void update_expert_bias(dist::ProcessGroup* dp);
  // After each step: update_expert_bias(dp), and global_aux_loss's running counts start over.
  void finish_moe_step(dist::ProcessGroup* dp);
  // The data-parallel group global_aux_loss sums its tokens per expert over (null: one rank).
  void set_data_parallel_group(dist::ProcessGroup* dp);
  // FP8 delayed scaling's amax reduction group (Megatron's: the tensor-, data- and context-parallel
  // ranks; null or one rank: none).
  void set_fp8_amax_group(dist::ProcessGroup* group);
  dist::ProcessGroup* fp8_amax_group() const { return fp8_amax_group_; }
  // Context parallelism (model/backend.hpp's BatchShape): the group of the ranks holding the other
  // chunks of each sequence; micro-batches are then this rank's chunks. Null or one rank: none.
  void set_context_parallel_group(dist::ProcessGroup* cp);
  dist::ProcessGroup* data_parallel_group() const { return dp_; }
  // The context-parallel group (null: none), set_context_parallel_group's.
  dist::ProcessGroup* context_parallel_group() const { return cp_; }
  // Those counts for layer l (empty without an expert bias).
  std::vector<double> expert_load(int64_t layer) const;

 private:
  void build_routed_ranges();
  float* G(int64_t off) { return grads_.data() + (off - table_.trainable_offset); }
  bool tensor_parallel() const { return tp_size_ > 1; }
  bool sequence_parallel() const { return tp_size_ > 1 && cfg_.sequence_parallel; }
  // How a parameter is split over the model-parallel groups (its norm's and zero count's share is
  // summed over them): by expert parallelism, by both, by tensor parallelism, or whole here.
  enum SplitKind { kSplitEp = 0, kSplitBoth = 1, kSplitTp = 2, kWhole = 3 };
  int split_kind(const std::string& name) const;
  void sum_split_parts(double (&parts)[4]) const;
  // Over the whole model (see grad_norm): buf holds the parameters from offset `from` on.
  double model_norm(const float* buf, int64_t from) const;
  // The module tree's step of the last forward (its inputs point into the copies below).
  mcore::Step step(const MicroBatch& mb, const DropoutKey& key, bool train_step);

  GptConfig cfg_, lc_;  // the model, and this rank's part of it
  dist::ProcessGroup* tp_ = nullptr;
  int64_t tp_size_ = 1, tp_rank_ = 0;
  dist::ProcessGroup *ep_ = nullptr, *expert_dp_ = nullptr;
  int64_t ep_size_ = 1, ep_rank_ = 0;
  // Whole experts under tensor parallelism (moe.expert_tensor_parallel 1); folded_edp_: with an EP
  // group inside a TP group, the ranks holding the same experts, which finalize_grads sums over
  // (expert_dp_ is then null). With EP a multiple of TP, expert_dp_ serves as without folding.
  bool folded_ = false;
  dist::ProcessGroup* folded_edp_ = nullptr;
  dist::ProcessGroup* dp_ = nullptr;  // set_data_parallel_group's (null: one rank)
  int64_t cp_rank_ = 0, cp_size_ = 1;   // set_context_parallel_group's
  std::vector<int32_t> cp_places_;      // the micro-batch's (MicroBatch::cp_places)
  dist::ProcessGroup* cp_ = nullptr;
  dist::ProcessGroup* fp8_amax_group_ = nullptr;  // set_fp8_amax_group's
  GptParameterLayout layout_;
  const ParameterTable& table_ = layout_.table;
  std::vector<float> weights_, grads_;
  std::vector<std::pair<int64_t, int64_t>> routed_ranges_;  // see routed_expert_ranges (built once)
  std::vector<std::pair<int64_t, int64_t>> tp_partial_sums_;   // finalize_grads' (tp_partial_grads)

  // The module tree over the CPU backend's ops, and the MoE layers' state (null for a dense model).
  std::unique_ptr<CpuBackend> backend_;
  std::unique_ptr<CpuMoeLayers> moe_;
  std::unique_ptr<mcore::GPTModel> net_;
  // The last forward's micro-batch (the backward reads it again) and its step.
  std::vector<int64_t> tokens_, labels_, positions_;
  std::vector<int32_t> key_start_;  // the micro-batch's documents (empty: plain causal)
  // Multi-token prediction layers' inputs (model/mtp_inputs.hpp); the logged losses' sums.
  MtpLayerInputs whole_sequences(const MicroBatch& mb) const;  // (context parallelism, for MTP)
  std::vector<MtpLayerInputs> mtp_inputs_;
  std::vector<double> mtp_losses_;
  MtpLossScale mtp_scale_;
  double mtp_tokens_ = 0;  // the micro-batch's loss tokens
  mcore::Step step_;
  bool forwarded_ = false;
  float moe_aux_loss_scale_ = 1.0f;
};

}  // namespace laoyao::model
