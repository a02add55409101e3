#include "train/fp8_setup.hpp"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "core/error.hpp"
#include "model/gpt_tp.hpp"

namespace laoyao::train {
namespace {

// Each FP8 linear layer's [in, out] features (those of the first layer; every layer has the same).
std::vector<std::pair<const char*, std::pair<int64_t, int64_t>>> fp8_linears(const model::GptConfig& g) {
  std::vector<std::pair<const char*, std::pair<int64_t, int64_t>>> out;
  if (g.mla) {
    const model::MlaSpec& m = *g.mla;
    const int64_t q_rows = g.heads * m.q_head_dim();
    if (m.q_lora_rank > 0) {
      out.push_back({"linear_q_down_proj", {g.hidden, m.q_lora_rank}});
      out.push_back({"linear_q_up_proj", {m.q_lora_rank, q_rows}});
    } else {
      out.push_back({"linear_q_proj", {g.hidden, q_rows}});
    }
    out.push_back({"linear_kv_down_proj", {g.hidden, m.kv_lora_rank + m.qk_pos_emb_head_dim}});
    out.push_back({"linear_kv_up_proj", {m.kv_lora_rank, g.heads * (m.qk_head_dim + m.v_head_dim)}});
  } else {
    out.push_back({"linear_qkv", {g.hidden, g.qkv_width()}});
  }
  out.push_back({"linear_proj", {g.heads * g.kv_channels, g.hidden}});
  out.push_back({"linear_fc1", {g.hidden, g.fc1_rows(g.ffn)}});
  out.push_back({"linear_fc2", {g.ffn, g.hidden}});
  if (g.moe.num_experts > 0) {  // the experts' GroupedLinear and the shared expert's Linear
    out.push_back({"experts' linear_fc1", {g.hidden, g.fc1_rows(g.moe.ffn)}});
    out.push_back({"experts' linear_fc2", {g.moe.ffn, g.hidden}});
    if (g.moe.shared_ffn > 0) {
      out.push_back({"shared_experts' linear_fc1", {g.hidden, g.fc1_rows(g.moe.shared_ffn)}});
      out.push_back({"shared_experts' linear_fc2", {g.moe.shared_ffn, g.hidden}});
    }
  }
  if (g.mtp_num_layers > 0) out.push_back({"mtp's eh_proj", {2 * g.hidden, g.hidden}});
  return out;
}

}  // namespace

std::optional<model::Fp8Spec> fp8_spec(const config::ConfigContainer& c, const model::GptConfig& g) {
  const config::ModelConfig& m = c.model;
  if (!m.fp8) {
    if (m.fp8_param)
      throw UsageError("model.fp8_param (--fp8-param-gather) needs FP8: give model.fp8 (--fp8-format) e4m3 or hybrid");
    return std::nullopt;
  }
  const std::string& recipe = m.fp8_recipe;
  if (recipe == "mxfp8")
    throw UsageError("model.fp8_recipe mxfp8 (--fp8-recipe mxfp8: MXFP8 block scaling) runs on Blackwell GPUs, "
                     "which laoyao cannot check yet (docs/fp8.md); accepted: delayed, tensorwise, blockwise");
  if (recipe == "custom")
    throw UsageError("model.fp8_recipe custom (--fp8-recipe custom) takes a Python quantizer factory "
                     "(fp8_quantizer_factory), which laoyao has no way to run; accepted: delayed, tensorwise, blockwise");
  if (m.fp8_dot_product_attention || m.fp8_multi_head_attention)
    throw UsageError("model.fp8_dot_product_attention / model.fp8_multi_head_attention: FP8 attention is not built "
                     "(attention runs in BF16, Megatron's default)");
  const bool delayed = recipe == "delayed";
  // Megatron-Core's TransformerConfig checks.
  if (m.first_last_layers_bf16 && delayed)
    throw UsageError("Delayed scaling does not support first / last layer in BF16 (model.first_last_layers_bf16 / "
                     "--first-last-layers-bf16 with model.fp8_recipe delayed; use tensorwise)");
  model::Fp8Spec s;
  if (m.first_last_layers_bf16) {
    for (const auto& [name, n] : {std::pair<const char*, int64_t>{"num_layers_at_start_in_bf16", m.num_layers_at_start_in_bf16},
                                  {"num_layers_at_end_in_bf16", m.num_layers_at_end_in_bf16}})
      if (n < 0 || n > g.num_layers)
        throw UsageError(std::string(name) + " (" + std::to_string(n) +
                         ") must be between 0 and number of layers per pipeline stage (" +
                         std::to_string(g.num_layers) + ")");
    s.bf16_layers_at_start = m.num_layers_at_start_in_bf16;
    s.bf16_layers_at_end = m.num_layers_at_end_in_bf16;
  }
  if (m.fp8_amax_history_len < 1)
    throw UsageError("model.fp8_amax_history_len (--fp8-amax-history-len) " + std::to_string(m.fp8_amax_history_len) +
                     " (accepted: 1 or more)");
  s.formats = *m.fp8 == "hybrid" ? Fp8Formats::Hybrid : Fp8Formats::E4M3;
  s.recipe = delayed ? Fp8ScalingRecipe::Delayed
             : recipe == "blockwise" ? Fp8ScalingRecipe::Blockwise
                                     : Fp8ScalingRecipe::Tensorwise;
  s.margin = static_cast<int>(m.fp8_margin);
  s.amax_history_len = m.fp8_amax_history_len;
  s.amax_compute_algo = m.fp8_amax_compute_algo == "max" ? AmaxComputeAlgo::Max : AmaxComputeAlgo::MostRecent;
  // cuBLASLt's FP8 GEMMs take dimensions in multiples of 16 (Transformer Engine asks callers to pad):
  // every linear layer's features, and the tokens of a micro-batch (the weight gradient's inner size).
  // (Under context parallelism each rank's: its 2 chunks of every sequence.)
  const int64_t cp = std::max<int64_t>(1, m.context_parallel_size);
  const int64_t tokens = m.seq_length / cp * c.train.micro_batch_size.value_or(1);
  if (tokens % 16 != 0)
    throw UsageError("FP8 needs the tokens of a micro-batch in multiples of 16: model.seq_length (--seq-length) " +
                     std::to_string(m.seq_length) +
                     (cp > 1 ? " / model.context_parallel_size " + std::to_string(cp) : "") +
                     " x train.micro_batch_size (--micro-batch-size) " +
                     std::to_string(c.train.micro_batch_size.value_or(1)) + " = " + std::to_string(tokens));
  // Under tensor parallelism each rank's GEMMs are its shards' (Transformer Engine checks those).
  const int64_t tp = c.model.tensor_model_parallel_size;
  for (const auto& [name, kn] : fp8_linears(tp > 1 ? model::tp_local_config(g, tp) : g))
    if (kn.first % 16 != 0 || kn.second % 16 != 0)
      throw UsageError(std::string("FP8 needs every linear layer's sizes in multiples of 16") +
                       (tp > 1 ? " on each of the " + std::to_string(tp) + " tensor-parallel ranks" : "") + ": " +
                       name + " is " + std::to_string(kn.first) + " -> " + std::to_string(kn.second) +
                       " (pad the model's widths, or train it without model.fp8 / --fp8-format)");
  return s;
}

}  // namespace laoyao::train
