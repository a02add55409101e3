// Hugging Face models as Megatron-Core GPTs, with Megatron-Bridge's rules: which `architectures`
// map to which GPT shape (config.json's fields -> the model's), the Megatron-LM flags and Bridge
// overrides of that shape, and how each Megatron-Core parameter is made of Hugging Face tensors
// (QKV interleaved per query group, linear_fc1 as [gate; up], GPT-2's Conv1D weights transposed,
// the experts one by one).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/gpt_config.hpp"

namespace laoyao::train {

enum class HfArchitecture { Gpt2, Llama, Qwen2, Qwen3, Qwen3Moe, DeepseekV2, DeepseekV3 };

// The architectures import-hf knows, as config.json names them ("GPT2LMHeadModel", ...).
std::vector<std::string> hf_architecture_names();

struct HfModel {
  HfArchitecture arch = HfArchitecture::Llama;
  std::string arch_name;     // as config.json names it
  model::GptConfig gpt;      // the Megatron-Core shape (vocab: config.json's vocab_size, unpadded)
  double norm_eps = 1e-5;    // as config.json gives it (the model's field is a float)
};

// config.json's text (`source` names it in messages) as a GPT; UsageError naming the field for an
// unknown architecture (with the supported list), a missing or out-of-range field, or a feature
// Megatron-Core's GPT here does not have (sliding windows, other rope scalings, shared expert gates).
HfModel parse_hf_config(const std::string& json_text, const std::string& source);

// The shortest text that reads back as x, whole numbers in full (1e-05, 500000, 0.02): how the
// flags, overrides and messages print config.json's numbers.
std::string hf_number(double x);

// Megatron-Bridge's make_vocab_size_divisible_by for an imported vocabulary: the largest power of
// two up to 128 that divides it (so the model's padded vocabulary is the checkpoint's).
int64_t hf_vocab_divisor(int64_t vocab);

// The Megatron-LM model flags of that shape ("--num-layers 16 --hidden-size 2048 ..."), and the
// same as Megatron-Bridge `model.*` overrides, one string each.
std::vector<std::string> hf_megatron_flags(const HfModel& m);
std::vector<std::string> hf_bridge_overrides(const HfModel& m);

// How a Megatron-Core parameter is made of Hugging Face tensors. Every kind only reorders rows
// (and Transpose the two dims of a matrix), so any dtype converts bit for bit.
struct HfTensorMap {
  enum class Kind {
    Copy,          // hf[0] as it is
    Transpose,     // hf[0] is [in, out] (GPT-2's Conv1D): rows and columns swapped
    Qkv,           // hf = {q, k, v}: rows interleaved per query group [q heads of g; k_g; v_g]
    Gpt2Qkv,       // hf[0] = c_attn ([h, 3h] weight, or [3h] bias): [q | k | v] columns, per head as Qkv
    GateUp,        // hf = {gate, up}: rows of gate then up (Megatron's [gate; up] linear_fc1)
  };
  std::string mcore;            // local-spec name (model/gpt_layout.hpp)
  std::vector<int64_t> shape;   // its shape
  Kind kind = Kind::Copy;
  std::vector<std::string> hf;  // the Hugging Face tensors, in the kind's order
};

// Every parameter of the model, in the table's order, with its Hugging Face sources.
std::vector<HfTensorMap> hf_tensor_maps(const HfModel& m);

// The other way: the Hugging Face architecture of a Megatron-Core GPT (the whole model; norm_eps
// and init_std as the run's config gives them, in double): GPT-2 for LayerNorm with learned
// positions, Qwen3 (or Qwen3-MoE) with QK layernorm, Qwen2 with QKV biases alone, else Llama.
// UsageError naming what no supported architecture has (a shared expert, MoE beside dense layers,
// biases on o_proj alone, GeLU with RoPE, ...).
HfModel hf_model_of(const model::GptConfig& whole, double norm_eps, double init_std);

// config.json for that model (model_type, the architecture's field names), its weights in `dtype`
// ("bfloat16" or "float32").
std::string hf_config_json(const HfModel& m, const std::string& dtype);

// The tokenizer files a Hugging Face folder may hold beside its weights (copied both ways).
inline constexpr const char* kHfTokenizerFiles[] = {"tokenizer.json",          "tokenizer_config.json", "tokenizer.model",
                                                    "special_tokens_map.json", "vocab.json",            "merges.txt",
                                                    "generation_config.json"};

// Hugging Face tensors a checkpoint may hold that are not parameters (GPT-2's causal mask
// buffers, rotary inv_freq): skipped on import.
bool hf_ignored_tensor(const HfModel& m, const std::string& name);

}  // namespace laoyao::train
