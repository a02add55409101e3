#include "model/cpu/cpu_backend.hpp"
#include "model/rotary.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.hpp"

namespace laoyao::model {

namespace k = kernels::cpu;

namespace {

k::Gelu gelu_kind(Activation a) { return a == Activation::GeluErf ? k::Gelu::Erf : k::Gelu::Tanh; }

void apply_dropout(float* y, int64_t n, const DropoutSpec& drop) {
  if (drop.p <= 0) return;
  for (int64_t i = 0; i < n; ++i) y[i] *= dropout_factor_host(drop, static_cast<uint64_t>(i));
}

}  // namespace

CpuBackend::CpuBackend(const GptConfig& local, dist::ProcessGroup* tp, int64_t tp_rank, int64_t tp_size)
    : lc_(local), tp_(tp_size > 1 ? tp : nullptr), tp_rank_(tp_rank), tp_size_(tp_size) {
  if (local.positions == Positions::Rope) {
    if (local.max_positions <= 0) throw Error("GptModel: rotary positions need max_positions > 0");
    rope_ = rotary_table(local);
  }
  probs_.resize(static_cast<size_t>(local.layer_count()));
  if (local.fp8) fp8_ = std::make_unique<CpuFp8Linears>(*local.fp8);
}

void* CpuBackend::reserve_activations(size_t bytes) {
  arena_.assign(bytes / sizeof(float) + 1, 0.0f);
  return arena_.data();
}

float* CpuBackend::scratch(std::vector<float>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
  return v.data();
}

void CpuBackend::embedding(const int64_t* ids, int64_t table, Act out, int64_t T, int64_t h, tp::Shard vocab,
                           bool accumulate) {
  if (tp_size_ > 1 && !accumulate)  // this rank's vocabulary rows; the caller sums over the group
    return tp::vocab_parallel_embedding_forward(ids, W(table), F(out), T, h, vocab, nullptr);
  k::embedding_forward(ids, W(table), F(out), T, h, vocab.size, accumulate);
}

void CpuBackend::embedding_backward(const int64_t* ids, Act dout, int64_t table, int64_t T, int64_t h,
                                    tp::Shard vocab) {
  if (!G(table)) return;  // frozen
  if (vocab.start != 0 || tp_size_ > 1)
    tp::vocab_parallel_embedding_backward(ids, F(dout), G(table), T, h, vocab);
  else
    k::embedding_backward(ids, F(dout), G(table), T, h);
}

void CpuBackend::gemm(const float* x, int64_t w, int64_t b, float* y, int64_t rows, int64_t K, int64_t N) {
  if (!fp8_ || !fp8_->on()) return k::linear_forward(x, W(w), W(b), y, rows, K, N);
  const k::Fp8Operand qx = fp8_->input(w, x, rows, K);
  k::fp8_linear_forward(qx, fp8_->weight(w, W(w), N, K), W(b), y, rows, K, N);
}

void CpuBackend::gemm_backward(const float* x, int64_t w, int64_t b, const float* dy, float* dx, int64_t rows,
                               int64_t K, int64_t N) {
  if (!fp8_ || !fp8_->on()) return k::linear_backward(x, W(w), dy, dx, G(w), G(b), rows, K, N);
  // The forward's FP8 input and weight, the output gradient cast now; the bias's gradient from dy.
  const k::Fp8Operand qx = fp8_->saved_input(w, x, rows, K), qw = fp8_->weight(w, W(w), N, K);
  k::fp8_linear_backward(qx, qw, fp8_->output_grad(w, dy, rows, N), dx, G(w), rows, K, N);
  if (G(b)) k::bias_grad_accumulate(dy, G(b), rows, N);
}

void CpuBackend::linear(Act x, int64_t w, int64_t b, Act y, int64_t rows, int64_t K, int64_t N) {
  gemm(F(x), w, b, F(y), rows, K, N);
}

void CpuBackend::linear_backward(Act x, int64_t w, int64_t b, Act dy, Act dx, int64_t rows, int64_t K, int64_t N) {
  gemm_backward(F(x), w, b, F(dy), F(dx), rows, K, N);
}

void CpuBackend::linear_bias_dropout_add(Act x, int64_t w, int64_t b, Act residual, Act out, int64_t rows, int64_t K,
                                         int64_t N, const DropoutSpec& drop) {
  gemm(F(x), w, b, F(out), rows, K, N);
  apply_dropout(F(out), rows * N, drop);
  k::add_inplace(F(out), F(residual), rows * N);
}

void CpuBackend::bias_dropout_add(Act x, int64_t b, Act residual, Act out, int64_t rows, int64_t N,
                                  const DropoutSpec& drop) {
  // Element by element, so that out may be x or residual.
  const float *in = F(x), *res = F(residual), *bias = W(b);
  float* o = F(out);
  const bool masked = drop.p > 0;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < rows * N; ++i) {
    float v = bias ? in[i] + bias[i % N] : in[i];
    if (masked) v *= dropout_factor_host(drop, static_cast<uint64_t>(i));
    o[i] = v + res[i];
  }
}

void CpuBackend::dropout(Act x, Act y, int64_t n, const DropoutSpec& drop) {
  if (y.p != x.p) std::memcpy(y.p, x.p, sizeof(float) * static_cast<size_t>(n));
  apply_dropout(F(y), n, drop);
}

void CpuBackend::norm(Act x, int64_t w, int64_t b, Act y, float* mean, float* rstd, int64_t rows, int64_t width) {
  const GptConfig& c = lc_;
  if (c.norm == Norm::LayerNorm)
    k::layernorm_forward(F(x), W(w), W(b), F(y), mean, rstd, rows, width, c.norm_eps, c.zero_centered_gamma);
  else
    k::rmsnorm_forward(F(x), W(w), F(y), rstd, rows, width, c.norm_eps, c.zero_centered_gamma);
}

void CpuBackend::norm_backward(Act dy, Act x, int64_t w, int64_t b, const float* mean, const float* rstd, Act dx,
                               int64_t rows, int64_t width, bool accumulate, int64_t dx_bias) {
  if (dx_bias >= 0) throw Error("CpuBackend: the norms' backward does not sum bias gradients here");
  const GptConfig& c = lc_;
  float* out = accumulate ? scratch(norm_dx_, rows * width) : F(dx);
  if (c.norm == Norm::LayerNorm)
    k::layernorm_backward(F(dy), F(x), W(w), mean, rstd, out, G(w), G(b), rows, width, c.zero_centered_gamma);
  else
    k::rmsnorm_backward(F(dy), F(x), W(w), rstd, out, G(w), rows, width, c.zero_centered_gamma);
  if (accumulate) k::add_inplace(F(dx), out, rows * width);
}

void CpuBackend::copy_columns(Act src, int64_t src_ld, Act dst, int64_t dst_ld, int64_t rows, int64_t cols) {
  k::copy_columns(F(src), src_ld, F(dst), dst_ld, rows, cols);
}

void CpuBackend::mlp_activation(Act u, Act g, int64_t rows, int64_t ffn) {
  if (lc_.activation == Activation::SwiGLU)
    k::swiglu_forward(F(u), F(g), rows, ffn);
  else
    k::gelu_forward(F(u), F(g), rows * ffn, gelu_kind(lc_.activation));
}

void CpuBackend::mlp_activation_backward(Act dg, Act u, Act du, int64_t rows, int64_t ffn) {
  if (lc_.activation == Activation::SwiGLU)
    k::swiglu_backward(F(u), F(dg), F(du), rows, ffn);
  else
    k::gelu_backward(F(u), F(dg), F(du), rows * ffn, gelu_kind(lc_.activation));
}

void CpuBackend::lora_forward(Act x, int64_t lora_a, int64_t lora_b, float scale, Act a, Act y, int64_t rows,
                              int64_t K, int64_t r, int64_t N) {
  k::linear_forward(F(x), W(lora_a), nullptr, F(a), rows, K, r);
  k::linear_accumulate(F(a), W(lora_b), F(y), rows, r, N, scale);
}

void CpuBackend::lora_backward(Act x, int64_t lora_a, int64_t lora_b, float scale, Act a, Act dy, Act da, Act dx,
                               int64_t rows, int64_t K, int64_t r, int64_t N, bool accumulate) {
  k::linear_backward_scaled(F(a), W(lora_b), F(dy), F(da), G(lora_b), rows, r, N, scale, false);
  k::linear_backward_scaled(F(x), W(lora_a), F(da), F(dx), G(lora_a), rows, K, r, 1.0f, accumulate);
}

void CpuBackend::mlp_fc1(Act x, int64_t fc1_w, int64_t fc1_b, Act u, Act g, int64_t rows, int64_t ffn) {
  gemm(F(x), fc1_w, fc1_b, F(u), rows, lc_.hidden, lc_.fc1_rows(ffn));
  mlp_activation(u, g, rows, ffn);
}

void CpuBackend::mlp_fc2_backward(Act dy, Act g, Act u, int64_t fc2_w, int64_t fc2_b, Act du, int64_t rows,
                                  int64_t ffn) {
  float* dg = scratch(dg_, rows * ffn);
  gemm_backward(F(g), fc2_w, fc2_b, F(dy), dg, rows, ffn, lc_.hidden);
  mlp_activation_backward(Act{dg}, u, du, rows, ffn);
}

const int64_t* CpuBackend::rope_positions(const BatchShape& batch) {
  rope_positions_.resize(static_cast<size_t>(batch.T));
  const int32_t* cp = batch.cp_size > 1 ? cp_positions(batch) : nullptr;  // (Megatron's RoPE of the rank's chunks)
  for (int64_t t = 0; t < batch.T; ++t) rope_positions_[static_cast<size_t>(t)] = cp ? cp[t] : t % batch.s;
  return rope_positions_.data();
}

const int32_t* CpuBackend::cp_positions(const BatchShape& batch) {
  if (batch.cp_places) return batch.cp_places;
  cp_positions_.resize(static_cast<size_t>(batch.T));
  for (int64_t t = 0; t < batch.T; ++t) cp_positions_[static_cast<size_t>(t)] = static_cast<int32_t>(batch.cp_place(t));
  return cp_positions_.data();
}

void CpuBackend::cp_gather_rows(const float* local, float* full, const BatchShape& batch, int64_t row) {
  if (!cp_ || cp_->size() != batch.cp_size) throw Error("CpuBackend: context parallelism without its group");
  const int64_t S = batch.s * batch.cp_size;
  const int32_t* pos = cp_positions(batch);
  std::fill(full, full + batch.b * S * row, 0.0f);
  for (int64_t t = 0; t < batch.T; ++t) {
    const int64_t bi = t / batch.s;
    std::copy(local + t * row, local + (t + 1) * row, full + (bi * S + pos[t]) * row);
  }
  // (Gloo here has no all-gather: every rank's rows in place of zeros, summed.)
  cp_->all_reduce_sum(full, static_cast<size_t>(batch.b * S * row));
}

void CpuBackend::qkv_prepare(Act qkv, int64_t q_norm, int64_t k_norm, Act qkv_attn, float* qk_rstd,
                             const BatchShape& batch) {
  const GptConfig& c = lc_;
  if (c.qk_layernorm)
    k::qk_rmsnorm_forward(F(qkv), W(q_norm), W(k_norm), F(qkv_attn), qk_rstd, batch.T, c.heads, c.query_groups,
                          c.kv_channels, c.norm_eps, c.zero_centered_gamma);
  if (c.positions == Positions::Rope)
    k::rope_forward_qkv(F(qkv_attn), rope_positions(batch), rope_, batch.T, c.heads, c.query_groups, c.kv_channels);
}

void CpuBackend::qkv_prepare_backward(Act dqkv, Act qkv, int64_t q_norm, int64_t k_norm, const float* qk_rstd,
                                      const BatchShape& batch) {
  const GptConfig& c = lc_;
  const int64_t D = c.kv_channels;
  if (c.positions == Positions::Rope)
    k::rope_backward_qkv(F(dqkv), rope_positions(batch), rope_, batch.T, c.heads, c.query_groups, D);
  if (!c.qk_layernorm) return;
  if (tp_size_ > 1) {
    // The replicated q/k norm weights serve every head: their gradient is this rank's heads'
    // share, summed over the group (this micro-batch's alone: the gradients hold earlier ones too).
    float* dqk = scratch(dqk_, 2 * D);
    std::fill(dqk, dqk + 2 * D, 0.0f);
    k::qk_rmsnorm_backward(F(dqkv), F(qkv), W(q_norm), W(k_norm), qk_rstd, F(dqkv), dqk, dqk + D, batch.T, c.heads,
                           c.query_groups, D, c.zero_centered_gamma);
    tp_->all_reduce_sum(dqk, static_cast<size_t>(2 * D));
    if (G(q_norm)) k::add_inplace(G(q_norm), dqk, D);
    if (G(k_norm)) k::add_inplace(G(k_norm), dqk + D, D);
  } else {
    k::qk_rmsnorm_backward(F(dqkv), F(qkv), W(q_norm), W(k_norm), qk_rstd, F(dqkv), G(q_norm), G(k_norm), batch.T,
                           c.heads, c.query_groups, D, c.zero_centered_gamma);
  }
}

const float* CpuBackend::attention_mask(const DropoutSpec& drop, const BatchShape& batch) {
  if (drop.p <= 0) return nullptr;
  const int64_t n = batch.b * lc_.heads * batch.s * batch.s * batch.cp_size;  // (keys: the whole sequence's)
  float* mask = scratch(mask_, n);
  for (int64_t i = 0; i < n; ++i) mask[i] = dropout_factor_host(drop, static_cast<uint64_t>(i));
  return mask;
}

void CpuBackend::core_attention(int64_t layer, Act qkv_attn, Act ctx, const BatchShape& batch,
                                const DropoutSpec& drop) {
  const GptConfig& c = lc_;
  std::vector<float>& probs = probs_.at(static_cast<size_t>(layer));
  if (batch.cp_size > 1) {  // this rank's queries against the whole sequences' keys
    const int64_t row = c.qkv_width(), S = batch.s * batch.cp_size;
    float* full = scratch(cp_full_, batch.b * S * row);
    cp_gather_rows(F(qkv_attn), full, batch, row);
    probs.resize(static_cast<size_t>(batch.b * c.heads * batch.s * S));
    k::context_parallel_attention_forward(F(qkv_attn), full, F(ctx), probs.data(), batch.b, batch.s, S, c.heads,
                                          c.query_groups, c.kv_channels,
                                          1.0f / std::sqrt(static_cast<float>(c.kv_channels)), cp_positions(batch),
                                          attention_mask(drop, batch), batch.key_start);
    return;
  }
  probs.resize(static_cast<size_t>(batch.b * c.heads * batch.s * batch.s));
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.kv_channels));
  k::attention_forward(F(qkv_attn), F(ctx), probs.data(), batch.b, batch.s, c.heads, c.query_groups, c.kv_channels,
                       scale, attention_mask(drop, batch), batch.key_start);
}

void CpuBackend::core_attention_backward(int64_t layer, Act qkv_attn, Act dctx, Act dqkv, const BatchShape& batch,
                                         const DropoutSpec& drop) {
  const GptConfig& c = lc_;
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.kv_channels));
  if (batch.cp_size > 1) {
    // The keys' and values' gradients from every rank's queries, summed; this rank keeps its rows.
    const int64_t row = c.qkv_width(), S = batch.s * batch.cp_size;
    float* full = scratch(cp_full_, batch.b * S * row);
    float* dfull = scratch(cp_dfull_, batch.b * S * row);
    cp_gather_rows(F(qkv_attn), full, batch, row);
    const int32_t* pos = cp_positions(batch);
    k::context_parallel_attention_backward(F(qkv_attn), full, probs_.at(static_cast<size_t>(layer)).data(), F(dctx),
                                           F(dqkv), dfull, batch.b, batch.s, S, c.heads, c.query_groups,
                                           c.kv_channels, scale, pos, attention_mask(drop, batch), batch.key_start);
    cp_->all_reduce_sum(dfull, static_cast<size_t>(batch.b * S * row));
    for (int64_t t = 0; t < batch.T; ++t)
      k::add_inplace(F(dqkv) + t * row, dfull + ((t / batch.s) * S + pos[t]) * row, row);
    return;
  }
  k::attention_backward(F(qkv_attn), probs_.at(static_cast<size_t>(layer)).data(), F(dctx), F(dqkv), batch.b, batch.s,
                        c.heads, c.query_groups, c.kv_channels, scale, attention_mask(drop, batch), batch.key_start);
}

void CpuBackend::mla_prepare(Act q, Act kv, Act k_pe, int64_t k_pe_ld, Act query, Act key, Act value,
                             const BatchShape& batch) {
  const MlaSpec& m = *lc_.mla;
  k::mla_qkv_forward(F(q), F(kv), F(k_pe), k_pe_ld, rope_positions(batch), rope_, F(query), F(key), F(value), batch.T,
                     lc_.heads, m.qk_head_dim, m.qk_pos_emb_head_dim, m.v_head_dim);
}

void CpuBackend::mla_prepare_backward(Act dquery, Act dkey, Act dvalue, Act dq, Act dkv, Act dk_pe, int64_t dk_pe_ld,
                                      const BatchShape& batch) {
  const MlaSpec& m = *lc_.mla;
  k::mla_qkv_backward(F(dquery), F(dkey), F(dvalue), rope_positions(batch), rope_, F(dq), F(dkv), F(dk_pe), dk_pe_ld,
                      batch.T, lc_.heads, m.qk_head_dim, m.qk_pos_emb_head_dim, m.v_head_dim);
}

void CpuBackend::separate_core_attention(int64_t layer, Act q, Act k, Act v, Act ctx, int64_t dqk, int64_t dv,
                                         float scale, const BatchShape& batch, const DropoutSpec& drop) {
  std::vector<float>& probs = probs_.at(static_cast<size_t>(layer));
  if (batch.cp_size > 1) {  // this rank's queries against the whole sequences' keys and values
    const int64_t H = lc_.heads, S = batch.s * batch.cp_size;
    float* k_full = scratch(cp_full_, batch.b * S * H * (dqk + dv));
    float* v_full = k_full + batch.b * S * H * dqk;
    cp_gather_rows(F(k), k_full, batch, H * dqk);
    cp_gather_rows(F(v), v_full, batch, H * dv);
    probs.resize(static_cast<size_t>(batch.b * H * batch.s * S));
    k::context_parallel_separate_attention_forward(F(q), k_full, v_full, F(ctx), probs.data(), batch.b, batch.s, S, H,
                                                   dqk, dv, scale, cp_positions(batch), attention_mask(drop, batch),
                                                   batch.key_start);
    return;
  }
  probs.resize(static_cast<size_t>(batch.b * lc_.heads * batch.s * batch.s));
  k::separate_attention_forward(F(q), F(k), F(v), F(ctx), probs.data(), batch.b, batch.s, lc_.heads, dqk, dv, scale,
                                attention_mask(drop, batch), batch.key_start);
}

void CpuBackend::separate_core_attention_backward(int64_t layer, Act q, Act k, Act v, Act dctx, Act dquery, Act dkey,
                                                  Act dvalue, int64_t dqk, int64_t dv, float scale,
                                                  const BatchShape& batch, const DropoutSpec& drop) {
  if (batch.cp_size > 1) {
    // The keys' and values' gradients from every rank's queries, summed; this rank keeps its rows.
    const int64_t H = lc_.heads, S = batch.s * batch.cp_size, kw = H * dqk, vw = H * dv;
    float* k_full = scratch(cp_full_, batch.b * S * (kw + vw));
    float* v_full = k_full + batch.b * S * kw;
    float* dk_full = scratch(cp_dfull_, batch.b * S * (kw + vw));
    float* dv_full = dk_full + batch.b * S * kw;
    cp_gather_rows(F(k), k_full, batch, kw);
    cp_gather_rows(F(v), v_full, batch, vw);
    const int32_t* pos = cp_positions(batch);
    k::context_parallel_separate_attention_backward(F(q), k_full, v_full, probs_.at(static_cast<size_t>(layer)).data(),
                                                    F(dctx), F(dquery), dk_full, dv_full, batch.b, batch.s, S, H, dqk,
                                                    dv, scale, pos, attention_mask(drop, batch), batch.key_start);
    cp_->all_reduce_sum(dk_full, static_cast<size_t>(batch.b * S * (kw + vw)));
    for (int64_t t = 0; t < batch.T; ++t) {
      const int64_t full_row = (t / batch.s) * S + pos[t];
      std::copy(dk_full + full_row * kw, dk_full + (full_row + 1) * kw, F(dkey) + t * kw);
      std::copy(dv_full + full_row * vw, dv_full + (full_row + 1) * vw, F(dvalue) + t * vw);
    }
    return;
  }
  k::separate_attention_backward(F(q), F(k), F(v), probs_.at(static_cast<size_t>(layer)).data(), F(dctx), F(dquery),
                                 F(dkey), F(dvalue), batch.b, batch.s, lc_.heads, dqk, dv, scale,
                                 attention_mask(drop, batch), batch.key_start);
}

void CpuBackend::moe_layer(int64_t layer, Act x, Act y, const BatchShape& batch, MoePass pass,
                           uint64_t random_logits_key, Act residual) {
  if (pass == MoePass::Recompute)  // (the CPU keeps every activation: model/gpt_model.cpp)
    throw Error("CpuBackend: an MoE layer's recomputation is not built on the CPU");
  moe_->forward(layer, w_, F(x), F(y), batch, pass == MoePass::Training, random_logits_key);
  if (residual.p) k::add_inplace(F(y), F(residual), batch.T * lc_.hidden);
}

void CpuBackend::moe_layer_backward(int64_t layer, Act x, Act dy, Act dx, const BatchShape& batch,
                                    float aux_loss_scale) {
  moe_->backward(layer, w_, g_, F(x), F(dy), F(dx), batch.T, aux_loss_scale);
}

void CpuBackend::cross_entropy(Act logits, const int64_t* labels, float* losses, float* stats, int64_t T,
                               tp::Shard vocab, const float* dloss) {
  if (tp_size_ > 1)
    tp::vocab_parallel_cross_entropy_forward(F(logits), labels, losses, stats, T, vocab, tp_);
  else
    k::cross_entropy_forward(F(logits), labels, losses, stats, T, vocab.size);
  if (dloss) cross_entropy_backward(logits, labels, stats, dloss, T, vocab);
}

void CpuBackend::cross_entropy_backward(Act logits, const int64_t* labels, const float* stats, const float* dloss,
                                        int64_t T, tp::Shard vocab) {
  if (tp_size_ > 1)
    tp::vocab_parallel_cross_entropy_backward(F(logits), labels, stats, dloss, T, vocab);
  else
    k::cross_entropy_backward(F(logits), labels, stats, dloss, T, vocab.size);
}

void CpuBackend::tp_all_reduce(Act x, int64_t n) {
  if (tp_) tp_->all_reduce_sum(F(x), static_cast<size_t>(n));
}

void CpuBackend::sp_gather(Act local, Act full, const BatchShape& batch, int64_t h) {
  tp::sequence_gather(F(local), F(full), batch.b, batch.s, h, tp_);
}

void CpuBackend::sp_reduce_scatter(Act full, Act local, const BatchShape& batch, int64_t h) {
  tp::sequence_reduce_scatter(F(full), F(local), batch.b, batch.s, h, tp_);
}

void CpuBackend::sp_slice(Act full, Act local, const BatchShape& batch, int64_t h) {
  tp::sequence_slice(F(full), F(local), batch.b, batch.s, h, tp_rank_, tp_size_);
}

void CpuBackend::fp8_layer(int64_t layer, Fp8Pass pass) {
  if (fp8_) fp8_->set_layer(lc_.fp8->layer_in_fp8(layer, lc_.num_layers), pass);
}

void CpuBackend::fp8_pass_done(Fp8Pass pass) {
  if (fp8_) fp8_->pass_done(pass);
}

void CpuBackend::fp8_new_weights() {
  if (fp8_) fp8_->new_weights();
}

}  // namespace laoyao::model
