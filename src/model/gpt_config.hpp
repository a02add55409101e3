// The shape and math of a GPT model, as the model layer needs it (the training layer maps the
// ConfigContainer's model section to this; the model knows no config files).
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "core/fp8_scaling.hpp"
#include "kernels/cpu/yarn.hpp"

namespace laoyao::model {

enum class Norm { LayerNorm, RMSNorm };
enum class Activation { GeluTanh, GeluErf, SwiGLU };
enum class Positions { LearnedAbsolute, Rope, None };
// Megatron's --attention-backend: auto, flash, fused, unfused, local. On the CUDA backend fused
// selects cuDNN's fused attention (Megatron's "fused" is Transformer Engine's, which is cuDNN's),
// flash our FlashAttention-2-style kernels, unfused and local the unfused (s x s) path, and auto
// cuDNN where the model has no attention dropout (cuDNN draws its own masks, ours match the CPU's),
// else our flash kernels where they take the head dim, else unfused. The CPU backend has one
// attention.
enum class AttentionBackend { Auto, Fused, Flash, Unfused };
// Megatron's full activation recomputation (--recompute-granularity full): Uniform keeps only the
// input of each chunk of recompute_num_layers consecutive layers and re-runs the chunk's forward
// in the backward; Block does so for each of the first recompute_num_layers layers alone and keeps
// every activation of the others. The numbers do not change, only memory (CUDA backend; the CPU
// backend keeps every activation).
enum class Recompute { None, Uniform, Block };

// Mixture of Experts (megatron-lm.md §9): Megatron-Core's MoELayer in place of the MLP of the layers
// `layers` marks: dropless top-k routing over num_experts experts of width ffn (the activation of
// the dense MLP: SwiGLU or GeLU, no biases), an optional shared expert, the load-balancing and z
// losses (each on when its coefficient is > 0).
// Bridge's LoRA (peft.scheme lora, megatron-bridge.md §4.5): on each targeted linear layer,
// y = base(x) + (alpha / dim) * linear_out(linear_in(dropout(x))), linear_in (A) [dim, in] and
// linear_out (B) [out, dim], the base model frozen.
enum class LoraInit { Xavier, Normal, Kaiming, Zero };
struct LoraSpec {
  int64_t dim = 32;
  double alpha = 32;
  double dropout = 0.0;  // on the adapter's input (dropout_position pre)
  bool qkv = true, proj = true, fc1 = true, fc2 = true;  // target_modules
  LoraInit a_init = LoraInit::Xavier, b_init = LoraInit::Zero;
  float scale() const { return static_cast<float>(alpha / static_cast<double>(dim)); }
};

// Megatron-Core's multi-latent attention (MLASelfAttention, DeepSeek-V2/V3) in place of the fused
// QKV attention: q from linear_q_proj, or through a latent (linear_q_down_proj to q_lora_rank, its
// q_layernorm, linear_q_up_proj); k and v from one latent (linear_kv_down_proj to kv_lora_rank plus
// the qk_pos_emb_head_dim columns of the shared RoPE key, kv_layernorm, linear_kv_up_proj); per head
// a q/k dim of qk_head_dim + qk_pos_emb_head_dim (RoPE on the latter only, interleaved) and a v dim
// of v_head_dim. The model's kv_channels is v_head_dim (linear_proj's input is heads x v_head_dim);
// the RoPE table is built for qk_pos_emb_head_dim.
struct MlaSpec {
  int64_t q_lora_rank = 0;  // 0: no query compression (linear_q_proj)
  int64_t kv_lora_rank = 512, qk_head_dim = 128, qk_pos_emb_head_dim = 64, v_head_dim = 128;
  bool latent_norms = true;  // qk_layernorm: q_layernorm and kv_layernorm (the model's norm)
  // The softmax scale: mscale^2 / sqrt(qk_head_dim + qk_pos_emb_head_dim), mscale = YaRN's
  // get_mscale(rotary_scaling_factor, mscale_all_dim) (1 without scaling).
  double softmax_scale = 0;
  int64_t q_head_dim() const { return qk_head_dim + qk_pos_emb_head_dim; }
};

struct MoeConfig {
  int64_t num_experts = 0;   // 0: a dense model
  std::vector<bool> layers;  // [num_layers]: layer l is an MoE layer (--moe-layer-freq)
  int64_t ffn = 0;           // --moe-ffn-hidden-size
  int64_t topk = 2;
  bool sigmoid = false;      // --moe-router-score-function sigmoid or sqrtsoftplus (else softmax)
  bool sqrt_softplus = false;  // sqrtsoftplus: the sigmoid's routing on sqrt(softplus(logit)) scores
  bool pre_softmax = false;
  std::optional<double> topk_scaling_factor;
  double aux_loss_coeff = 0;      // --moe-router-load-balancing-type aux_loss
  double seq_aux_loss_coeff = 0;  // ... seq_aux_loss
  double global_aux_loss_coeff = 0;  // ... global_aux_loss (CPU backend; counts over the data-parallel ranks)
  double z_loss_coeff = 0;
  int64_t shared_ffn = 0;  // --moe-shared-expert-intermediate-size (0: none)
  // --moe-router-enable-expert-bias (aux-loss-free balancing, sigmoid router): a per-expert bias
  // that only chooses the experts, moved by --moe-router-bias-update-rate after every step.
  bool expert_bias = false;
  double bias_update_rate = 1e-3;
  // --moe-router-force-load-balancing (for benchmarks, as Megatron's): the router's logits are
  // replaced by standard normal values (core/counter_normal.hpp, stream
  // "decoder.layers.L.mlp.router.random_logits.<call>"), so the routing is balanced in expectation;
  // the gradient passes to the real logits unchanged (Megatron's straight-through RandomSTE).
  bool force_load_balancing = false;
  // --moe-router-dtype unset with --bf16: the router's logits at bf16 precision (Megatron's bf16
  // router linear); fp32 or fp64 keep them fp32.
  bool router_bf16 = false;
  // --moe-expert-capacity-factor (none: dropless) and --moe-token-drop-policy (kernels/cpu/moe.hpp's
  // moe_capacity_mask); --moe-pad-expert-input-to-capacity changes no value, so it is not kept.
  std::optional<double> capacity_factor;
  bool drop_by_position = false;
  // --moe-router-num-groups / --moe-router-group-topk: group-limited routing (0: off).
  int64_t num_groups = 0, group_topk = 0;
  // --expert-model-parallel-size: each rank of an expert-parallel group holds num_experts /
  // expert_parallel of every MoE layer's routed experts (model/gpt_ep.hpp); 1: all of them.
  int64_t expert_parallel = 1;
  // --moe-token-dispatcher-type: allgather (Megatron's default) or alltoall (flex: alltoall). The
  // same values either way; under expert parallelism on GPUs it picks how the tokens travel
  // (model/cuda/moe_layers_cuda.hpp).
  bool allgather_dispatcher = true;
  // --tensor-model-parallel-size for an MoE model: each expert is split over these ranks (expert
  // tensor parallelism = tensor parallelism, model/gpt_tp.hpp's check_moe_tensor_parallel); 1: whole.
  int64_t tensor_parallel = 1;
  // --expert-tensor-parallel-size for an MoE model under tensor parallelism: 0 (or the TP size)
  // splits every routed expert over the TP ranks as above; 1 keeps each routed expert whole, the
  // experts shared out over an expert-parallel group folded across the TP ranks (Megatron-Core's
  // "parallel folding", model/moe_share_stage.hpp). Shared experts follow TP either way.
  int64_t expert_tensor_parallel = 0;
  bool experts_split_by_tp() const { return expert_tensor_parallel != 1; }
  int64_t local_experts() const { return expert_parallel > 1 ? num_experts / expert_parallel : num_experts; }
};

// FP8 linear layers (--fp8-format; docs/reference/fp8-facts.md), as Transformer Engine's Linear runs
// them under Megatron's recipes: inside the transformer layers every linear layer's GEMMs take FP8
// operands scaled per tensor (the input and the weight in E4M3; the output gradient in E5M2 under
// hybrid, E4M3 under e4m3), accumulate in fp32 and write the usual precision; the weight's FP8 copy
// is made on a step's first micro-batch. Scales: delayed (each tensor's amax history, updated after
// every forward and every backward of a training micro-batch) or tensorwise (each cast's own amax).
// The embeddings, the output layer, norms, attention, activations and the router stay as they are.
struct Fp8Spec {
  Fp8Formats formats = Fp8Formats::Hybrid;
  Fp8ScalingRecipe recipe = Fp8ScalingRecipe::Delayed;
  int margin = 0;                // --fp8-margin (delayed)
  int64_t amax_history_len = 1;  // --fp8-amax-history-len (delayed)
  AmaxComputeAlgo amax_compute_algo = AmaxComputeAlgo::MostRecent;
  // --first-last-layers-bf16: the first and last layers this many keep high-precision GEMMs.
  int64_t bf16_layers_at_start = 0, bf16_layers_at_end = 0;
  // Whether layer `layer` runs its linear layers in FP8: a decoder layer of `num_layers` outside
  // --first-last-layers-bf16's, and a multi-token prediction layer (layer >= num_layers) always, with
  // its eh_proj: Megatron runs the MTP block under its global FP8 context, whatever the first and
  // last layers do. Layer -1 (Backend::fp8_layer's "none": the output layer) never.
  bool layer_in_fp8(int64_t layer, int64_t num_layers) const {
    if (layer < 0) return false;
    return layer >= num_layers || (layer >= bf16_layers_at_start && layer < num_layers - bf16_layers_at_end);
  }
};

struct GptConfig {
  int64_t num_layers = 0;
  int64_t hidden = 0;
  int64_t heads = 0;
  int64_t query_groups = 0;  // = heads without GQA
  int64_t kv_channels = 0;   // head dim
  int64_t ffn = 0;           // MLP width (per half with SwiGLU)
  int64_t vocab = 0;         // padded vocabulary: rows of the word embedding and output layer
  int64_t max_positions = 0; // rows of the learned position table
  bool tied_embeddings = true;
  bool add_bias_linear = true;  // linear_proj, linear_fc1, linear_fc2
  bool add_qkv_bias = true;
  Norm norm = Norm::LayerNorm;
  float norm_eps = 1e-5f;
  bool zero_centered_gamma = false;
  Activation activation = Activation::GeluTanh;
  Positions positions = Positions::LearnedAbsolute;
  // Rotary embeddings (Positions::Rope), as Megatron-Core's RotaryEmbedding.
  double rotary_base = 10000;
  double rotary_percent = 1.0;
  bool rope_scaling = false;  // Llama 3.x frequency scaling
  double rope_scaling_factor = 8.0;
  std::optional<double> seq_len_interpolation_factor;
  // YaRN's frequencies and scale instead (--position-embedding-type yarn), as YarnRotaryEmbedding.
  std::optional<kernels::cpu::YarnParams> yarn;
  bool qk_layernorm = false;  // RMSNorm over each head's q and k (Qwen3), before RoPE
  // Weight decay on the q/k layernorm weights (--apply-wd-to-qk-layernorm; an optimizer setting
  // that lives here because the parameter table carries each parameter's weight-decay flag).
  bool apply_wd_to_qk_layernorm = false;
  // No weight decay on the embeddings (names with "embedding": the word and position tables), as
  // Megatron does when an embedding init std is given (default_skip_embedding_weight_decay,
  // arXiv 2312.16903: embeddings would shrink towards zero).
  bool skip_embedding_weight_decay = false;
  double init_std = 0.02;
  double embedding_init_std = 0.02;
  double hidden_dropout = 0.0;
  double attention_dropout = 0.0;
  AttentionBackend attention_backend = AttentionBackend::Auto;
  // Attention within documents: every micro-batch carries key_start (--reset-attention-mask where
  // Megatron's attention applies the dataloader's mask: train::document_mask).
  bool document_attention = false;
  // With tensor parallelism: Megatron's sequence parallelism (norms, dropout and residuals on each
  // rank's share of the sequence; all-gather / reduce-scatter around the parallel layers).
  bool sequence_parallel = false;
  Recompute recompute = Recompute::None;
  int64_t recompute_num_layers = 0;
  // Precision: --bf16 (Megatron's default without it is fp32 throughout) and
  // --fp32-residual-connection. The CPU backend computes in fp32 either way; the CUDA backend
  // trains bf16 with a bf16 residual stream only.
  bool bf16 = true;
  bool fp32_residual_connection = false;

  MoeConfig moe;
  std::optional<MlaSpec> mla;    // multi-latent attention in every layer (else the fused QKV one)
  // Megatron-Core's multi-token prediction (--mtp-num-layers): after the decoder, layers that each
  // predict one token further (model/mcore/gpt_model.hpp's MultiTokenPredictionBlock), their
  // transformer layers numbered num_layers .. layer_count() - 1 and of the last decoder layer's
  // kind (dense or MoE); their losses weighted mtp_loss_scaling_factor / mtp_num_layers.
  int64_t mtp_num_layers = 0;
  double mtp_loss_scaling_factor = 0.1;
  // --context-parallel-size: each rank holds 2 of every sequence's 2 x context_parallel chunks
  // (model/backend.hpp's BatchShape; the CPU backend's attention gathers the rest).
  int64_t context_parallel = 1;
  // --cp-comm-type p2p (Megatron's default: the ring, each step's keys and values arriving while the
  // step before runs) or all_gather (one exchange); the same values either way.
  bool cp_ring = true;
  std::optional<LoraSpec> lora;  // PEFT: the base frozen, adapters trained
  std::optional<Fp8Spec> fp8;    // FP8 linear layers (else every GEMM in the model's precision)

  int64_t qkv_width() const { return (heads + 2 * query_groups) * kv_channels; }
  int64_t fc1_width() const { return activation == Activation::SwiGLU ? 2 * ffn : ffn; }
  // The rows of an MLP's linear_fc1 of width f (SwiGLU: the gate and up halves).
  int64_t fc1_rows(int64_t f) const { return activation == Activation::SwiGLU ? 2 * f : f; }
  // Every transformer layer: the decoder's, then the multi-token prediction layers'.
  int64_t layer_count() const { return num_layers + mtp_num_layers; }
  bool is_moe_layer(int64_t l) const {
    if (l >= num_layers && l < layer_count()) l = num_layers - 1;  // (an MTP layer: the last layer's kind)
    return moe.num_experts > 0 && l >= 0 && l < static_cast<int64_t>(moe.layers.size()) && moe.layers[l];
  }
};

}  // namespace laoyao::model
