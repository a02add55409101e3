// TransformerLayer and its submodules: SelfAttention, MLP, MoELayer (model/mcore/gpt_model.hpp;
// MLASelfAttention in mla_self_attention.cpp).
#include <algorithm>
#include <string>

#include "model/mcore/gpt_model.hpp"
#include "model/mcore/parallel_linear.hpp"

namespace laoyao::model::mcore {

// ---- SelfAttention

SelfAttention::SelfAttention(const ModuleContext& m, int64_t layer)
    : m_(m),
      layer_(layer),
      qkv_lora_(m, layer, W().qkv_lora, "linear_qkv", m.local.hidden, m.local.qkv_width(), false),
      proj_lora_(m, layer, W().proj_lora, "linear_proj", m.local.heads * m.local.kv_channels, m.local.hidden, true) {}

void SelfAttention::carve(ActivationCarver& c, int64_t T) {
  const GptConfig& lc = m_.local;
  qkv_ = c.act(T * lc.qkv_width());
  // What attention reads: q and k normalised (QK layernorm) and rotated (RoPE). Without the norm
  // RoPE rotates qkv in place (nothing needs the unrotated values); with it, qkv keeps the pre-norm
  // values the norm's backward needs.
  qkv_attn_ = lc.qk_layernorm ? c.act(T * lc.qkv_width()) : qkv_;
  qk_rstd_ = c.f32(lc.qk_layernorm ? T * (lc.heads + lc.query_groups) : 0);
  ctx_ = c.act(T * lc.heads * lc.kv_channels);
  qkv_lora_.carve(c, T);
  proj_lora_.carve(c, T);
}

void SelfAttention::forward(const Step& st, Act x, Act residual, Act out, Scratch& w) {
  const GptConfig& lc = m_.local;
  const int64_t T = st.batch.T;
  Backend& be = m_.backend;
  be.linear(x, W().qkv_w, W().qkv_b, qkv_, T, lc.hidden, lc.qkv_width());
  qkv_lora_.forward(st, x, qkv_, w);
  be.qkv_prepare(qkv_, W().q_norm, W().k_norm, qkv_attn_, qk_rstd_, st.batch);
  be.core_attention(layer_, qkv_attn_, ctx_, st.batch, attention_dropout(m_, st, layer_));
  const DropoutSpec drop = hidden_dropout(m_, st, dropout_site(layer_, "attention"));
  if (!proj_lora_.on())
    return row_parallel_bias_dropout_add(m_, st, ctx_, W().proj_w, W().proj_b, lc.heads * lc.kv_channels, residual,
                                         out, drop, w);
  // The adapter adds to the projection before its bias, dropout and residual.
  be.linear(ctx_, W().proj_w, -1, w.branch, T, lc.heads * lc.kv_channels, lc.hidden);
  proj_lora_.forward(st, ctx_, w.branch, w);
  reduce_bias_dropout_add(m_, st, W().proj_b, residual, out, drop, w);
}

void SelfAttention::backward(const Step& st, Act x, Act dout, Scratch& w) {
  const GptConfig& lc = m_.local;
  const int64_t T = st.batch.T, D = lc.kv_channels;
  Backend& be = m_.backend;
  const Act dbranch = branch_output_grad(m_, st, dout, hidden_dropout(m_, st, dropout_site(layer_, "attention")), w);
  be.linear_backward(ctx_, W().proj_w, m_.bias_grad_in_norm() ? -1 : W().proj_b, dbranch, w.dctx, T, lc.heads * D,
                     lc.hidden);
  proj_lora_.backward(st, ctx_, dbranch, w.dctx, w);
  be.core_attention_backward(layer_, qkv_attn_, w.dctx, w.dwide, st.batch, attention_dropout(m_, st, layer_));
  be.qkv_prepare_backward(w.dwide, qkv_, W().q_norm, W().k_norm, qk_rstd_, st.batch);
  be.linear_backward(x, W().qkv_w, W().qkv_b, w.dwide, w.dnorm, T, lc.hidden, lc.qkv_width());
  qkv_lora_.backward(st, x, w.dwide, w.dnorm, w);
}

// ---- MLP

MLP::MLP(const ModuleContext& m, int64_t layer)
    : m_(m),
      layer_(layer),
      fc1_lora_(m, layer, W().fc1_lora, "linear_fc1", m.local.hidden, m.local.fc1_width(), false),
      fc2_lora_(m, layer, W().fc2_lora, "linear_fc2", m.local.ffn, m.local.hidden, true) {}

void MLP::carve(ActivationCarver& c, int64_t T) {
  u_ = c.act(T * m_.local.fc1_width());
  g_ = c.act(T * m_.local.ffn);
  fc1_lora_.carve(c, T);
  fc2_lora_.carve(c, T);
}

void MLP::forward(const Step& st, Act x, Act residual, Act out, Scratch& w) {
  const GptConfig& lc = m_.local;
  const int64_t T = st.batch.T;
  Backend& be = m_.backend;
  if (!fc1_lora_.on()) {
    be.mlp_fc1(x, W().fc1_w, W().fc1_b, u_, g_, T, lc.ffn);
  } else {  // the adapter adds to linear_fc1's output before the activation
    be.linear(x, W().fc1_w, W().fc1_b, u_, T, lc.hidden, lc.fc1_width());
    fc1_lora_.forward(st, x, u_, w);
    be.mlp_activation(u_, g_, T, lc.ffn);
  }
  const DropoutSpec drop = hidden_dropout(m_, st, dropout_site(layer_, "mlp"));
  if (!fc2_lora_.on()) return row_parallel_bias_dropout_add(m_, st, g_, W().fc2_w, W().fc2_b, lc.ffn, residual, out, drop, w);
  be.linear(g_, W().fc2_w, -1, w.branch, T, lc.ffn, lc.hidden);
  fc2_lora_.forward(st, g_, w.branch, w);
  reduce_bias_dropout_add(m_, st, W().fc2_b, residual, out, drop, w);
}

void MLP::backward(const Step& st, Act x, Act dout, Scratch& w) {
  const GptConfig& lc = m_.local;
  const int64_t T = st.batch.T;
  Backend& be = m_.backend;
  const Act dbranch = branch_output_grad(m_, st, dout, hidden_dropout(m_, st, dropout_site(layer_, "mlp")), w);
  const int64_t fc2_b = m_.bias_grad_in_norm() ? -1 : W().fc2_b;
  if (!fc2_lora_.on()) {
    be.mlp_fc2_backward(dbranch, g_, u_, W().fc2_w, fc2_b, w.dwide, T, lc.ffn);
  } else {  // the adapter's share of linear_fc2's input gradient joins before the activation's backward
    be.linear_backward(g_, W().fc2_w, fc2_b, dbranch, w.dg, T, lc.ffn, lc.hidden);
    fc2_lora_.backward(st, g_, dbranch, w.dg, w);
    be.mlp_activation_backward(w.dg, u_, w.dwide, T, lc.ffn);
  }
  be.linear_backward(x, W().fc1_w, W().fc1_b, w.dwide, w.dnorm, T, lc.hidden, lc.fc1_width());
  fc1_lora_.backward(st, x, w.dwide, w.dnorm, w);
}

// ---- MoELayer

void MoELayer::forward(const Step& st, Act x, Act residual, Act out, Scratch& w) {
  // Under tensor parallelism every rank routes the whole gathered sequence, as Megatron's
  // dispatcher gathers the tokens and their routing over the group, and runs its share of each
  // expert: the outputs are partial sums, reduced like linear_fc2's (the experts have no bias).
  const uint64_t logits_key = m_.local.moe.force_load_balancing ? random_logits_key(st.seed, st.call, layer_) : 0;
  const MoePass pass = !st.train_step ? MoePass::Evaluation : st.recomputing ? MoePass::Recompute : MoePass::Training;
  const DropoutSpec drop = hidden_dropout(m_, st, dropout_site(layer_, "mlp"));
  if (!m_.tensor_parallel() && !(drop.p > 0))  // nothing between the experts' sum and the residual add
    return m_.backend.moe_layer(layer_, x, out, st.batch, pass, logits_key, residual);
  m_.backend.moe_layer(layer_, x, w.branch, st.batch, pass, logits_key, Act{});
  reduce_bias_dropout_add(m_, st, -1, residual, out, drop, w);
}

void MoELayer::backward(const Step& st, Act x, Act dout, Scratch& w, float aux_loss_scale) {
  const Act dbranch = branch_output_grad(m_, st, dout, hidden_dropout(m_, st, dropout_site(layer_, "mlp")), w);
  // Under tensor parallelism each rank's router gradient is a share that the model's
  // finalize_grads sums (and its input gradient is summed with the experts'): the aux and z losses,
  // which every rank computes whole, add 1/tp of theirs on each.
  m_.backend.moe_layer_backward(layer_, x, dbranch, w.dnorm, st.batch,
                                aux_loss_scale / static_cast<float>(m_.tp.size));
}

// ---- TransformerLayer

TransformerLayer::TransformerLayer(const ModuleContext& m, int64_t layer)
    : m_(m), layer_(layer), self_attention_(m, layer), mla_attention_(m, layer), mlp_(m, layer), moe_(m, layer) {}

void TransformerLayer::carve(ActivationCarver& c, int64_t T, int64_t rows) {
  const int64_t h = m_.local.hidden;
  x_in_ = c.act(rows * h);
  ln1_ = c.act(T * h);  // the whole sequence's (sequence parallel: all-gathered)
  ln1_mean_ = c.f32(rows), ln1_rstd_ = c.f32(rows);
  if (mla())
    mla_attention_.carve(c, T);
  else
    self_attention_.carve(c, T);
  x_mid_ = c.act(rows * h);
  ln2_ = c.act(T * h);
  ln2_mean_ = c.f32(rows), ln2_rstd_ = c.f32(rows);
  if (!moe()) mlp_.carve(c, T);
}

void TransformerLayer::share_activations(ActivationCarver& c, const TransformerLayer& o, bool own_input,
                                         int64_t rows) {
  x_in_ = own_input ? c.act(rows * m_.local.hidden) : o.x_in_;
  ln1_ = o.ln1_, x_mid_ = o.x_mid_, ln2_ = o.ln2_;
  ln1_mean_ = o.ln1_mean_, ln1_rstd_ = o.ln1_rstd_, ln2_mean_ = o.ln2_mean_, ln2_rstd_ = o.ln2_rstd_;
  self_attention_.share_activations(o.self_attention_);
  mla_attention_.share_activations(o.mla_attention_);
  mlp_.share_activations(o.mlp_);
}

void TransformerLayer::forward(const Step& st, Act out, Scratch& w) {
  // input_layernorm -> self_attention -> + residual; pre_mlp_layernorm -> mlp (or MoE) -> + residual.
  norm_whole_sequence(m_, st, x_in_, W().ln1_w, W().ln1_b, ln1_, ln1_mean_, ln1_rstd_, w);
  if (mla())
    mla_attention_.forward(st, ln1_, x_in_, x_mid_, w);
  else
    self_attention_.forward(st, ln1_, x_in_, x_mid_, w);
  norm_whole_sequence(m_, st, x_mid_, W().ln2_w, W().ln2_b, ln2_, ln2_mean_, ln2_rstd_, w);
  if (moe())
    moe_.forward(st, ln2_, x_mid_, out, w);
  else
    mlp_.forward(st, ln2_, x_mid_, out, w);
}

void TransformerLayer::backward(const Step& st, Scratch& w, float moe_aux_loss_scale) {
  const int64_t rows = st.batch.rows;
  Backend& be = m_.backend;
  // w.dx holds d(out); the residual passes it to x_mid unchanged, and the branch adds its part.
  if (moe())
    moe_.backward(st, ln2_, w.dx, w, moe_aux_loss_scale);
  else
    mlp_.backward(st, ln2_, w.dx, w);
  // (With the bias gradients summed in the norms: linear_proj's by pre_mlp_layernorm's backward, the
  // previous layer's linear_fc2's by input_layernorm's.)
  be.norm_backward(sum_input_grad(m_, st, w), x_mid_, W().ln2_w, W().ln2_b, ln2_mean_, ln2_rstd_, w.dx, rows,
                   m_.local.hidden, true,
                   m_.bias_grad_in_norm() ? W().proj_b : -1);
  if (mla())
    mla_attention_.backward(st, ln1_, w.dx, w);
  else
    self_attention_.backward(st, ln1_, w.dx, w);
  be.norm_backward(sum_input_grad(m_, st, w), x_in_, W().ln1_w, W().ln1_b, ln1_mean_, ln1_rstd_, w.dx, rows,
                   m_.local.hidden, true,
                   m_.fc2_bias_in_norm(layer_ - 1));
}

}  // namespace laoyao::model::mcore
