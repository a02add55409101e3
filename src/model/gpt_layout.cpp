#include "model/gpt_layout.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.hpp"

namespace laoyao::model {

namespace {

// Bridge's ParallelLinearAdapter init methods (peft/utils.py): xavier is torch's xavier_normal_,
// normal N(0, 0.2), kaiming torch's kaiming_uniform_ with a = sqrt(5) (bound 1 / sqrt(fan_in)).
void add_lora_weight(ParameterTable& t, const std::string& name, int64_t out, int64_t in, LoraInit init) {
  switch (init) {
    case LoraInit::Xavier:
      t.add(name, {out, in}, Init::Normal, std::sqrt(2.0 / static_cast<double>(in + out)));
      return;
    case LoraInit::Normal:
      t.add(name, {out, in}, Init::Normal, 0.2);
      return;
    case LoraInit::Kaiming:
      t.add(name, {out, in}, Init::Uniform, 1.0 / std::sqrt(static_cast<double>(in)));
      return;
    case LoraInit::Zero:
      t.add(name, {out, in}, Init::Zeros);
      return;
  }
}

LoraOffsets add_lora(ParameterTable& t, const LoraSpec& s, const std::string& linear, int64_t in, int64_t out) {
  LoraOffsets o;
  o.a = t.total;
  add_lora_weight(t, linear + ".adapter.linear_in.weight", s.dim, in, s.a_init);
  o.b = t.total;
  add_lora_weight(t, linear + ".adapter.linear_out.weight", out, s.dim, s.b_init);
  return o;
}

// PEFT: the base frozen, then each targeted linear's adapter (Megatron-Core's registration order
// within a layer: linear_proj, linear_qkv, linear_fc1, linear_fc2), the decoder's layers' and then
// the multi-token prediction layers' (Bridge matches the target names wherever the modules are).
void add_lora_adapters(const GptConfig& c, GptParameterLayout& out) {
  const LoraSpec& s = *c.lora;
  if (s.dim <= 0) throw Error("GptModel: the LoRA dim must be positive");
  out.table.freeze_all();
  const int64_t h = c.hidden, attn = c.heads * c.kv_channels;
  for (int64_t l = 0; l < c.layer_count(); ++l) {
    GptLayerOffsets& L = out.layers[static_cast<size_t>(l)];
    const std::string p = l < c.num_layers ? "decoder.layers." + std::to_string(l) + "."
                                           : "mtp.layers." + std::to_string(l - c.num_layers) + ".mtp_model_layer.";
    if (s.proj) L.proj_lora = add_lora(out.table, s, p + "self_attention.linear_proj", attn, h);
    if (s.qkv) L.qkv_lora = add_lora(out.table, s, p + "self_attention.linear_qkv", h, c.qkv_width());
    if (c.is_moe_layer(l)) {
      // Megatron-Core's MoELayer order: the experts' linear_fc1 and linear_fc2, then the shared
      // expert's. The routed experts' adapter is one pair whatever the expert (Bridge's shared
      // ParallelLinearAdapter over the grouped GEMM's rows).
      const int64_t F = c.moe.ffn, Fs = c.moe.shared_ffn;
      const int64_t F1 = c.activation == Activation::SwiGLU ? 2 * F : F, F1s = c.activation == Activation::SwiGLU ? 2 * Fs : Fs;
      if (s.fc1) L.experts_fc1_lora = add_lora(out.table, s, p + "mlp.experts.linear_fc1", h, F1);
      if (s.fc2) L.experts_fc2_lora = add_lora(out.table, s, p + "mlp.experts.linear_fc2", F, h);
      if (Fs > 0 && s.fc1) L.shared_fc1_lora = add_lora(out.table, s, p + "mlp.shared_experts.linear_fc1", h, F1s);
      if (Fs > 0 && s.fc2) L.shared_fc2_lora = add_lora(out.table, s, p + "mlp.shared_experts.linear_fc2", Fs, h);
      continue;
    }
    if (s.fc1) L.fc1_lora = add_lora(out.table, s, p + "mlp.linear_fc1", h, c.fc1_width());
    if (s.fc2) L.fc2_lora = add_lora(out.table, s, p + "mlp.linear_fc2", c.ffn, h);
  }
}

// MLASelfAttention's own parameters after linear_proj, in its registration order: linear_q_proj (or
// linear_q_down_proj, linear_q_up_proj), linear_kv_down_proj, linear_kv_up_proj, q_layernorm (with
// query compression), kv_layernorm; none has a bias, the norms follow the model's.
void add_mla_attention(const GptConfig& c, ParameterTable& t, const std::string& p, Init gamma_init,
                       GptLayerOffsets& L) {
  const MlaSpec& m = *c.mla;
  const int64_t h = c.hidden, q_rows = c.heads * m.q_head_dim();
  const bool ln = c.norm == Norm::LayerNorm;
  if (m.q_lora_rank > 0) {
    L.q_down_w = t.add(p + "linear_q_down_proj.weight", {m.q_lora_rank, h}, Init::Normal, c.init_std);
    L.q_up_w = t.add(p + "linear_q_up_proj.weight", {q_rows, m.q_lora_rank}, Init::Normal, c.init_std);
  } else {
    L.q_proj_w = t.add(p + "linear_q_proj.weight", {q_rows, h}, Init::Normal, c.init_std);
  }
  L.kv_down_w = t.add(p + "linear_kv_down_proj.weight", {m.kv_lora_rank + m.qk_pos_emb_head_dim, h}, Init::Normal,
                      c.init_std);
  L.kv_up_w = t.add(p + "linear_kv_up_proj.weight", {c.heads * (m.qk_head_dim + m.v_head_dim), m.kv_lora_rank},
                    Init::Normal, c.init_std);
  if (m.latent_norms && m.q_lora_rank > 0) {
    L.q_ln_w = t.add(p + "q_layernorm.weight", {m.q_lora_rank}, gamma_init);
    L.q_ln_b = ln ? t.add(p + "q_layernorm.bias", {m.q_lora_rank}, Init::Zeros) : -1;
  }
  if (m.latent_norms) {
    L.kv_ln_w = t.add(p + "kv_layernorm.weight", {m.kv_lora_rank}, gamma_init);
    L.kv_ln_b = ln ? t.add(p + "kv_layernorm.bias", {m.kv_lora_rank}, Init::Zeros) : -1;
  }
}

// Transformer layer l's parameters under `p` ("decoder.layers.3.", or an MTP layer's
// "mtp.layers.0.mtp_model_layer."), in Megatron-Core's registration order.
GptLayerOffsets add_transformer_layer(const GptConfig& c, ParameterTable& table, const std::string& p, int64_t l) {
  const int64_t h = c.hidden;
  // Output layers (linear_proj, linear_fc2) are scaled by 1/sqrt(2L) (scaled_init_method_normal).
  const double out_std = c.init_std / std::sqrt(2.0 * static_cast<double>(c.num_layers));
  const Init gamma_init = c.zero_centered_gamma ? Init::Zeros : Init::Ones;
  const bool ln = c.norm == Norm::LayerNorm;
  GptLayerOffsets L{};
  L.ln1_w = table.add(p + "input_layernorm.weight", {h}, gamma_init);
  L.ln1_b = ln ? table.add(p + "input_layernorm.bias", {h}, Init::Zeros) : -1;
  // Megatron registers linear_proj (Attention.__init__) before linear_qkv (SelfAttention.__init__).
  L.proj_w = table.add(p + "self_attention.linear_proj.weight", {h, c.heads * c.kv_channels}, Init::Normal, out_std);
  L.proj_b = c.add_bias_linear ? table.add(p + "self_attention.linear_proj.bias", {h}, Init::Zeros) : -1;
  if (c.mla) {
    L.qkv_w = L.qkv_b = L.q_norm = L.k_norm = -1;
    add_mla_attention(c, table, p + "self_attention.", gamma_init, L);
  } else {
    L.qkv_w = table.add(p + "self_attention.linear_qkv.weight", {c.qkv_width(), h}, Init::Normal, c.init_std);
    L.qkv_b = (c.add_bias_linear || c.add_qkv_bias)
                  ? table.add(p + "self_attention.linear_qkv.bias", {c.qkv_width()}, Init::Zeros)
                  : -1;
    // SelfAttention registers q_layernorm and k_layernorm after linear_qkv.
    L.q_norm = c.qk_layernorm ? table.add(p + "self_attention.q_layernorm.weight", {c.kv_channels}, gamma_init) : -1;
    L.k_norm = c.qk_layernorm ? table.add(p + "self_attention.k_layernorm.weight", {c.kv_channels}, gamma_init) : -1;
  }
  L.ln2_w = table.add(p + "pre_mlp_layernorm.weight", {h}, gamma_init);
  L.ln2_b = ln ? table.add(p + "pre_mlp_layernorm.bias", {h}, Init::Zeros) : -1;
  if (c.is_moe_layer(l)) {
    // Megatron-Core's MoELayer: router, experts, shared experts (its registration order). The
    // experts' linear_fc1 are kept together, then their linear_fc2 (TEGroupedMLP's grouping),
    // under SequentialMLP's names.
    const auto& m = c.moe;
    if (m.ffn <= 0 || m.topk < 1 || m.topk > m.num_experts || m.expert_parallel < 1 ||
        m.num_experts % m.expert_parallel != 0)
      throw Error("GptModel: invalid MoE shape");
    if (c.add_bias_linear) throw Error("GptModel: MoE experts with biases are not supported");
    L.fc1_w = L.fc1_b = L.fc2_w = L.fc2_b = -1;
    L.router_w = table.add(p + "mlp.router.weight", {m.num_experts, h}, Init::Normal, c.init_std);
    if (m.expert_bias) {  // TopKRouter's buffer, after its weight in the state dict
      L.expert_bias = table.add(p + "mlp.router.expert_bias", {m.num_experts}, Init::Zeros);
      table.specs.back().buffer = true;
    }
    // Under expert parallelism this rank's experts only, as local_experts.0 .. (model/gpt_ep.hpp).
    const std::string e = p + "mlp.experts.local_experts.";
    for (int64_t x = 0; x < m.local_experts(); ++x) {
      const int64_t off = table.add(e + std::to_string(x) + ".linear_fc1.weight", {c.fc1_rows(m.ffn), h},
                                    Init::Normal, c.init_std);
      if (x == 0) L.experts_fc1 = off;
    }
    for (int64_t x = 0; x < m.local_experts(); ++x) {
      const int64_t off = table.add(e + std::to_string(x) + ".linear_fc2.weight", {h, m.ffn}, Init::Normal, out_std);
      if (x == 0) L.experts_fc2 = off;
    }
    if (m.shared_ffn > 0) {
      L.shared_fc1 = table.add(p + "mlp.shared_experts.linear_fc1.weight", {c.fc1_rows(m.shared_ffn), h},
                               Init::Normal, c.init_std);
      L.shared_fc2 = table.add(p + "mlp.shared_experts.linear_fc2.weight", {h, m.shared_ffn}, Init::Normal, out_std);
    }
  } else {
    L.fc1_w = table.add(p + "mlp.linear_fc1.weight", {c.fc1_width(), h}, Init::Normal, c.init_std);
    L.fc1_b = c.add_bias_linear ? table.add(p + "mlp.linear_fc1.bias", {c.fc1_width()}, Init::Zeros) : -1;
    L.fc2_w = table.add(p + "mlp.linear_fc2.weight", {h, c.ffn}, Init::Normal, out_std);
    L.fc2_b = c.add_bias_linear ? table.add(p + "mlp.linear_fc2.bias", {h}, Init::Zeros) : -1;
  }
  return L;
}

}  // namespace

GptParameterLayout build_gpt_parameters(const GptConfig& c) {
  if (c.num_layers <= 0 || c.hidden <= 0 || c.heads <= 0 || c.kv_channels <= 0 || c.ffn <= 0 || c.vocab <= 0 ||
      c.query_groups <= 0 || c.heads % c.query_groups != 0)
    throw Error("GptModel: invalid shape");
  if (c.positions == Positions::LearnedAbsolute && c.max_positions <= 0)
    throw Error("GptModel: learned positions need max_positions > 0");
  if (c.mtp_num_layers < 0) throw Error("GptModel: a negative number of multi-token prediction layers");
  if (c.mla) {
    const MlaSpec& m = *c.mla;
    if (m.q_lora_rank < 0 || m.kv_lora_rank <= 0 || m.qk_head_dim <= 0 || m.qk_pos_emb_head_dim <= 0 ||
        m.v_head_dim <= 0 || c.kv_channels != m.v_head_dim || c.query_groups != c.heads || c.qk_layernorm ||
        c.positions != Positions::Rope)
      throw Error("GptModel: invalid multi-latent attention shape");
  }
  GptParameterLayout out;
  ParameterTable& table = out.table;
  const int64_t h = c.hidden;
  table.weight_decay = {c.apply_wd_to_qk_layernorm, c.skip_embedding_weight_decay};
  out.word_emb = table.add("embedding.word_embeddings.weight", {c.vocab, h}, Init::Normal, c.embedding_init_std);
  table.specs.back().embedding_or_output = true;
  if (c.positions == Positions::LearnedAbsolute)
    out.pos_emb = table.add("embedding.position_embeddings.weight", {c.max_positions, h}, Init::Normal, c.init_std);
  const Init gamma_init = c.zero_centered_gamma ? Init::Zeros : Init::Ones;
  const bool ln = c.norm == Norm::LayerNorm;
  for (int64_t l = 0; l < c.num_layers; ++l)
    out.layers.push_back(add_transformer_layer(c, table, "decoder.layers." + std::to_string(l) + ".", l));
  out.final_w = table.add("decoder.final_layernorm.weight", {h}, gamma_init);
  out.final_b = ln ? table.add("decoder.final_layernorm.bias", {h}, Init::Zeros) : -1;
  // Multi-token prediction (GPTModel.mtp, between the decoder and the output layer): per layer
  // enorm, hnorm, eh_proj, its transformer layer (mtp_model_layer) and final_layernorm.
  for (int64_t k = 0; k < c.mtp_num_layers; ++k) {
    const std::string p = "mtp.layers." + std::to_string(k) + ".";
    MtpOffsets M;
    M.enorm_w = table.add(p + "enorm.weight", {h}, gamma_init);
    M.enorm_b = ln ? table.add(p + "enorm.bias", {h}, Init::Zeros) : -1;
    M.hnorm_w = table.add(p + "hnorm.weight", {h}, gamma_init);
    M.hnorm_b = ln ? table.add(p + "hnorm.bias", {h}, Init::Zeros) : -1;
    M.eh_proj = table.add(p + "eh_proj.weight", {h, 2 * h}, Init::Normal, c.init_std);
    out.layers.push_back(add_transformer_layer(c, table, p + "mtp_model_layer.", c.num_layers + k));
    M.final_w = table.add(p + "final_layernorm.weight", {h}, gamma_init);
    M.final_b = ln ? table.add(p + "final_layernorm.bias", {h}, Init::Zeros) : -1;
    out.mtp.push_back(M);
  }
  out.output_w = c.tied_embeddings ? out.word_emb
                                   : table.add("output_layer.weight", {c.vocab, h}, Init::Normal, c.init_std);
  if (!c.tied_embeddings) table.specs.back().embedding_or_output = true;
  if (c.lora) add_lora_adapters(c, out);
  return out;
}

GradientWriters gradient_writers(const GptParameterLayout& layout) {
  // PEFT: the frozen base has no gradients, and the adapters' GEMMs accumulate (their few
  // gradients are all zeroed first).
  if (layout.table.has_frozen()) return {{}, {{0, layout.table.trainable()}}};
  const auto& specs = layout.table.specs;  // in offset order
  auto index_of = [&](int64_t offset) {
    const auto it = std::lower_bound(specs.begin(), specs.end(), offset,
                                     [](const ParamSpec& s, int64_t o) { return s.offset < o; });
    if (it == specs.end() || it->offset != offset) throw Error("gradient_writers: no parameter at offset " +
                                                                std::to_string(offset));
    return static_cast<size_t>(it - specs.begin());
  };
  GradientWriters w;
  for (const GptLayerOffsets& L : layout.layers) {
    for (int64_t o : {L.qkv_w, L.proj_w, L.fc1_w, L.fc2_w, L.router_w, L.shared_fc1, L.shared_fc2, L.q_proj_w,
                      L.q_down_w, L.q_up_w, L.kv_down_w, L.kv_up_w})
      if (o >= 0) w.gemm_written.push_back(o);
    if (L.experts_fc1 >= 0) {  // the local experts' linear_fc1 one after another, then their linear_fc2
      const size_t fc1 = index_of(L.experts_fc1), fc2 = index_of(L.experts_fc2);
      for (size_t i = fc1; i < fc2 + (fc2 - fc1); ++i) w.gemm_written.push_back(specs[i].offset);
    }
  }
  // (Multi-token prediction's layers use the output layer too: its gradient is added to, not written.)
  if (layout.output_w >= 0 && layout.output_w != layout.word_emb && layout.mtp.empty())
    w.gemm_written.push_back(layout.output_w);
  std::sort(w.gemm_written.begin(), w.gemm_written.end());
  int64_t at = 0;
  for (int64_t o : w.gemm_written) {
    if (o > at) w.zeroed.push_back({at, o - at});
    at = o + specs[index_of(o)].numel;
  }
  if (layout.table.total > at) w.zeroed.push_back({at, layout.table.total - at});
  return w;
}

}  // namespace laoyao::model
