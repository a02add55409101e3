// Hugging Face model folders written by tests: config.json and *.safetensors under Hugging Face's
// names, with random values (exact in BF16), for import-hf's tests.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "core/file_io.hpp"
#include "core/rng.hpp"
#include "core/safetensors.hpp"

namespace laoyao::test {

// A fresh empty folder under the system temp folder, private to this process.
inline std::string fresh_hf_dir(const std::string& name) {
  const std::filesystem::path d =
      std::filesystem::temp_directory_path() / ("laoyao_hf_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d.string();
}

// A Hugging Face folder being written: tensors by name with random values.
struct HfFolder {
  std::string dir;
  std::map<std::string, std::vector<int64_t>> shape;
  std::map<std::string, std::vector<float>> value;

  void add(const std::string& name, std::vector<int64_t> s) {
    int64_t n = 1;
    for (int64_t d : s) n *= d;
    Rng rng(7, name);
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = round_to_bf16(static_cast<float>(rng.normal()));  // exact in BF16 too
    shape[name] = std::move(s);
    value[name] = std::move(v);
  }
  // Writes config.json and the tensors, in `shards` files with an index when more than one.
  void write(const std::string& config, Dtype dtype = Dtype::F32, int shards = 1) {
    write_file_atomic(dir + "/config.json", config);
    std::vector<std::vector<TensorWrite>> files(static_cast<size_t>(shards));
    std::vector<std::vector<uint16_t>> bf16;
    bf16.reserve(value.size());
    std::string index = "{\"metadata\": {}, \"weight_map\": {";
    size_t i = 0;
    for (const auto& [name, v] : value) {
      const size_t f = i++ % static_cast<size_t>(shards);
      const void* data = v.data();
      if (dtype == Dtype::BF16) {
        bf16.emplace_back();
        for (float x : v) bf16.back().push_back(f32_to_bf16(x));
        data = bf16.back().data();
      }
      files[f].push_back({name, dtype, shape[name], data});
      index += std::string(i > 1 ? ", " : "") + "\"" + name + "\": \"model-" + std::to_string(f) + ".safetensors\"";
    }
    for (size_t f = 0; f < files.size(); ++f)
      write_safetensors(dir + (shards == 1 ? "/model.safetensors" : "/model-" + std::to_string(f) + ".safetensors"),
                        files[f]);
    if (shards > 1) write_file_atomic(dir + "/model.safetensors.index.json", index + "}}");
  }
  float at(const std::string& name, int64_t r, int64_t c) const {
    const auto& s = shape.at(name);
    return value.at(name)[static_cast<size_t>(s.size() > 1 ? r * s[1] + c : r)];
  }
};

// Llama-style layer tensors (prefix "model.layers.L."), GQA with q heads H, groups G, head dim D.
inline void add_llama_layer(HfFolder& hf, int l, int64_t h, int64_t H, int64_t G, int64_t D, int64_t ffn, bool qkv_bias,
                     bool qk_norm) {
  const std::string p = "model.layers." + std::to_string(l) + ".";
  hf.add(p + "input_layernorm.weight", {h});
  hf.add(p + "self_attn.q_proj.weight", {H * D, h});
  hf.add(p + "self_attn.k_proj.weight", {G * D, h});
  hf.add(p + "self_attn.v_proj.weight", {G * D, h});
  if (qkv_bias) {
    hf.add(p + "self_attn.q_proj.bias", {H * D});
    hf.add(p + "self_attn.k_proj.bias", {G * D});
    hf.add(p + "self_attn.v_proj.bias", {G * D});
  }
  if (qk_norm) {
    hf.add(p + "self_attn.q_norm.weight", {D});
    hf.add(p + "self_attn.k_norm.weight", {D});
  }
  hf.add(p + "self_attn.o_proj.weight", {h, H * D});
  hf.add(p + "post_attention_layernorm.weight", {h});
  if (ffn > 0) {
    hf.add(p + "mlp.gate_proj.weight", {ffn, h});
    hf.add(p + "mlp.up_proj.weight", {ffn, h});
    hf.add(p + "mlp.down_proj.weight", {h, ffn});
  }
}

inline std::string llama_config(const std::string& arch, const std::string& extra = "") {
  return "{\"architectures\": [\"" + arch + "\"], \"hidden_size\": 16, \"intermediate_size\": 24, "
         "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 8, "
         "\"vocab_size\": 64, \"max_position_embeddings\": 128, \"rms_norm_eps\": 1e-05, \"rope_theta\": 500000.0, "
         "\"hidden_act\": \"silu\", \"torch_dtype\": \"bfloat16\"" + extra + "}";
}

inline HfFolder llama_folder(const std::string& dir, bool tied) {
  HfFolder hf{dir, {}, {}};
  hf.add("model.embed_tokens.weight", {64, 16});
  for (int l = 0; l < 2; ++l) add_llama_layer(hf, l, 16, 4, 2, 8, 24, false, false);
  hf.add("model.norm.weight", {16});
  if (!tied) hf.add("lm_head.weight", {64, 16});
  return hf;
}

// A Qwen3-MoE folder: 2 layers, 4 experts of width 8, QK norms, untied.
inline HfFolder qwen3_moe_folder(const std::string& dir) {
  HfFolder hf{dir, {}, {}};
  hf.add("model.embed_tokens.weight", {64, 16});
  for (int l = 0; l < 2; ++l) {
    add_llama_layer(hf, l, 16, 4, 2, 8, 0, false, true);
    const std::string p = "model.layers." + std::to_string(l) + ".mlp.";
    hf.add(p + "gate.weight", {4, 16});
    for (int e = 0; e < 4; ++e) {
      const std::string x = p + "experts." + std::to_string(e) + ".";
      hf.add(x + "gate_proj.weight", {8, 16}), hf.add(x + "up_proj.weight", {8, 16}), hf.add(x + "down_proj.weight", {16, 8});
    }
  }
  hf.add("model.norm.weight", {16});
  hf.add("lm_head.weight", {64, 16});
  return hf;
}

// DeepSeek-V2 (no q latent, YaRN, softmax router) or V3 (a q latent, the sigmoid router with its
// expert bias and groups): 2 layers, the first dense (width 24), then 4 experts of width 8 top-2
// with one shared expert; 2 heads, kv latent 8, q/k dims 4 + 4 (RoPE'd), v 6; untied.
inline std::string deepseek_config(bool v3) {
  std::string c = std::string("{\"architectures\": [\"") + (v3 ? "DeepseekV3ForCausalLM" : "DeepseekV2ForCausalLM") +
                  "\"], \"hidden_size\": 16, \"intermediate_size\": 24, \"num_hidden_layers\": 2, "
                  "\"num_attention_heads\": 2, \"num_key_value_heads\": 2, \"vocab_size\": 64, "
                  "\"max_position_embeddings\": 128, \"rms_norm_eps\": 1e-06, \"rope_theta\": 10000.0, "
                  "\"hidden_act\": \"silu\", \"torch_dtype\": \"bfloat16\", \"kv_lora_rank\": 8, "
                  "\"qk_nope_head_dim\": 4, \"qk_rope_head_dim\": 4, \"v_head_dim\": 6, \"n_routed_experts\": 4, "
                  "\"num_experts_per_tok\": 2, \"moe_intermediate_size\": 8, \"n_shared_experts\": 1, "
                  "\"first_k_dense_replace\": 1, \"moe_layer_freq\": 1, \"routed_scaling_factor\": 2.5, "
                  "\"aux_loss_alpha\": 0.001, \"tie_word_embeddings\": false";
  if (v3)
    return c + ", \"q_lora_rank\": 12, \"scoring_func\": \"sigmoid\", \"topk_method\": \"noaux_tc\", "
               "\"n_group\": 2, \"topk_group\": 1, \"norm_topk_prob\": true, \"rope_scaling\": null}";
  return c + ", \"q_lora_rank\": null, \"scoring_func\": \"softmax\", \"topk_method\": \"greedy\", "
             "\"norm_topk_prob\": false, \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 40, "
             "\"original_max_position_embeddings\": 16, \"beta_fast\": 32, \"beta_slow\": 1, \"mscale\": 0.707, "
             "\"mscale_all_dim\": 0.707}}";
}

inline HfFolder deepseek_folder(const std::string& dir, bool v3) {
  HfFolder hf{dir, {}, {}};
  hf.add("model.embed_tokens.weight", {64, 16});
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    hf.add(p + "input_layernorm.weight", {16});
    hf.add(p + "post_attention_layernorm.weight", {16});
    if (v3) {
      hf.add(p + "self_attn.q_a_proj.weight", {12, 16});
      hf.add(p + "self_attn.q_a_layernorm.weight", {12});
      hf.add(p + "self_attn.q_b_proj.weight", {2 * 8, 12});
    } else {
      hf.add(p + "self_attn.q_proj.weight", {2 * 8, 16});
    }
    hf.add(p + "self_attn.kv_a_proj_with_mqa.weight", {8 + 4, 16});
    hf.add(p + "self_attn.kv_a_layernorm.weight", {8});
    hf.add(p + "self_attn.kv_b_proj.weight", {2 * (4 + 6), 8});
    hf.add(p + "self_attn.o_proj.weight", {16, 2 * 6});
    if (l == 0) {
      hf.add(p + "mlp.gate_proj.weight", {24, 16}), hf.add(p + "mlp.up_proj.weight", {24, 16});
      hf.add(p + "mlp.down_proj.weight", {16, 24});
      continue;
    }
    hf.add(p + "mlp.gate.weight", {4, 16});
    if (v3) hf.add(p + "mlp.gate.e_score_correction_bias", {4});
    for (int e = 0; e < 4; ++e) {
      const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
      hf.add(x + "gate_proj.weight", {8, 16}), hf.add(x + "up_proj.weight", {8, 16}), hf.add(x + "down_proj.weight", {16, 8});
    }
    const std::string sh = p + "mlp.shared_experts.";
    hf.add(sh + "gate_proj.weight", {8, 16}), hf.add(sh + "up_proj.weight", {8, 16}), hf.add(sh + "down_proj.weight", {16, 8});
  }
  hf.add("model.norm.weight", {16});
  hf.add("lm_head.weight", {64, 16});
  return hf;
}

}  // namespace laoyao::test
