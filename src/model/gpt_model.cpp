#include "model/gpt_model.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "core/error.hpp"
#include "model/gpt_ep.hpp"
#include "model/gpt_tp.hpp"

namespace laoyao::model {

GptModel::GptModel(const GptConfig& cfg, dist::ProcessGroup* tp, dist::ProcessGroup* ep,
                   dist::ProcessGroup* expert_dp, bool host_state)
    : cfg_(cfg), tp_(tp), ep_(ep), expert_dp_(expert_dp && expert_dp->size() > 1 ? expert_dp : nullptr) {
  if (tp_ && tp_->size() > 1) tp_size_ = tp_->size(), tp_rank_ = tp_->rank();
  if (cfg.moe.num_experts > 0 && tp_size_ > 1) check_moe_tensor_parallel(cfg);
  if (cfg.moe.num_experts > 0 && cfg.moe.expert_parallel > 1) {
    if (!ep_ || ep_->size() != cfg.moe.expert_parallel)
      throw Error("GptModel: expert parallelism over " + std::to_string(cfg.moe.expert_parallel) +
                  " ranks needs an expert-parallel group of that size");
    ep_size_ = ep_->size(), ep_rank_ = ep_->rank();
  }
  // Whole experts under tensor parallelism (expert TP size 1): the expert-parallel group is folded
  // across the TP ranks. Who sums the gradients of the ranks holding the same experts:
  // - EP a multiple of TP (each EP group whole TP groups): those ranks lie across the data-parallel
  //   ranks, so the trainer's expert data-parallel reduction does, as for split experts;
  // - otherwise (an EP group inside a TP group) they may share a TP group: finalize_grads does,
  //   over folded_edp_, and the trainer only scales; without EP every TP rank holds every expert
  //   and finalize_grads sums them over the TP group.
  folded_ = cfg.moe.num_experts > 0 && tp_size_ > 1 && !cfg.moe.experts_split_by_tp();
  if (folded_ && ep_size_ % tp_size_ != 0) {
    folded_edp_ = expert_dp_;
    expert_dp_ = nullptr;
  }
  if (cfg.lora && cfg.moe.num_experts > 0 && cfg.moe.expert_parallel > 1)
    throw UsageError("LoRA (peft.scheme lora) with expert parallelism is not built yet");
  lc_ = tp_local_config(cfg, tp_size_);
  layout_ = build_gpt_parameters(lc_);  // this rank's shapes, Megatron-Core's names
  if (tensor_parallel()) tp_partial_sums_ = tp_partial_grads(layout_);
  mtp_losses_.assign(static_cast<size_t>(cfg.mtp_num_layers), 0.0);
  if (host_state) {
    weights_.assign(static_cast<size_t>(table_.total), 0.0f);
    grads_.assign(static_cast<size_t>(table_.trainable()), 0.0f);  // none for a frozen base
  }
  backend_ = std::make_unique<CpuBackend>(lc_, tp_, tp_rank_, tp_size_);
  if (cfg.moe.num_experts > 0) {
    build_routed_ranges();
    moe_ = std::make_unique<CpuMoeLayers>(cfg_, lc_, layout_, tp_rank_, tp_size_, ep_size_ > 1 ? ep_ : nullptr,
                                          folded_, weights_.data(), grads_.data());
    backend_->set_moe(moe_.get());
  }
  net_ = std::make_unique<mcore::GPTModel>(cfg_, lc_, layout_,
                                           mcore::TensorParallel{tp_rank_, tp_size_, cfg_.sequence_parallel},
                                           *backend_, /*recompute=*/false);  // the CPU keeps every activation
}

GptModel::~GptModel() = default;

const CpuFp8Linears* GptModel::fp8_linears() const { return backend_->fp8_linears(); }

int GptModel::split_kind(const std::string& name) const {
  const bool ep = ep_size_ > 1 && is_routed_expert(name);
  const bool tp = tp_size_ > 1 && tp_split_of(name, cfg_) != TpSplit::Replicated;
  return ep && tp ? kSplitBoth : ep ? kSplitEp : tp ? kSplitTp : kWhole;
}

void GptModel::sum_split_parts(double (&parts)[4]) const {
  // [EP only, both, TP only, whole]: the TP group sums entries 1-2, the EP group 0-1 (after the TP
  // sum, so a part split both ways is summed over every rank holding a piece of it).
  if (tensor_parallel()) tp_->all_reduce_sum(parts + kSplitBoth, 2);
  if (ep_size_ > 1) ep_->all_reduce_sum(parts + kSplitEp, 2);
}

void GptModel::build_routed_ranges() {
  auto& out = routed_ranges_;
  out.clear();
  for (const auto& p : table_.specs) {
    if (!is_routed_expert(p.name)) continue;
    if (!out.empty() && out.back().first + out.back().second == p.offset)
      out.back().second += p.numel;  // neighbours merged (a layer's experts are consecutive)
    else
      out.emplace_back(p.offset, p.numel);
  }
}

namespace {

// The whole model's parameters (no buffers), every expert whole on one rank, and the routed
// experts' part of them: the counts do not depend on how tensor or expert parallelism splits them.
std::pair<int64_t, int64_t> whole_and_routed_parameters(const GptConfig& full) {
  const GptParameterLayout whole = build_gpt_parameters(ep_whole_config(full));
  int64_t all = 0, routed = 0;
  for (const auto& p : whole.table.specs) {
    if (p.buffer) continue;
    all += p.numel;
    if (is_routed_expert(p.name)) routed += p.numel;
  }
  return {all, routed};
}

}  // namespace

int64_t GptModel::num_active_parameters() const {
  if (cfg_.moe.num_experts <= 0) return num_parameters();
  const auto [all, routed] = whole_and_routed_parameters(cfg_);
  return all - routed + routed / cfg_.moe.num_experts * cfg_.moe.topk;
}

int64_t GptModel::num_whole_parameters() const { return whole_and_routed_parameters(cfg_).first; }

int64_t GptModel::num_buffer_elements() const {
  int64_t n = 0;
  for (const auto& p : table_.specs)
    if (p.buffer) n += p.numel;
  return n;
}

void GptModel::update_expert_bias(dist::ProcessGroup* dp) {
  if (moe_) moe_->update_expert_bias(weights_.data(), dp);
}

void GptModel::finish_moe_step(dist::ProcessGroup* dp) {
  if (!moe_) return;
  moe_->update_expert_bias(weights_.data(), dp);
  moe_->reset_global_aux();
}

void GptModel::set_context_parallel_group(dist::ProcessGroup* cp) {
  const bool on = cp && cp->size() > 1;
  // (Each document's chunks: the dropout masks' and the MTP rolls' two chunks of a sequence do not apply.)
  if (on && cfg_.document_attention && (cfg_.mtp_num_layers > 0 || cfg_.hidden_dropout > 0 || cfg_.attention_dropout > 0))
    throw Error("GptModel: context parallelism with documents and multi-token prediction or dropout is not built");
  cp_rank_ = on ? cp->rank() : 0, cp_size_ = on ? cp->size() : 1;
  cp_ = on ? cp : nullptr;
  backend_->set_context_parallel(cp_);
  if (moe_) moe_->set_context_parallel_group(cp_);
}

void GptModel::set_data_parallel_group(dist::ProcessGroup* dp) {
  dp_ = dp && dp->size() > 1 ? dp : nullptr;
  if (moe_) moe_->set_data_parallel_group(dp_);
}

void GptModel::set_fp8_amax_group(dist::ProcessGroup* group) {
  fp8_amax_group_ = group;
  backend_->set_fp8_amax_group(group);
}

std::vector<double> GptModel::expert_load(int64_t layer) const {
  return moe_ ? moe_->expert_load(layer) : std::vector<double>{};
}

int64_t GptModel::num_moe_layers() const {
  int64_t n = 0;
  for (int64_t l = 0; l < cfg_.layer_count(); ++l) n += cfg_.is_moe_layer(l);
  return n;
}

void GptModel::zero_grads() { std::fill(grads_.begin(), grads_.end(), 0.0f); }

void GptModel::hold_host_weights(bool hold) {
  if (hold)
    weights_.assign(static_cast<size_t>(table_.total), 0.0f);
  else
    std::vector<float>().swap(weights_);
}

int64_t GptModel::count_zero_grads() const {
  double zeros[4] = {0.0, 0.0, 0.0, 0.0};  // by split_kind
  for (const auto& p : table_.specs) {
    // Not a parameter, or frozen: Megatron counts the gradients of the trained parameters.
    if (p.buffer || p.frozen) continue;
    const float* g = grads_.data() + (p.offset - table_.trainable_offset);
    int64_t z = 0;
    for (int64_t i = 0; i < p.numel; ++i) z += g[i] == 0.0f;
    zeros[split_kind(p.name)] += static_cast<double>(z);
  }
  sum_split_parts(zeros);
  return static_cast<int64_t>(zeros[0] + zeros[1] + zeros[2] + zeros[3]);
}

double GptModel::model_norm(const float* buf, int64_t from) const {
  double sq[4] = {0.0, 0.0, 0.0, 0.0};  // by split_kind
  for (const auto& p : table_.specs) {
    if (p.buffer || p.offset < from) continue;  // not a parameter (and never given a gradient)
    const float* v = buf + (p.offset - from);
    double s = 0.0;
    for (int64_t i = 0; i < p.numel; ++i) s += double(v[i]) * v[i];
    sq[split_kind(p.name)] += s;
  }
  sum_split_parts(sq);
  return std::sqrt(sq[0] + sq[1] + sq[2] + sq[3]);
}

void GptModel::finalize_grads() {
  // Each rank's part of the whole LoRA adapter halves' and MLA down projections' gradients.
  for (const auto& [off, n] : tp_partial_sums_)
    if (off >= table_.trainable_offset) tp_->all_reduce_sum(G(off), static_cast<size_t>(n));
  if (!sequence_parallel()) return;
  // Each rank's norm weights and biases saw only its share of the sequence.
  std::vector<int64_t> offs = {layout_.final_w, layout_.final_b};
  for (const auto& M : layout_.mtp) offs.insert(offs.end(), {M.final_w, M.final_b});  // (on each rank's rows too)
  for (const auto& L : layout_.layers) offs.insert(offs.end(), {L.ln1_w, L.ln1_b, L.ln2_w, L.ln2_b});
  for (int64_t off : offs) {
    if (off < table_.trainable_offset) continue;  // none, or frozen
    tp_->all_reduce_sum(G(off), static_cast<size_t>(lc_.hidden));
  }
  // A router's gradient is each rank's share (its experts' columns' part of the probabilities'
  // gradient): summed, as Megatron all-reduces the sequence-parallel router over the group.
  for (const auto& L : layout_.layers)  // (frozen under PEFT: no gradient)
    if (L.router_w >= table_.trainable_offset)
      tp_->all_reduce_sum(G(L.router_w), static_cast<size_t>(cfg_.moe.num_experts * lc_.hidden));
  // Whole experts (see the constructor): each rank's experts saw its share's rows (and its
  // expert-parallel group's); here the ranks holding the same experts sum them where the trainer
  // does not: over folded_edp_ with EP, over the TP group without.
  if (dist::ProcessGroup* same_experts = ep_size_ > 1 ? folded_edp_ : folded_ ? tp_ : nullptr)
    for (const auto& [offset, count] : routed_ranges_)
      if (offset >= table_.trainable_offset) same_experts->all_reduce_sum(G(offset), static_cast<size_t>(count));
}

void check_key_start(const MicroBatch& mb) {
  if (!mb.key_start) return;
  for (int64_t t = 0; t < mb.b * mb.s; ++t) {
    // (i: the token's place in its sequence; the previous token is this row's previous one)
    const int64_t local = t % mb.s, i = mb.cp_places ? mb.cp_places[t] : local, first = mb.key_start[t];
    const int64_t before = local > 0 ? mb.key_start[t - 1] : 0;
    if (first < before || first > i)
      throw Error("micro-batch key_start[" + std::to_string(t) + "] = " + std::to_string(first) + " outside [" +
                  std::to_string(before) + ", " + std::to_string(i) +
                  "]: a query's document starts at or before it and not before the previous query's");
  }
}

mcore::Step GptModel::step(const MicroBatch& mb, const DropoutKey& key, bool train_step) {
  const int64_t T = mb.b * mb.s;
  tokens_.assign(mb.tokens, mb.tokens + T);
  labels_.assign(mb.labels, mb.labels + T);
  if (mb.positions) positions_.assign(mb.positions, mb.positions + T);
  else positions_.clear();
  if (mb.key_start) key_start_.assign(mb.key_start, mb.key_start + T);
  else key_start_.clear();
  if (mb.cp_places && !cp_) throw Error("GptModel: a micro-batch of context-parallel places without context parallelism");
  if (mb.cp_places) cp_places_.assign(mb.cp_places, mb.cp_places + T);
  else cp_places_.clear();
  mcore::Step st;
  st.batch = {mb.b,    mb.s,      T, net_->rows(T), key_start_.empty() ? nullptr : key_start_.data(), cp_rank_,
              cp_size_, cp_places_.empty() ? nullptr : cp_places_.data()};
  st.tokens = tokens_.data(), st.labels = labels_.data();
  st.positions = positions_.empty() ? nullptr : positions_.data();
  st.seed = key.seed, st.call = key.call, st.training = key.training, st.train_step = train_step;
  st.is_first_microbatch = mb.is_first_microbatch;
  // Multi-token prediction: ids, positions, labels and mask rolled left once more per layer.
  mtp_inputs_.resize(static_cast<size_t>(cfg_.mtp_num_layers));
  mtp_tokens_ = mtp_tokens(mb.loss_mask, T);  // (this rank's: Megatron normalises each rank's by its own)
  const MtpLayerInputs whole = mtp_inputs_.empty() || !cp_ ? MtpLayerInputs{} : whole_sequences(mb);
  for (size_t k = 0; k < mtp_inputs_.size(); ++k) {
    MtpLayerInputs& m = mtp_inputs_[k];
    if (cp_)
      roll_mtp_inputs_cp(m, whole, mb.b, mb.s, cp_rank_, cp_size_, static_cast<int64_t>(k));
    else
      roll_mtp_inputs(m, mb.b, mb.s, mb.tokens, mb.positions, mb.labels, mb.loss_mask, static_cast<int64_t>(k));
    st.mtp.push_back({m.tokens.data(), m.positions.data(), m.labels.data(), m.losses.data(), nullptr});
  }
  return st;
}

// Context parallelism: the whole sequences' ids, positions, labels and mask, each rank's chunks put in
// their places and summed over the group (exact in doubles).
MtpLayerInputs GptModel::whole_sequences(const MicroBatch& mb) const {
  const int64_t s = mb.s, S = s * cp_size_, n = mb.b * S;
  std::vector<double> all(static_cast<size_t>(4 * n), 0.0);
  for (int64_t t = 0; t < mb.b * s; ++t) {
    const size_t at = static_cast<size_t>(4 * ((t / s) * S + cp_place(t % s, s, cp_rank_, cp_size_)));
    all[at] = static_cast<double>(mb.tokens[t]);
    all[at + 1] = mb.positions ? static_cast<double>(mb.positions[t]) : 0.0;
    all[at + 2] = static_cast<double>(mb.labels[t]);
    all[at + 3] = mb.loss_mask ? mb.loss_mask[t] : 1.0;
  }
  cp_->all_reduce_sum(all.data(), all.size());
  MtpLayerInputs w;
  for (int64_t t = 0; t < n; ++t) {
    w.tokens.push_back(static_cast<int64_t>(all[static_cast<size_t>(4 * t)]));
    w.positions.push_back(static_cast<int64_t>(all[static_cast<size_t>(4 * t + 1)]));
    w.labels.push_back(static_cast<int64_t>(all[static_cast<size_t>(4 * t + 2)]));
    w.mask.push_back(static_cast<float>(all[static_cast<size_t>(4 * t + 3)]));
  }
  return w;
}

void GptModel::forward(const MicroBatch& mb, const DropoutKey& key, float* losses, bool train_step) {
  check_key_start(mb);  // what the CUDA model requires too, so both backends take the same inputs
  if (tensor_parallel()) check_token_ids(mb.tokens, mb.b * mb.s, cfg_.vocab, "GptModel");
  net_->allocate(mb.b, mb.s);
  step_ = step(mb, key, train_step);
  backend_->bind(weights_.data(), grads_.data(), table_.trainable_offset);
  net_->forward(step_, losses);
  forwarded_ = true;
  // Megatron logs a training forward's MTP losses: the masked mean, scaled as the main loss is.
  if (train_step)
    for (size_t k = 0; k < mtp_inputs_.size(); ++k)
      mtp_losses_[k] += mtp_masked_mean(mtp_inputs_[k]) * mtp_scale_.per_microbatch;
}

void GptModel::backward(const float* dloss) {
  if (!forwarded_) throw Error("GptModel::backward without a forward");
  if (moe_) moe_->count_training_forward();  // a training step's forward: its MoE losses are logged
  // Each MTP layer's loss weights (Megatron's MTPLossAutoScaler; model/mtp_inputs.hpp).
  const double weight = mtp_loss_weight(mtp_scale_, cfg_.mtp_loss_scaling_factor, cfg_.mtp_num_layers, mtp_tokens_);
  for (size_t k = 0; k < mtp_inputs_.size(); ++k) {
    set_mtp_loss_weights(mtp_inputs_[k], weight);
    step_.mtp[k].dloss = mtp_inputs_[k].dloss.data();
  }
  backend_->bind(weights_.data(), grads_.data(), table_.trainable_offset);
  net_->backward(step_, dloss, moe_aux_loss_scale_);
}

}  // namespace laoyao::model
