// MLASelfAttention (model/mcore/gpt_model.hpp): Megatron-Core's multi-latent attention, unfused
// (MLASelfAttention.get_query_key_value_tensors, then core attention and linear_proj).
#include <algorithm>

#include "model/mcore/gpt_model.hpp"
#include "model/mcore/parallel_linear.hpp"

namespace laoyao::model::mcore {

Act MLASelfAttention::cols(Act a, int64_t n) const {
  return Act{static_cast<char*>(a.p) + n * static_cast<int64_t>(m_.backend.activation_bytes())};
}

void MLASelfAttention::carve(ActivationCarver& c, int64_t T) {
  const MlaSpec& m = spec();
  const int64_t n = m_.local.heads, kv_lora = m.kv_lora_rank;
  if (m.q_lora_rank > 0) {
    q_down_ = c.act(T * m.q_lora_rank);
    q_latent_ = W().q_ln_w >= 0 ? c.act(T * m.q_lora_rank) : q_down_;
    q_mean_ = c.f32(T), q_rstd_ = c.f32(T);
  }
  q_ = c.act(T * n * m.q_head_dim());
  kv_down_ = c.act(T * (kv_lora + m.qk_pos_emb_head_dim));
  kv_c_ = c.act(T * kv_lora);  // the latent columns, contiguous for the norm and linear_kv_up_proj
  kv_latent_ = W().kv_ln_w >= 0 ? c.act(T * kv_lora) : kv_c_;
  kv_mean_ = c.f32(T), kv_rstd_ = c.f32(T);
  kv_ = c.act(T * n * (m.qk_head_dim + m.v_head_dim));
  query_ = c.act(T * n * m.q_head_dim());
  key_ = c.act(T * n * m.q_head_dim());
  value_ = c.act(T * n * m.v_head_dim);
  ctx_ = c.act(T * n * m.v_head_dim);
}

void MLASelfAttention::forward(const Step& st, Act x, Act residual, Act out, Scratch& w) {
  const MlaSpec& m = spec();
  const GptConfig& lc = m_.local;
  const int64_t T = st.batch.T, h = lc.hidden, n = lc.heads, kv_lora = m.kv_lora_rank;
  const int64_t kv_down_width = kv_lora + m.qk_pos_emb_head_dim;
  Backend& be = m_.backend;
  // The query: through its latent and q_layernorm, or straight from the input.
  if (m.q_lora_rank > 0) {
    be.linear(x, W().q_down_w, -1, q_down_, T, h, m.q_lora_rank);
    if (W().q_ln_w >= 0) be.norm(q_down_, W().q_ln_w, W().q_ln_b, q_latent_, q_mean_, q_rstd_, T, m.q_lora_rank);
    be.linear(q_latent_, W().q_up_w, -1, q_, T, m.q_lora_rank, n * m.q_head_dim());
  } else {
    be.linear(x, W().q_proj_w, -1, q_, T, h, n * m.q_head_dim());
  }
  // The key and value: one latent (kv_layernorm, linear_kv_up_proj) and the shared RoPE key.
  be.linear(x, W().kv_down_w, -1, kv_down_, T, h, kv_down_width);
  be.copy_columns(kv_down_, kv_down_width, kv_c_, kv_lora, T, kv_lora);
  if (W().kv_ln_w >= 0) be.norm(kv_c_, W().kv_ln_w, W().kv_ln_b, kv_latent_, kv_mean_, kv_rstd_, T, kv_lora);
  be.linear(kv_latent_, W().kv_up_w, -1, kv_, T, kv_lora, n * (m.qk_head_dim + m.v_head_dim));
  be.mla_prepare(q_, kv_, cols(kv_down_, kv_lora), kv_down_width, query_, key_, value_, st.batch);
  be.separate_core_attention(layer_, query_, key_, value_, ctx_, m.q_head_dim(), m.v_head_dim,
                             static_cast<float>(m.softmax_scale), st.batch, attention_dropout(m_, st, layer_));
  row_parallel_bias_dropout_add(m_, st, ctx_, W().proj_w, W().proj_b, n * m.v_head_dim, residual, out,
                                hidden_dropout(m_, st, dropout_site(layer_, "attention")), w);
}

void MLASelfAttention::backward(const Step& st, Act x, Act dout, Scratch& w) {
  const MlaSpec& m = spec();
  const GptConfig& lc = m_.local;
  const int64_t T = st.batch.T, h = lc.hidden, n = lc.heads, kv_lora = m.kv_lora_rank;
  const int64_t kv_down_width = kv_lora + m.qk_pos_emb_head_dim;
  Backend& be = m_.backend;
  const Act dbranch = branch_output_grad(m_, st, dout, hidden_dropout(m_, st, dropout_site(layer_, "attention")), w);
  be.linear_backward(ctx_, W().proj_w, m_.bias_grad_in_norm() ? -1 : W().proj_b, dbranch, w.dctx, T, n * m.v_head_dim,
                     h);
  be.separate_core_attention_backward(layer_, query_, key_, value_, w.dctx, w.mla_dquery, w.mla_dkey, w.mla_dvalue,
                                      m.q_head_dim(), m.v_head_dim, static_cast<float>(m.softmax_scale), st.batch,
                                      attention_dropout(m_, st, layer_));
  // The RoPE key's gradient lands in linear_kv_down_proj's output gradient, beside the latent's.
  be.mla_prepare_backward(w.mla_dquery, w.mla_dkey, w.mla_dvalue, w.mla_dq, w.mla_dkv, cols(w.mla_dkv_down, kv_lora),
                          kv_down_width, st.batch);
  // Under tensor parallelism every gradient from here to the input is this rank's heads' part.
  const Act dkv_latent = W().kv_ln_w >= 0 ? w.mla_dlatent_normed : w.mla_dlatent;
  be.linear_backward(kv_latent_, W().kv_up_w, -1, w.mla_dkv, dkv_latent, T, kv_lora, n * (m.qk_head_dim + m.v_head_dim));
  if (W().kv_ln_w >= 0)
    be.norm_backward(dkv_latent, kv_c_, W().kv_ln_w, W().kv_ln_b, kv_mean_, kv_rstd_, w.mla_dlatent, T, kv_lora, false,
                     -1);
  be.copy_columns(w.mla_dlatent, kv_lora, w.mla_dkv_down, kv_down_width, T, kv_lora);
  be.linear_backward(x, W().kv_down_w, -1, w.mla_dkv_down, w.dnorm, T, h, kv_down_width);
  // The query's path, its input gradient added to the key and value's.
  if (m.q_lora_rank > 0) {
    const Act dq_latent = W().q_ln_w >= 0 ? w.mla_dlatent_normed : w.mla_dlatent;
    be.linear_backward(q_latent_, W().q_up_w, -1, w.mla_dq, dq_latent, T, m.q_lora_rank, n * m.q_head_dim());
    if (W().q_ln_w >= 0)
      be.norm_backward(dq_latent, q_down_, W().q_ln_w, W().q_ln_b, q_mean_, q_rstd_, w.mla_dlatent, T, m.q_lora_rank,
                       false, -1);
    be.linear_backward(x, W().q_down_w, -1, w.mla_dlatent, w.mla_dx, T, h, m.q_lora_rank);
  } else {
    be.linear_backward(x, W().q_proj_w, -1, w.mla_dq, w.mla_dx, T, h, n * m.q_head_dim());
  }
  be.bias_dropout_add(w.mla_dx, -1, w.dnorm, w.dnorm, T, h, DropoutSpec{});
}

}  // namespace laoyao::model::mcore
