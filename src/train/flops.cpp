#include "train/flops.hpp"

#include <string>

#include "core/error.hpp"

namespace laoyao::train {
namespace {

void require_positive(int64_t v, const char* name) {
  if (v <= 0) throw UsageError(std::string("FLOP count: ") + name + " must be positive, got " +
                               std::to_string(v));
}

}  // namespace

// Mirrors training.py::num_floating_point_operations -> transformer_flops(): integer terms stay
// integers (exact, as Python ints are) and the causal-attention term brings in floating point at
// the same place as in Python (`q * s / 2 * 2`), so the result is the same double.
double num_floating_point_operations(const FlopShape& a) {
  require_positive(a.global_batch_size, "global_batch_size");
  require_positive(a.seq_length, "seq_length");
  require_positive(a.num_layers, "num_layers");
  require_positive(a.hidden_size, "hidden_size");
  require_positive(a.num_attention_heads, "num_attention_heads");
  require_positive(a.padded_vocab_size, "padded_vocab_size");

  const int64_t h = a.hidden_size;
  const int64_t heads = a.num_attention_heads;
  const int64_t groups = a.num_query_groups > 0 ? a.num_query_groups : heads;
  if (a.kv_channels <= 0 && h % heads != 0)
    throw UsageError("FLOP count: hidden_size " + std::to_string(h) +
                     " is not divisible by num_attention_heads " + std::to_string(heads) +
                     "; give kv_channels");
  const int64_t kv_channels = a.kv_channels > 0 ? a.kv_channels : h / heads;

  // Dense and MoE MLP layers.
  int64_t num_dense_layers = a.num_layers;
  int64_t num_moe_layers = 0;
  int64_t experts_routed_to = 0;
  int64_t last_layer_is_moe = 0;
  if (a.num_experts > 0) {
    std::vector<int> pattern = a.moe_layer_pattern;
    if (pattern.empty()) {
      if (a.moe_layer_freq <= 0) throw UsageError("FLOP count: moe_layer_freq must be positive");
      for (int64_t i = 0; i < a.num_layers; ++i) pattern.push_back(i % a.moe_layer_freq == 0 ? 1 : 0);
    }
    if (static_cast<int64_t>(pattern.size()) != a.num_layers)
      throw UsageError("FLOP count: moe_layer_pattern has " + std::to_string(pattern.size()) +
                       " entries, expected num_layers = " + std::to_string(a.num_layers));
    num_moe_layers = 0;
    for (int p : pattern) num_moe_layers += p != 0 ? 1 : 0;
    num_dense_layers = a.num_layers - num_moe_layers;
    experts_routed_to = a.moe_router_topk;
    last_layer_is_moe = pattern.back() != 0 ? 1 : 0;
  }
  // MTP layers repeat the last layer's kind and add attention layers.
  const int64_t mtp = a.mtp_num_layers;
  num_moe_layers += last_layer_is_moe * mtp;
  num_dense_layers += (1 - last_layer_is_moe) * mtp;
  const int64_t num_layers = a.num_layers + mtp;

  const int64_t moe_ffn = a.moe_ffn_hidden_size > 0 ? a.moe_ffn_hidden_size : a.ffn_hidden_size;
  const int64_t shared_ffn = a.moe_shared_expert_ffn_hidden_size;

  const int64_t fwd_bwd = 3;  // forward, backward wgrad, backward dgrad
  const int64_t fma = 2;      // a multiply-add is 2 FLOPs
  const int64_t ffn_factor = a.gated_linear_unit ? 3 : 2;

  // Self attention (MHA/GQA), per token per layer.
  const int64_t q = kv_channels * heads;
  const int64_t k = kv_channels * groups;
  const int64_t v = kv_channels * groups;
  const int64_t gate = a.attention_output_gate ? q : 0;
  const double s_attn =
      a.effective_seq_length ? *a.effective_seq_length : static_cast<double>(a.seq_length);
  const double core_attention = static_cast<double>(q) * s_attn / 2 * 2;  // causal half; QK^T and PV
  double standard_self_attn_term =
      static_cast<double>(fwd_bwd * fma) *
      (static_cast<double>(h * (q + k + v + gate)) + core_attention + static_cast<double>(q * h));
  if (a.multi_latent_attention) {  // Megatron's MLA term, its integer part first as Python sums it
    const int64_t qk = a.qk_head_dim + a.qk_pos_emb_head_dim;
    const int64_t q_term = a.q_lora_rank > 0 ? a.q_lora_rank * (h + heads * qk + 1) : h * heads * qk;
    const int64_t linear = q_term + a.kv_lora_rank * (h + heads * (a.qk_head_dim + a.v_head_dim) + 1) +
                           h * a.qk_pos_emb_head_dim + heads * a.v_head_dim * h;
    standard_self_attn_term =
        static_cast<double>(fwd_bwd * fma) * (static_cast<double>(linear) + static_cast<double>(heads * qk) * s_attn / 2 +
                                              static_cast<double>(heads * a.v_head_dim) * s_attn / 2);
  }
  const double self_attn_term = standard_self_attn_term * static_cast<double>(num_layers);

  const int64_t mlp = fwd_bwd * fma * h *
                      (a.ffn_hidden_size * ffn_factor * num_dense_layers +
                       moe_ffn * experts_routed_to * ffn_factor * num_moe_layers +
                       shared_ffn * ffn_factor * num_moe_layers);
  const int64_t mtp_norms_and_proj = fwd_bwd * fma * mtp * (3 * h + 2 * h * h);
  const int64_t logits = fwd_bwd * fma * h * a.padded_vocab_size * (mtp + 1);

  double per_token = static_cast<double>(mlp) + self_attn_term;
  per_token += static_cast<double>(mtp_norms_and_proj);
  per_token += static_cast<double>(logits);
  return static_cast<double>(a.global_batch_size * a.seq_length) * per_token;
}

}  // namespace laoyao::train
