#include "model/gpt_model.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#include "core/error.hpp"
#include "core/rng.hpp"
#include "kernels/cpu/ops.hpp"
#include "model/gpt_ep.hpp"
#include "model/gpt_tp.hpp"
#include "model/moe_expert_parallel.hpp"
#include "model/moe_share_stage.hpp"
#include "model/tensor_parallel.hpp"

namespace laoyao::model {

namespace k = laoyao::kernels::cpu;

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
  lc_ = tp_local_config(cfg, tp_size_);
  if (cfg.qk_layernorm) dqk_scratch_.assign(static_cast<size_t>(2 * cfg.kv_channels), 0.0f);
  build_parameter_table();
  if (cfg.positions == Positions::Rope) {
    if (cfg.max_positions <= 0) throw Error("GptModel: rotary positions need max_positions > 0");
    k::RopeParams rp;
    rp.rotary_base = cfg.rotary_base;
    rp.rotary_percent = cfg.rotary_percent;
    rp.rope_scaling = cfg.rope_scaling;
    rp.rope_scaling_factor = cfg.rope_scaling_factor;
    rp.seq_len_interpolation_factor = cfg.seq_len_interpolation_factor;
    rope_ = k::rope_table(cfg.kv_channels, cfg.max_positions, rp);
  }
  if (host_state) {
    weights_.assign(static_cast<size_t>(table_.total), 0.0f);
    grads_.assign(static_cast<size_t>(table_.total), 0.0f);
  }
  if (cfg.moe.num_experts > 0) {
    namespace k = kernels::cpu;
    const MoeConfig& m = cfg.moe;
    moe_cfg_.hidden_size = cfg.hidden;
    moe_cfg_.num_experts = m.num_experts;
    moe_cfg_.topk = m.topk;
    moe_cfg_.ffn_hidden_size = lc_.moe.ffn;  // with tensor parallelism this rank's share of each expert
    moe_cfg_.shared_expert_intermediate_size = lc_.moe.shared_ffn;
    moe_cfg_.activation = cfg.activation == Activation::SwiGLU   ? k::MoeActivation::SwiGlu
                          : cfg.activation == Activation::GeluErf ? k::MoeActivation::GeluErf
                                                                  : k::MoeActivation::GeluTanh;
    moe_cfg_.router.score_function = !m.sigmoid       ? k::MoeScoreFunction::Softmax
                                     : m.sqrt_softplus ? k::MoeScoreFunction::SqrtSoftplus
                                                       : k::MoeScoreFunction::Sigmoid;
    moe_cfg_.router.pre_softmax = m.pre_softmax;
    if (m.topk_scaling_factor) moe_cfg_.router.topk_scaling_factor = static_cast<float>(*m.topk_scaling_factor);
    moe_cfg_.router.num_groups = m.num_groups, moe_cfg_.router.group_topk = m.group_topk;
    moe_cfg_.force_load_balancing = m.force_load_balancing;
    moe_cfg_.router_bf16_logits = m.router_bf16;
    moe_cfg_.capacity_factor = m.capacity_factor;
    moe_cfg_.drop_by_position = m.drop_by_position;
    // Megatron drops within each TP rank's share of the sequence; every rank here routes the whole
    // gathered sequence, so it drops by those shares. A one-rank model with moe.tensor_parallel > 1
    // drops as that many ranks would.
    moe_cfg_.capacity_shares = tp_size_ > 1 ? tp_size_ : m.tensor_parallel;
    moe_cfg_.aux_loss_coeff = static_cast<float>(m.aux_loss_coeff);
    moe_cfg_.seq_aux_loss_coeff = static_cast<float>(m.seq_aux_loss_coeff);
    moe_cfg_.global_aux_loss_coeff = static_cast<float>(m.global_aux_loss_coeff);
    moe_cfg_.z_loss_coeff = static_cast<float>(m.z_loss_coeff);
    moe_states_.resize(static_cast<size_t>(cfg.num_layers));
    expert_load_.assign(static_cast<size_t>(cfg.num_layers),
                        std::vector<double>(static_cast<size_t>(m.num_experts), 0.0));
    ep_stages_.resize(static_cast<size_t>(cfg.num_layers));
    build_routed_ranges();
    for (int64_t l = 0; l < cfg.num_layers && (ep_size_ > 1 || folded_); ++l) {
      if (!cfg.is_moe_layer(l)) continue;
      const LayerParams& L = layers_[l];
      std::unique_ptr<kernels::cpu::MoeExpertsStage> experts;
      if (ep_size_ > 1) {
        auto stage = std::make_unique<MoeExpertParallelStage>(*ep_, m.num_experts, cfg.hidden, lc_.moe.ffn,
                                                              moe_cfg_.activation);
        stage->set_weights(P(L.experts_fc1), P(L.experts_fc2), G(L.experts_fc1), G(L.experts_fc2));
        experts = std::move(stage);
      } else {  // whole experts, all of them on every TP rank
        auto stage = std::make_unique<kernels::cpu::MoeLocalExpertsStage>(m.num_experts, cfg.hidden, lc_.moe.ffn,
                                                                          moe_cfg_.activation);
        stage->set_weights(P(L.experts_fc1), P(L.experts_fc2), G(L.experts_fc1), G(L.experts_fc2));
        experts = std::move(stage);
      }
      if (folded_)  // only this rank's share of the sequence goes to the experts
        experts = std::make_unique<MoeShareStage>(std::move(experts), tp_rank_, tp_size_, cfg.hidden, m.num_experts);
      ep_stages_[static_cast<size_t>(l)] = std::move(experts);
    }
  }
}

GptModel::~GptModel() = default;

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

GptModel::MoeLosses GptModel::last_moe_losses() const {
  MoeLosses out;
  const auto& m = cfg_.moe;
  for (int64_t l = 0; l < cfg_.num_layers; ++l) {
    if (!cfg_.is_moe_layer(l)) continue;
    const auto& st = moe_states_[static_cast<size_t>(l)];
    if (m.aux_loss_coeff > 0) out.aux += st.aux_loss / m.aux_loss_coeff;
    if (m.seq_aux_loss_coeff > 0) out.seq_aux += st.seq_aux_loss / m.seq_aux_loss_coeff;
    if (m.z_loss_coeff > 0) out.z += st.z_loss / m.z_loss_coeff;
    if (m.global_aux_loss_coeff > 0) out.global_aux += st.global_aux_loss / m.global_aux_loss_coeff;
  }
  return out;
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
  if (!cfg_.moe.expert_bias) return;
  const float rate = static_cast<float>(cfg_.moe.bias_update_rate);
  for (int64_t l = 0; l < cfg_.num_layers; ++l) {
    if (!cfg_.is_moe_layer(l)) continue;
    auto& load = expert_load_[static_cast<size_t>(l)];
    load.resize(static_cast<size_t>(cfg_.moe.num_experts), 0.0);
    if (dp && dp->size() > 1) dp->all_reduce_sum(load.data(), load.size());
    double mean = 0.0;
    for (double x : load) mean += x / static_cast<double>(load.size());
    // Megatron's get_updated_expert_bias: bias += sign(mean load - load) * rate (in fp32).
    float* bias = P(layers_[l].expert_bias);
    for (size_t e = 0; e < load.size(); ++e) {
      const double offset = mean - load[e];
      bias[e] += offset > 0 ? rate : offset < 0 ? -rate : 0.0f;
    }
    std::fill(load.begin(), load.end(), 0.0);
  }
}

void GptModel::finish_moe_step(dist::ProcessGroup* dp) {
  update_expert_bias(dp);
  for (auto& st : moe_states_) k::moe_global_aux_reset(st);
}

void GptModel::set_data_parallel_group(dist::ProcessGroup* dp) {
  dp_ = dp && dp->size() > 1 ? dp : nullptr;
  if (!dp_) {
    moe_cfg_.data_parallel_size = 1;
    moe_cfg_.sum_over_data_parallel = nullptr;
    return;
  }
  moe_cfg_.data_parallel_size = dp->size();
  moe_cfg_.sum_over_data_parallel = [dp](double* counts, int64_t n) {
    dp->all_reduce_sum(counts, static_cast<size_t>(n));
  };
}

std::vector<double> GptModel::expert_load(int64_t layer) const {
  return cfg_.is_moe_layer(layer) && cfg_.moe.expert_bias ? expert_load_.at(static_cast<size_t>(layer))
                                                          : std::vector<double>{};
}

int64_t GptModel::num_moe_layers() const {
  int64_t n = 0;
  for (int64_t l = 0; l < cfg_.num_layers; ++l) n += cfg_.is_moe_layer(l);
  return n;
}

kernels::cpu::MoeLayerWeights GptModel::moe_weights(const LayerParams& L) {
  kernels::cpu::MoeLayerWeights w;
  w.router_weight = P(L.router_w);
  w.fc1_weight = P(L.experts_fc1);
  w.fc2_weight = P(L.experts_fc2);
  w.shared_fc1_weight = L.shared_fc1 >= 0 ? P(L.shared_fc1) : nullptr;
  w.shared_fc2_weight = L.shared_fc2 >= 0 ? P(L.shared_fc2) : nullptr;
  w.expert_bias = L.expert_bias >= 0 ? P(L.expert_bias) : nullptr;
  return w;
}

kernels::cpu::MoeLayerGrads GptModel::moe_grads(const LayerParams& L) {
  kernels::cpu::MoeLayerGrads g;
  g.router_weight = G(L.router_w);
  g.fc1_weight = G(L.experts_fc1);
  g.fc2_weight = G(L.experts_fc2);
  g.shared_fc1_weight = L.shared_fc1 >= 0 ? G(L.shared_fc1) : nullptr;
  g.shared_fc2_weight = L.shared_fc2 >= 0 ? G(L.shared_fc2) : nullptr;
  return g;
}

void GptModel::build_parameter_table() {
  GptParameterLayout layout = build_gpt_parameters(lc_);  // this rank's shapes, Megatron-Core's names
  table_ = std::move(layout.table);
  word_emb_ = layout.word_emb, pos_emb_ = layout.pos_emb, final_w_ = layout.final_w, final_b_ = layout.final_b;
  output_w_ = layout.output_w;
  layers_ = std::move(layout.layers);
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
    if (p.buffer) continue;  // not a parameter: Megatron counts the gradients of parameters
    int64_t z = 0;
    for (int64_t i = 0; i < p.numel; ++i) z += grads_[p.offset + i] == 0.0f;
    zeros[split_kind(p.name)] += static_cast<double>(z);
  }
  sum_split_parts(zeros);
  return static_cast<int64_t>(zeros[0] + zeros[1] + zeros[2] + zeros[3]);
}

double GptModel::model_norm(const float* buf) const {
  double sq[4] = {0.0, 0.0, 0.0, 0.0};  // by split_kind
  for (const auto& p : table_.specs) {
    if (p.buffer) continue;  // not a parameter (and never given a gradient)
    double s = 0.0;
    for (int64_t i = 0; i < p.numel; ++i) s += double(buf[p.offset + i]) * buf[p.offset + i];
    sq[split_kind(p.name)] += s;
  }
  sum_split_parts(sq);
  return std::sqrt(sq[0] + sq[1] + sq[2] + sq[3]);
}

void GptModel::allocate_activations(int64_t b, int64_t s) {
  if (b == b_ && s == s_) return;
  const auto& c = lc_;
  const int64_t T = b * s, h = c.hidden;
  int64_t n = 0;
  auto take = [&](int64_t count) {
    int64_t off = n;
    n += count;
    return off;
  };
  layer_acts_.clear();
  emb_drop_ = take(T * h);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    LayerActs a{};
    a.x_in = take(T * h);
    a.ln1 = take(T * h);
    a.ln1_mean = take(T);
    a.ln1_rstd = take(T);
    a.qkv = take(T * c.qkv_width());
    // What attention reads: q/k normalised (QK layernorm) and rotated (RoPE). Without QK layernorm
    // RoPE rotates qkv in place (nothing needs the unrotated values); with it, qkv keeps the
    // pre-norm values its backward needs.
    a.qkv_attn = c.qk_layernorm ? take(T * c.qkv_width()) : a.qkv;
    a.qk_rstd = take(c.qk_layernorm ? T * (c.heads + c.query_groups) : 0);
    a.probs = take(b * c.heads * s * s);
    a.attn_mask = take(c.attention_dropout > 0 ? b * c.heads * s * s : 0);
    a.ctx = take(T * c.heads * c.kv_channels);
    a.drop1 = take(T * h);
    a.x_mid = take(T * h);
    a.ln2 = take(T * h);
    a.ln2_mean = take(T);
    a.ln2_rstd = take(T);
    a.u = take(T * c.fc1_width());
    a.g = take(T * c.ffn);
    a.drop2 = take(T * h);
    layer_acts_.push_back(a);
  }
  x_final_in_ = take(T * h);
  xf_ = take(T * h);
  xf_mean_ = take(T);
  xf_rstd_ = take(T);
  logits_ = take(T * c.vocab);
  lse_ = take(2 * T);  // the log-sum-exp, or with tensor parallelism the maximum and the sum of exponentials
  acts_.assign(static_cast<size_t>(n), 0.0f);
  if (sequence_parallel()) {
    if (s % tp_size_ != 0)
      throw UsageError("sequence parallelism splits each sequence over the tensor-parallel ranks: the sequence "
                       "length (" + std::to_string(s) + ") must be divisible by the tensor-parallel size (" +
                       std::to_string(tp_size_) + ")");
    sp_full_.assign(static_cast<size_t>(T * h), 0.0f);
    sp_local_.assign(static_cast<size_t>(T / tp_size_ * h), 0.0f);
  }
  // Backward scratch: dqkv/du (widest), d(residual), d(norm out), d(norm in), d(act), d(ctx).
  int64_t wide = std::max({c.qkv_width(), c.fc1_width(), c.heads * c.kv_channels, h});
  work_.assign(static_cast<size_t>(T * (wide + 3 * h + c.ffn + c.heads * c.kv_channels)), 0.0f);
  b_ = b, s_ = s;
}

namespace {

// Fills `mask` with 0 or 1/(1-p) (inverted dropout, as torch.nn.functional.dropout scales).
void dropout_mask(float* mask, int64_t n, double p, uint64_t seed, const std::string& stream) {
  Rng rng(seed, stream);
  const float keep = static_cast<float>(1.0 / (1.0 - p));
  for (int64_t i = 0; i < n; ++i) mask[i] = rng.uniform() < p ? 0.0f : keep;
}

void add_bias(float* y, const float* b, int64_t T, int64_t C) {
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c) y[t * C + c] += b[c];
}

void multiply(float* y, const float* mask, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] *= mask[i];
}

k::Gelu gelu_kind(Activation a) { return a == Activation::GeluErf ? k::Gelu::Erf : k::Gelu::Tanh; }

// The configured norm (LayerNorm with bias, or RMSNorm) over [T, C].
void norm_forward(const GptConfig& c, const float* x, const float* gamma, const float* beta, float* y, float* mean,
                  float* rstd, int64_t T) {
  if (c.norm == Norm::LayerNorm)
    k::layernorm_forward(x, gamma, beta, y, mean, rstd, T, c.hidden, c.norm_eps, c.zero_centered_gamma);
  else
    k::rmsnorm_forward(x, gamma, y, rstd, T, c.hidden, c.norm_eps, c.zero_centered_gamma);
}

void norm_backward(const GptConfig& c, const float* dy, const float* x, const float* gamma, const float* mean,
                   const float* rstd, float* dx, float* dgamma, float* dbeta, int64_t T) {
  if (c.norm == Norm::LayerNorm)
    k::layernorm_backward(dy, x, gamma, mean, rstd, dx, dgamma, dbeta, T, c.hidden, c.zero_centered_gamma);
  else
    k::rmsnorm_backward(dy, x, gamma, rstd, dx, dgamma, T, c.hidden, c.zero_centered_gamma);
}

}  // namespace

void GptModel::gather_sequence(float* buf) {
  const int64_t Tl = b_ * s_ / tp_size_, h = lc_.hidden;
  std::copy(buf, buf + Tl * h, sp_local_.begin());
  tp::sequence_gather(sp_local_.data(), buf, b_, s_, h, tp_);
}

void GptModel::reduce_scatter_sequence(float* buf) {
  const int64_t Tl = b_ * s_ / tp_size_, h = lc_.hidden;
  tp::sequence_reduce_scatter(buf, sp_local_.data(), b_, s_, h, tp_);
  std::copy(sp_local_.begin(), sp_local_.begin() + Tl * h, buf);
}

void GptModel::hidden_dropout_mask(float* mask, double p, uint64_t seed, const std::string& stream) {
  const int64_t T = b_ * s_, h = lc_.hidden;
  if (!sequence_parallel()) return dropout_mask(mask, T * h, p, seed, stream);
  dropout_mask(sp_full_.data(), T * h, p, seed, stream);  // the whole model's mask: this rank's rows
  tp::sequence_slice(sp_full_.data(), mask, b_, s_, h, tp_rank_, tp_size_);
}

void GptModel::finalize_grads() {
  if (!sequence_parallel()) return;
  // Each rank's norm weights and biases saw only its share of the sequence.
  std::vector<int64_t> offs = {final_w_, final_b_};
  for (const auto& L : layers_) offs.insert(offs.end(), {L.ln1_w, L.ln1_b, L.ln2_w, L.ln2_b});
  for (int64_t off : offs) {
    if (off < 0) continue;
    tp_->all_reduce_sum(G(off), static_cast<size_t>(lc_.hidden));
  }
  // A router's gradient is each rank's share (its experts' columns' part of the probabilities'
  // gradient): summed, as Megatron all-reduces the sequence-parallel router over the group.
  for (const auto& L : layers_)
    if (L.router_w >= 0) tp_->all_reduce_sum(G(L.router_w), static_cast<size_t>(cfg_.moe.num_experts * lc_.hidden));
  // Whole experts (see the constructor): each rank's experts saw its share's rows (and its
  // expert-parallel group's); here the ranks holding the same experts sum them where the trainer
  // does not: over folded_edp_ with EP, over the TP group without.
  if (dist::ProcessGroup* same_experts = ep_size_ > 1 ? folded_edp_ : folded_ ? tp_ : nullptr)
    for (const auto& [offset, count] : routed_ranges_)
      same_experts->all_reduce_sum(G(offset), static_cast<size_t>(count));
}

void check_key_start(const MicroBatch& mb) {
  if (!mb.key_start) return;
  for (int64_t t = 0; t < mb.b * mb.s; ++t) {
    const int64_t i = t % mb.s, first = mb.key_start[t];
    const int64_t before = i > 0 ? mb.key_start[t - 1] : 0;
    if (first < before || first > i)
      throw Error("micro-batch key_start[" + std::to_string(t) + "] = " + std::to_string(first) + " outside [" +
                  std::to_string(before) + ", " + std::to_string(i) +
                  "]: a query's document starts at or before it and not before the previous query's");
  }
}

void GptModel::forward(const MicroBatch& mb, const DropoutKey& key, float* losses, bool train_step) {
  const auto& c = lc_;
  allocate_activations(mb.b, mb.s);
  const int64_t T = mb.b * mb.s, h = c.hidden, D = c.kv_channels;
  training_ = key.training;
  tokens_.assign(mb.tokens, mb.tokens + T);
  labels_.assign(mb.labels, mb.labels + T);
  if (mb.positions) positions_.assign(mb.positions, mb.positions + T);
  check_key_start(mb);  // what the CUDA model requires too, so both backends take the same inputs
  if (mb.key_start) key_start_.assign(mb.key_start, mb.key_start + T);
  else key_start_.clear();
  // Megatron-Core builds RoPE for positions 0..s-1 of every sequence (not from position_ids).
  rope_positions_.resize(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) rope_positions_[t] = t % mb.s;
  const bool drop = training_ && c.hidden_dropout > 0;
  const bool attn_drop = training_ && c.attention_dropout > 0;
  const std::string call = std::to_string(key.call);

  // Embedding: word + position, then embedding dropout. With sequence parallelism it is built
  // whole and each rank keeps its share of the sequence (Megatron's scatter to the SP region).
  const bool sp = sequence_parallel();
  const int64_t Tl = sp ? T / tp_size_ : T;  // the tokens this rank holds outside the TP regions
  float* x_kept = A(layer_acts_.empty() ? x_final_in_ : layer_acts_[0].x_in);
  float* x = sp ? sp_full_.data() : x_kept;
  const tp::Shard vocab{tp_rank_ * c.vocab, c.vocab};  // this rank's vocabulary rows
  if (tensor_parallel()) {
    check_token_ids(mb.tokens, T, cfg_.vocab, "GptModel");
    tp::vocab_parallel_embedding_forward(mb.tokens, P(word_emb_), x, T, h, vocab, tp_);
  } else {
    k::embedding_forward(mb.tokens, P(word_emb_), x, T, h, c.vocab, false);
  }
  if (pos_emb_ >= 0) {
    if (!mb.positions) throw Error("GptModel: learned positions need position ids");
    k::embedding_forward(mb.positions, P(pos_emb_), x, T, h, c.max_positions, true);
  }
  if (drop) {
    dropout_mask(A(emb_drop_), T * h, c.hidden_dropout, key.seed, "dropout.embedding." + call);
    multiply(x, A(emb_drop_), T * h);
  }
  if (sp) tp::sequence_slice(x, x_kept, mb.b, mb.s, h, tp_rank_, tp_size_);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const LayerParams& L = layers_[l];
    const LayerActs& a = layer_acts_[l];
    float* x_in = A(a.x_in);
    float* x_out = A(l + 1 < c.num_layers ? layer_acts_[l + 1].x_in : x_final_in_);
    const std::string site = "dropout.layer" + std::to_string(l) + ".";
    // Attention block: x_mid = x_in + dropout(proj(attn(norm(x_in))) + b_proj)
    // ln1 holds the whole sequence's norm output (sequence parallel: this rank's, all-gathered).
    norm_forward(c, x_in, P(L.ln1_w), opt(L.ln1_b), A(a.ln1), A(a.ln1_mean), A(a.ln1_rstd), Tl);
    if (sp) gather_sequence(A(a.ln1));
    k::linear_forward(A(a.ln1), P(L.qkv_w), opt(L.qkv_b), A(a.qkv), T, h, c.qkv_width());
    if (c.qk_layernorm)
      k::qk_rmsnorm_forward(A(a.qkv), P(L.q_norm), P(L.k_norm), A(a.qkv_attn), A(a.qk_rstd), T, c.heads,
                            c.query_groups, D, c.norm_eps, c.zero_centered_gamma);
    if (c.positions == Positions::Rope)
      k::rope_forward_qkv(A(a.qkv_attn), rope_positions_.data(), rope_, T, c.heads, c.query_groups, D);
    const float* attn_mask = nullptr;
    if (attn_drop) {
      if (tensor_parallel()) {  // the whole model's mask, this rank's heads of it
        const int64_t per_head = mb.s * mb.s, H = cfg_.heads;
        full_mask_.resize(static_cast<size_t>(mb.b * H * per_head));
        dropout_mask(full_mask_.data(), mb.b * H * per_head, c.attention_dropout, key.seed, site + "probs." + call);
        for (int64_t bi = 0; bi < mb.b; ++bi)
          std::copy(full_mask_.begin() + (bi * H + tp_rank_ * c.heads) * per_head,
                    full_mask_.begin() + (bi * H + (tp_rank_ + 1) * c.heads) * per_head,
                    A(a.attn_mask) + bi * c.heads * per_head);
      } else {
        dropout_mask(A(a.attn_mask), mb.b * c.heads * mb.s * mb.s, c.attention_dropout, key.seed,
                     site + "probs." + call);
      }
      attn_mask = A(a.attn_mask);
    }
    k::attention_forward(A(a.qkv_attn), A(a.ctx), A(a.probs), mb.b, mb.s, c.heads, c.query_groups, D, scale,
                         attn_mask, key_start());
    float* o = A(a.x_mid);  // the branch output is built in place, then the residual added
    if (sp) {  // RowParallelLinear, reduce-scattered along the sequence, then the bias
      k::linear_forward(A(a.ctx), P(L.proj_w), nullptr, o, T, c.heads * D, h);
      reduce_scatter_sequence(o);
      if (L.proj_b >= 0) add_bias(o, P(L.proj_b), Tl, h);
    } else if (tensor_parallel()) {  // RowParallelLinear: this rank's heads' share, summed, then the bias
      tp::row_parallel_forward(A(a.ctx), P(L.proj_w), opt(L.proj_b), o, T, c.heads * D, h, tp_);
    } else {
      k::linear_forward(A(a.ctx), P(L.proj_w), opt(L.proj_b), o, T, c.heads * D, h);
    }
    if (drop) {
      hidden_dropout_mask(A(a.drop1), c.hidden_dropout, key.seed, site + "attention." + call);
      multiply(o, A(a.drop1), Tl * h);
    }
    k::add_inplace(o, x_in, Tl * h);
    // MLP block: x_out = x_mid + dropout(fc2(act(fc1(norm(x_mid)))) + b_fc2)
    norm_forward(c, o, P(L.ln2_w), opt(L.ln2_b), A(a.ln2), A(a.ln2_mean), A(a.ln2_rstd), Tl);
    if (sp) gather_sequence(A(a.ln2));
    if (cfg_.is_moe_layer(l)) {  // Megatron-Core's MoELayer in place of the MLP
      // With tensor parallelism (sequence parallel) every rank routes the whole gathered sequence,
      // as Megatron's dispatcher gathers the tokens and their routing over the group, and runs its
      // share of each expert: the outputs are partial sums, reduce-scattered like linear_fc2's.
      moe_cfg_.seq_length = mb.s;
      moe_cfg_.random_logits_key = random_logits_key(key, l);
      moe_cfg_.global_aux_training = train_step;
      if (folded_) static_cast<MoeShareStage&>(*ep_stages_[static_cast<size_t>(l)]).set_sequence_length(mb.s);
      k::moe_layer_forward(moe_cfg_, moe_weights(L), A(a.ln2), x_out, T, moe_states_[static_cast<size_t>(l)],
                           ep_stages_[static_cast<size_t>(l)].get());
      if (sp) reduce_scatter_sequence(x_out);
    } else {
      k::linear_forward(A(a.ln2), P(L.fc1_w), opt(L.fc1_b), A(a.u), T, h, c.fc1_width());
      if (c.activation == Activation::SwiGLU)
        k::swiglu_forward(A(a.u), A(a.g), T, c.ffn);
      else
        k::gelu_forward(A(a.u), A(a.g), T * c.ffn, gelu_kind(c.activation));
      if (sp) {
        k::linear_forward(A(a.g), P(L.fc2_w), nullptr, x_out, T, c.ffn, h);
        reduce_scatter_sequence(x_out);
        if (L.fc2_b >= 0) add_bias(x_out, P(L.fc2_b), Tl, h);
      } else if (tensor_parallel()) {
        tp::row_parallel_forward(A(a.g), P(L.fc2_w), opt(L.fc2_b), x_out, T, c.ffn, h, tp_);
      } else {
        k::linear_forward(A(a.g), P(L.fc2_w), opt(L.fc2_b), x_out, T, c.ffn, h);
      }
    }
    if (drop) {
      hidden_dropout_mask(A(a.drop2), c.hidden_dropout, key.seed, site + "mlp." + call);
      multiply(x_out, A(a.drop2), Tl * h);
    }
    k::add_inplace(x_out, o, Tl * h);
  }
  norm_forward(c, A(x_final_in_), P(final_w_), opt(final_b_), A(xf_), A(xf_mean_), A(xf_rstd_), Tl);
  if (sp) gather_sequence(A(xf_));
  k::linear_forward(A(xf_), P(output_w_), nullptr, A(logits_), T, h, c.vocab);
  if (tensor_parallel())
    tp::vocab_parallel_cross_entropy_forward(A(logits_), mb.labels, losses, A(lse_), T, vocab, tp_);
  else
    k::cross_entropy_forward(A(logits_), mb.labels, losses, A(lse_), T, c.vocab);
}

void GptModel::backward(const float* dloss) {
  const auto& c = lc_;
  if (b_ == 0) throw Error("GptModel::backward without a forward");
  if (cfg_.moe.num_experts > 0) {  // a training step's forward: its MoE losses are logged
    const MoeLosses last = last_moe_losses();
    moe_losses_.aux += last.aux, moe_losses_.seq_aux += last.seq_aux, moe_losses_.z += last.z;
    moe_losses_.global_aux += last.global_aux;
    // Aux-loss-free balancing counts the training tokens each expert got (Megatron's
    // local_tokens_per_expert), until update_expert_bias.
    if (cfg_.moe.expert_bias)
      for (int64_t l = 0; l < cfg_.num_layers; ++l) {
        if (!cfg_.is_moe_layer(l)) continue;
        const auto& tpe = moe_states_[static_cast<size_t>(l)].tokens_per_expert;
        auto& load = expert_load_[static_cast<size_t>(l)];
        load.resize(tpe.size(), 0.0);
        for (size_t e = 0; e < tpe.size(); ++e) load[e] += static_cast<double>(tpe[e]);
      }
  }
  const int64_t T = b_ * s_, h = c.hidden, D = c.kv_channels;
  const int64_t wide = std::max({c.qkv_width(), c.fc1_width(), c.heads * D, h});
  float* dwide = work_.data();          // [T, wide]: dqkv, du, dctx
  float* dx = dwide + T * wide;         // [T, h]: gradient of the residual stream
  float* dnorm = dx + T * h;            // [T, h]: gradient at a norm's output
  float* dtmp = dnorm + T * h;          // [T, h]: gradient at a norm's input
  float* dg = dtmp + T * h;             // [T, ffn]
  float* dctx = dg + T * c.ffn;         // [T, heads * D]
  const bool drop = training_ && c.hidden_dropout > 0;
  // Sequence parallelism: the residual stream's gradient is this rank's Tl tokens; a
  // column-parallel layer's input gradient is reduce-scattered, a row-parallel layer's output
  // gradient all-gathered.
  const bool sp = sequence_parallel();
  const int64_t Tl = sp ? T / tp_size_ : T;
  auto sum_input_grad = [&](float* d) {  // a column-parallel layer's input gradient over the group
    if (sp)
      reduce_scatter_sequence(d);
    else
      sum_over_tp(d, T * h);
  };

  // Loss and output layer (tied: the gradient lands in the word embedding).
  const tp::Shard vocab{tp_rank_ * c.vocab, c.vocab};
  if (tensor_parallel())
    tp::vocab_parallel_cross_entropy_backward(A(logits_), labels_.data(), A(lse_), dloss, T, vocab);
  else
    k::cross_entropy_backward(A(logits_), labels_.data(), A(lse_), dloss, T, c.vocab);
  // Column-parallel layers (output layer, fc1, qkv): each rank's input gradient is its share, summed.
  k::linear_backward(A(xf_), P(output_w_), A(logits_), dnorm, G(output_w_), nullptr, T, h, c.vocab);
  sum_input_grad(dnorm);
  norm_backward(c, dnorm, A(x_final_in_), P(final_w_), A(xf_mean_), A(xf_rstd_), dx, G(final_w_),
                gopt(final_b_), Tl);

  for (int64_t l = c.num_layers - 1; l >= 0; --l) {
    const LayerParams& L = layers_[l];
    const LayerActs& a = layer_acts_[l];
    // MLP block. dx holds d(x_out); the residual passes it to x_mid unchanged.
    float* dbranch = dtmp;
    std::memcpy(dbranch, dx, sizeof(float) * Tl * h);
    if (drop) multiply(dbranch, A(a.drop2), Tl * h);
    if (sp) gather_sequence(dbranch);  // the whole sequence's: the bias gradient is whole too
    if (cfg_.is_moe_layer(l)) {
      // Under tensor parallelism each rank's router gradient is a share that finalize_grads sums
      // (and its input gradient is summed with the experts'): the aux and z losses, which every
      // rank computes whole, add 1/tp of theirs on each.
      k::moe_layer_backward(moe_cfg_, moe_weights(L), A(a.ln2), dbranch, dnorm, moe_grads(L), T,
                            moe_states_[static_cast<size_t>(l)], moe_aux_loss_scale_ / static_cast<float>(tp_size_),
                            ep_stages_[static_cast<size_t>(l)].get());
    } else {
      k::linear_backward(A(a.g), P(L.fc2_w), dbranch, dg, G(L.fc2_w), gopt(L.fc2_b), T, c.ffn, h);
      if (c.activation == Activation::SwiGLU)
        k::swiglu_backward(A(a.u), dg, dwide, T, c.ffn);
      else
        k::gelu_backward(A(a.u), dg, dwide, T * c.ffn, gelu_kind(c.activation));
      k::linear_backward(A(a.ln2), P(L.fc1_w), dwide, dnorm, G(L.fc1_w), gopt(L.fc1_b), T, h, c.fc1_width());
    }
    sum_input_grad(dnorm);
    norm_backward(c, dnorm, A(a.x_mid), P(L.ln2_w), A(a.ln2_mean), A(a.ln2_rstd), dtmp, G(L.ln2_w), gopt(L.ln2_b), Tl);
    k::add_inplace(dx, dtmp, Tl * h);  // dx = d(x_mid)
    // Attention block.
    std::memcpy(dbranch, dx, sizeof(float) * Tl * h);
    if (drop) multiply(dbranch, A(a.drop1), Tl * h);
    if (sp) gather_sequence(dbranch);
    k::linear_backward(A(a.ctx), P(L.proj_w), dbranch, dctx, G(L.proj_w), gopt(L.proj_b), T,
                       c.heads * D, h);
    k::attention_backward(A(a.qkv_attn), A(a.probs), dctx, dwide, b_, s_, c.heads, c.query_groups, D,
                          1.0f / std::sqrt(static_cast<float>(D)),
                          training_ && c.attention_dropout > 0 ? A(a.attn_mask) : nullptr, key_start());
    if (c.positions == Positions::Rope)
      k::rope_backward_qkv(dwide, rope_positions_.data(), rope_, T, c.heads, c.query_groups, D);
    if (c.qk_layernorm && tensor_parallel()) {
      // The replicated q/k norm weights serve every head: their gradient is this rank's heads'
      // share, summed over the group (this micro-batch's alone: G() holds earlier ones too).
      std::vector<float>& dqk = dqk_scratch_;
      std::fill(dqk.begin(), dqk.end(), 0.0f);
      k::qk_rmsnorm_backward(dwide, A(a.qkv), P(L.q_norm), P(L.k_norm), A(a.qk_rstd), dwide, dqk.data(),
                             dqk.data() + D, T, c.heads, c.query_groups, D, c.zero_centered_gamma);
      sum_over_tp(dqk.data(), 2 * D);
      k::add_inplace(G(L.q_norm), dqk.data(), D);
      k::add_inplace(G(L.k_norm), dqk.data() + D, D);
    } else if (c.qk_layernorm) {  // in place: dwide becomes d(qkv before the norm)
      k::qk_rmsnorm_backward(dwide, A(a.qkv), P(L.q_norm), P(L.k_norm), A(a.qk_rstd), dwide, G(L.q_norm),
                             G(L.k_norm), T, c.heads, c.query_groups, D, c.zero_centered_gamma);
    }
    k::linear_backward(A(a.ln1), P(L.qkv_w), dwide, dnorm, G(L.qkv_w), gopt(L.qkv_b), T, h,
                       c.qkv_width());
    sum_input_grad(dnorm);
    norm_backward(c, dnorm, A(a.x_in), P(L.ln1_w), A(a.ln1_mean), A(a.ln1_rstd), dtmp, G(L.ln1_w), gopt(L.ln1_b), Tl);
    k::add_inplace(dx, dtmp, Tl * h);  // dx = d(x_in)
  }
  if (sp) gather_sequence(dx);  // the embedding was scattered: its gradient is gathered
  if (drop) multiply(dx, A(emb_drop_), T * h);
  if (tensor_parallel())
    tp::vocab_parallel_embedding_backward(tokens_.data(), dx, G(word_emb_), T, h, vocab);
  else
    k::embedding_backward(tokens_.data(), dx, G(word_emb_), T, h);
  if (pos_emb_ >= 0) k::embedding_backward(positions_.data(), dx, G(pos_emb_), T, h);
}

}  // namespace laoyao::model
