#include "train/run_setup.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.hpp"
#include "data/tokenizer/tokenizer_factory.hpp"
#include "model/gpt_tp.hpp"
#include "train/fp8_setup.hpp"

namespace laoyao::train {

void load_tokenizer_vocab(config::ConfigContainer& c, config::Derived& d, config::FrontEnd fe) {
  const auto& k = c.tokenizer;
  if (!k.tokenizer_type || *k.tokenizer_type == "NullTokenizer" || d.padded_vocab_size > 0) return;
  tokenizer::TokenizerSpec spec;
  spec.type = *k.tokenizer_type;
  spec.model = k.tokenizer_model.value_or("");
  spec.vocab_file = k.vocab_file.value_or("");
  spec.merge_file = k.merge_file.value_or("");
  spec.vocab_size = k.vocab_size;
  spec.vocab_extra_ids = static_cast<int>(k.vocab_extra_ids);
  auto tok = tokenizer::make_tokenizer(spec);
  config::apply_vocab_rule(c, d, tok->vocab_size(), tok->eod(), fe);
}

DocumentMask document_mask(const config::ConfigContainer& c) {
  DocumentMask r;
  if (!c.dataset.reset_attention_mask || c.dataset.skip_getting_attention_mask_from_dataset) return r;
  const auto& m = c.model;
  if (m.transformer_impl != "local") {
    r.ignored = "with --transformer-impl " + m.transformer_impl +
                " Megatron's attention takes the causal mask type and ignores the dataloader's mask "
                "(Megatron-LM issue #2357)";
    return r;
  }
  // FusedScaleMaskSoftmax.is_kernel_available for the causal mask type, with get_batch_per_block:
  // keys up to 128 run two rows a warp (8 a block of 4 warps), longer ones one.
  const int64_t s = m.seq_length, b = c.train.micro_batch_size.value_or(1);
  const int64_t batches = b * m.num_attention_heads / std::max<int64_t>(m.tensor_model_parallel_size, 1);
  const int64_t per_block = s <= 128 ? 8 : 4;
  const bool fused = m.masked_softmax_fusion && (m.bf16 || m.fp16) && s > 16 && s <= 4096 && s % 4 == 0 &&
                     batches % 4 == 0 && batches % per_block == 0;
  if (fused) {
    r.ignored = "Megatron-Core's fused causal softmax (masked_softmax_fusion, at sequence length " +
                std::to_string(s) + ") ignores the dataloader's mask; --no-masked-softmax-fusion applies it";
    return r;
  }
  r.applied = true;
  return r;
}

namespace {

model::LoraInit lora_init(const std::string& method, const char* field) {
  if (method == "xavier") return model::LoraInit::Xavier;
  if (method == "normal") return model::LoraInit::Normal;
  if (method == "kaiming") return model::LoraInit::Kaiming;
  if (method == "zero") return model::LoraInit::Zero;
  throw UsageError(std::string("peft.") + field + " '" + method + "' (accepted: xavier, normal, kaiming, zero)");
}

// Bridge's LoRA settings (peft.*), where this build trains them.
model::LoraSpec lora_spec(const config::ConfigContainer& c, const model::GptConfig& g) {
  const config::PeftConfig& p = c.peft;
  model::LoraSpec s;
  if (p.dim <= 0) throw UsageError("peft.dim " + std::to_string(p.dim) + " (the LoRA rank must be positive)");
  s.dim = p.dim;
  s.alpha = p.alpha;
  if (!(p.dropout >= 0 && p.dropout < 1)) throw UsageError("peft.dropout " + std::to_string(p.dropout) + " (accepted: 0 <= p < 1)");
  s.dropout = p.dropout;
  if (p.dropout_position != "pre" && p.dropout_position != "post")
    throw UsageError("peft.dropout_position '" + p.dropout_position + "' (accepted: pre, post)");
  if (p.dropout_position == "post" && p.dropout > 0)
    throw UsageError("peft.dropout_position post with peft.dropout > 0: dropout after the adapter is not built yet "
                     "(accepted: pre)");
  s.qkv = s.proj = s.fc1 = s.fc2 = false;
  for (const std::string& t : p.target_modules) {
    if (t == "linear_qkv") s.qkv = true;
    else if (t == "linear_proj") s.proj = true;
    else if (t == "linear_fc1") s.fc1 = true;
    else if (t == "linear_fc2") s.fc2 = true;
    else
      throw UsageError("peft.target_modules '" + t + "' (accepted: linear_qkv, linear_proj, linear_fc1, linear_fc2; "
                       "patterns and other modules are not built yet)");
  }
  if (!(s.qkv || s.proj || s.fc1 || s.fc2)) throw UsageError("peft.target_modules is empty: LoRA would train nothing");
  s.a_init = lora_init(p.lora_A_init_method, "lora_A_init_method");
  s.b_init = lora_init(p.lora_B_init_method, "lora_B_init_method");
  // linear_fc1 / linear_fc2 name the experts' linears too (and the shared expert's): one adapter
  // pair shared by every routed expert, as Bridge's default share_expert_adapters.
  if (g.moe.num_experts > 0 && (s.fc1 || s.fc2)) {
    if (c.model.tensor_model_parallel_size > 1)
      throw UsageError("peft.target_modules linear_fc1/linear_fc2 on a Mixture-of-Experts model with tensor "
                       "parallelism: adapters on split experts are not built yet (accepted: "
                       "tensor_model_parallel_size 1, or target_modules linear_qkv, linear_proj)");
    if (c.model.fp8)  // (Bridge's own MoE adapters refuse FP8 expert quantization too)
      throw UsageError("peft.target_modules linear_fc1/linear_fc2 on a Mixture-of-Experts model in FP8 (model.fp8 " +
                       *c.model.fp8 + "): the experts' FP8 GEMMs beside adapters are not built yet (accepted: "
                       "target_modules linear_qkv, linear_proj, or no FP8)");
    if (s.dropout > 0)
      throw UsageError("peft.dropout " + std::to_string(s.dropout) + " with adapters on Mixture-of-Experts experts "
                       "(target_modules linear_fc1/linear_fc2): dropout on the experts' adapters is not built yet "
                       "(accepted: 0)");
  }
  if (g.moe.num_experts > 0 && g.moe.expert_parallel > 1)
    throw UsageError("LoRA (peft.scheme lora) with expert parallelism (expert_model_parallel_size " +
                     std::to_string(g.moe.expert_parallel) + ") is not built yet (accepted: 1)");
  return s;
}

// Megatron-Core's MLA settings (MLATransformerConfig) onto g, refusing by name the shapes it cannot
// build: RoPE on the decoupled dims (rope, or YaRN as --rope-type / rope_type says; learned positions
// refused), its softmax scale with YaRN's mscale.
void mla_spec(const config::ConfigContainer& c, model::GptConfig& g) {
  const auto& m = c.model;
  auto positive = [](int64_t v, const char* field, const char* flag) {
    if (v <= 0)
      throw UsageError(std::string("model.") + field + " (" + flag + ") " + std::to_string(v) +
                       " for multi-latent attention (accepted: a positive size)");
  };
  model::MlaSpec s;
  if (m.q_lora_rank) {
    positive(*m.q_lora_rank, "q_lora_rank", "--q-lora-rank");
    s.q_lora_rank = *m.q_lora_rank;
  }
  positive(m.kv_lora_rank, "kv_lora_rank", "--kv-lora-rank");
  positive(m.qk_head_dim, "qk_head_dim", "--qk-head-dim");
  positive(m.qk_pos_emb_head_dim, "qk_pos_emb_head_dim", "--qk-pos-emb-head-dim");
  positive(m.v_head_dim, "v_head_dim", "--v-head-dim");
  if (m.qk_pos_emb_head_dim % 2 != 0)
    throw UsageError("model.qk_pos_emb_head_dim (--qk-pos-emb-head-dim) " + std::to_string(m.qk_pos_emb_head_dim) +
                     " is odd: RoPE rotates pairs of dims (accepted: an even size)");
  if (m.position_embedding_type == "learned_absolute")
    throw UsageError("multi-latent attention with model.position_embedding_type learned_absolute "
                     "(--position-embedding-type): MLA puts RoPE on its qk_pos_emb_head_dim dims, and learned "
                     "positions beside it are not built (accepted: rope, yarn, none)");
  if (m.qk_layernorm && m.normalization != "RMSNorm" && m.normalization != "LayerNorm")
    throw UsageError("model.normalization '" + m.normalization + "' for MLA's q/kv layernorms");
  s.kv_lora_rank = m.kv_lora_rank, s.qk_head_dim = m.qk_head_dim, s.qk_pos_emb_head_dim = m.qk_pos_emb_head_dim;
  s.v_head_dim = m.v_head_dim;
  s.latent_norms = m.qk_layernorm;  // MLA's qk_layernorm: the q and kv latents' norms
  // softmax_scale = mscale^2 / sqrt(q head dim), mscale = _yarn_get_mscale(rotary_scaling_factor,
  // mscale_all_dim), whatever the RoPE type (MultiLatentAttention.__init__).
  const double f = m.rotary_scaling_factor;
  const double mscale = f <= 1.0 ? 1.0 : 0.1 * m.mscale_all_dim * std::log(f) + 1.0;
  s.softmax_scale = mscale * mscale / std::sqrt(static_cast<double>(s.q_head_dim()));
  // The decoupled RoPE: yarn unless rope_type says rope (Megatron-LM's --rope-type; MLA's default).
  const bool yarn = m.rope_type ? *m.rope_type == "yarn" : true;
  g.positions = model::Positions::Rope;
  if (yarn)
    g.yarn = kernels::cpu::YarnParams{m.rotary_scaling_factor, m.original_max_position_embeddings, m.beta_fast,
                                      m.beta_slow, m.mscale, m.mscale_all_dim, m.yarn_correction_range_round_to_int};
  else
    g.yarn.reset();
  g.query_groups = g.heads;  // (MLA has a key and value per head)
  g.kv_channels = s.v_head_dim;  // linear_proj reads heads x v_head_dim
  g.qk_layernorm = false;        // (the per-head QK norm of the fused attention)
  g.mla = s;
  if (c.peft.scheme)
    throw UsageError("PEFT (peft.scheme " + *c.peft.scheme + ") on multi-latent attention is not built yet: its "
                     "targets (linear_q_proj, linear_kv_down_proj, ...) are not LoRA's linear_qkv");
}

}  // namespace

model::GptConfig model_config(const config::ConfigContainer& c, const config::Derived& d) {
  const auto& m = c.model;
  model::GptConfig g;
  g.num_layers = m.num_layers;
  g.hidden = m.hidden_size;
  g.heads = m.num_attention_heads;
  g.query_groups = m.num_query_groups.value_or(m.num_attention_heads);
  g.kv_channels = m.kv_channels.value_or(m.hidden_size / m.num_attention_heads);
  g.ffn = m.ffn_hidden_size.value_or(4 * m.hidden_size);
  if (d.padded_vocab_size <= 0) throw Error("the padded vocabulary size is not known yet");
  g.vocab = d.padded_vocab_size;
  g.max_positions = m.max_position_embeddings.value_or(m.seq_length);
  g.tied_embeddings = m.share_embeddings_and_output_weights;
  g.add_bias_linear = m.add_bias_linear;
  g.add_qkv_bias = m.add_bias_linear || m.add_qkv_bias;  // MCore: qkv bias = add_bias_linear or add_qkv_bias
  g.norm = m.normalization == "RMSNorm" ? model::Norm::RMSNorm : model::Norm::LayerNorm;
  g.norm_eps = static_cast<float>(m.layernorm_epsilon);
  g.zero_centered_gamma = m.layernorm_zero_centered_gamma;
  if (m.gated_linear_unit) {
    g.activation = model::Activation::SwiGLU;
  } else {
    // The fused bias_gelu (tanh approximation) runs when bias-activation fusion is on and the
    // linears have biases; otherwise F.gelu, the exact erf form (megatron-lm.md §3.6).
    g.activation = (m.bias_activation_fusion && m.add_bias_linear) ? model::Activation::GeluTanh
                                                                    : model::Activation::GeluErf;
  }
  const bool yarn = m.position_embedding_type == "yarn";
  g.positions = m.position_embedding_type == "learned_absolute"   ? model::Positions::LearnedAbsolute
                 : m.position_embedding_type == "rope" || yarn ? model::Positions::Rope
                                                                : model::Positions::None;
  if (yarn)  // Megatron-LM's --rotary-scaling-factor, --yarn-*, --mscale, --mscale-all-dim
    g.yarn = kernels::cpu::YarnParams{m.rotary_scaling_factor, m.original_max_position_embeddings, m.beta_fast,
                                      m.beta_slow, m.mscale, m.mscale_all_dim, m.yarn_correction_range_round_to_int};
  g.rotary_base = m.rotary_base;
  g.rotary_percent = m.rotary_percent;
  g.rope_scaling = m.rope_scaling;
  g.rope_scaling_factor = m.rope_scaling_factor;
  g.seq_len_interpolation_factor = m.seq_len_interpolation_factor;
  g.qk_layernorm = m.qk_layernorm;
  // Bridge's qwen3_next weight-decay condition is the same rule for these models (their q/k norms
  // are RMSNorm weights, no biases).
  g.apply_wd_to_qk_layernorm =
      c.optimizer.apply_wd_to_qk_layernorm || c.scheduler.no_weight_decay_cond_type.value_or("") == "qwen3_next";
  g.init_std = m.init_method_std;
  g.embedding_init_std = m.embedding_init_method_std.value_or(m.init_method_std);
  g.skip_embedding_weight_decay = m.embedding_init_method_std.has_value();
  g.hidden_dropout = m.hidden_dropout;
  g.attention_dropout = m.attention_dropout;
  g.sequence_parallel = m.sequence_parallel;
  // Attention within documents: --reset-attention-mask's, packed fine-tuning rows' examples, or
  // Megatron-LM's --sft rows' conversations.
  g.document_attention =
      document_mask(c).applied || (c.dataset.dataset_root && c.dataset.packed_sequence) || c.dataset.sft;
  g.bf16 = m.bf16;
  g.fp32_residual_connection = m.fp32_residual_connection;
  g.attention_backend = m.attention_backend == "unfused" || m.attention_backend == "local" ? model::AttentionBackend::Unfused
                        : m.attention_backend == "auto"                                   ? model::AttentionBackend::Auto
                        : m.attention_backend == "fused"                                  ? model::AttentionBackend::Fused
                                                                                          : model::AttentionBackend::Flash;
  // Selective recomputation (core attention) saves nothing where attention keeps no s x s scores
  // (cuDNN's and our flash kernels): only full recomputation changes what is kept.
  if (m.recompute_granularity == "full") {
    if (!m.recompute_method)
      throw UsageError("model.recompute_granularity full (--recompute-granularity full) needs model.recompute_method "
                       "(--recompute-method) uniform or block, as Megatron-Core requires");
    g.recompute = *m.recompute_method == "block" ? model::Recompute::Block : model::Recompute::Uniform;
    g.recompute_num_layers = m.recompute_num_layers.value_or(1);  // Megatron-LM's --recompute-num-layers default
    const int64_t lo = g.recompute == model::Recompute::Block ? 0 : 1;
    if (g.recompute_num_layers < lo || g.recompute_num_layers > g.num_layers)
      throw UsageError("model.recompute_num_layers (--recompute-num-layers) " + std::to_string(g.recompute_num_layers) +
                       " is outside " + std::to_string(lo) + ".." + std::to_string(g.num_layers) +
                       " (the layers of the model) for recompute_method " + *m.recompute_method);
  }
  if (m.num_moe_experts && *m.num_moe_experts > 0) {
    g.moe = moe_config(c, g);
    g.moe.tensor_parallel = m.tensor_model_parallel_size;
    g.moe.expert_tensor_parallel = m.expert_tensor_parallel_size.value_or(m.tensor_model_parallel_size);
    if (g.moe.tensor_parallel > 1) model::check_moe_tensor_parallel(g);
  }
  if (m.multi_latent_attention) mla_spec(c, g);
  g.context_parallel = m.context_parallel_size;
  g.cp_ring = m.cp_comm_type == "p2p";
  if (m.mtp_num_layers && *m.mtp_num_layers > 0) {
    // Megatron-Core's multi-token prediction.
    g.mtp_num_layers = *m.mtp_num_layers;
    g.mtp_loss_scaling_factor = m.mtp_loss_scaling_factor;
  } else if (m.mtp_num_layers && *m.mtp_num_layers < 0) {
    throw UsageError("model.mtp_num_layers (--mtp-num-layers) " + std::to_string(*m.mtp_num_layers) +
                     " (accepted: a positive number, or none)");
  }
  if (c.peft.scheme && *c.peft.scheme == "lora") g.lora = lora_spec(c, g);
  g.fp8 = fp8_spec(c, g);
  return g;
}

namespace {

// --moe-router-load-balancing-type and --moe-aux-loss-coeff: one type and its coefficient, or
// lists of the same length paired by position (Megatron's get_aux_loss_coeff).
std::vector<std::pair<std::string, double>> load_balancing(const config::ModelConfig& m) {
  const char* types = "model.moe_router_load_balancing_type (--moe-router-load-balancing-type)";
  const char* coeffs = "model.moe_aux_loss_coeff (--moe-aux-loss-coeff)";
  auto type_of = [&](const config::Value& v) -> std::string {
    if (v.kind == config::Value::Kind::Null) return "none";  // an override's none
    if (v.kind != config::Value::Kind::String)
      throw UsageError(std::string(types) + ": expected a type name or a list of them, got a " + kind_name(v.kind));
    return v.s;
  };
  auto coeff_of = [&](const config::Value& v) -> double {
    if (v.kind == config::Value::Kind::Int) return static_cast<double>(v.i);
    if (v.kind == config::Value::Kind::Float) return v.f;
    throw UsageError(std::string(coeffs) + ": expected a number or a list of them, got a " + kind_name(v.kind));
  };
  auto items = [](const config::Value& v) {
    return v.kind == config::Value::Kind::List ? v.list : std::vector<config::Value>{v};
  };
  const std::vector<config::Value> t = items(m.moe_router_load_balancing_type), k = items(m.moe_aux_loss_coeff);
  if (t.size() != k.size())
    throw UsageError(std::string(types) + " lists " + std::to_string(t.size()) + " type(s) and " + coeffs + " " +
                     std::to_string(k.size()) + " coefficient(s): give one coefficient per type");
  std::vector<std::pair<std::string, double>> out;
  for (size_t i = 0; i < t.size(); ++i) {
    out.emplace_back(type_of(t[i]), coeff_of(k[i]));
    for (size_t j = 0; j < i; ++j)
      if (out[j].first == out[i].first) throw UsageError(std::string(types) + " lists '" + out[i].first + "' twice");
  }
  return out;
}

}  // namespace

std::vector<bool> moe_layer_pattern(const config::ModelConfig& m) {
  const config::Value& freq = m.moe_layer_freq;
  std::vector<bool> layers(static_cast<size_t>(m.num_layers), false);
  if (freq.kind == config::Value::Kind::Int) {
    if (freq.i < 1) throw UsageError("model.moe_layer_freq (--moe-layer-freq) " + std::to_string(freq.i) +
                                     " must be a positive integer or a list of 0/1 per layer");
    for (int64_t l = 0; l < m.num_layers; ++l) layers[l] = l % freq.i == 0;
  } else if (freq.kind == config::Value::Kind::List) {
    if (static_cast<int64_t>(freq.list.size()) != m.num_layers)
      throw UsageError("model.moe_layer_freq (--moe-layer-freq) lists " + std::to_string(freq.list.size()) +
                       " layers, the model has " + std::to_string(m.num_layers));
    for (int64_t l = 0; l < m.num_layers; ++l) {
      const config::Value& v = freq.list[static_cast<size_t>(l)];
      if (v.kind != config::Value::Kind::Int || (v.i != 0 && v.i != 1))
        throw UsageError("model.moe_layer_freq (--moe-layer-freq): every entry must be 0 or 1");
      layers[l] = v.i == 1;
    }
  } else {
    throw UsageError("model.moe_layer_freq (--moe-layer-freq) must be an integer or a list of 0/1 per layer");
  }
  return layers;
}

model::MoeConfig moe_config(const config::ConfigContainer& c, const model::GptConfig& g) {
  const auto& m = c.model;
  model::MoeConfig moe;
  moe.num_experts = *m.num_moe_experts;
  moe.layers = moe_layer_pattern(m);
  moe.ffn = m.moe_ffn_hidden_size.value_or(g.ffn);
  moe.topk = m.moe_router_topk;
  if (moe.topk < 1 || moe.topk > moe.num_experts)
    throw UsageError("model.moe_router_topk (--moe-router-topk) " + std::to_string(moe.topk) + " must be 1.." +
                     std::to_string(moe.num_experts) + " (the number of experts)");
  // (The config's choices are softmax, sigmoid and sqrtsoftplus.)
  moe.sigmoid = m.moe_router_score_function != "softmax";
  moe.sqrt_softplus = m.moe_router_score_function == "sqrtsoftplus";
  moe.pre_softmax = m.moe_router_pre_softmax;
  if (m.moe_router_topk_scaling_factor && *m.moe_router_topk_scaling_factor != 0)
    moe.topk_scaling_factor = *m.moe_router_topk_scaling_factor;
  for (const auto& [balance, coeff] : load_balancing(m)) {
    double* slot = balance == "aux_loss"          ? &moe.aux_loss_coeff
                   : balance == "seq_aux_loss"    ? &moe.seq_aux_loss_coeff
                   : balance == "global_aux_loss" ? &moe.global_aux_loss_coeff
                                                  : nullptr;
    if (!slot && balance != "none")
      throw UsageError("model.moe_router_load_balancing_type (--moe-router-load-balancing-type) '" + balance +
                       "' is not supported yet (aux_loss, seq_aux_loss, global_aux_loss, none)");
    if (slot) *slot = coeff;
  }
  moe.z_loss_coeff = m.moe_z_loss_coeff.value_or(0.0);
  moe.shared_ffn = m.moe_shared_expert_intermediate_size.value_or(0);
  moe.expert_parallel = m.expert_model_parallel_size;
  moe.allgather_dispatcher = m.moe_token_dispatcher_type == "allgather";
  if (g.add_bias_linear)
    throw UsageError("Mixture-of-Experts layers with biases (add_bias_linear; --disable-bias-linear turns them off) "
                     "are not supported yet");
  // Megatron's check: the expert bias serves the sigmoid-like routers only.
  if (m.moe_router_enable_expert_bias && m.moe_router_score_function == "softmax")
    throw UsageError("model.moe_router_enable_expert_bias (--moe-router-enable-expert-bias) needs "
                     "--moe-router-score-function sigmoid or sqrtsoftplus (model.moe_router_score_function), not '" +
                     m.moe_router_score_function + "'");
  moe.expert_bias = m.moe_router_enable_expert_bias;
  moe.force_load_balancing = m.moe_router_force_load_balancing;
  moe.router_bf16 = !m.moe_router_dtype && g.bf16;  // Megatron: the router in the input dtype
  moe.bias_update_rate = m.moe_router_bias_update_rate;
  // Group-limited routing: both or neither, and shapes the router can split (Megatron's checks).
  if (m.moe_router_num_groups.has_value() != m.moe_router_group_topk.has_value())
    throw UsageError("group-limited routing needs both --moe-router-num-groups and --moe-router-group-topk "
                     "(model.moe_router_num_groups, model.moe_router_group_topk)");
  if (m.moe_router_num_groups) {
    moe.num_groups = *m.moe_router_num_groups, moe.group_topk = *m.moe_router_group_topk;
    if (moe.num_groups < 1 || moe.num_experts % moe.num_groups != 0 || moe.group_topk < 1 ||
        moe.group_topk > moe.num_groups || moe.topk < moe.group_topk ||
        moe.topk > moe.group_topk * (moe.num_experts / moe.num_groups))
      throw UsageError("model.moe_router_num_groups (" + std::to_string(moe.num_groups) +
                       ") must divide the experts (" + std::to_string(moe.num_experts) +
                       "), and model.moe_router_group_topk (" + std::to_string(moe.group_topk) +
                       ") lie in 1..num_groups with group_topk <= topk <= group_topk x experts per group");
  }
  // Token dropping (Megatron's checks: a negative factor means dropless; padding needs a factor;
  // the balancing types accepted above are the ones it allows).
  if (m.moe_expert_capacity_factor && *m.moe_expert_capacity_factor >= 0) {
    moe.capacity_factor = *m.moe_expert_capacity_factor;
    moe.drop_by_position = m.moe_token_drop_policy == "position";
  } else if (m.moe_pad_expert_input_to_capacity) {
    throw UsageError("model.moe_pad_expert_input_to_capacity (--moe-pad-expert-input-to-capacity) needs "
                     "model.moe_expert_capacity_factor (--moe-expert-capacity-factor)");
  }
  return moe;
}

optim::ParamSchedule param_schedule(const config::ConfigContainer& c) {
  const auto& s = c.scheduler;
  optim::ParamSchedule p;
  p.max_lr = *c.optimizer.lr;
  p.min_lr = c.optimizer.min_lr.value_or(0.0);
  p.init_lr = s.lr_warmup_init;
  p.warmup_steps = s.lr_warmup_steps.value_or(0);
  p.decay_steps = s.lr_decay_steps.value_or(0);
  p.decay_style = s.lr_decay_style;
  p.wsd_decay_style = s.lr_wsd_decay_style;
  p.wsd_decay_steps = s.wsd_decay_steps.value_or(0);
  p.start_wd = s.start_weight_decay.value_or(c.optimizer.weight_decay);
  p.end_wd = s.end_weight_decay.value_or(c.optimizer.weight_decay);
  p.wd_incr_steps = s.wd_incr_steps.value_or(0);
  p.wd_incr_style = s.weight_decay_incr_style;
  return p;
}

FlopShape flop_shape(const config::ConfigContainer& c, const config::Derived& d) {
  const auto& m = c.model;
  FlopShape f;
  f.global_batch_size = *c.train.global_batch_size;
  f.seq_length = m.seq_length;
  f.num_layers = m.num_layers;
  f.hidden_size = m.hidden_size;
  f.ffn_hidden_size = m.ffn_hidden_size.value_or(4 * m.hidden_size);
  f.num_attention_heads = m.num_attention_heads;
  f.num_query_groups = m.num_query_groups.value_or(0);
  f.kv_channels = m.kv_channels.value_or(0);
  f.gated_linear_unit = m.gated_linear_unit;
  f.padded_vocab_size = d.padded_vocab_size;
  f.mtp_num_layers = std::max<int64_t>(m.mtp_num_layers.value_or(0), 0);
  if (m.multi_latent_attention) {
    f.multi_latent_attention = true;
    f.q_lora_rank = m.q_lora_rank.value_or(0);
    f.kv_lora_rank = m.kv_lora_rank, f.qk_head_dim = m.qk_head_dim, f.qk_pos_emb_head_dim = m.qk_pos_emb_head_dim;
    f.v_head_dim = m.v_head_dim;
  }
  if (m.num_moe_experts && *m.num_moe_experts > 0) {
    f.num_experts = *m.num_moe_experts;
    f.moe_router_topk = m.moe_router_topk;
    f.moe_ffn_hidden_size = m.moe_ffn_hidden_size.value_or(0);
    f.moe_shared_expert_ffn_hidden_size = m.moe_shared_expert_intermediate_size.value_or(0);
    if (m.moe_layer_freq.kind == config::Value::Kind::Int) {
      f.moe_layer_freq = m.moe_layer_freq.i;
    } else {
      for (const auto& v : m.moe_layer_freq.list) f.moe_layer_pattern.push_back(static_cast<int>(v.i));
    }
  }
  return f;
}

}  // namespace laoyao::train
