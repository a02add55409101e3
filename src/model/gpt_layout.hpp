// Where each parameter of a GPT model lives in the flat buffers: Megatron-Core's names and state-dict
// order (the ParameterTable) plus each layer's offsets. Shared by every backend's GptModel, so the
// CPU and CUDA models hold the same parameters at the same offsets and checkpoints map one to one.
#pragma once
#include <cstdint>
#include <vector>

#include "model/gpt_config.hpp"
#include "model/parameters.hpp"

namespace laoyao::model {

// A LoRA adapter on a linear layer (model/gpt_config.hpp LoraSpec): linear_in (A) [dim, in] and
// linear_out (B) [out, dim]; -1 where the layer has none.
struct LoraOffsets {
  int64_t a = -1, b = -1;
  bool on() const { return a >= 0; }
};

// Offsets into the flat buffers; -1 for a parameter the model does not have (a bias, a LayerNorm
// beta, QK-norm weights).
struct GptLayerOffsets {
  int64_t ln1_w, ln1_b, qkv_w, qkv_b, q_norm, k_norm, proj_w, proj_b, ln2_w, ln2_b, fc1_w, fc1_b, fc2_w, fc2_b;
  // Multi-latent attention (qkv_w, qkv_b, q_norm, k_norm -1): linear_q_proj, or linear_q_down_proj
  // and linear_q_up_proj (q_proj_w then -1); linear_kv_down_proj, linear_kv_up_proj; the latent
  // norms q_layernorm, kv_layernorm (weight, LayerNorm's bias).
  int64_t q_proj_w = -1, q_down_w = -1, q_up_w = -1, kv_down_w = -1, kv_up_w = -1;
  int64_t q_ln_w = -1, q_ln_b = -1, kv_ln_w = -1, kv_ln_b = -1;
  // An MoE layer (fc1/fc2 -1): the router, the experts' linear_fc1 then their linear_fc2 (each
  // kind consecutive, expert after expert), the shared expert's (-1: none); -1 in a dense layer.
  int64_t router_w = -1, experts_fc1 = -1, experts_fc2 = -1, shared_fc1 = -1, shared_fc2 = -1;
  int64_t expert_bias = -1;  // the router's expert_bias buffer (aux-loss-free balancing)
  // PEFT's adapters (after every base parameter in the table: the trained tail). An MoE layer's
  // routed experts share one adapter per linear (Bridge's share_expert_adapters, its default:
  // mlp.experts.linear_fc1.adapter.*), its shared expert has its own.
  LoraOffsets qkv_lora, proj_lora, fc1_lora, fc2_lora;
  LoraOffsets experts_fc1_lora, experts_fc2_lora, shared_fc1_lora, shared_fc2_lora;
};

// A multi-token prediction layer's own parameters (its transformer layer's are in `layers`).
struct MtpOffsets {
  int64_t enorm_w = -1, enorm_b = -1, hnorm_w = -1, hnorm_b = -1, eh_proj = -1, final_w = -1, final_b = -1;
};

struct GptParameterLayout {
  ParameterTable table;
  int64_t word_emb = -1, pos_emb = -1, final_w = -1, final_b = -1;
  int64_t output_w = -1;  // == word_emb when the embeddings are tied
  std::vector<GptLayerOffsets> layers;  // the decoder's, then the MTP layers' (GptConfig::layer_count)
  std::vector<MtpOffsets> mtp;
};

// Throws laoyao::Error for a shape no GPT model has.
GptParameterLayout build_gpt_parameters(const GptConfig& c);

// Who writes each gradient in a backward: `gemm_written` holds the parameters (offsets, sorted)
// whose whole gradient one weight-gradient GEMM computes (every linear's weight, the routers', all
// of a layer's routed experts (one grouped GEMM covers them), the shared experts'; not a tied output
// layer, to whose gradient the embedding's backward adds), `zeroed` the ranges [offset, offset +
// count) of everything else (norms, biases, embeddings, buffers). Together they cover every
// parameter once. A backward that writes the former instead of adding to them zeroes the latter.
// Offsets in the gradients' buffer: the table's, or under PEFT from its trainable_offset on (no
// GEMM-written parameters then; all of the adapters zeroed).
struct GradientWriters {
  struct Range {
    int64_t offset, count;
  };
  std::vector<int64_t> gemm_written;
  std::vector<Range> zeroed;
};
GradientWriters gradient_writers(const GptParameterLayout& layout);

}  // namespace laoyao::model
