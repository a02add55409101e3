// Model FLOPs per training iteration, as Megatron counts them for "throughput per GPU
// (TFLOP/s/GPU)" and Bridge for "MODEL_TFLOP/s/GPU": megatron/training/training.py::
// num_floating_point_operations (transformer_flops branch) and Bridge's
// training/utils/flop_utils.py::num_floating_point_operations (dense/GQA/MoE path).
//
//   FLOPs = B*s * [ 6*h*( f*g*L_dense + (f_moe*topk*g + f_shared*g)*L_moe )
//                 + 6*( h*(q + 2kv + gate) + q*s_eff/2*2 + q*h ) * L
//                 + 6*h*V_pad ]
// with g = 3 for a gated MLP (SwiGLU) else 2, q = kv_channels*heads, kv = kv_channels*groups, the
// core-attention term halved for the causal mask (the "/2*2"), router FLOPs not counted, and
// s_eff = s unless Bridge's packed-sequence mean (sum s^2 / sum s) is given.
// Multi-latent attention replaces the attention term by Megatron's MLA one (n heads, q/kv latents
// r_q (none: the q projection) and r_kv, per-head dims d_qk, d_rope, d_v):
//   6*( q_term + r_kv*(h + n*(d_qk + d_v) + 1) + h*d_rope + n*d_v*h + n*(d_qk + d_rope)*s_eff/2 + n*d_v*s_eff/2 )
//   q_term = h*n*(d_qk + d_rope), or r_q*(h + n*(d_qk + d_rope) + 1)
// Not covered: linear-attention/hybrid (Mamba) layers, MoE latent projections.
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

namespace laoyao::train {

struct FlopShape {
  int64_t global_batch_size = 0;  // B: samples per iteration (gbs)
  int64_t seq_length = 0;         // s
  int64_t num_layers = 0;         // L
  int64_t hidden_size = 0;        // h
  int64_t ffn_hidden_size = 0;    // f (dense MLP layers)
  int64_t num_attention_heads = 0;
  int64_t num_query_groups = 0;  // 0: no GQA (groups = heads)
  int64_t kv_channels = 0;       // 0: hidden_size / num_attention_heads
  bool gated_linear_unit = false;  // --swiglu: 3 GEMM factors instead of 2
  bool attention_output_gate = false;
  int64_t padded_vocab_size = 0;  // V_pad (after make-vocab-size-divisible-by * TP padding)
  // MoE: num_experts == 0 means every MLP is dense. Otherwise the MoE layers are
  // moe_layer_pattern (1 = MoE, one entry per layer) when given, else every layer i with
  // i % moe_layer_freq == 0 (Megatron's default freq 1: all layers).
  int64_t num_experts = 0;
  int64_t moe_router_topk = 0;
  int64_t moe_ffn_hidden_size = 0;             // 0: ffn_hidden_size
  int64_t moe_shared_expert_ffn_hidden_size = 0;  // --moe-shared-expert-intermediate-size
  int64_t moe_layer_freq = 1;
  std::vector<int> moe_layer_pattern;
  int64_t mtp_num_layers = 0;  // multi-token prediction layers (counted like the last layer)
  std::optional<double> effective_seq_length;  // Bridge packed sequences: sum(s^2)/sum(s)
  // Multi-latent attention (--multi-latent-attention): q_lora_rank 0 is none.
  bool multi_latent_attention = false;
  int64_t q_lora_rank = 0, kv_lora_rank = 0, qk_head_dim = 0, qk_pos_emb_head_dim = 0, v_head_dim = 0;
};

// FLOPs for one iteration of the whole global batch (forward + backward), as a double in the
// same evaluation order as Megatron's Python, so printed throughputs match digit for digit.
// Throws laoyao::UsageError on an inconsistent shape (zero sizes, pattern length != layers).
double num_floating_point_operations(const FlopShape& shape);

}  // namespace laoyao::train
