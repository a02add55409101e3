#include "train/hf_model.hpp"

#include <nlohmann/json.hpp>

#include <charconv>
#include <cmath>

#include "core/error.hpp"
#include "model/gpt_layout.hpp"

namespace laoyao::train {

namespace {

using nlohmann::json;

struct Arch {
  const char* name;
  HfArchitecture arch;
};
constexpr Arch kArchitectures[] = {{"GPT2LMHeadModel", HfArchitecture::Gpt2},
                                   {"LlamaForCausalLM", HfArchitecture::Llama},
                                   {"Qwen2ForCausalLM", HfArchitecture::Qwen2},
                                   {"Qwen3ForCausalLM", HfArchitecture::Qwen3},
                                   {"Qwen3MoeForCausalLM", HfArchitecture::Qwen3Moe},
                                   {"DeepseekV2ForCausalLM", HfArchitecture::DeepseekV2},
                                   {"DeepseekV3ForCausalLM", HfArchitecture::DeepseekV3}};

std::string supported_list() {
  std::string out;
  for (const auto& a : kArchitectures) out += (out.empty() ? "" : ", ") + std::string(a.name);
  return out;
}

// config.json's fields, each read with a message naming it.
class Fields {
 public:
  Fields(const json& j, const std::string& source) : j_(j), source_(source) {}
  bool has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }
  // A positive integer, at most 2^24 (no model has more layers, heads or width; larger values are a
  // malformed file, not a model to allocate).
  int64_t integer(const char* key) const {
    if (!has(key)) fail(key, "is missing");
    const json& v = j_[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > (int64_t{1} << 24))
      fail(key, "must be a positive integer up to 2^24, not " + v.dump());
    return v.get<int64_t>();
  }
  int64_t integer(const char* key, int64_t fallback) const { return has(key) ? integer(key) : fallback; }
  // An integer >= 0, up to 2^24 (0 when missing): a count that may be none.
  int64_t count(const char* key) const {
    if (!has(key)) return 0;
    const json& v = j_[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > (int64_t{1} << 24))
      fail(key, "must be an integer from 0 up to 2^24, not " + v.dump());
    return v.get<int64_t>();
  }
  double number(const char* key, double fallback) const {
    if (!has(key)) return fallback;
    const json& v = j_[key];
    if (!v.is_number() || !(v.get<double>() > 0)) fail(key, "must be a positive number, not " + v.dump());
    return v.get<double>();
  }
  double non_negative(const char* key, double fallback) const {
    if (!has(key)) return fallback;
    const json& v = j_[key];
    if (!v.is_number() || !(v.get<double>() >= 0)) fail(key, "must be a number >= 0, not " + v.dump());
    return v.get<double>();
  }
  bool boolean(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    if (!j_[key].is_boolean()) fail(key, "must be true or false, not " + j_[key].dump());
    return j_[key].get<bool>();
  }
  std::string string(const char* key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    if (!j_[key].is_string()) fail(key, "must be a string, not " + j_[key].dump());
    return j_[key].get<std::string>();
  }
  const json& raw(const char* key) const { return j_[key]; }
  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw UsageError(source_ + ": \"" + key + "\" " + what);
  }

 private:
  const json& j_;
  std::string source_;
};

// RoPE's scaling: config.json's rope_scaling, or (transformers 5 writes RoPE's base and scaling as
// one object) rope_parameters unless its rope_type is "default"; the key it came from with it, or
// null when the model's RoPE is unscaled.
std::pair<const char*, const json*> rope_scaling_of(const Fields& f) {
  if (f.has("rope_scaling")) return {"rope_scaling", &f.raw("rope_scaling")};
  if (!f.has("rope_parameters")) return {"rope_scaling", nullptr};
  const json& p = f.raw("rope_parameters");
  if (!p.is_object()) f.fail("rope_parameters", "must be an object or null, not " + p.dump());
  const bool plain = !p.contains("rope_type") || (p["rope_type"].is_string() && p["rope_type"] == "default");
  return {"rope_parameters", plain ? nullptr : &p};
}

// RoPE's base: rope_theta, at the top or in transformers 5's rope_parameters.
double rope_theta_of(const Fields& f) {
  if (f.has("rope_theta") || !f.has("rope_parameters") || !f.raw("rope_parameters").is_object())
    return f.number("rope_theta", 10000.0);
  const json& p = f.raw("rope_parameters");
  if (!p.contains("rope_theta")) return 10000.0;
  if (!p["rope_theta"].is_number() || !(p["rope_theta"].get<double>() > 0))
    f.fail("rope_parameters.rope_theta", "must be a positive number, not " + p["rope_theta"].dump());
  return p["rope_theta"].get<double>();
}

// The fields of every RMSNorm / SwiGLU / RoPE architecture here: the MLP and vocabulary sizes, the
// positions, the norm's epsilon, the activation, RoPE's base and the init std.
void parse_rmsnorm_swiglu_rope(const Fields& f, HfModel& m) {
  model::GptConfig& g = m.gpt;
  g.ffn = f.integer("intermediate_size");
  g.vocab = f.integer("vocab_size");
  g.max_positions = f.integer("max_position_embeddings");
  g.norm = model::Norm::RMSNorm;
  m.norm_eps = f.number("rms_norm_eps", 1e-6);
  g.norm_eps = static_cast<float>(m.norm_eps);
  g.activation = model::Activation::SwiGLU;
  const std::string act = f.string("hidden_act", "silu");
  if (act != "silu") f.fail("hidden_act", "is \"" + act + "\"; Megatron's SwiGLU is silu");
  g.positions = model::Positions::Rope;
  g.rotary_base = rope_theta_of(f);
  g.init_std = g.embedding_init_std = f.number("initializer_range", 0.02);
}

// Llama's and Qwen's common fields: RMSNorm, SwiGLU (silu), RoPE, GQA.
void parse_llama_like(const Fields& f, HfModel& m) {
  model::GptConfig& g = m.gpt;
  g.num_layers = f.integer("num_hidden_layers");
  g.hidden = f.integer("hidden_size");
  g.heads = f.integer("num_attention_heads");
  g.query_groups = f.integer("num_key_value_heads", g.heads);
  if (g.hidden % g.heads != 0 && !f.has("head_dim"))
    f.fail("head_dim", "is missing and hidden_size is not a multiple of num_attention_heads");
  g.kv_channels = f.integer("head_dim", g.hidden / g.heads);
  if (g.heads % g.query_groups != 0)
    f.fail("num_key_value_heads", std::to_string(g.query_groups) + " must divide num_attention_heads, " +
                                      std::to_string(g.heads));
  parse_rmsnorm_swiglu_rope(f, m);
  if (f.integer("pretraining_tp", 1) != 1) f.fail("pretraining_tp", "must be 1");
  if (const auto [key, scaling] = rope_scaling_of(f); scaling) {
    const json& rs = *scaling;
    const std::string at = key;
    if (!rs.is_object()) f.fail(at, "must be an object or null, not " + rs.dump());
    auto text = [&](const char* k) { return rs.contains(k) && rs[k].is_string() ? rs[k].get<std::string>() : ""; };
    const std::string type = !text("rope_type").empty() ? text("rope_type") : text("type");
    if (type != "llama3")
      f.fail(at, "of type \"" + type + "\" is not supported (Megatron's Llama 3 scaling: \"llama3\")");
    // Megatron's _apply_scaling fixes these; a checkpoint with others would compute other angles.
    auto fixed = [&](const char* k, double want) {
      if (!rs.contains(k) || !rs[k].is_number() || rs[k].get<double>() != want)
        f.fail(at + "." + k, "must be " + std::to_string(want).substr(0, 6) + " (Megatron's Llama 3 scaling constant)");
    };
    fixed("low_freq_factor", 1.0);
    fixed("high_freq_factor", 4.0);
    fixed("original_max_position_embeddings", 8192.0);
    if (!rs.contains("factor") || !rs["factor"].is_number() || !(rs["factor"].get<double>() > 0))
      f.fail(at + ".factor", "must be a positive number");
    g.rope_scaling = true;
    g.rope_scaling_factor = rs["factor"].get<double>();
  }
  if (f.boolean("use_sliding_window", false) || (f.has("sliding_window") && m.arch == HfArchitecture::Llama))
    f.fail("sliding_window", "is set: sliding-window attention is not supported");
  g.tied_embeddings = f.boolean("tie_word_embeddings", false);
}

void parse_gpt2(const Fields& f, HfModel& m) {
  model::GptConfig& g = m.gpt;
  g.num_layers = f.integer("n_layer");
  g.hidden = f.integer("n_embd");
  g.heads = g.query_groups = f.integer("n_head");
  if (g.hidden % g.heads != 0) f.fail("n_head", "must divide n_embd");
  g.kv_channels = g.hidden / g.heads;
  g.ffn = f.integer("n_inner", 4 * g.hidden);
  g.vocab = f.integer("vocab_size");
  g.max_positions = f.integer("n_positions");
  g.norm = model::Norm::LayerNorm;
  m.norm_eps = f.number("layer_norm_epsilon", 1e-5);
  g.norm_eps = static_cast<float>(m.norm_eps);
  const std::string act = f.string("activation_function", "gelu_new");
  if (act == "gelu_new" || act == "gelu_pytorch_tanh")
    g.activation = model::Activation::GeluTanh;  // Megatron's fused bias-GeLU (tanh form)
  else if (act == "gelu")
    g.activation = model::Activation::GeluErf;
  else
    f.fail("activation_function", "is \"" + act + "\" (supported: gelu_new, gelu_pytorch_tanh, gelu)");
  g.positions = model::Positions::LearnedAbsolute;
  g.init_std = g.embedding_init_std = f.number("initializer_range", 0.02);
  g.tied_embeddings = f.boolean("tie_word_embeddings", true);
  if (f.boolean("scale_attn_by_inverse_layer_idx", false))
    f.fail("scale_attn_by_inverse_layer_idx", "is true: Megatron scales attention by 1/sqrt(head dim) only");
  if (!f.boolean("scale_attn_weights", true)) f.fail("scale_attn_weights", "is false");
}

// DeepSeek-V2/V3 (Megatron-Bridge's DeepSeekV2Bridge / DeepSeekV3Bridge): multi-latent attention
// with YaRN (or plain) RoPE on the decoupled dims, the first first_k_dense_replace layers dense and
// the rest MoE with shared experts. The routers, as transformers computes them, in Megatron's terms:
// V2's softmax over every expert then the top k (pre-softmax; norm_topk_prob renormalises, Megatron's
// softmax over the top k), V3's sigmoid with the expert bias choosing, groups by their top-2 sum,
// the chosen scores renormalised; both scaled by routed_scaling_factor.
void parse_deepseek(const Fields& f, HfModel& m) {
  model::GptConfig& g = m.gpt;
  const bool v3 = m.arch == HfArchitecture::DeepseekV3;
  g.num_layers = f.integer("num_hidden_layers");
  g.hidden = f.integer("hidden_size");
  g.heads = g.query_groups = f.integer("num_attention_heads");
  if (f.integer("num_key_value_heads", g.heads) != g.heads)
    f.fail("num_key_value_heads", "differs from num_attention_heads: multi-latent attention has a key per head");
  parse_rmsnorm_swiglu_rope(f, m);
  g.tied_embeddings = f.boolean("tie_word_embeddings", false);
  g.add_bias_linear = g.add_qkv_bias = false;
  if (f.boolean("attention_bias", false)) f.fail("attention_bias", "is true: MLA's projections have no biases");
  if (f.count("num_nextn_predict_layers") > 0)
    f.fail("num_nextn_predict_layers", "asks for multi-token prediction layers, which are not built yet");
  model::MlaSpec s;
  s.q_lora_rank = f.has("q_lora_rank") ? f.integer("q_lora_rank") : 0;
  s.kv_lora_rank = f.integer("kv_lora_rank");
  s.qk_head_dim = f.integer("qk_nope_head_dim");
  s.qk_pos_emb_head_dim = f.integer("qk_rope_head_dim");
  s.v_head_dim = f.integer("v_head_dim");
  if (s.qk_pos_emb_head_dim % 2 != 0) f.fail("qk_rope_head_dim", "is odd: RoPE rotates pairs of dims");
  s.latent_norms = true;
  g.kv_channels = s.v_head_dim;
  double mscale_all_dim = 1.0, factor = 1.0;  // Bridge's values without YaRN (scale 1)
  if (const auto [key, scaling] = rope_scaling_of(f); scaling) {
    const json& rs = *scaling;
    auto text = [&](const char* k) { return rs.contains(k) && rs[k].is_string() ? rs[k].get<std::string>() : ""; };
    const std::string type = rs.is_object() ? (!text("type").empty() ? text("type") : text("rope_type")) : "";
    if (type != "yarn" && type != "default")
      f.fail(key, "of type \"" + type + "\" is not supported for multi-latent attention (yarn)");
    if (type == "yarn") {
      auto num = [&](const char* k, double fallback) {
        if (!rs.contains(k) || rs[k].is_null()) return fallback;
        if (!rs[k].is_number() || !(rs[k].get<double>() >= 0)) f.fail(std::string("rope_scaling.") + k, "must be a number >= 0");
        return rs[k].get<double>();
      };
      kernels::cpu::YarnParams y;
      y.scaling_factor = factor = num("factor", 1.0);
      y.original_max_position_embeddings = static_cast<int64_t>(num("original_max_position_embeddings", 4096));
      y.beta_fast = num("beta_fast", 32.0);
      y.beta_slow = num("beta_slow", 1.0);
      y.mscale = num("mscale", 1.0);
      y.mscale_all_dim = mscale_all_dim = num("mscale_all_dim", 0.0);
      if (!(y.scaling_factor > 0) || y.original_max_position_embeddings < 1)
        f.fail("rope_scaling", "needs a positive factor and original_max_position_embeddings");
      g.yarn = y;
    }
  }
  const double mscale = factor <= 1.0 ? 1.0 : 0.1 * mscale_all_dim * std::log(factor) + 1.0;
  s.softmax_scale = mscale * mscale / std::sqrt(static_cast<double>(s.q_head_dim()));
  g.mla = s;

  model::MoeConfig& moe = g.moe;
  moe.num_experts = f.integer("n_routed_experts");
  if (moe.num_experts * g.num_layers > (int64_t{1} << 20))
    f.fail("n_routed_experts", "times num_hidden_layers is over 2^20 experts (a malformed file)");
  moe.topk = f.integer("num_experts_per_tok");
  moe.ffn = f.integer("moe_intermediate_size");
  moe.shared_ffn = f.has("n_shared_experts") ? moe.ffn * f.integer("n_shared_experts") : 0;
  if (f.integer("moe_layer_freq", 1) != 1) f.fail("moe_layer_freq", "must be 1 (every layer after the dense ones)");
  const int64_t dense = f.count("first_k_dense_replace");
  if (dense > g.num_layers) f.fail("first_k_dense_replace", "is more than num_hidden_layers");
  moe.layers.assign(static_cast<size_t>(g.num_layers), false);
  for (int64_t l = dense; l < g.num_layers; ++l) moe.layers[static_cast<size_t>(l)] = true;
  const double scaling = f.number("routed_scaling_factor", 1.0);
  if (scaling != 1.0) moe.topk_scaling_factor = scaling;
  const std::string method = f.string("topk_method", v3 ? "noaux_tc" : "greedy");
  const std::string scoring = f.string("scoring_func", v3 ? "sigmoid" : "softmax");
  const bool norm_topk = f.boolean("norm_topk_prob", v3);
  const int64_t groups = f.integer("n_group", 1), group_topk = f.integer("topk_group", 1);
  if (method == "greedy" && scoring == "softmax") {
    moe.pre_softmax = !norm_topk;
  } else if (method == "group_limited_greedy" && scoring == "softmax") {
    // transformers ranks a group by its best expert, Megatron by the sum of its top k / topk_group:
    // the same only when that is one expert.
    if (groups > 1 && moe.topk / group_topk != 1)
      f.fail("topk_method", "group_limited_greedy ranks groups by their best expert, Megatron-Core's group-limited "
                            "routing by the sum of the top num_experts_per_tok / topk_group (" +
                                std::to_string(moe.topk / group_topk) + "): not the same router");
    moe.pre_softmax = !norm_topk;
    if (groups > 1) moe.num_groups = groups, moe.group_topk = group_topk;
  } else if (method == "noaux_tc" && scoring == "sigmoid") {
    if (!norm_topk) f.fail("norm_topk_prob", "is false: Megatron-Core's sigmoid router renormalises the top k");
    if (groups > 1 && moe.topk / group_topk != 2)
      f.fail("topk_group", "makes groups of " + std::to_string(moe.topk / group_topk) + " experts per chosen group; "
                           "noaux_tc ranks a group by its top-2 sum, Megatron-Core by its top num_experts_per_tok / "
                           "topk_group");
    moe.sigmoid = true;
    moe.expert_bias = true;
    if (groups > 1) moe.num_groups = groups, moe.group_topk = group_topk;
  } else {
    f.fail("topk_method", "\"" + method + "\" with scoring_func \"" + scoring + "\" is not supported (greedy or "
                          "group_limited_greedy with softmax, noaux_tc with sigmoid)");
  }
  // The sequence-level load-balancing loss DeepSeek trains with (Bridge: seq_aux_loss, aux_loss_alpha;
  // transformers' default for V2, Bridge's for V3).
  moe.seq_aux_loss_coeff = f.non_negative("aux_loss_alpha", v3 ? 0.0001 : 0.001);
}

}  // namespace

std::vector<std::string> hf_architecture_names() {
  std::vector<std::string> out;
  for (const auto& a : kArchitectures) out.emplace_back(a.name);
  return out;
}

HfModel parse_hf_config(const std::string& json_text, const std::string& source) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {
    throw UsageError(source + ": not valid JSON (" + e.what() + ")");
  }
  if (!j.is_object()) throw UsageError(source + ": not a JSON object");
  const Fields f(j, source);
  if (!f.has("architectures") || !j["architectures"].is_array() || j["architectures"].size() != 1 ||
      !j["architectures"][0].is_string())
    f.fail("architectures", "must list one architecture (supported: " + supported_list() + ")");
  HfModel m;
  m.arch_name = j["architectures"][0].get<std::string>();
  bool known = false;
  for (const auto& a : kArchitectures)
    if (m.arch_name == a.name) m.arch = a.arch, known = true;
  if (!known)
    throw UsageError(source + ": architecture \"" + m.arch_name + "\" is not supported (supported: " +
                     supported_list() + ")");
  model::GptConfig& g = m.gpt;
  g.bf16 = true;
  switch (m.arch) {
    case HfArchitecture::Gpt2:
      parse_gpt2(f, m);
      break;
    case HfArchitecture::Llama:
      parse_llama_like(f, m);
      g.add_qkv_bias = f.boolean("attention_bias", false);
      g.add_bias_linear = f.boolean("mlp_bias", false);
      if (g.add_qkv_bias != g.add_bias_linear)
        f.fail("attention_bias", "and \"mlp_bias\" differ: Megatron's add_bias_linear covers both (with "
                                 "add_qkv_bias for the QKV alone: attention_bias without mlp_bias is not a Llama "
                                 "Megatron-Core builds, as o_proj would have a bias)");
      break;
    case HfArchitecture::Qwen2:
      parse_llama_like(f, m);
      g.add_qkv_bias = true;  // Qwen2's q/k/v projections have biases, o_proj and the MLP none
      g.add_bias_linear = false;
      break;
    case HfArchitecture::Qwen3:
    case HfArchitecture::Qwen3Moe:
      parse_llama_like(f, m);
      g.qk_layernorm = true;
      g.add_qkv_bias = f.boolean("attention_bias", false);
      if (g.add_qkv_bias) f.fail("attention_bias", "is true: Qwen3 with QKV biases is not supported");
      g.add_bias_linear = false;
      break;
    case HfArchitecture::DeepseekV2:
    case HfArchitecture::DeepseekV3:
      parse_deepseek(f, m);
      break;
  }
  if (g.num_layers > 4096) f.fail("num_hidden_layers", "is " + std::to_string(g.num_layers) + " (at most 4096)");
  if (m.arch == HfArchitecture::Qwen3Moe) {
    model::MoeConfig& moe = g.moe;
    // transformers 5 writes the count under its attribute_map's name, num_local_experts.
    const char* experts = f.has("num_experts") || !f.has("num_local_experts") ? "num_experts" : "num_local_experts";
    moe.num_experts = f.integer(experts);
    if (moe.num_experts * g.num_layers > (int64_t{1} << 20))
      f.fail(experts, "times num_hidden_layers is over 2^20 experts (a malformed file)");
    moe.topk = f.integer("num_experts_per_tok");
    moe.ffn = f.integer("moe_intermediate_size");
    // Qwen3-MoE's router: softmax over every expert, the top k, renormalised (norm_topk_prob) -- that
    // is Megatron's top k of the logits then their softmax; without renormalising, Megatron's pre-softmax.
    moe.pre_softmax = !f.boolean("norm_topk_prob", true);
    moe.aux_loss_coeff = f.non_negative("router_aux_loss_coef", 0.0);  // 0: no load-balancing loss
    const int64_t step = f.integer("decoder_sparse_step", 1);
    std::vector<bool> dense(static_cast<size_t>(g.num_layers), false);
    if (f.has("mlp_only_layers")) {
      const json& only = f.raw("mlp_only_layers");
      if (!only.is_array()) f.fail("mlp_only_layers", "must be a list of layer numbers");
      for (const auto& v : only) {
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= g.num_layers)
          f.fail("mlp_only_layers", "holds " + v.dump() + ", not a layer number");
        dense[static_cast<size_t>(v.get<int64_t>())] = true;
      }
    }
    moe.layers.assign(static_cast<size_t>(g.num_layers), false);
    for (int64_t l = 0; l < g.num_layers; ++l)
      moe.layers[static_cast<size_t>(l)] = !dense[static_cast<size_t>(l)] && (l + 1) % step == 0;
    for (bool is_moe : moe.layers)
      if (!is_moe) f.fail("mlp_only_layers", "or \"decoder_sparse_step\" make dense layers, whose intermediate_size "
                                             "MLP is not supported next to MoE layers yet");
  }
  return m;
}

int64_t hf_vocab_divisor(int64_t vocab) {
  int64_t d = 1;
  while (d < 128 && vocab % (2 * d) == 0) d *= 2;
  return d;
}

std::string hf_number(double x) {
  if (x == std::floor(x) && std::abs(x) < 1e15) return std::to_string(static_cast<int64_t>(x));
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, x);
  return std::string(buf, r.ptr);
}

namespace {

// The model's settings as (Megatron-LM flag, value or "" for a switch, Bridge override).
struct Setting {
  std::string flag, value, field, field_value;
};

// Multi-latent attention's flags: its dims, the latent norms, and its RoPE (YaRN's parameters, or
// plain RoPE with Bridge's no-scaling values).
void mla_settings(const model::GptConfig& g, std::vector<Setting>& s) {
  const model::MlaSpec& m = *g.mla;
  auto num = [](int64_t v) { return std::to_string(v); };
  s.push_back({"--multi-latent-attention", "", "multi_latent_attention", "true"});
  if (m.q_lora_rank > 0)
    s.push_back({"--q-lora-rank", num(m.q_lora_rank), "q_lora_rank", num(m.q_lora_rank)});
  else
    s.push_back({"", "", "q_lora_rank", "null"});  // (Bridge's MLA config has 512; Megatron-LM's flag None)
  s.push_back({"--kv-lora-rank", num(m.kv_lora_rank), "kv_lora_rank", num(m.kv_lora_rank)});
  s.push_back({"--qk-head-dim", num(m.qk_head_dim), "qk_head_dim", num(m.qk_head_dim)});
  s.push_back({"--qk-pos-emb-head-dim", num(m.qk_pos_emb_head_dim), "qk_pos_emb_head_dim", num(m.qk_pos_emb_head_dim)});
  s.push_back({"--v-head-dim", num(m.v_head_dim), "v_head_dim", num(m.v_head_dim)});
  if (m.latent_norms) s.push_back({"--qk-layernorm", "", "qk_layernorm", "true"});
  if (!g.yarn) {
    s.push_back({"--rope-type", "rope", "rope_type", "rope"});
    s.push_back({"--rotary-scaling-factor", "1", "rotary_scaling_factor", "1"});
    s.push_back({"--mscale-all-dim", "1", "mscale_all_dim", "1"});
    return;
  }
  const kernels::cpu::YarnParams& y = *g.yarn;
  s.push_back({"--rope-type", "yarn", "rope_type", "yarn"});
  s.push_back({"--rotary-scaling-factor", hf_number(y.scaling_factor), "rotary_scaling_factor", hf_number(y.scaling_factor)});
  s.push_back({"--yarn-original-max-position-embeddings", num(y.original_max_position_embeddings),
               "original_max_position_embeddings", num(y.original_max_position_embeddings)});
  s.push_back({"--yarn-beta-fast", hf_number(y.beta_fast), "beta_fast", hf_number(y.beta_fast)});
  s.push_back({"--yarn-beta-slow", hf_number(y.beta_slow), "beta_slow", hf_number(y.beta_slow)});
  s.push_back({"--mscale", hf_number(y.mscale), "mscale", hf_number(y.mscale)});
  s.push_back({"--mscale-all-dim", hf_number(y.mscale_all_dim), "mscale_all_dim", hf_number(y.mscale_all_dim)});
}

// DeepSeek's MoE beyond Qwen3-MoE's: the dense first layers, shared experts, the router's scale,
// score function, expert bias and groups, the sequence-level load-balancing loss.
void deepseek_moe_settings(const model::GptConfig& g, std::vector<Setting>& s) {
  const model::MoeConfig& moe = g.moe;
  int64_t dense = 0;
  while (dense < g.num_layers && !g.is_moe_layer(dense)) ++dense;
  const std::string expr = "([0]*" + std::to_string(dense) + "+[1]*" + std::to_string(g.num_layers - dense) + ")";
  std::string list = "[";
  for (int64_t l = 0; l < g.num_layers; ++l) list += std::string(l ? "," : "") + (g.is_moe_layer(l) ? "1" : "0");
  s.push_back({"--moe-layer-freq", expr, "moe_layer_freq", list + "]"});
  if (moe.shared_ffn > 0)
    s.push_back({"--moe-shared-expert-intermediate-size", std::to_string(moe.shared_ffn),
                 "moe_shared_expert_intermediate_size", std::to_string(moe.shared_ffn)});
  if (moe.topk_scaling_factor)
    s.push_back({"--moe-router-topk-scaling-factor", hf_number(*moe.topk_scaling_factor),
                 "moe_router_topk_scaling_factor", hf_number(*moe.topk_scaling_factor)});
  if (moe.sigmoid) s.push_back({"--moe-router-score-function", "sigmoid", "moe_router_score_function", "sigmoid"});
  if (moe.expert_bias) s.push_back({"--moe-router-enable-expert-bias", "", "moe_router_enable_expert_bias", "true"});
  if (moe.num_groups > 0) {
    s.push_back({"--moe-router-num-groups", std::to_string(moe.num_groups), "moe_router_num_groups",
                 std::to_string(moe.num_groups)});
    s.push_back({"--moe-router-group-topk", std::to_string(moe.group_topk), "moe_router_group_topk",
                 std::to_string(moe.group_topk)});
  }
  if (moe.seq_aux_loss_coeff > 0) {
    s.push_back({"--moe-router-load-balancing-type", "seq_aux_loss", "moe_router_load_balancing_type", "seq_aux_loss"});
    s.push_back({"--moe-aux-loss-coeff", hf_number(moe.seq_aux_loss_coeff), "moe_aux_loss_coeff",
                 hf_number(moe.seq_aux_loss_coeff)});
  }
}

std::vector<Setting> settings(const HfModel& m) {
  const model::GptConfig& g = m.gpt;
  const bool rope = g.positions == model::Positions::Rope;
  std::vector<Setting> s = {
      {"--num-layers", std::to_string(g.num_layers), "num_layers", std::to_string(g.num_layers)},
      {"--hidden-size", std::to_string(g.hidden), "hidden_size", std::to_string(g.hidden)},
      {"--ffn-hidden-size", std::to_string(g.ffn), "ffn_hidden_size", std::to_string(g.ffn)},
      {"--num-attention-heads", std::to_string(g.heads), "num_attention_heads", std::to_string(g.heads)},
  };
  if (g.query_groups != g.heads) {
    s.push_back({"--group-query-attention", "", "", ""});
    s.push_back({"--num-query-groups", std::to_string(g.query_groups), "num_query_groups",
                 std::to_string(g.query_groups)});
  } else {  // (a recipe's own groups would otherwise stay: Megatron-LM's default is the heads)
    s.push_back({"", "", "num_query_groups", std::to_string(g.query_groups)});
  }
  if (!g.mla)  // (multi-latent attention's head dims are its own)
    s.push_back({"--kv-channels", std::to_string(g.kv_channels), "kv_channels", std::to_string(g.kv_channels)});
  s.push_back({"--max-position-embeddings", std::to_string(g.max_positions), "max_position_embeddings",
               std::to_string(g.max_positions)});
  s.push_back({"--position-embedding-type", rope ? "rope" : "learned_absolute", "position_embedding_type",
               rope ? "rope" : "learned_absolute"});
  if (rope) s.push_back({"--rotary-base", hf_number(g.rotary_base), "rotary_base", hf_number(g.rotary_base)});
  if (g.mla) mla_settings(g, s);
  if (g.rope_scaling) {
    s.push_back({"--use-rope-scaling", "", "rope_scaling", "true"});
    s.push_back({"--rope-scaling-factor", hf_number(g.rope_scaling_factor), "rope_scaling_factor",
                 hf_number(g.rope_scaling_factor)});
  }
  const bool rms = g.norm == model::Norm::RMSNorm;
  s.push_back({"--normalization", rms ? "RMSNorm" : "LayerNorm", "normalization", rms ? "RMSNorm" : "LayerNorm"});
  s.push_back({"--norm-epsilon", hf_number(m.norm_eps), "layernorm_epsilon", hf_number(m.norm_eps)});
  if (g.activation == model::Activation::SwiGLU) {
    s.push_back({"--swiglu", "", "gated_linear_unit", "true"});
    s.push_back({"", "", "activation_func", "silu"});
  }
  if (g.activation == model::Activation::GeluErf) s.push_back({"--no-bias-gelu-fusion", "", "bias_activation_fusion", "false"});
  if (!g.add_bias_linear) s.push_back({"--disable-bias-linear", "", "add_bias_linear", "false"});
  if (g.add_qkv_bias && !g.add_bias_linear) s.push_back({"--add-qkv-bias", "", "add_qkv_bias", "true"});
  if (g.qk_layernorm) s.push_back({"--qk-layernorm", "", "qk_layernorm", "true"});
  if (!g.tied_embeddings)
    s.push_back({"--untie-embeddings-and-output-weights", "", "share_embeddings_and_output_weights", "false"});
  s.push_back({"--init-method-std", hf_number(g.init_std), "init_method_std", hf_number(g.init_std)});
  const std::string divisor = std::to_string(hf_vocab_divisor(g.vocab));
  s.push_back({"--make-vocab-size-divisible-by", divisor, "make_vocab_size_divisible_by", divisor});
  s.push_back({"", "", "vocab_size", std::to_string(g.vocab)});
  if (g.moe.num_experts > 0) {
    const model::MoeConfig& moe = g.moe;
    s.push_back({"--num-experts", std::to_string(moe.num_experts), "num_moe_experts", std::to_string(moe.num_experts)});
    s.push_back({"--moe-router-topk", std::to_string(moe.topk), "moe_router_topk", std::to_string(moe.topk)});
    s.push_back({"--moe-ffn-hidden-size", std::to_string(moe.ffn), "moe_ffn_hidden_size", std::to_string(moe.ffn)});
    if (moe.pre_softmax) s.push_back({"--moe-router-pre-softmax", "", "moe_router_pre_softmax", "true"});
    if (moe.aux_loss_coeff > 0)
      s.push_back({"--moe-aux-loss-coeff", hf_number(moe.aux_loss_coeff), "moe_aux_loss_coeff", hf_number(moe.aux_loss_coeff)});
    if (g.mla) deepseek_moe_settings(g, s);
  }
  return s;
}

}  // namespace

std::vector<std::string> hf_megatron_flags(const HfModel& m) {
  std::vector<std::string> out;
  for (const auto& s : settings(m)) {
    if (s.flag.empty()) continue;
    out.push_back(s.flag);
    if (!s.value.empty()) out.push_back(s.value);
  }
  return out;
}

std::vector<std::string> hf_bridge_overrides(const HfModel& m) {
  std::vector<std::string> out;
  for (const auto& s : settings(m))
    if (!s.field.empty()) out.push_back("model." + s.field + "=" + s.field_value);
  return out;
}

std::vector<HfTensorMap> hf_tensor_maps(const HfModel& m) {
  using Kind = HfTensorMap::Kind;
  const model::GptParameterLayout layout = model::build_gpt_parameters(m.gpt);
  const bool gpt2 = m.arch == HfArchitecture::Gpt2;
  std::vector<HfTensorMap> out;
  for (const auto& p : layout.table.specs) {
    // A buffer only where Hugging Face holds it: DeepSeek-V3's expert bias (e_score_correction_bias).
    if (p.buffer && !(m.arch == HfArchitecture::DeepseekV3 && p.name.find(".mlp.router.expert_bias") != std::string::npos))
      continue;
    HfTensorMap t{p.name, p.shape, Kind::Copy, {}};
    const std::string& n = p.name;
    auto ends = [&](const std::string& suffix) {
      return n.size() >= suffix.size() && n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    const std::string wb = ends(".bias") ? "bias" : "weight";
    if (n == "embedding.word_embeddings.weight") {
      t.hf = {gpt2 ? "transformer.wte.weight" : "model.embed_tokens.weight"};
    } else if (n == "embedding.position_embeddings.weight") {
      t.hf = {"transformer.wpe.weight"};
    } else if (n == "output_layer.weight") {
      t.hf = {"lm_head.weight"};
    } else if (n.rfind("decoder.final_layernorm.", 0) == 0) {
      t.hf = {gpt2 ? "transformer.ln_f." + wb : "model.norm." + wb};
    } else {
      // decoder.layers.L.<rest>
      const size_t dot = n.find('.', 15);
      const std::string layer = n.substr(15, dot - 15), rest = n.substr(dot + 1);
      const std::string h = gpt2 ? "transformer.h." + layer + "." : "model.layers." + layer + ".";
      if (rest.rfind("input_layernorm.", 0) == 0) {
        t.hf = {h + (gpt2 ? "ln_1." : "input_layernorm.") + wb};
      } else if (rest.rfind("pre_mlp_layernorm.", 0) == 0) {
        t.hf = {h + (gpt2 ? "ln_2." : "post_attention_layernorm.") + wb};
      } else if (rest.rfind("self_attention.linear_qkv.", 0) == 0) {
        if (gpt2) {
          t.kind = Kind::Gpt2Qkv;
          t.hf = {h + "attn.c_attn." + wb};
        } else {
          t.kind = Kind::Qkv;
          t.hf = {h + "self_attn.q_proj." + wb, h + "self_attn.k_proj." + wb, h + "self_attn.v_proj." + wb};
        }
      } else if (rest.rfind("self_attention.linear_proj.", 0) == 0) {
        t.kind = gpt2 && wb == "weight" ? Kind::Transpose : Kind::Copy;
        t.hf = {h + (gpt2 ? "attn.c_proj." : "self_attn.o_proj.") + wb};
      } else if (m.gpt.mla && rest.rfind("self_attention.", 0) == 0) {
        // Multi-latent attention: DeepSeek's names, the same layouts (kv_b_proj's rows per head
        // [k_nope; v], q's [q_nope; q_rope], kv_a_proj_with_mqa's [latent; k_rope]).
        static const std::pair<const char*, const char*> kMla[] = {
            {"linear_q_proj.weight", "q_proj.weight"},
            {"linear_q_down_proj.weight", "q_a_proj.weight"},
            {"linear_q_up_proj.weight", "q_b_proj.weight"},
            {"q_layernorm.weight", "q_a_layernorm.weight"},
            {"linear_kv_down_proj.weight", "kv_a_proj_with_mqa.weight"},
            {"linear_kv_up_proj.weight", "kv_b_proj.weight"},
            {"kv_layernorm.weight", "kv_a_layernorm.weight"}};
        for (const auto& [ours, theirs] : kMla)
          if (rest == std::string("self_attention.") + ours) t.hf = {h + "self_attn." + theirs};
        if (t.hf.empty()) throw Error("hf_tensor_maps: no Hugging Face source for " + n);
      } else if (rest == "self_attention.q_layernorm.weight") {
        t.hf = {h + "self_attn.q_norm.weight"};
      } else if (rest == "self_attention.k_layernorm.weight") {
        t.hf = {h + "self_attn.k_norm.weight"};
      } else if (rest.rfind("mlp.linear_fc1.", 0) == 0) {
        if (gpt2) {
          t.kind = wb == "weight" ? Kind::Transpose : Kind::Copy;
          t.hf = {h + "mlp.c_fc." + wb};
        } else {
          t.kind = Kind::GateUp;
          t.hf = {h + "mlp.gate_proj." + wb, h + "mlp.up_proj." + wb};
        }
      } else if (rest.rfind("mlp.linear_fc2.", 0) == 0) {
        t.kind = gpt2 && wb == "weight" ? Kind::Transpose : Kind::Copy;
        t.hf = {h + (gpt2 ? "mlp.c_proj." : "mlp.down_proj.") + wb};
      } else if (rest == "mlp.router.weight") {
        t.hf = {h + "mlp.gate.weight"};
      } else if (rest == "mlp.router.expert_bias") {
        t.hf = {h + "mlp.gate.e_score_correction_bias"};
      } else if (rest == "mlp.shared_experts.linear_fc1.weight") {
        t.kind = Kind::GateUp;
        t.hf = {h + "mlp.shared_experts.gate_proj.weight", h + "mlp.shared_experts.up_proj.weight"};
      } else if (rest == "mlp.shared_experts.linear_fc2.weight") {
        t.hf = {h + "mlp.shared_experts.down_proj.weight"};
      } else if (rest.rfind("mlp.experts.local_experts.", 0) == 0) {
        // mlp.experts.local_experts.E.linear_fc1.weight
        const std::string tail = rest.substr(26);
        const std::string e = tail.substr(0, tail.find('.'));
        const std::string x = h + "mlp.experts." + e + ".";
        if (ends(".linear_fc1.weight")) {
          t.kind = Kind::GateUp;
          t.hf = {x + "gate_proj.weight", x + "up_proj.weight"};
        } else {
          t.hf = {x + "down_proj.weight"};
        }
      } else {
        throw Error("hf_tensor_maps: no Hugging Face source for " + n);
      }
    }
    out.push_back(std::move(t));
  }
  return out;
}

bool hf_ignored_tensor(const HfModel& m, const std::string& name) {
  auto ends = [&](const std::string& suffix) {
    return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  if (m.arch == HfArchitecture::Gpt2) return ends(".attn.bias") || ends(".attn.masked_bias");
  return ends(".rotary_emb.inv_freq");
}

}  // namespace laoyao::train

namespace laoyao::train {

namespace {

// A multi-latent attention model as DeepSeek-V3 (the sigmoid router with the expert bias) or V2 (the
// softmax one); refuse(what) for what neither holds.
template <class Refuse>
void deepseek_of(const model::GptConfig& g, const Refuse& refuse, HfModel& m) {
  const model::MoeConfig& moe = g.moe;
  if (g.norm != model::Norm::RMSNorm || g.activation != model::Activation::SwiGLU || g.add_bias_linear)
    refuse("multi-latent attention without DeepSeek's RMSNorm, SwiGLU and bias-free linears");
  if (!g.mla->latent_norms) refuse("multi-latent attention without its latent norms (DeepSeek has them)");
  if (g.rotary_percent != 1.0 || g.seq_len_interpolation_factor || g.rope_scaling) refuse("partial or scaled RoPE beside MLA");
  if (moe.num_experts == 0) refuse("multi-latent attention without experts (DeepSeek's layers are MoE)");
  bool dense_part = true;
  for (int64_t l = 0; l < g.num_layers; ++l) {
    if (!g.is_moe_layer(l) && !dense_part) refuse("dense layers after MoE layers (DeepSeek's dense layers come first)");
    dense_part = dense_part && !g.is_moe_layer(l);
  }
  if (moe.shared_ffn % moe.ffn != 0) refuse("a shared expert whose width is not a whole number of experts'");
  if (moe.aux_loss_coeff > 0 || moe.global_aux_loss_coeff > 0 || moe.z_loss_coeff > 0)
    refuse("load-balancing losses other than the sequence-level one (DeepSeek's aux_loss_alpha)");
  if (moe.sigmoid) {
    if (!moe.expert_bias || moe.sqrt_softplus) refuse("a sigmoid router without DeepSeek-V3's expert bias");
    if (moe.num_groups > 0 && moe.topk / moe.group_topk != 2)
      refuse("group-limited routing whose groups are ranked by other than their top-2 sum (DeepSeek-V3's)");
    m.arch = HfArchitecture::DeepseekV3;
  } else {
    if (moe.expert_bias) refuse("an expert bias with the softmax router");
    if (moe.num_groups > 0 && moe.topk / moe.group_topk != 1)
      refuse("group-limited routing whose groups are ranked by other than their best expert (DeepSeek-V2's)");
    m.arch = HfArchitecture::DeepseekV2;
  }
}

}  // namespace

HfModel hf_model_of(const model::GptConfig& whole, double norm_eps, double init_std) {
  HfModel m;
  m.gpt = whole;
  m.norm_eps = norm_eps;
  m.gpt.init_std = m.gpt.embedding_init_std = init_std;
  const model::GptConfig& g = whole;
  auto refuse = [](const std::string& what) {
    throw UsageError("no Hugging Face architecture here expresses this model: " + what + " (supported: " +
                     supported_list() + ")");
  };
  const bool rope = g.positions == model::Positions::Rope;
  if (g.mla) {
    deepseek_of(g, refuse, m);
  } else if (g.norm == model::Norm::LayerNorm) {
    if (rope || g.positions == model::Positions::None) refuse("LayerNorm with rotary or no positions");
    if (g.activation == model::Activation::SwiGLU) refuse("LayerNorm with SwiGLU");
    if (!g.add_bias_linear) refuse("GPT-2 without biases (--disable-bias-linear)");
    if (g.heads != g.query_groups) refuse("GPT-2 with grouped-query attention");
    if (g.kv_channels * g.heads != g.hidden) refuse("GPT-2 whose heads x head dim is not the hidden size");
    if (g.qk_layernorm || g.moe.num_experts > 0 || !g.tied_embeddings)
      refuse("GPT-2 with QK layernorm, experts or an untied output layer");
    m.arch = HfArchitecture::Gpt2;
  } else {
    if (!rope) refuse("RMSNorm without rotary positions");
    if (g.activation != model::Activation::SwiGLU) refuse("RMSNorm with GeLU (Llama and Qwen are SwiGLU)");
    if (g.rotary_percent != 1.0 || g.seq_len_interpolation_factor) refuse("partial or interpolated RoPE");
    if (g.moe.num_experts > 0) {
      if (!g.qk_layernorm) refuse("experts without QK layernorm (Qwen3-MoE has it)");
      if (g.moe.shared_ffn > 0) refuse("a shared expert");
      for (int64_t l = 0; l < g.num_layers; ++l)
        if (!g.is_moe_layer(l)) refuse("dense layers beside MoE layers");
      if (g.moe.sigmoid || g.moe.expert_bias || g.moe.num_groups > 0 || g.moe.topk_scaling_factor)
        refuse("a router other than Qwen3-MoE's softmax top k");
      m.arch = HfArchitecture::Qwen3Moe;
    } else if (g.qk_layernorm) {
      m.arch = HfArchitecture::Qwen3;
    } else if (g.add_qkv_bias && !g.add_bias_linear) {
      m.arch = HfArchitecture::Qwen2;
    } else {
      m.arch = HfArchitecture::Llama;
    }
    if (g.qk_layernorm && g.add_qkv_bias) refuse("QK layernorm with QKV biases");
  }
  if (g.zero_centered_gamma) refuse("zero-centred norm weights (--apply-layernorm-1p)");
  for (const auto& a : kArchitectures)
    if (a.arch == m.arch) m.arch_name = a.name;
  return m;
}

namespace {

// DeepSeek-V2/V3's config.json fields (transformers' DeepseekV2Config / DeepseekV3Config) after the
// common ones in j.
std::string deepseek_config_json(const HfModel& m, json& j) {
  const model::GptConfig& g = m.gpt;
  const model::MlaSpec& a = *g.mla;
  const model::MoeConfig& moe = g.moe;
  const bool v3 = m.arch == HfArchitecture::DeepseekV3;
  j["model_type"] = v3 ? "deepseek_v3" : "deepseek_v2";
  j["hidden_size"] = g.hidden;
  j["intermediate_size"] = g.ffn;
  j["num_hidden_layers"] = g.num_layers;
  j["num_attention_heads"] = g.heads;
  j["num_key_value_heads"] = g.heads;
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = g.max_positions;
  j["rms_norm_eps"] = m.norm_eps;
  j["rope_theta"] = g.rotary_base;
  j["rope_scaling"] = nullptr;
  if (g.yarn)
    j["rope_scaling"] = {{"type", "yarn"},
                         {"factor", g.yarn->scaling_factor},
                         {"original_max_position_embeddings", g.yarn->original_max_position_embeddings},
                         {"beta_fast", g.yarn->beta_fast},
                         {"beta_slow", g.yarn->beta_slow},
                         {"mscale", g.yarn->mscale},
                         {"mscale_all_dim", g.yarn->mscale_all_dim}};
  j["attention_bias"] = false;
  j["attention_dropout"] = 0.0;
  j["q_lora_rank"] = a.q_lora_rank > 0 ? json(a.q_lora_rank) : json(nullptr);
  j["kv_lora_rank"] = a.kv_lora_rank;
  j["qk_nope_head_dim"] = a.qk_head_dim;
  j["qk_rope_head_dim"] = a.qk_pos_emb_head_dim;
  j["v_head_dim"] = a.v_head_dim;
  j["head_dim"] = a.qk_pos_emb_head_dim;  // (transformers' name for the RoPE'd dims)
  int64_t dense = 0;
  while (dense < g.num_layers && !g.is_moe_layer(dense)) ++dense;
  j["first_k_dense_replace"] = dense;
  j["moe_layer_freq"] = 1;
  j["n_routed_experts"] = moe.num_experts;
  j["num_experts_per_tok"] = moe.topk;
  j["moe_intermediate_size"] = moe.ffn;
  j["n_shared_experts"] = moe.shared_ffn / moe.ffn;
  j["routed_scaling_factor"] = moe.topk_scaling_factor.value_or(1.0);
  j["scoring_func"] = v3 ? "sigmoid" : "softmax";
  j["topk_method"] = v3 ? "noaux_tc" : moe.num_groups > 0 ? "group_limited_greedy" : "greedy";
  j["n_group"] = moe.num_groups > 0 ? moe.num_groups : 1;
  j["topk_group"] = moe.num_groups > 0 ? moe.group_topk : 1;
  j["norm_topk_prob"] = v3 || !moe.pre_softmax;
  j["aux_loss_alpha"] = moe.seq_aux_loss_coeff;
  j["seq_aux"] = true;
  j["num_nextn_predict_layers"] = 0;
  return j.dump(2) + "\n";
}

}  // namespace

std::string hf_config_json(const HfModel& m, const std::string& dtype) {
  const model::GptConfig& g = m.gpt;
  json j;
  j["architectures"] = json::array({m.arch_name});
  j["torch_dtype"] = dtype;
  j["vocab_size"] = g.vocab;
  j["initializer_range"] = g.init_std;
  j["tie_word_embeddings"] = g.tied_embeddings;
  if (m.arch == HfArchitecture::Gpt2) {
    j["model_type"] = "gpt2";
    j["n_embd"] = g.hidden;
    j["n_layer"] = g.num_layers;
    j["n_head"] = g.heads;
    j["n_inner"] = g.ffn;
    j["n_positions"] = g.max_positions;
    j["n_ctx"] = g.max_positions;
    j["layer_norm_epsilon"] = m.norm_eps;
    j["activation_function"] = g.activation == model::Activation::GeluErf ? "gelu" : "gelu_new";
    j["resid_pdrop"] = j["embd_pdrop"] = j["attn_pdrop"] = 0.0;
    return j.dump(2) + "\n";
  }
  if (g.mla) return deepseek_config_json(m, j);
  static const char* kModelTypes[] = {"gpt2", "llama", "qwen2", "qwen3", "qwen3_moe"};
  j["model_type"] = kModelTypes[static_cast<int>(m.arch)];
  j["hidden_size"] = g.hidden;
  j["intermediate_size"] = g.ffn;
  j["num_hidden_layers"] = g.num_layers;
  j["num_attention_heads"] = g.heads;
  j["num_key_value_heads"] = g.query_groups;
  j["head_dim"] = g.kv_channels;
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = g.max_positions;
  j["rms_norm_eps"] = m.norm_eps;
  j["rope_theta"] = g.rotary_base;
  j["rope_scaling"] = nullptr;
  if (g.rope_scaling)
    j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", g.rope_scaling_factor}, {"low_freq_factor", 1.0},
                         {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  j["attention_dropout"] = 0.0;
  if (m.arch == HfArchitecture::Llama) {
    j["attention_bias"] = g.add_bias_linear;
    j["mlp_bias"] = g.add_bias_linear;
  } else {
    j["use_sliding_window"] = false;
    if (m.arch != HfArchitecture::Qwen2) j["attention_bias"] = false;
  }
  if (m.arch == HfArchitecture::Qwen3Moe) {
    j["num_experts"] = g.moe.num_experts;
    j["num_experts_per_tok"] = g.moe.topk;
    j["moe_intermediate_size"] = g.moe.ffn;
    j["norm_topk_prob"] = !g.moe.pre_softmax;
    j["decoder_sparse_step"] = 1;
    j["mlp_only_layers"] = json::array();
    j["router_aux_loss_coef"] = g.moe.aux_loss_coeff;
  }
  return j.dump(2) + "\n";
}

}  // namespace laoyao::train
