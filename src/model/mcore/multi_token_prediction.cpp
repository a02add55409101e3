// MultiTokenPredictionBlock (model/mcore/gpt_model.hpp): Megatron-Core's multi-token prediction
// layers (MultiTokenPredictionLayer: _get_embeddings, _concat_embeddings, the transformer layer,
// _postprocess; process_mtp_loss for the logits and losses).
#include <string>

#include "core/error.hpp"
#include "model/mcore/gpt_model.hpp"
#include "model/mcore/parallel_linear.hpp"

namespace laoyao::model::mcore {

namespace {

std::string embedding_site(size_t k) { return "dropout.mtp" + std::to_string(k) + ".embedding"; }

}  // namespace

MultiTokenPredictionBlock::MultiTokenPredictionBlock(const ModuleContext& m) : m_(m) {
  const int64_t L = m.local.num_layers, D = m.local.mtp_num_layers;
  layers_.reserve(static_cast<size_t>(D));
  for (int64_t k = 0; k < D; ++k) layers_.emplace_back(m, L + k);
  acts_.resize(static_cast<size_t>(D));
}

Act MultiTokenPredictionBlock::half(Act a) const {
  return Act{static_cast<char*>(a.p) +
             m_.local.hidden * static_cast<int64_t>(m_.backend.activation_bytes())};
}

void MultiTokenPredictionBlock::carve(ActivationCarver& c, int64_t T) {
  if (layers_.empty()) return;
  const int64_t h = m_.local.hidden, rows = m_.sp() ? T / m_.tp.size : T;
  for (size_t k = 0; k < layers_.size(); ++k) {
    Layer& a = acts_[k];
    a.e = c.act(T * h), a.en = c.act(T * h), a.hn = c.act(T * h), a.cat = c.act(T * 2 * h);
    a.en_mean = c.f32(T), a.en_rstd = c.f32(T), a.hn_mean = c.f32(T), a.hn_rstd = c.f32(T);
    layers_[k].carve(c, T, rows);
    a.x = m_.sp() ? c.act(T * h) : layers_[k].input();
    a.y = c.act(rows * h), a.h = c.act(T * h), a.h_mean = c.f32(rows), a.h_rstd = c.f32(rows);
    a.logits = c.act(T * m_.local.vocab);
    a.ce_stats = c.f32(2 * T);
  }
  dh_ = c.act(T * h), carry_ = c.act(T * h), dcat_ = c.act(T * 2 * h), dh0_ = c.act(T * h);
  den_ = c.act(T * h), dhn_ = c.act(T * h), de_ = c.act(T * h);
  dx_ = c.act(m_.sp() ? T * h : 0);
}

void MultiTokenPredictionBlock::forward(const Step& st, Act h0, Scratch& w) {
  if (layers_.empty()) return;
  if (st.mtp.size() != layers_.size()) throw Error("MultiTokenPredictionBlock: the step has no inputs for its layers");
  Backend& be = m_.backend;
  const GptConfig& lc = m_.local;
  const GptParameterLayout& P = m_.params;
  const int64_t T = st.batch.T, h = lc.hidden;
  const Fp8Pass fp8_pass = st.train_step ? Fp8Pass::TrainingForward : Fp8Pass::EvaluationForward;
  Act prev = h0;
  for (size_t k = 0; k < layers_.size(); ++k) {
    const Step::MtpInputs& in = st.mtp[k];
    Layer& a = acts_[k];
    // GPTModel's embedding of the rolled ids (and positions), with its dropout; whole on every rank.
    be.embedding(in.tokens, P.word_emb, a.e, T, h, vocab(), false);
    if (m_.tensor_parallel()) be.tp_all_reduce(a.e, T * h);  // (each rank its vocabulary rows)
    if (P.pos_emb >= 0) be.embedding(in.positions, P.pos_emb, a.e, T, h, {0, lc.max_positions}, true);
    be.dropout(a.e, a.e, T * h, st.dropout(lc.hidden_dropout, embedding_site(k)));
    // eh_proj([enorm(embedding), hnorm(h)]) into the transformer layer's input.
    be.norm(a.e, M(k).enorm_w, M(k).enorm_b, a.en, a.en_mean, a.en_rstd, T, h);
    be.norm(prev, M(k).hnorm_w, M(k).hnorm_b, a.hn, a.hn_mean, a.hn_rstd, T, h);
    be.copy_columns(a.en, h, a.cat, 2 * h, T, h);
    be.copy_columns(a.hn, h, half(a.cat), 2 * h, T, h);
    be.fp8_layer(lc.num_layers + static_cast<int64_t>(k), fp8_pass);  // (eh_proj and the layer: FP8 where asked)
    be.linear(a.cat, M(k).eh_proj, -1, a.x, T, 2 * h, h);
    if (m_.sp()) be.sp_slice(a.x, layers_[k].input(), st.batch, h);  // (the layer runs this rank's rows)
    layers_[k].forward(st, a.y, w);
    be.fp8_layer(-1, fp8_pass);  // (the shared output layer: as the main one)
    norm_whole_sequence(m_, st, a.y, M(k).final_w, M(k).final_b, a.h, a.h_mean, a.h_rstd, w);
    be.linear(a.h, P.output_w, -1, a.logits, T, h, lc.vocab);
    be.cross_entropy(a.logits, in.labels, in.losses, a.ce_stats, T, vocab(), nullptr);
    prev = a.h;
  }
}

void MultiTokenPredictionBlock::backward(const Step& st, Act h0, Act dh0, Scratch& w, float moe_aux_loss_scale) {
  if (layers_.empty()) return;
  Backend& be = m_.backend;
  const GptConfig& lc = m_.local;
  const GptParameterLayout& P = m_.params;
  const int64_t T = st.batch.T, h = lc.hidden;
  be.copy_columns(dh0, h, dh0_, h, T, h);  // (the layers' backward uses the scratch dh0 is in)
  for (size_t k = layers_.size(); k-- > 0;) {
    const Step::MtpInputs& in = st.mtp[k];
    if (!in.dloss) throw Error("MultiTokenPredictionBlock: a backward without its losses' weights");
    Layer& a = acts_[k];
    // The gradient at h_k (whole): its own loss's (the vocabulary shards' parts summed), plus the
    // next layer's through its hnorm (carry_).
    be.cross_entropy_backward(a.logits, in.labels, a.ce_stats, in.dloss, T, vocab());
    be.linear_backward(a.h, P.output_w, -1, a.logits, dh_, T, h, lc.vocab);
    if (m_.tensor_parallel()) be.tp_all_reduce(dh_, T * h);
    if (k + 1 < layers_.size()) be.bias_dropout_add(carry_, -1, dh_, dh_, T, h, DropoutSpec{});
    // final_layernorm ran on this rank's rows (sequence parallel: its share of the whole gradient).
    const int64_t rows = st.batch.rows;
    Act dy = dh_;
    if (m_.sp()) be.sp_slice(dh_, w.local, st.batch, h), dy = w.local;
    be.norm_backward(dy, a.y, M(k).final_w, M(k).final_b, a.h_mean, a.h_rstd, w.dx, rows, h, false, -1);
    be.fp8_layer(lc.num_layers + static_cast<int64_t>(k), Fp8Pass::Backward);
    layers_[k].backward(st, w, moe_aux_loss_scale);  // w.dx: now the gradient at eh_proj's output
    Act dx = w.dx;
    if (m_.sp()) be.sp_gather(w.dx, dx_, st.batch, h), dx = dx_;
    be.linear_backward(a.cat, M(k).eh_proj, -1, dx, dcat_, T, 2 * h, h);
    be.fp8_layer(-1, Fp8Pass::Backward);
    be.copy_columns(dcat_, 2 * h, den_, h, T, h);
    be.copy_columns(half(dcat_), 2 * h, dhn_, h, T, h);
    be.norm_backward(den_, a.e, M(k).enorm_w, M(k).enorm_b, a.en_mean, a.en_rstd, de_, T, h, false, -1);
    be.dropout(de_, de_, T * h, st.dropout(lc.hidden_dropout, embedding_site(k)));
    be.embedding_backward(in.tokens, de_, P.word_emb, T, h, vocab());
    if (P.pos_emb >= 0) be.embedding_backward(in.positions, de_, P.pos_emb, T, h, {0, lc.max_positions});
    // The gradient at the previous output (whole, the same on every rank): the previous layer's
    // carry, or the decoder's.
    const Act prev = k > 0 ? acts_[k - 1].h : h0;
    be.norm_backward(dhn_, prev, M(k).hnorm_w, M(k).hnorm_b, a.hn_mean, a.hn_rstd, carry_, T, h, false, -1);
  }
  // dh0 holds this rank's part of the decoder output's gradient, which the decoder sums over the
  // tensor-parallel group: the whole MTP part goes to one rank's.
  be.copy_columns(dh0_, h, dh0, h, T, h);
  if (m_.tp.rank == 0) be.bias_dropout_add(carry_, -1, dh0, dh0, T, h, DropoutSpec{});
}

}  // namespace laoyao::model::mcore
