// Megatron-Core's GPT as one module tree over a backend's ops (model/backend.hpp): GPTModel ->
// embedding, TransformerBlock (decoder) -> TransformerLayer (input_layernorm, SelfAttention with
// linear_qkv, core_attention, linear_proj; pre_mlp_layernorm; MLP with linear_fc1, linear_fc2, or
// MoELayer), final_layernorm, output_layer and the loss. Each module's forward and backward is
// written here once; what differs between the CPU and the GPU is the backend's ops.
//
// Tensor parallelism: the modules run this rank's shards (its heads, ffn columns, vocabulary rows)
// and reduce where Megatron-Core's layers do: a row-parallel linear's output (all-reduce, or under
// sequence parallelism a reduce-scatter into this rank's share of every sequence), a
// column-parallel linear's input gradient (the same in reverse). Under sequence parallelism the
// norms, dropouts and residual adds run on this rank's rows, all-gathered before the parallel
// layers. Dropout masks are the whole model's, sliced (core/dropout_spec.hpp), so any TP size
// draws one rank's masks.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "model/backend.hpp"
#include "model/gpt_config.hpp"
#include "model/gpt_layout.hpp"

namespace laoyao::model::mcore {

// The stream of layer l's random router logits in a micro-batch (--moe-router-force-load-balancing),
// the same on every backend.
uint64_t random_logits_key(uint64_t seed, uint64_t call, int64_t layer);

// Where this rank sits in the tensor-parallel group.
struct TensorParallel {
  int64_t rank = 0, size = 1;
  bool sequence_parallel = false;  // only with size > 1
};

// The micro-batch being run, as every module sees it: its shape, its inputs (backend memory),
// and where its dropout masks come from.
struct Step {
  BatchShape batch;
  const int64_t *tokens = nullptr, *labels = nullptr, *positions = nullptr;
  uint64_t seed = 0, call = 0;
  bool training = false;    // dropout on
  bool train_step = false;  // a training micro-batch, whose backward follows
  bool recomputing = false;  // a layer's forward run again before its backward (full recomputation)
  // The first micro-batch of a step or of an evaluation's iteration (Megatron's is_first_microbatch):
  // FP8 linear layers cast their weights again.
  bool is_first_microbatch = true;
  // Multi-token prediction layer k's inputs: the ids, positions and labels rolled left k + 1
  // times with zeros shifted in (each sequence on its own), in backend memory; its losses [T] (out,
  // unmasked) and their weights [T] for the backward (null in the forward).
  struct MtpInputs {
    const int64_t *tokens = nullptr, *positions = nullptr, *labels = nullptr;
    float* losses = nullptr;
    const float* dloss = nullptr;
  };
  std::vector<MtpInputs> mtp;
  // The mask of dropout site `site` (e.g. "dropout.layer0.attention"), this call's.
  DropoutSpec dropout(double p, const std::string& site) const;
};

// What a module needs to run: the model (whole and this rank's), the parameters, the backend.
struct ModuleContext {
  const GptConfig& whole;
  const GptConfig& local;
  const GptParameterLayout& params;
  TensorParallel tp;
  Backend& backend;
  // Full activation recomputation as the config asks (--recompute-granularity full), or every
  // activation kept (a backend with memory to spare: the CPU).
  bool recompute = false;
  bool tensor_parallel() const { return tp.size > 1; }
  bool sp() const { return tp.sequence_parallel && tp.size > 1; }
  // Whether the norms' backward sums the bias gradients of linear_proj and linear_fc2, whose output
  // gradient is the residual stream's whole rows when there is no hidden dropout and no sequence
  // parallelism (a backend's fusion; else linear_backward sums them).
  bool bias_grad_in_norm() const { return backend.sums_bias_grad_in_norm() && !(local.hidden_dropout > 0) && !sp(); }
  // Layer l's linear_fc2 bias where a norm's backward sums its gradient; else -1 (also for l < 0, an
  // MoE layer, a model without biases).
  int64_t fc2_bias_in_norm(int64_t l) const {
    return bias_grad_in_norm() && l >= 0 && !local.is_moe_layer(l) ? params.layers[static_cast<size_t>(l)].fc2_b : -1;
  }
};

// Backward scratch shared by the layers, and the sequence-parallel staging ([T, h] each but wide).
struct Scratch {
  Act dx;       // [rows, h]: the residual stream's gradient
  Act dbranch;  // [T, h]: a branch's output gradient (whole rows)
  Act dnorm;    // [T, h]: the gradient at a norm's output (a column-parallel layer's input)
  Act dwide;    // [T, max(qkv, fc1, heads * D, h)]: d(qkv), d(fc1 output)
  Act dctx;     // [T, heads * D]
  Act branch;   // [T, h]: a row-parallel layer's (or an MoE layer's) partial sums before the reduction
  Act local;    // [rows, h]: this rank's rows of a reduction or a norm under sequence parallelism
  // PEFT: an adapter's dropped-out input and its gradient [T, widest input] (with LoRA dropout),
  // the gradient at its low-rank activation [T, dim], and at linear_fc2's input [T, ffn].
  Act lora_in, lora_da, dg;
  // Multi-latent attention: the gradients at the query, key and value, at the up projections'
  // outputs q and kv, at linear_kv_down_proj's output, at a latent before and after its norm, and
  // the query path's share of the input gradient [T, h].
  Act mla_dquery, mla_dkey, mla_dvalue, mla_dq, mla_dkv, mla_dkv_down, mla_dlatent, mla_dlatent_normed, mla_dx;
  void carve(ActivationCarver& c, const ModuleContext& m, int64_t T, int64_t rows);
};

// Megatron-Bridge's LoRA adapter beside one linear layer (ParallelLinearAdapter, identity
// activation): y += (alpha / dim) * linear_out(linear_in(dropout(x))). Off where the layer has none.
class LoraAdapter {
 public:
  // in, out: the linear layer's input and output widths (this rank's); name: its module
  // ("linear_qkv"); row_parallel: linear_proj or linear_fc2, whose input (and linear_in) is split
  // by columns under tensor parallelism.
  LoraAdapter(const ModuleContext& m, int64_t layer, LoraOffsets w, const char* name, int64_t in, int64_t out,
              bool row_parallel);
  bool on() const { return w_.on(); }
  void carve(ActivationCarver& c, int64_t T);
  void share_activations(const LoraAdapter& o) { a_ = o.a_; }
  // y (the linear layer's output, whole rows) += the adapter's output on x.
  void forward(const Step& st, Act x, Act y, Scratch& w);
  // The adapter's gradients from dy (the gradient at y), and dx (the linear layer's input
  // gradient, already there) += the adapter's share.
  void backward(const Step& st, Act x, Act dy, Act dx, Scratch& w);

 private:
  // The adapter's input: x, or dropout(x) in w.lora_in.
  Act input(const Step& st, Act x, Scratch& w) const;
  DropoutSpec drop(const Step& st) const;
  const ModuleContext& m_;
  int64_t layer_;
  LoraOffsets w_;
  const char* name_;
  int64_t in_, out_;
  bool row_parallel_;
  Act a_;  // [T, dim]: linear_in's output (a row-parallel layer's: this rank's part of the sum)
};

class SelfAttention {
 public:
  SelfAttention(const ModuleContext& m, int64_t layer);
  void carve(ActivationCarver& c, int64_t T);
  void share_activations(const SelfAttention& o) {
    qkv_ = o.qkv_, qkv_attn_ = o.qkv_attn_, ctx_ = o.ctx_, qk_rstd_ = o.qk_rstd_;
    qkv_lora_.share_activations(o.qkv_lora_), proj_lora_.share_activations(o.proj_lora_);
  }
  // out = residual + dropout(linear_proj(attention(linear_qkv(x)))): x the whole sequence's norm
  // output, residual and out this rank's rows.
  void forward(const Step& st, Act x, Act residual, Act out, Scratch& w);
  // dout: the gradient at out (this rank's rows); the gradient at x lands in w.dnorm (this rank's
  // part: the caller sums it over the group).
  void backward(const Step& st, Act x, Act dout, Scratch& w);

 private:
  const GptLayerOffsets& W() const { return m_.params.layers[static_cast<size_t>(layer_)]; }
  const ModuleContext& m_;
  int64_t layer_;
  Act qkv_, qkv_attn_, ctx_;
  float* qk_rstd_ = nullptr;
  LoraAdapter qkv_lora_, proj_lora_;
};

// Megatron-Core's MLASelfAttention (GptConfig::mla) in place of SelfAttention: the query from
// linear_q_proj, or linear_q_down_proj -> q_layernorm -> linear_q_up_proj; the key and value from
// linear_kv_down_proj's latent -> kv_layernorm -> linear_kv_up_proj, and its last columns, the RoPE
// key every head shares; core attention of q/k head dim qk_head_dim + qk_pos_emb_head_dim and v head
// dim v_head_dim; linear_proj. Under tensor parallelism the up projections are column-parallel (this
// rank's heads) and the down projections and latent norms whole on every rank: their gradients are
// this rank's heads' part, which finalize_grads sums (model/gpt_tp.hpp's tp_partial_grads).
class MLASelfAttention {
 public:
  MLASelfAttention(const ModuleContext& m, int64_t layer) : m_(m), layer_(layer) {}
  void carve(ActivationCarver& c, int64_t T);
  void share_activations(const MLASelfAttention& o) {
    q_down_ = o.q_down_, q_latent_ = o.q_latent_, q_ = o.q_, kv_down_ = o.kv_down_, kv_c_ = o.kv_c_;
    kv_latent_ = o.kv_latent_, kv_ = o.kv_, query_ = o.query_, key_ = o.key_, value_ = o.value_, ctx_ = o.ctx_;
    q_mean_ = o.q_mean_, q_rstd_ = o.q_rstd_, kv_mean_ = o.kv_mean_, kv_rstd_ = o.kv_rstd_;
  }
  // As SelfAttention's: x the whole sequence's norm output, residual and out this rank's rows.
  void forward(const Step& st, Act x, Act residual, Act out, Scratch& w);
  // The gradient at x lands in w.dnorm (this rank's part: the caller sums it over the group).
  void backward(const Step& st, Act x, Act dout, Scratch& w);

 private:
  const GptLayerOffsets& W() const { return m_.params.layers[static_cast<size_t>(layer_)]; }
  const MlaSpec& spec() const { return *m_.local.mla; }
  Act cols(Act a, int64_t n) const;  // a, n elements on
  const ModuleContext& m_;
  int64_t layer_;
  // q_down_ [T, q_lora] and q_latent_ (normed; q_down_ without the norm); q_ [T, heads*(dqk+dr)];
  // kv_down_ [T, kv_lora+dr], kv_c_ its latent columns, kv_latent_ normed; kv_ [T, heads*(dqk+dv)];
  // query_, key_ [T, heads*(dqk+dr)], value_, ctx_ [T, heads*dv].
  Act q_down_, q_latent_, q_, kv_down_, kv_c_, kv_latent_, kv_, query_, key_, value_, ctx_;
  float *q_mean_ = nullptr, *q_rstd_ = nullptr, *kv_mean_ = nullptr, *kv_rstd_ = nullptr;
};

class MLP {
 public:
  MLP(const ModuleContext& m, int64_t layer);
  void carve(ActivationCarver& c, int64_t T);
  void share_activations(const MLP& o) {  // (an MoE layer's live in the backend)
    u_ = o.u_, g_ = o.g_;
    fc1_lora_.share_activations(o.fc1_lora_), fc2_lora_.share_activations(o.fc2_lora_);
  }
  void forward(const Step& st, Act x, Act residual, Act out, Scratch& w);
  void backward(const Step& st, Act x, Act dout, Scratch& w);

 private:
  const GptLayerOffsets& W() const { return m_.params.layers[static_cast<size_t>(layer_)]; }
  const ModuleContext& m_;
  int64_t layer_;
  Act u_, g_;
  LoraAdapter fc1_lora_, fc2_lora_;
};

// Megatron-Core's MoELayer in place of the MLP: the backend's router, token dispatcher, experts
// and shared experts (model/backend.hpp's moe_layer), then the residual.
class MoELayer {
 public:
  MoELayer(const ModuleContext& m, int64_t layer) : m_(m), layer_(layer) {}
  void forward(const Step& st, Act x, Act residual, Act out, Scratch& w);
  void backward(const Step& st, Act x, Act dout, Scratch& w, float aux_loss_scale);

 private:
  const ModuleContext& m_;
  int64_t layer_;
};

class TransformerLayer {
 public:
  TransformerLayer(const ModuleContext& m, int64_t layer);
  void carve(ActivationCarver& c, int64_t T, int64_t rows);
  // Full recomputation: this layer's activations are o's (a layer at the same place of another
  // chunk, rebuilt before each backward), except its input where it keeps its own (a chunk's first).
  void share_activations(ActivationCarver& c, const TransformerLayer& o, bool own_input, int64_t rows);
  Act input() const { return x_in_; }
  // out = the layer applied to input() (this rank's rows).
  void forward(const Step& st, Act out, Scratch& w);
  // w.dx: the gradient at out in, at input() out.
  void backward(const Step& st, Scratch& w, float moe_aux_loss_scale);

 private:
  const GptLayerOffsets& W() const { return m_.params.layers[static_cast<size_t>(layer_)]; }
  bool moe() const { return m_.whole.is_moe_layer(layer_); }
  bool mla() const { return m_.local.mla.has_value(); }
  const ModuleContext& m_;
  int64_t layer_;
  SelfAttention self_attention_;
  MLASelfAttention mla_attention_;
  MLP mlp_;
  MoELayer moe_;
  Act x_in_, ln1_, x_mid_, ln2_;
  float *ln1_mean_ = nullptr, *ln1_rstd_ = nullptr, *ln2_mean_ = nullptr, *ln2_rstd_ = nullptr;
};

// Megatron-Core's TransformerBlock (GPTModel.decoder): the layers, then final_layernorm, whose
// output the output layer reads whole (all-gathered under sequence parallelism).
class TransformerBlock {
 public:
  explicit TransformerBlock(const ModuleContext& m);
  void carve(ActivationCarver& c, int64_t T, int64_t rows);
  Act input() const { return layers_.empty() ? x_final_ : layers_[0].input(); }
  Act output() const { return xf_; }  // [T, h]
  void forward(const Step& st, Scratch& w);
  // w.dnorm: the gradient at output(), this rank's part (summed over the group here); the gradient
  // at input() lands in w.dx.
  void backward(const Step& st, Scratch& w, float moe_aux_loss_scale);
  // Called during backward(): with -1 once final_layernorm's gradients are done (and the output
  // layer's, which runs before), then with l once layer l's are, last layer first.
  std::function<void(int64_t layer)> on_backward_done;

 private:
  const ModuleContext& m_;
  std::vector<TransformerLayer> layers_;
  // Full recomputation: the first and last layer of layer l's chunk, -1 where l keeps its own
  // activations. A chunk keeps only its input; its layers share the first chunk's activations.
  std::vector<int64_t> chunk_start_, chunk_end_;
  Act x_final_, xf_;  // final_layernorm's input (this rank's rows) and output (whole)
  float *xf_mean_ = nullptr, *xf_rstd_ = nullptr;
};

// Megatron-Core's MultiTokenPredictionBlock (GptConfig::mtp_num_layers). Layer k reads the
// previous layer's output h (for the first, the decoder's after final_layernorm) and the embedding
// of the ids rolled k + 1 ahead: h_k = final_layernorm(TransformerLayer(eh_proj([enorm(embedding),
// hnorm(h)]))), and its loss is the shared output layer's cross entropy on the labels rolled alike.
// The embedding and output layer are GPTModel's (the word embedding shared, its gradient too).
// Under tensor parallelism the embedding, the norms and eh_proj run on the whole sequence on every
// rank (replicated, their gradients the same on each), the transformer layer as the decoder's (on
// this rank's rows under sequence parallelism), the output layer vocabulary-parallel.
class MultiTokenPredictionBlock {
 public:
  explicit MultiTokenPredictionBlock(const ModuleContext& m);
  void carve(ActivationCarver& c, int64_t T);
  // h0: the decoder's output [T, h]; st.mtp[k].losses receive each layer's per-token losses.
  void forward(const Step& st, Act h0, Scratch& w);
  // From st.mtp[k].dloss: the layers' gradients, and the gradient at h0 added to dh0 (which may be
  // the scratch's: it is kept aside while the layers run).
  void backward(const Step& st, Act h0, Act dh0, Scratch& w, float moe_aux_loss_scale);

 private:
  struct Layer {
    // embedding, the two norms, [en, hn], eh_proj's output (whole; sequence parallel), the layer's
    // output (this rank's rows), final_layernorm's (whole), the logits
    Act e, en, hn, cat, x, y, h, logits;
    float *en_mean = nullptr, *en_rstd = nullptr, *hn_mean = nullptr, *hn_rstd = nullptr;
    float *h_mean = nullptr, *h_rstd = nullptr, *ce_stats = nullptr;
  };
  const MtpOffsets& M(size_t k) const { return m_.params.mtp[k]; }
  tp::Shard vocab() const { return {m_.tp.rank * m_.local.vocab, m_.local.vocab}; }
  Act half(Act a) const;  // a, hidden-size elements on (the second half of a [.., 2h] row)
  const ModuleContext& m_;
  std::vector<TransformerLayer> layers_;
  std::vector<Layer> acts_;
  Act dh_, carry_, dcat_, den_, dhn_, de_, dh0_;  // backward: [T, h] each but dcat_ [T, 2h]
  Act dx_;  // sequence parallel: the layer's input gradient, all-gathered [T, h]
};

class GPTModel {
 public:
  // local: this rank's shapes (heads, groups, ffn and vocabulary divided by the TP size);
  // params: their offsets.
  GPTModel(const GptConfig& whole, const GptConfig& local, const GptParameterLayout& params, TensorParallel tp,
           Backend& backend, bool recompute);
  GPTModel(const GPTModel&) = delete;
  GPTModel& operator=(const GPTModel&) = delete;
  // Activations for micro-batches of b sequences of s tokens (again only when the shape changes).
  void allocate(int64_t b, int64_t s);
  // Per-token losses [T] (unmasked) of st's micro-batch; given the losses' weights dloss[T] (backend
  // memory) already, the loss's gradient is taken in the same pass.
  void forward(const Step& st, float* losses, const float* dloss = nullptr);
  // d(sum_t dloss[t] * loss[t]) accumulated into the gradients; right after forward(st) (with the
  // same dloss, if the forward had it).
  void backward(const Step& st, const float* dloss, float moe_aux_loss_scale);
  int64_t rows(int64_t T) const { return ctx_.sp() ? T / ctx_.tp.size : T; }
  size_t activation_bytes() const { return activation_bytes_; }  // the arena allocate() reserved
  // Where a backward's gradients become final, for reducing them while it runs (TransformerBlock::
  // on_backward_done: -1 for the head, then each layer); the embeddings' are final at its end.
  void set_backward_hook(std::function<void(int64_t layer)> hook) { decoder_.on_backward_done = std::move(hook); }

 private:
  tp::Shard vocab() const { return {ctx_.tp.rank * ctx_.local.vocab, ctx_.local.vocab}; }
  void embedding_forward(const Step& st, Act out);
  void embedding_backward(const Step& st, Act dx);

  ModuleContext ctx_;
  TransformerBlock decoder_;
  MultiTokenPredictionBlock mtp_;
  int64_t b_ = 0, s_ = 0;
  size_t activation_bytes_ = 0;
  Scratch w_;
  Act emb_full_, logits_;
  float* ce_stats_ = nullptr;
  bool loss_grad_taken_ = false;  // the last forward was given dloss
};

}  // namespace laoyao::model::mcore
