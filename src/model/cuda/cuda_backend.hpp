// The CUDA backend of the model's ops (model/backend.hpp): bf16 activations, fp32 statistics,
// Megatron's --bf16 numerics, every op enqueued on the rank's stream with nothing waiting for the
// host (so a step can be captured as a CUDA graph). Its fusions are ops the interface offers: the
// residual added by the last linear's GEMM (no dropout), GeLU in fc1's epilogue and its derivative
// in fc2's input-gradient GEMM, the QK norm with RoPE in one pass, cuDNN's fused attention (over
// split QKV rows for GQA with the QK norm), the cross entropy's gradient written by its forward.
//
// It runs on the state of a CudaGptModel (model/cuda/gpt_model_cuda.hpp), which owns the weights,
// the gradients, the cuBLASLt plans, the RoPE table and cuDNN's plans, and tells it when a backward
// writes the GEMM-written gradients instead of adding to them (set_writing_grads). What an op's
// backward needs beyond its arguments (attention's log-sum-exp or probabilities, per layer) and
// its own scratch it keeps here, allocated once for micro-batches of up to max_b sequences.
//
// Tensor parallelism: the collectives over the group's NCCL communicator, bf16 sums; sequence
// parallelism's rows (b runs of s / tp per rank) rearranged around the collectives, which put the
// ranks' blocks one after another; the vocabulary-parallel cross entropy from each shard's
// log-sum-exp and target logit, all-gathered. Expert parallelism lives inside the MoE layers.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dist/process_group.hpp"
#include "kernels/cuda/attention_cudnn.hpp"
#include "kernels/cuda/attention_cudnn_cp.hpp"
#include "kernels/cuda/attention_unfused.hpp"
#include "kernels/cuda/device_buffer.hpp"
#include "kernels/cuda/gemm_cublaslt.hpp"
#include "kernels/cuda/mla.hpp"
#include "kernels/cuda/qkv_rows.hpp"
#include "kernels/cuda/rope.hpp"
#include "model/backend.hpp"
#include "model/cuda/fp8_linears_cuda.hpp"
#include "model/cuda/moe_layers_cuda.hpp"
#include "model/cuda/stream_timeline.hpp"
#include "model/gpt_config.hpp"
#include "model/gpt_layout.hpp"

namespace laoyao::model {

enum class CudaAttentionPath { Cudnn, Flash, Unfused };

// The features of `cfg` this backend cannot train yet ("" when it can all be trained): the one place
// that says what the CUDA backend supports (the trainer refuses the rest before building anything).
std::string cuda_unsupported_features(const GptConfig& cfg);

// Whether the norms' backward kernels can add into the residual stream's gradient: layernorm.hpp's
// accumulate_dx conditions (hidden a multiple of 8 up to 4096, every norm weight and bias 16-byte
// aligned in the bf16 table). RMSNorm needs it; LayerNorm goes through scratch without.
bool norms_add_in_place(const GptConfig& cfg, const GptParameterLayout& layout);

// What the backend runs on, owned by the model.
struct CudaBackendState {
  cudaStream_t stream = nullptr;
  kernels::cuda::CublasLtGemm* gemm = nullptr;
  const __nv_bfloat16* params = nullptr;  // bf16 weights at table offsets
  // fp32 main gradients of the trained parameters: at table offset - trainable_offset (PEFT's frozen
  // base, before trainable_offset, has none).
  float* grads = nullptr;
  int64_t trainable_offset = 0;
  const float* main = nullptr;            // fp32 main weights (an MoE router's expert_bias)
  const GptParameterLayout* layout = nullptr;
  const GradientWriters* writers = nullptr;
  // The MoE layers (null for a dense model), and each layer's stream of random router logits for
  // this micro-batch (device memory, staged with its inputs so a captured step reads the new ones).
  CudaMoeLayers* moe = nullptr;
  const uint64_t* logit_keys = nullptr;
  // The tensor-parallel group over NCCL (null for one rank) and this rank's place in it.
  dist::ProcessGroup* tp = nullptr;
  int64_t tp_rank = 0, tp_size = 1;
  bool sequence_parallel = false;
  kernels::cuda::RopeDeviceTable rope;  // rot_dim 0: no rotary embeddings
  bool rope_in_qk_norm = false;         // the QK norm applies RoPE in its pass
  kernels::cuda::QkvRows qkv_rows = kernels::cuda::QkvRows::Fused;
  CudaAttentionPath attention = CudaAttentionPath::Unfused;
  // With CudaAttentionPath::Cudnn (over QkvRows::Separate for multi-latent attention).
  kernels::cuda::CudnnAttention* cudnn = nullptr;
  // Context parallelism (BatchShape::cp_size > 1): the attention over the whole sequences' keys.
  kernels::cuda::CudnnCpAttention* cudnn_cp = nullptr;
  bool gelu_epilogue = false;  // tanh-GeLU through cuBLASLt's GELU_AUX / DGELU epilogues
  bool norms_add_in_place = false;  // norms_add_in_place() of the model
  // The norms' backward kernels sum the bias gradients the model asks them to (sums_bias_grad_in_norm).
  bool bias_grad_in_norm = false;
};


class CudaBackend final : public Backend {
 public:
  using bf16 = __nv_bfloat16;
  CudaBackend(const GptConfig& local, const CudaBackendState& state, int64_t max_b, int64_t s);

  // The next backward is a step's first: the gradients gradient_writers() names as GEMM-written
  // are written (beta 0), not added to (the model zeroed the rest).
  void set_writing_grads(bool writing) { writing_grads_ = writing; }
  size_t device_bytes() const;
  // LAOYAO_MODEL_PHASES=1: each forward's and backward's GPU time by kind of op (CUDA events after
  // the ops, not in captured graphs), printed on stderr by report_phases (when the step's loss is
  // taken). For finding where a model's time goes (LAOYAO_MOE_PHASES splits the MoE layers further).
  void begin_phases(bool backward);
  void report_phases();

  size_t activation_bytes() const override { return sizeof(bf16); }
  void* reserve_activations(size_t bytes) override;

  void embedding(const int64_t* ids, int64_t table, Act out, int64_t T, int64_t h, tp::Shard vocab,
                 bool accumulate) override;
  void embedding_backward(const int64_t* ids, Act dout, int64_t table, int64_t T, int64_t h, tp::Shard vocab) override;
  void linear(Act x, int64_t w, int64_t b, Act y, int64_t rows, int64_t K, int64_t N) override;
  void linear_backward(Act x, int64_t w, int64_t b, Act dy, Act dx, int64_t rows, int64_t K, int64_t N) override;
  void linear_bias_dropout_add(Act x, int64_t w, int64_t b, Act residual, Act out, int64_t rows, int64_t K, int64_t N,
                               const DropoutSpec& drop) override;
  void bias_dropout_add(Act x, int64_t b, Act residual, Act out, int64_t rows, int64_t N,
                        const DropoutSpec& drop) override;
  void dropout(Act x, Act y, int64_t n, const DropoutSpec& drop) override;
  void norm(Act x, int64_t w, int64_t b, Act y, float* mean, float* rstd, int64_t rows, int64_t width) override;
  void norm_backward(Act dy, Act x, int64_t w, int64_t b, const float* mean, const float* rstd, Act dx, int64_t rows,
                     int64_t width, bool accumulate, int64_t dx_bias) override;
  void copy_columns(Act src, int64_t src_ld, Act dst, int64_t dst_ld, int64_t rows, int64_t cols) override;
  bool sums_bias_grad_in_norm() const override { return st_.bias_grad_in_norm; }
  void mlp_fc1(Act x, int64_t fc1_w, int64_t fc1_b, Act u, Act g, int64_t rows, int64_t ffn) override;
  void mlp_fc2_backward(Act dy, Act g, Act u, int64_t fc2_w, int64_t fc2_b, Act du, int64_t rows,
                        int64_t ffn) override;
  void mlp_activation(Act u, Act g, int64_t rows, int64_t ffn) override;
  void mlp_activation_backward(Act dg, Act u, Act du, int64_t rows, int64_t ffn) override;
  // (a is kept scaled: a = scale * x @ A^T.)
  void lora_forward(Act x, int64_t lora_a, int64_t lora_b, float scale, Act a, Act y, int64_t rows, int64_t K,
                    int64_t r, int64_t N) override;
  void lora_backward(Act x, int64_t lora_a, int64_t lora_b, float scale, Act a, Act dy, Act da, Act dx, int64_t rows,
                     int64_t K, int64_t r, int64_t N, bool accumulate) override;
  void qkv_prepare(Act qkv, int64_t q_norm, int64_t k_norm, Act qkv_attn, float* qk_rstd,
                   const BatchShape& batch) override;
  void qkv_prepare_backward(Act dqkv, Act qkv, int64_t q_norm, int64_t k_norm, const float* qk_rstd,
                            const BatchShape& batch) override;
  void core_attention(int64_t layer, Act qkv_attn, Act ctx, const BatchShape& batch, const DropoutSpec& drop) override;
  void core_attention_backward(int64_t layer, Act qkv_attn, Act dctx, Act dqkv, const BatchShape& batch,
                               const DropoutSpec& drop) override;
  // Multi-latent attention: kernels/cuda/mla.hpp, then cuDNN over separate q, k, v (st_.cudnn).
  void mla_prepare(Act q, Act kv, Act k_pe, int64_t k_pe_ld, Act query, Act key, Act value,
                   const BatchShape& batch) override;
  void mla_prepare_backward(Act dquery, Act dkey, Act dvalue, Act dq, Act dkv, Act dk_pe, int64_t dk_pe_ld,
                            const BatchShape& batch) override;
  void separate_core_attention(int64_t layer, Act q, Act k, Act v, Act ctx, int64_t dqk, int64_t dv, float scale,
                               const BatchShape& batch, const DropoutSpec& drop) override;
  void separate_core_attention_backward(int64_t layer, Act q, Act k, Act v, Act dctx, Act dquery, Act dkey,
                                        Act dvalue, int64_t dqk, int64_t dv, float scale, const BatchShape& batch,
                                        const DropoutSpec& drop) override;
  void moe_layer(int64_t layer, Act x, Act y, const BatchShape& batch, MoePass pass, uint64_t random_logits_key,
                 Act residual) override;
  void moe_layer_backward(int64_t layer, Act x, Act dy, Act dx, const BatchShape& batch,
                          float aux_loss_scale) override;
  void cross_entropy(Act logits, const int64_t* labels, float* losses, float* stats, int64_t T, tp::Shard vocab,
                     const float* dloss) override;
  void cross_entropy_backward(Act logits, const int64_t* labels, const float* stats, const float* dloss, int64_t T,
                              tp::Shard vocab) override;
  void tp_all_reduce(Act x, int64_t n) override;
  void sp_gather(Act local, Act full, const BatchShape& batch, int64_t h) override;
  void sp_reduce_scatter(Act full, Act local, const BatchShape& batch, int64_t h) override;
  void sp_slice(Act full, Act local, const BatchShape& batch, int64_t h) override;
  void fp8_layer(int64_t layer, Fp8Pass pass) override;
  void fp8_pass_done(Fp8Pass pass) override;
  void fp8_new_weights() override;
  // The FP8 linear layers' state (null without GptConfig::fp8).
  const CudaFp8Linears* fp8_linears() const { return fp8_.get(); }
  // FP8 delayed scaling's amax reduction group (CudaFp8Linears::set_amax_group).
  void set_fp8_amax_group(dist::ProcessGroup* group) {
    if (fp8_) fp8_->set_amax_group(group);
  }

 private:
  enum Phase { kEmbedding, kNorms, kAttentionGemms, kQkNormRope, kAttention, kMlpGemms, kActivations, kMoe, kHead,
               kResidual, kCommunication, kLora, kPhaseKinds };
  void phase(Phase p);
  Phase gemm_phase(int64_t w) const;  // which kind a linear layer's GEMMs count to
  const bf16* P(int64_t off) const { return off >= 0 ? st_.params + off : nullptr; }
  float* G(int64_t off) const {
    return off >= 0 && off >= st_.trainable_offset ? st_.grads + (off - st_.trainable_offset) : nullptr;
  }
  static bf16* B(Act a) { return static_cast<bf16*>(a.p); }
  // The accumulate flag of parameter w's weight-gradient GEMM in the backward being enqueued.
  bool accumulates(int64_t w) const;
  kernels::cuda::AttentionShape attention_shape(const BatchShape& batch) const;
  // Where attention's backward leaves d(qkv_attn): dqkv, or with split rows the split scratch the
  // QK norm's backward reads.
  bf16* attention_grad(Act dqkv) const;
  // The context-parallel attention for a micro-batch split over batch.cp_size ranks (throws when
  // the model was built without it, or for another split).
  kernels::cuda::CudnnCpAttention& cp_attention(const BatchShape& batch) const;
  CudaMoeLayers::Context moe_context(int64_t layer) const;
  kernels::cuda::MlaDims mla_dims(const BatchShape& batch) const;
  // That the separate attention asked for is the one cuDNN's plans were built for.
  void check_separate_attention(int64_t dqk, int64_t dv, float scale, const DropoutSpec& drop) const;

  const GptConfig& lc_;
  CudaBackendState st_;
  bool writing_grads_ = false;
  kernels::cuda::DeviceBuffer arena_, scratch_;
  // Carved from scratch_: a branch before its dropout-add [T, h] (hidden dropout, or an FP8 GEMM's output), a norm's input gradient before
  // it is added [T, h], the positions' embedding [T, h], fc2's input gradient [T, ffn], split rows'
  // attention gradient [T, qkv], reductions' partial sums, the embedding gradient's sort, the
  // flash backward's row sums and the unfused path's per-call scratch; under TP the sequence-parallel
  // staging [T, h] and every rank's cross-entropy statistics [tp, 2T].
  bf16 *branch_ = nullptr, *dtmp_ = nullptr, *pos_ = nullptr, *dg_ = nullptr, *dsplit_ = nullptr;
  bf16* sp_staging_ = nullptr;
  float* ce_gathered_ = nullptr;
  const bf16* zero_bias_ = nullptr;  // [ffn] zeros: the bias-GeLU kernels after a GEMM that added it
  float* reduce_scratch_ = nullptr;
  void* emb_scratch_ = nullptr;
  size_t emb_scratch_bytes_ = 0;
  float* delta_ = nullptr;
  kernels::cuda::UnfusedAttentionScratch unfused_scratch_;
  // Per layer: the log-sum-exp [b, H, s] (cuDNN, flash) or the unfused path's saved tensors, and
  // the context its forward wrote (cuDNN's and flash's backward read it).
  std::vector<float*> lse_;
  std::vector<kernels::cuda::UnfusedAttentionBuffers> unfused_;
  std::vector<const bf16*> ctx_;
  StreamTimeline phases_;
  std::unique_ptr<CudaFp8Linears> fp8_;  // GptConfig::fp8's linear layers
  bool backward_ = false;  // the ops being enqueued are a backward's (recomputed forwards included)
};

}  // namespace laoyao::model
