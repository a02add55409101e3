// The ops a backend offers the model (model/mcore): the one module tree of Megatron-Core's GPT is
// written once over this interface, and each backend supplies the ops (CPU: the fp32 reference ops
// of kernels/cpu; a fused op is one the backend offers whole, not a branch in the model).
//
// Conventions. Activations are row-major [rows, C] buffers of the backend's activation type (Act;
// fp32 on the CPU), statistics (norm mean/rstd, losses) fp32. A parameter is named by its offset in
// the model's flat table (model/gpt_layout.hpp; -1: the model has none); the backend reads its
// weight and accumulates (+=) its gradient, if it has one (a frozen parameter has none: PEFT's
// base model, ParameterTable::trainable_offset). Input gradients are overwritten. Ops run in order on
// the backend's stream; none waits for the host.
//
// Parallelism: ops whose math spans a tensor-parallel group (the vocabulary-parallel cross entropy)
// communicate inside; the modules call the collectives below where Megatron-Core's layers do.
#pragma once
#include <cstdint>

#include "core/dropout_spec.hpp"
#include "model/tensor_parallel.hpp"

namespace laoyao::model {

// What an MoE layer's forward is: a training one (its losses count in the step's sums), its
// recomputation before the backward (the same losses' gradients, nothing counted again), or an
// evaluation (no global_aux_loss: Megatron applies it in training only).
enum class MoePass { Training, Recompute, Evaluation };

// Which pass over the transformer block the ops belong to (FP8's scaling: Backend::fp8_layer): a
// training micro-batch's forward, an evaluation's, a layer's forward run again before its backward
// (full recomputation), or the backward.
enum class Fp8Pass { TrainingForward, EvaluationForward, Recompute, Backward };

// An activation buffer (or a position in one) in the backend's memory and type.
struct Act {
  void* p = nullptr;
};

// Context parallelism's split of a sequence of 2 cp_size chunks (Megatron's
// get_batch_on_this_cp_rank): the place in its sequence of rank cp_rank's i-th token of it, s
// tokens a rank (chunks cp_rank and 2 cp_size - 1 - cp_rank).
inline int64_t cp_place(int64_t i, int64_t s, int64_t cp_rank, int64_t cp_size) {
  const int64_t c = s / 2;
  return (i < c ? cp_rank : 2 * cp_size - 1 - cp_rank) * c + i % c;
}

// The micro-batch the ops of a forward or backward work on: b sequences of s tokens (T = b * s,
// batch-major), rows of them on this rank outside the tensor-parallel regions (T, or T / tp under
// sequence parallelism), and the documents of a packed sequence (key_start: backend memory, null
// for plain causal attention).
struct BatchShape {
  int64_t b = 0, s = 0, T = 0, rows = 0;
  const int32_t* key_start = nullptr;
  // Context parallelism: this rank holds chunks cp_rank and 2 cp_size - 1 - cp_rank of each
  // sequence's 2 cp_size (s: their tokens, s * cp_size the sequence's); attention meets the whole
  // sequence's keys, RoPE takes the tokens' places in it. With packed documents the chunks are
  // each document's, and cp_places (host memory, [T]) holds every token's place (key_start's
  // entries then places too); null: the two chunks of the sequence.
  int64_t cp_rank = 0, cp_size = 1;
  const int32_t* cp_places = nullptr;
  // key_start's documents as a list (backend memory, for attention that takes them so: the CUDA
  // backend's cuDNN path, kernels/cuda/attention_cudnn.hpp): `documents` entries (a bucket, 0:
  // none), doc_start [documents + 1] their first tokens of the T, doc_length [documents].
  int64_t documents = 0;
  const int64_t* doc_start = nullptr;
  const int32_t* doc_length = nullptr;
  // Token t's place in its whole sequence.
  int64_t cp_place(int64_t t) const {
    if (cp_places) return cp_places[t];
    return cp_size <= 1 ? t % s : model::cp_place(t % s, s, cp_rank, cp_size);
  }
};

class Backend {
 public:
  virtual ~Backend() = default;

  // ---- memory: the activations live in one arena of this many bytes (contents undefined),
  // handed out by ActivationCarver below; an element of an activation is activation_bytes().
  virtual size_t activation_bytes() const = 0;
  virtual void* reserve_activations(size_t bytes) = 0;

  // ---- embeddings: out[T, h] = table rows of ids (vocab: this rank's rows of the table; ids
  // outside it give zeros); accumulate adds instead (the learned positions onto the words).
  virtual void embedding(const int64_t* ids, int64_t table, Act out, int64_t T, int64_t h, tp::Shard vocab,
                         bool accumulate) = 0;
  virtual void embedding_backward(const int64_t* ids, Act dout, int64_t table, int64_t T, int64_t h,
                                  tp::Shard vocab) = 0;

  // ---- linear layers: y[rows, N] = x[rows, K] @ w[N, K]^T (+ b).
  virtual void linear(Act x, int64_t w, int64_t b, Act y, int64_t rows, int64_t K, int64_t N) = 0;
  // dx = dy @ w (dx.p null: skipped), dw += dy^T x, db += column sums of dy.
  virtual void linear_backward(Act x, int64_t w, int64_t b, Act dy, Act dx, int64_t rows, int64_t K, int64_t N) = 0;
  // out = residual + dropout(x @ w^T + b): a layer's last linear and its bias-dropout-add.
  virtual void linear_bias_dropout_add(Act x, int64_t w, int64_t b, Act residual, Act out, int64_t rows, int64_t K,
                                       int64_t N, const DropoutSpec& drop) = 0;
  // out = residual + dropout(x + b) (out may be x or residual): the bias-dropout-add after a
  // reduction.
  virtual void bias_dropout_add(Act x, int64_t b, Act residual, Act out, int64_t rows, int64_t N,
                                const DropoutSpec& drop) = 0;
  // y = x * mask (y may be x): a dropout's forward or backward alone.
  virtual void dropout(Act x, Act y, int64_t n, const DropoutSpec& drop) = 0;

  // ---- the configured norm (LayerNorm with bias, or RMSNorm) over rows of `width` values (the
  // hidden size, or a latent's: multi-latent attention's q and kv norms); mean/rstd [rows] saved.
  // The backward overwrites dx, or adds to it (accumulate: the residual stream's gradient).
  // dx_bias >= 0 (only where sums_bias_grad_in_norm()): that bias's gradient += the column sums of
  // the dx it leaves (a linear layer's bias whose output gradient is the residual stream's).
  virtual void norm(Act x, int64_t w, int64_t b, Act y, float* mean, float* rstd, int64_t rows, int64_t width) = 0;
  virtual void norm_backward(Act dy, Act x, int64_t w, int64_t b, const float* mean, const float* rstd, Act dx,
                             int64_t rows, int64_t width, bool accumulate, int64_t dx_bias) = 0;
  virtual bool sums_bias_grad_in_norm() const = 0;

  // dst[r, 0:cols] = src[r, 0:cols], rows of src_ld and dst_ld elements: a column slice moved.
  virtual void copy_columns(Act src, int64_t src_ld, Act dst, int64_t dst_ld, int64_t rows, int64_t cols) = 0;

  // ---- the MLP's fc1 and its activation (GeLU or SwiGLU): u = x @ fc1^T + b (kept for the
  // backward), g = act(u); and back through fc2 and the activation: dfc2 += dy^T g (+ bias), du =
  // act'(u) * (dy @ fc2).
  virtual void mlp_fc1(Act x, int64_t fc1_w, int64_t fc1_b, Act u, Act g, int64_t rows, int64_t ffn) = 0;
  virtual void mlp_fc2_backward(Act dy, Act g, Act u, int64_t fc2_w, int64_t fc2_b, Act du, int64_t rows,
                                int64_t ffn) = 0;

  // The activation alone, g = act(u), and its backward du = act'(u) * dg: for an MLP whose fc1
  // output or fc2 input gradient a LoRA adapter adds to between the GEMM and the activation.
  virtual void mlp_activation(Act u, Act g, int64_t rows, int64_t ffn) = 0;
  virtual void mlp_activation_backward(Act dg, Act u, Act du, int64_t rows, int64_t ffn) = 0;

  // ---- a LoRA adapter (PEFT) beside a linear layer: a = x[rows, K] @ A[r, K]^T (kept for the
  // backward), y[rows, N] += scale * a @ B[N, r]^T.
  virtual void lora_forward(Act x, int64_t lora_a, int64_t lora_b, float scale, Act a, Act y, int64_t rows, int64_t K,
                            int64_t r, int64_t N) = 0;
  // da = scale * dy @ B (scratch [rows, r]); dB += scale * dy^T a; dA += da^T x; then dx = da @ A,
  // or dx += it (accumulate: the base linear's input gradient is there). dx may be x.
  virtual void lora_backward(Act x, int64_t lora_a, int64_t lora_b, float scale, Act a, Act dy, Act da, Act dx,
                             int64_t rows, int64_t K, int64_t r, int64_t N, bool accumulate) = 0;

  // ---- attention on Megatron-Core's fused QKV rows (kernels/cpu/ops.hpp's layout).
  // q and k made ready for attention: the QK layernorm (q_norm, k_norm >= 0) into qkv_attn (rstd
  // saved), then RoPE (if the model has it) on qkv_attn; without the norm qkv_attn is qkv.
  virtual void qkv_prepare(Act qkv, int64_t q_norm, int64_t k_norm, Act qkv_attn, float* qk_rstd,
                           const BatchShape& batch) = 0;
  // In place on dqkv: the gradient at qkv_attn becomes the gradient at qkv.
  virtual void qkv_prepare_backward(Act dqkv, Act qkv, int64_t q_norm, int64_t k_norm, const float* qk_rstd,
                                    const BatchShape& batch) = 0;
  // Causal (or per-document) softmax attention of layer `layer`; what its backward needs the
  // backend keeps per layer.
  virtual void core_attention(int64_t layer, Act qkv_attn, Act ctx, const BatchShape& batch,
                              const DropoutSpec& drop) = 0;
  virtual void core_attention_backward(int64_t layer, Act qkv_attn, Act dctx, Act dqkv, const BatchShape& batch,
                                       const DropoutSpec& drop) = 0;

  // ---- multi-latent attention (GptConfig::mla; kernels/cpu/ops.hpp's mla_qkv_forward): the
  // query, key and value of this rank's heads from the up projections' q [T, heads*(dqk+dr)] and kv
  // [T, heads*(dqk+dv)] and the shared RoPE key k_pe (rows of k_pe_ld elements), RoPE'd at the
  // batch's positions with the model's table for dr dims.
  virtual void mla_prepare(Act q, Act kv, Act k_pe, int64_t k_pe_ld, Act query, Act key, Act value,
                           const BatchShape& batch) = 0;
  // Overwrites dq, dkv and dk_pe's dr columns (the heads' sum).
  virtual void mla_prepare_backward(Act dquery, Act dkey, Act dvalue, Act dq, Act dkv, Act dk_pe, int64_t dk_pe_ld,
                                    const BatchShape& batch) = 0;
  // Causal (or per-document) attention of layer `layer` on separate query, key [T, heads*dqk] and
  // value [T, heads*dv] into ctx [T, heads*dv], softmax scale `scale`; the backward overwrites
  // dquery, dkey, dvalue.
  virtual void separate_core_attention(int64_t layer, Act q, Act k, Act v, Act ctx, int64_t dqk, int64_t dv,
                                       float scale, const BatchShape& batch, const DropoutSpec& drop) = 0;
  virtual void separate_core_attention_backward(int64_t layer, Act q, Act k, Act v, Act dctx, Act dquery, Act dkey,
                                                Act dvalue, int64_t dqk, int64_t dv, float scale,
                                                const BatchShape& batch, const DropoutSpec& drop) = 0;

  // ---- Mixture of Experts: layer `layer`'s MoELayer (router, dispatcher, experts, shared experts)
  // on x[T, h] into y[T, h] (this rank's share of every expert's output under tensor parallelism),
  // plus residual where given (one rank, no dropout: the residual add in the combine).
  // random_logits_key: the stream of --moe-router-force-load-balancing's logits.
  virtual void moe_layer(int64_t layer, Act x, Act y, const BatchShape& batch, MoePass pass,
                         uint64_t random_logits_key, Act residual) = 0;
  // dx = the gradient at x; aux_loss_scale: what each load-balancing and z loss's gradient is scaled by.
  virtual void moe_layer_backward(int64_t layer, Act x, Act dy, Act dx, const BatchShape& batch,
                                  float aux_loss_scale) = 0;

  // ---- the output: per-token cross entropy of logits [T, vocab.size] (this rank's vocabulary
  // rows; the whole vocabulary's loss, communicating over the tensor-parallel group), stats [2T]
  // saved; the backward overwrites the logits with their gradient (dloss[T]: each loss's weight).
  // Given dloss already (a training micro-batch's weights are known before its forward), the
  // forward writes the gradient too, and the backward is not called.
  virtual void cross_entropy(Act logits, const int64_t* labels, float* losses, float* stats, int64_t T,
                             tp::Shard vocab, const float* dloss) = 0;
  virtual void cross_entropy_backward(Act logits, const int64_t* labels, const float* stats, const float* dloss,
                                      int64_t T, tp::Shard vocab) = 0;

  // ---- collectives over the tensor-parallel group on [T, h] activations: the sum in place;
  // sequence parallelism's all-gather of every rank's rows into the whole sequence (batch-major:
  // each rank's rows are b runs of s / tp), the reduce-scatter of every rank's whole partial sums
  // into this rank's rows (full clobbered), and this rank's rows of a whole buffer.
  virtual void tp_all_reduce(Act x, int64_t n) = 0;
  virtual void sp_gather(Act local, Act full, const BatchShape& batch, int64_t h) = 0;
  virtual void sp_reduce_scatter(Act full, Act local, const BatchShape& batch, int64_t h) = 0;
  virtual void sp_slice(Act full, Act local, const BatchShape& batch, int64_t h) = 0;

  // ---- FP8 linear layers (GptConfig::fp8), as Transformer Engine's fp8_autocast around the
  // transformer block: the model says which decoder layer the ops that follow belong to (-1: none,
  // as the output layer) and in which pass; a backend runs that layer's linear layers in FP8 where
  // the config asks. Casts record their amaxes except in a recomputation, which casts with the
  // scales of the forward it repeats.
  virtual void fp8_layer(int64_t /*layer*/, Fp8Pass /*pass*/) {}
  // The end of a micro-batch's pass over its transformer layers (the decoder's, then the MTP
  // block's, as Megatron runs both under FP8): after a training forward and after a backward
  // delayed scaling's recorded amaxes update the scales (an evaluation's stay recorded until the
  // next update, as Transformer Engine's do under no_grad).
  virtual void fp8_pass_done(Fp8Pass /*pass*/) {}
  // The weights' FP8 copies are made again at their next use: the first micro-batch of a step or of
  // an evaluation's iteration (Megatron's is_first_microbatch).
  virtual void fp8_new_weights() {}
};

// Carves the activation arena: run the same take() calls once to measure (base null), reserve,
// then again over the arena to hand out the buffers (256-byte aligned).
class ActivationCarver {
 public:
  explicit ActivationCarver(size_t act_bytes, char* base = nullptr) : act_bytes_(act_bytes), base_(base) {}
  Act act(int64_t count) { return Act{take(count, act_bytes_)}; }
  float* f32(int64_t count) { return static_cast<float*>(take(count, sizeof(float))); }
  size_t used() const { return used_; }

 private:
  void* take(int64_t count, size_t element) {
    const size_t off = used_;
    used_ += (static_cast<size_t>(count > 0 ? count : 0) * element + 255) / 256 * 256;
    return base_ ? base_ + off : nullptr;
  }
  size_t act_bytes_;
  char* base_;
  size_t used_ = 0;
};

}  // namespace laoyao::model
