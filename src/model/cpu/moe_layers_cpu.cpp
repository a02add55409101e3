#include "model/cpu/moe_layers_cpu.hpp"

#include <algorithm>
#include <utility>

#include "core/error.hpp"
#include "model/moe_expert_parallel.hpp"
#include "model/moe_share_stage.hpp"

namespace laoyao::model {

namespace k = kernels::cpu;

CpuMoeLayers::CpuMoeLayers(const GptConfig& whole, const GptConfig& local, const GptParameterLayout& layout,
                           int64_t tp_rank, int64_t tp_size, dist::ProcessGroup* ep, bool folded, float* weights,
                           float* grads)
    : whole_(whole), layout_(layout), folded_(folded) {
  const MoeConfig& m = whole.moe;
  cfg_.hidden_size = whole.hidden;
  cfg_.num_experts = m.num_experts;
  cfg_.topk = m.topk;
  cfg_.ffn_hidden_size = local.moe.ffn;  // with tensor parallelism this rank's share of each expert
  cfg_.shared_expert_intermediate_size = local.moe.shared_ffn;
  cfg_.activation = whole.activation == Activation::SwiGLU   ? k::MoeActivation::SwiGlu
                    : whole.activation == Activation::GeluErf ? k::MoeActivation::GeluErf
                                                              : k::MoeActivation::GeluTanh;
  cfg_.router.score_function = !m.sigmoid       ? k::MoeScoreFunction::Softmax
                               : m.sqrt_softplus ? k::MoeScoreFunction::SqrtSoftplus
                                                 : k::MoeScoreFunction::Sigmoid;
  cfg_.router.pre_softmax = m.pre_softmax;
  if (m.topk_scaling_factor) cfg_.router.topk_scaling_factor = static_cast<float>(*m.topk_scaling_factor);
  cfg_.router.num_groups = m.num_groups, cfg_.router.group_topk = m.group_topk;
  cfg_.force_load_balancing = m.force_load_balancing;
  cfg_.router_bf16_logits = m.router_bf16;
  cfg_.capacity_factor = m.capacity_factor;
  cfg_.drop_by_position = m.drop_by_position;
  // Megatron drops within each TP rank's share of the sequence; every rank here routes the whole
  // gathered sequence, so it drops by those shares. A one-rank model with moe.tensor_parallel > 1
  // drops as that many ranks would.
  cfg_.capacity_shares = tp_size > 1 ? tp_size : m.tensor_parallel;
  cfg_.aux_loss_coeff = static_cast<float>(m.aux_loss_coeff);
  cfg_.seq_aux_loss_coeff = static_cast<float>(m.seq_aux_loss_coeff);
  cfg_.global_aux_loss_coeff = static_cast<float>(m.global_aux_loss_coeff);
  cfg_.z_loss_coeff = static_cast<float>(m.z_loss_coeff);
  const size_t L = static_cast<size_t>(whole.layer_count());  // (multi-token prediction layers too)
  states_.resize(L);
  lora_.resize(L);
  expert_load_.assign(L, std::vector<double>(static_cast<size_t>(m.num_experts), 0.0));
  stages_.resize(L);
  const bool ep_split = ep && ep->size() > 1;
  if ((ep_split || folded) && whole.lora && (whole.lora->fc1 || whole.lora->fc2))
    throw Error("CpuMoeLayers: LoRA adapters on experts split over expert or tensor parallelism are not built");
  for (int64_t l = 0; l < whole.layer_count() && (ep_split || folded); ++l) {
    if (!whole.is_moe_layer(l)) continue;
    const GptLayerOffsets& W = layout.layers[static_cast<size_t>(l)];
    std::unique_ptr<k::MoeExpertsStage> experts;
    if (ep_split) {
      auto stage = std::make_unique<MoeExpertParallelStage>(*ep, m.num_experts, whole.hidden, local.moe.ffn,
                                                            cfg_.activation);
      stage->set_weights(weights + W.experts_fc1, weights + W.experts_fc2, grads + W.experts_fc1,
                         grads + W.experts_fc2);
      experts = std::move(stage);
    } else {  // whole experts, all of them on every TP rank
      auto stage = std::make_unique<k::MoeLocalExpertsStage>(m.num_experts, whole.hidden, local.moe.ffn,
                                                             cfg_.activation);
      stage->set_weights(weights + W.experts_fc1, weights + W.experts_fc2, grads + W.experts_fc1,
                         grads + W.experts_fc2);
      experts = std::move(stage);
    }
    if (folded)  // only this rank's share of the sequence goes to the experts
      experts = std::make_unique<MoeShareStage>(std::move(experts), tp_rank, tp_size, whole.hidden, m.num_experts);
    stages_[static_cast<size_t>(l)] = std::move(experts);
  }
}

CpuMoeLayers::~CpuMoeLayers() = default;

k::MoeLayerWeights CpuMoeLayers::weights_of(int64_t l, const float* weights, float* grads) const {
  const GptLayerOffsets& L = layout_.layers[static_cast<size_t>(l)];
  auto opt = [&](int64_t off) { return off >= 0 ? weights + off : nullptr; };
  k::MoeLayerWeights w;
  if (whole_.lora) {
    // The adapters' gradients sit after the frozen base (the buffer starts at trainable_offset).
    const int64_t from = layout_.table.trainable_offset;
    auto adapters = [&](const LoraOffsets& f1, const LoraOffsets& f2, k::MoeAdapters& a) -> const k::MoeAdapters* {
      if (!f1.on() && !f2.on()) return nullptr;
      a = {};
      a.dim = whole_.lora->dim, a.scale = whole_.lora->scale();
      if (f1.on()) {
        a.fc1_a = weights + f1.a, a.fc1_b = weights + f1.b;
        if (grads) a.dfc1_a = grads + (f1.a - from), a.dfc1_b = grads + (f1.b - from);
      }
      if (f2.on()) {
        a.fc2_a = weights + f2.a, a.fc2_b = weights + f2.b;
        if (grads) a.dfc2_a = grads + (f2.a - from), a.dfc2_b = grads + (f2.b - from);
      }
      return &a;
    };
    auto& slot = lora_[static_cast<size_t>(l)];
    w.expert_lora = adapters(L.experts_fc1_lora, L.experts_fc2_lora, slot.first);
    w.shared_lora = adapters(L.shared_fc1_lora, L.shared_fc2_lora, slot.second);
  }
  w.router_weight = weights + L.router_w;
  w.fc1_weight = weights + L.experts_fc1;
  w.fc2_weight = weights + L.experts_fc2;
  w.shared_fc1_weight = opt(L.shared_fc1);
  w.shared_fc2_weight = opt(L.shared_fc2);
  w.expert_bias = opt(L.expert_bias);
  if (fp8_ && fp8_->on()) {
    w.expert_fp8 = fp8_experts_[static_cast<size_t>(2 * l)].get();
    w.shared_fp8 = fp8_experts_[static_cast<size_t>(2 * l + 1)].get();
  }
  return w;
}

void CpuMoeLayers::set_fp8(CpuFp8Linears* fp8) {
  fp8_ = fp8;
  fp8_experts_.clear();
  fp8_experts_.resize(static_cast<size_t>(2 * whole_.layer_count()));
  if (!fp8_) return;
  const int64_t H = cfg_.hidden_size, F = cfg_.ffn_hidden_size, Fs = cfg_.shared_expert_intermediate_size;
  for (int64_t l = 0; l < whole_.layer_count(); ++l) {
    if (!whole_.is_moe_layer(l)) continue;
    const GptLayerOffsets& L = layout_.layers[static_cast<size_t>(l)];
    fp8_experts_[static_cast<size_t>(2 * l)] = std::make_unique<CpuFp8Experts>(
        *fp8_, L.experts_fc1, k::moe_fc1_rows(cfg_.activation, F) * H, L.experts_fc2, H * F);
    if (L.shared_fc1 >= 0)
      fp8_experts_[static_cast<size_t>(2 * l + 1)] = std::make_unique<CpuFp8Experts>(
          *fp8_, L.shared_fc1, k::moe_fc1_rows(cfg_.activation, Fs) * H, L.shared_fc2, H * Fs);
  }
}

k::MoeLayerGrads CpuMoeLayers::grads_of(int64_t l, float* grads) const {
  const GptLayerOffsets& L = layout_.layers[static_cast<size_t>(l)];
  // (grads holds the trained parameters from the table's trainable_offset on: PEFT's frozen base,
  // the MoE layer's weights among it, has none, and the kernels skip a null gradient.)
  const int64_t from = layout_.table.trainable_offset;
  auto opt = [&](int64_t off) { return off >= 0 && off >= from ? grads + (off - from) : nullptr; };
  k::MoeLayerGrads g;
  g.router_weight = opt(L.router_w);
  g.fc1_weight = opt(L.experts_fc1);
  g.fc2_weight = opt(L.experts_fc2);
  g.shared_fc1_weight = opt(L.shared_fc1);
  g.shared_fc2_weight = opt(L.shared_fc2);
  return g;
}

void CpuMoeLayers::forward(int64_t l, const float* weights, const float* x, float* y, const BatchShape& batch,
                           bool train_step, uint64_t random_logits_key) {
  if (batch.cp_size != cfg_.context_parallel_size)
    throw Error("CpuMoeLayers: a micro-batch of " + std::to_string(batch.cp_size) + " context-parallel ranks' chunks "
                "on a layer set for " + std::to_string(cfg_.context_parallel_size));
  cfg_.seq_length = batch.s;
  cfg_.random_logits_key = random_logits_key;
  cfg_.global_aux_training = train_step;
  cfg_.random_logits_rows = nullptr;
  if (whole_.moe.force_load_balancing && batch.cp_size > 1) {  // the tokens' places in the whole micro-batch
    random_logits_rows_.resize(static_cast<size_t>(batch.T));
    const int64_t S = batch.s * batch.cp_size;
    for (int64_t t = 0; t < batch.T; ++t)
      random_logits_rows_[static_cast<size_t>(t)] = t / batch.s * S + batch.cp_place(t);
    cfg_.random_logits_rows = random_logits_rows_.data();
  }
  auto& stage = stages_[static_cast<size_t>(l)];
  if (folded_) static_cast<MoeShareStage&>(*stage).set_sequence_length(batch.s);
  k::moe_layer_forward(cfg_, weights_of(l, weights), x, y, batch.T, states_[static_cast<size_t>(l)], stage.get());
}

void CpuMoeLayers::backward(int64_t l, const float* weights, float* grads, const float* x, const float* dy, float* dx,
                            int64_t T, float aux_loss_scale) {
  k::moe_layer_backward(cfg_, weights_of(l, weights, grads), x, dy, dx, grads_of(l, grads), T,
                        states_[static_cast<size_t>(l)], aux_loss_scale, stages_[static_cast<size_t>(l)].get());
}

MoeLosses CpuMoeLayers::last_losses() const {
  MoeLosses out;
  const auto& m = whole_.moe;
  for (int64_t l = 0; l < whole_.layer_count(); ++l) {
    if (!whole_.is_moe_layer(l)) continue;
    const auto& st = states_[static_cast<size_t>(l)];
    if (m.aux_loss_coeff > 0) out.aux += st.aux_loss / m.aux_loss_coeff;
    if (m.seq_aux_loss_coeff > 0) out.seq_aux += st.seq_aux_loss / m.seq_aux_loss_coeff;
    // (the z-loss of a context-parallel rank's tokens: its coefficient divided by the CP size)
    if (m.z_loss_coeff > 0) out.z += st.z_loss / (m.z_loss_coeff / static_cast<double>(cfg_.context_parallel_size));
    if (m.global_aux_loss_coeff > 0) out.global_aux += st.global_aux_loss / m.global_aux_loss_coeff;
  }
  return out;
}

void CpuMoeLayers::count_training_forward() {
  const MoeLosses last = last_losses();
  losses_.aux += last.aux, losses_.seq_aux += last.seq_aux, losses_.z += last.z;
  losses_.global_aux += last.global_aux;
  if (!whole_.moe.expert_bias) return;
  // Aux-loss-free balancing counts the training tokens each expert got (Megatron's
  // local_tokens_per_expert), until update_expert_bias.
  for (int64_t l = 0; l < whole_.layer_count(); ++l) {
    if (!whole_.is_moe_layer(l)) continue;
    const auto& tpe = states_[static_cast<size_t>(l)].tokens_per_expert;
    auto& load = expert_load_[static_cast<size_t>(l)];
    load.resize(tpe.size(), 0.0);
    for (size_t e = 0; e < tpe.size(); ++e) load[e] += static_cast<double>(tpe[e]);
  }
}

MoeLosses CpuMoeLayers::take_losses() { return std::exchange(losses_, MoeLosses{}); }

void CpuMoeLayers::update_expert_bias(float* weights, dist::ProcessGroup* dp) {
  if (!whole_.moe.expert_bias) return;
  const float rate = static_cast<float>(whole_.moe.bias_update_rate);
  for (int64_t l = 0; l < whole_.layer_count(); ++l) {
    if (!whole_.is_moe_layer(l)) continue;
    auto& load = expert_load_[static_cast<size_t>(l)];
    load.resize(static_cast<size_t>(whole_.moe.num_experts), 0.0);
    if (dp && dp->size() > 1) dp->all_reduce_sum(load.data(), load.size());
    double mean = 0.0;
    for (double x : load) mean += x / static_cast<double>(load.size());
    // Megatron's get_updated_expert_bias: bias += sign(mean load - load) * rate (in fp32).
    float* bias = weights + layout_.layers[static_cast<size_t>(l)].expert_bias;
    for (size_t e = 0; e < load.size(); ++e) {
      const double offset = mean - load[e];
      bias[e] += offset > 0 ? rate : offset < 0 ? -rate : 0.0f;
    }
    std::fill(load.begin(), load.end(), 0.0);
  }
}

void CpuMoeLayers::reset_global_aux() {
  for (auto& st : states_) k::moe_global_aux_reset(st);
}

void CpuMoeLayers::set_data_parallel_group(dist::ProcessGroup* dp) {
  if (!dp || dp->size() <= 1) {
    cfg_.data_parallel_size = 1;
    cfg_.sum_over_data_parallel = nullptr;
    return;
  }
  cfg_.data_parallel_size = dp->size();
  cfg_.sum_over_data_parallel = [dp](double* counts, int64_t n) { dp->all_reduce_sum(counts, static_cast<size_t>(n)); };
}

void CpuMoeLayers::set_context_parallel_group(dist::ProcessGroup* cp) {
  if (!cp || cp->size() <= 1) {
    cfg_.context_parallel_size = 1;
    cfg_.sum_over_context_parallel = nullptr;
    return;
  }
  cfg_.context_parallel_size = cp->size();
  cfg_.sum_over_context_parallel = [cp](double* counts, int64_t n) {
    cp->all_reduce_sum(counts, static_cast<size_t>(n));
  };
}

std::vector<double> CpuMoeLayers::expert_load(int64_t layer) const {
  return whole_.is_moe_layer(layer) && whole_.moe.expert_bias ? expert_load_.at(static_cast<size_t>(layer))
                                                              : std::vector<double>{};
}

}  // namespace laoyao::model
