// GPTModel: the embedding, the transformer block's layers, the final norm, the output layer and
// the loss (model/mcore/gpt_model.hpp).
#include "model/mcore/gpt_model.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "model/mcore/parallel_linear.hpp"

namespace laoyao::model::mcore {

void Scratch::carve(ActivationCarver& c, const ModuleContext& m, int64_t T, int64_t rows) {
  const GptConfig& lc = m.local;
  const int64_t h = lc.hidden;
  bool any_moe = false;
  for (int64_t l = 0; l < lc.num_layers; ++l) any_moe = any_moe || lc.is_moe_layer(l);
  const int64_t wide = std::max({lc.qkv_width(), lc.fc1_width(), lc.heads * lc.kv_channels, h});
  dx = c.act(rows * h);
  dbranch = c.act(T * h);
  dnorm = c.act(T * h);
  dwide = c.act(T * wide);
  dctx = c.act(T * lc.heads * lc.kv_channels);
  const bool lora = lc.lora.has_value();
  branch = c.act(m.tensor_parallel() || any_moe || lora ? T * h : 0);
  local = c.act(m.sp() ? rows * h : 0);
  lora_in = c.act(lora && lc.lora->dropout > 0 ? T * std::max({h, lc.heads * lc.kv_channels, lc.ffn}) : 0);
  lora_da = c.act(lora ? T * lc.lora->dim : 0);
  dg = c.act(lora && lc.lora->fc2 ? T * lc.ffn : 0);
  const int64_t n = lc.mla ? lc.heads : 0;  // (no multi-latent attention: nothing carved)
  const MlaSpec mla = lc.mla.value_or(MlaSpec{});
  const int64_t latent = std::max(mla.q_lora_rank, mla.kv_lora_rank);
  mla_dquery = c.act(T * n * mla.q_head_dim());
  mla_dkey = c.act(T * n * mla.q_head_dim());
  mla_dvalue = c.act(T * n * mla.v_head_dim);
  mla_dq = c.act(T * n * mla.q_head_dim());
  mla_dkv = c.act(T * n * (mla.qk_head_dim + mla.v_head_dim));
  mla_dkv_down = c.act(n ? T * (mla.kv_lora_rank + mla.qk_pos_emb_head_dim) : 0);
  mla_dlatent = c.act(n ? T * latent : 0);
  mla_dlatent_normed = c.act(n ? T * latent : 0);
  mla_dx = c.act(n ? T * h : 0);
}

TransformerBlock::TransformerBlock(const ModuleContext& m) : m_(m) {
  const GptConfig& lc = m.local;
  const int64_t L = lc.num_layers;
  layers_.reserve(static_cast<size_t>(L));
  for (int64_t l = 0; l < L; ++l) layers_.emplace_back(m, l);
  // Megatron's full recomputation: uniform chunks of n layers over the whole block, or block: each
  // of the first n layers alone.
  chunk_start_.assign(static_cast<size_t>(L), -1);
  chunk_end_.assign(static_cast<size_t>(L), -1);
  if (!m.recompute || lc.recompute == Recompute::None || lc.recompute_num_layers <= 0) return;
  const bool block = lc.recompute == Recompute::Block;
  const int64_t n = lc.recompute_num_layers, covered = block ? std::min(n, L) : L, chunk = block ? 1 : n;
  for (int64_t l = 0; l < covered; ++l) {
    chunk_start_[l] = l / chunk * chunk;
    chunk_end_[l] = std::min(chunk_start_[l] + chunk, covered) - 1;
  }
}

void TransformerBlock::carve(ActivationCarver& c, int64_t T, int64_t rows) {
  for (size_t l = 0; l < layers_.size(); ++l) {
    const int64_t start = chunk_start_[l];
    if (start <= 0)  // its own, or in the first chunk, whose activations the others share
      layers_[l].carve(c, T, rows);
    else
      layers_[l].share_activations(c, layers_[l - static_cast<size_t>(start)], start == static_cast<int64_t>(l), rows);
  }
  x_final_ = c.act(rows * m_.local.hidden);
  xf_ = c.act(T * m_.local.hidden);
  xf_mean_ = c.f32(rows), xf_rstd_ = c.f32(rows);
}

void TransformerBlock::forward(const Step& st, Scratch& w) {
  Backend& be = m_.backend;
  const Fp8Pass pass = st.train_step ? Fp8Pass::TrainingForward : Fp8Pass::EvaluationForward;
  for (size_t l = 0; l < layers_.size(); ++l) {
    be.fp8_layer(static_cast<int64_t>(l), pass);
    layers_[l].forward(st, l + 1 < layers_.size() ? layers_[l + 1].input() : x_final_, w);
  }
  be.fp8_layer(-1, pass);  // (the pass is done after the MTP block: GPTModel::forward)
  const GptParameterLayout& P = m_.params;
  norm_whole_sequence(m_, st, x_final_, P.final_w, P.final_b, xf_, xf_mean_, xf_rstd_, w);
}

void TransformerBlock::backward(const Step& st, Scratch& w, float moe_aux_loss_scale) {
  const GptParameterLayout& P = m_.params;
  m_.backend.norm_backward(sum_input_grad(m_, st, w), x_final_, P.final_w, P.final_b, xf_mean_, xf_rstd_, w.dx,
                           st.batch.rows, m_.local.hidden, false, m_.fc2_bias_in_norm(static_cast<int64_t>(layers_.size()) - 1));
  if (on_backward_done) on_backward_done(-1);
  Step again = st;
  again.recomputing = true;
  Backend& be = m_.backend;
  for (size_t l = layers_.size(); l-- > 0;) {
    if (chunk_end_[l] == static_cast<int64_t>(l))  // entering a chunk from its end: rebuild its activations
      for (size_t j = static_cast<size_t>(chunk_start_[l]); j <= l; ++j) {
        be.fp8_layer(static_cast<int64_t>(j), Fp8Pass::Recompute);
        layers_[j].forward(again, j + 1 < layers_.size() ? layers_[j + 1].input() : x_final_, w);
      }
    be.fp8_layer(static_cast<int64_t>(l), Fp8Pass::Backward);
    layers_[l].backward(st, w, moe_aux_loss_scale);
    if (on_backward_done) on_backward_done(static_cast<int64_t>(l));
  }
  be.fp8_layer(-1, Fp8Pass::Backward);
  be.fp8_pass_done(Fp8Pass::Backward);
}

GPTModel::GPTModel(const GptConfig& whole, const GptConfig& local, const GptParameterLayout& params,
                   TensorParallel tp, Backend& backend, bool recompute)
    : ctx_{whole, local, params, tp, backend, recompute}, decoder_(ctx_), mtp_(ctx_) {}

void GPTModel::allocate(int64_t b, int64_t s) {
  if (b == b_ && s == s_) return;
  const int64_t T = b * s, h = ctx_.local.hidden;
  if (ctx_.sp() && s % ctx_.tp.size != 0)
    throw UsageError("sequence parallelism splits each sequence over the tensor-parallel ranks: the sequence "
                     "length (" + std::to_string(s) + ") must be divisible by the tensor-parallel size (" +
                     std::to_string(ctx_.tp.size) + ")");
  const int64_t R = rows(T);
  auto carve = [&](ActivationCarver& c) {
    emb_full_ = c.act(ctx_.sp() ? T * h : 0);
    decoder_.carve(c, T, R);
    mtp_.carve(c, T);
    logits_ = c.act(T * ctx_.local.vocab);
    ce_stats_ = c.f32(2 * T);
    w_.carve(c, ctx_, T, R);
  };
  ActivationCarver measure(ctx_.backend.activation_bytes());
  carve(measure);
  ActivationCarver cut(ctx_.backend.activation_bytes(),
                       static_cast<char*>(ctx_.backend.reserve_activations(measure.used())));
  carve(cut);
  b_ = b, s_ = s;
  activation_bytes_ = measure.used();
}

void GPTModel::embedding_forward(const Step& st, Act out) {
  // LanguageModelEmbedding: word (vocabulary-parallel: each rank its rows, summed) + learned
  // positions, then the embedding dropout. Under sequence parallelism it is built whole and each
  // rank keeps its share of the sequence (Megatron's scatter to the sequence-parallel region).
  Backend& be = ctx_.backend;
  const int64_t T = st.batch.T, h = ctx_.local.hidden;
  const Act x = ctx_.sp() ? emb_full_ : out;
  be.embedding(st.tokens, ctx_.params.word_emb, x, T, h, vocab(), false);
  if (ctx_.tensor_parallel()) be.tp_all_reduce(x, T * h);
  if (ctx_.params.pos_emb >= 0) {
    if (!st.positions) throw Error("GPTModel: learned positions need position ids");
    be.embedding(st.positions, ctx_.params.pos_emb, x, T, h, {0, ctx_.local.max_positions}, true);
  }
  be.dropout(x, x, T * h, context_parallel_rows(st.dropout(ctx_.local.hidden_dropout, "dropout.embedding"), st, h));
  if (ctx_.sp()) be.sp_slice(x, out, st.batch, h);
}

void GPTModel::embedding_backward(const Step& st, Act dx) {
  Backend& be = ctx_.backend;
  const int64_t T = st.batch.T, h = ctx_.local.hidden;
  Act d = dx;
  if (ctx_.sp()) {  // the embedding was scattered: its gradient is gathered
    be.sp_gather(dx, emb_full_, st.batch, h);
    d = emb_full_;
  }
  be.dropout(d, d, T * h, context_parallel_rows(st.dropout(ctx_.local.hidden_dropout, "dropout.embedding"), st, h));
  be.embedding_backward(st.tokens, d, ctx_.params.word_emb, T, h, vocab());
  if (ctx_.params.pos_emb >= 0)
    be.embedding_backward(st.positions, d, ctx_.params.pos_emb, T, h, {0, ctx_.local.max_positions});
}

void GPTModel::forward(const Step& st, float* losses, const float* dloss) {
  Backend& be = ctx_.backend;
  const GptConfig& lc = ctx_.local;
  const int64_t T = st.batch.T;
  if (st.is_first_microbatch) be.fp8_new_weights();
  embedding_forward(st, decoder_.input());
  decoder_.forward(st, w_);
  be.linear(decoder_.output(), ctx_.params.output_w, -1, logits_, T, lc.hidden, lc.vocab);
  be.cross_entropy(logits_, st.labels, losses, ce_stats_, T, vocab(), dloss);
  loss_grad_taken_ = dloss != nullptr;
  mtp_.forward(st, decoder_.output(), w_);
  be.fp8_pass_done(st.train_step ? Fp8Pass::TrainingForward : Fp8Pass::EvaluationForward);
}

void GPTModel::backward(const Step& st, const float* dloss, float moe_aux_loss_scale) {
  Backend& be = ctx_.backend;
  const GptConfig& lc = ctx_.local;
  const GptParameterLayout& P = ctx_.params;
  const int64_t T = st.batch.T;
  // The loss and the output layer (column-parallel; tied: its gradient lands in the word embedding).
  if (!loss_grad_taken_) be.cross_entropy_backward(logits_, st.labels, ce_stats_, dloss, T, vocab());
  loss_grad_taken_ = false;
  be.linear_backward(decoder_.output(), P.output_w, -1, logits_, w_.dnorm, T, lc.hidden, lc.vocab);
  mtp_.backward(st, decoder_.output(), w_.dnorm, w_, moe_aux_loss_scale);
  decoder_.backward(st, w_, moe_aux_loss_scale);
  embedding_backward(st, w_.dx);
}

}  // namespace laoyao::model::mcore
