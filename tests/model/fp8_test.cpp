// FP8 linear layers on the CPU backend (GptConfig::fp8): the per-linear scaling state as Transformer
// Engine keeps it under Megatron's recipes (when amaxes are recorded, when scales move, when the
// weight is cast), and the model: its transformer layers' linears in FP8, the rest untouched, its
// losses and gradients near the high-precision model's, its first and last layers kept in high
// precision where asked.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include "core/error.hpp"
#include "core/fp8_scaling.hpp"
#include "dist/process_group.hpp"
#include "model/cpu/fp8_linears_cpu.hpp"
#include "model/gpt_model.hpp"

using namespace laoyao;
using namespace laoyao::model;

namespace {

std::vector<float> randn(int64_t n, std::mt19937& rng, float stddev) {
  std::normal_distribution<float> d(0.0f, stddev);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

std::vector<float> fp8_values(const std::vector<float>& x, float scale, Fp8Format f) {
  std::vector<float> q(x.size());
  fp8_quantize_values(x.data(), static_cast<int64_t>(x.size()), scale, f, q.data());
  return q;
}

float amax(const std::vector<float>& x) { return fp8_amax(x.data(), static_cast<int64_t>(x.size())); }

std::vector<float> as_vector(const kernels::cpu::Fp8Operand& o, size_t n) { return {o.q, o.q + n}; }

Fp8Spec delayed(int64_t history = 2, AmaxComputeAlgo algo = AmaxComputeAlgo::MostRecent) {
  Fp8Spec s;
  s.recipe = Fp8ScalingRecipe::Delayed, s.amax_history_len = history, s.amax_compute_algo = algo;
  return s;
}

}  // namespace

// Delayed scaling, one linear over two steps of two micro-batches: the first casts use scale 1;
// a training forward's end moves the input's and weight's scales to E4M3's max over their amaxes,
// a backward's end the output gradient's to E5M2's; the weight is cast once a step (its amax slot
// then stays empty and its scale where it was); the backward casts the input with the forward's
// scale although the scale has moved since.
TEST(Fp8Linears, DelayedScalingMovesAfterEachTrainingPass) {
  std::mt19937 rng(1);
  const int64_t n = 64, w = 7;
  CpuFp8Linears f(delayed());
  const auto x1 = randn(n, rng, 3.0f), x2 = randn(n, rng, 5.0f), W = randn(n, rng, 0.1f), dy = randn(n, rng, 1e-3f);

  f.new_weights();
  f.set_layer(true, Fp8Pass::TrainingForward);
  EXPECT_EQ(f.input(w, x1.data(), 1, n).scale_inv, 1.0f);
  const kernels::cpu::Fp8Operand w1 = f.weight(w, W.data(), 1, n);
  EXPECT_EQ(w1.scale_inv, 1.0f);
  EXPECT_EQ(as_vector(w1, n), fp8_values(W, 1.0f, Fp8Format::E4M3));
  f.pass_done(Fp8Pass::TrainingForward);
  const DelayedScaling& fwd = *f.forward_scaling(w);
  EXPECT_EQ(fwd.scale(0), 448.0f / amax(x1));
  EXPECT_EQ(fwd.scale(1), 448.0f / amax(W));

  f.set_layer(true, Fp8Pass::Backward);
  const kernels::cpu::Fp8Operand saved = f.saved_input(w, x1.data(), 1, n);
  EXPECT_EQ(saved.scale_inv, 1.0f);  // the forward's scale, not the moved one
  EXPECT_EQ(as_vector(saved, n), fp8_values(x1, 1.0f, Fp8Format::E4M3));
  const kernels::cpu::Fp8Operand g = f.output_grad(w, dy.data(), 1, n).dgrad;
  EXPECT_EQ(as_vector(g, n), fp8_values(dy, 1.0f, Fp8Format::E5M2));
  f.pass_done(Fp8Pass::Backward);
  EXPECT_EQ(f.backward_scaling(w)->scale(0), 57344.0f / amax(dy));

  // The step's second micro-batch: the weight's copy is reused (scale 1, no amax recorded).
  f.set_layer(true, Fp8Pass::TrainingForward);
  const kernels::cpu::Fp8Operand in2 = f.input(w, x2.data(), 1, n);
  EXPECT_EQ(in2.scale_inv, 1.0f / (448.0f / amax(x1)));
  EXPECT_EQ(as_vector(in2, n), fp8_values(x2, 448.0f / amax(x1), Fp8Format::E4M3));
  EXPECT_EQ(f.weight(w, W.data(), 1, n).scale_inv, 1.0f);
  f.pass_done(Fp8Pass::TrainingForward);
  EXPECT_EQ(fwd.scale(0), 448.0f / amax(x2));
  EXPECT_EQ(fwd.scale(1), 448.0f / amax(W));  // unchanged: no cast, no amax
  EXPECT_EQ(fwd.history(1, 1), amax(W));      // and no roll of its history

  // The next step casts the weight again, with the scale its last amax gave.
  f.new_weights();
  const kernels::cpu::Fp8Operand w2 = f.weight(w, W.data(), 1, n);
  EXPECT_EQ(w2.scale_inv, 1.0f / (448.0f / amax(W)));
  EXPECT_EQ(as_vector(w2, n), fp8_values(W, 448.0f / amax(W), Fp8Format::E4M3));
}

namespace {

// The other data-parallel rank, played by a fixed array: all_reduce_max maxes with it (the count
// check's two floats with the same count, so the ranks agree).
class OtherRankGroup final : public dist::ProcessGroup {
 public:
  explicit OtherRankGroup(std::vector<float> other) : other_(std::move(other)) {}
  int rank() const override { return 0; }
  int size() const override { return 2; }
  void all_reduce_sum(float*, size_t) override { throw Error("no sum expected"); }
  void all_reduce_sum(double*, size_t) override { throw Error("no sum expected"); }
  void all_reduce_max(float* data, size_t n) override {
    if (n == 2 && data[0] == -data[1]) return;  // the count check: the other rank holds as many
    ASSERT_EQ(n, other_.size());
    for (size_t i = 0; i < n; ++i) data[i] = std::max(data[i], other_[i]);
    ++reductions;
  }
  void barrier() override {}
  int reductions = 0;

 private:
  std::vector<float> other_;
};

}  // namespace

// Delayed scaling over data-parallel ranks: each training pass's amaxes are MAX-reduced over the
// group before the update (Megatron's amax reduction group), so a rank whose own amax is smaller
// takes the other rank's scale; an evaluation's pass reduces nothing.
TEST(Fp8Linears, DelayedScalingReducesAmaxesOverTheDataParallelRanks) {
  std::mt19937 rng(3);
  const int64_t n = 64, w1 = 5, w2 = 9;
  const auto x = randn(n, rng, 1.0f), W = randn(n, rng, 0.1f), dy = randn(n, rng, 1e-3f);
  // The other rank's amaxes, in the linears' (offset) order: w1's input and weight, w2's.
  OtherRankGroup fwd({10.0f, 0.0f, 0.5f, 7.0f});
  CpuFp8Linears f(delayed());
  f.set_amax_group(&fwd);
  f.new_weights();
  f.set_layer(true, Fp8Pass::TrainingForward);
  for (const int64_t w : {w1, w2}) f.input(w, x.data(), 1, n), f.weight(w, W.data(), 1, n);
  f.pass_done(Fp8Pass::TrainingForward);
  EXPECT_EQ(fwd.reductions, 1);
  EXPECT_EQ(f.forward_scaling(w1)->scale(0), 448.0f / 10.0f);        // the other rank's larger input
  EXPECT_EQ(f.forward_scaling(w1)->scale(1), 448.0f / amax(W));        // this rank's larger weight
  EXPECT_EQ(f.forward_scaling(w2)->scale(0), 448.0f / amax(x));        // this rank's larger input
  EXPECT_EQ(f.forward_scaling(w2)->scale(1), 448.0f / 7.0f);
  f.set_layer(true, Fp8Pass::EvaluationForward);
  f.input(w1, x.data(), 1, n);
  f.pass_done(Fp8Pass::EvaluationForward);
  EXPECT_EQ(fwd.reductions, 1);
  OtherRankGroup bwd({1.0f, 0.0f});  // the output gradients: w1's, w2's
  f.set_amax_group(&bwd);
  f.set_layer(true, Fp8Pass::Backward);
  for (const int64_t w : {w1, w2}) f.output_grad(w, dy.data(), 1, n);
  f.pass_done(Fp8Pass::Backward);
  EXPECT_EQ(f.backward_scaling(w1)->scale(0), 57344.0f / 1.0f);
  EXPECT_EQ(f.backward_scaling(w2)->scale(0), 57344.0f / amax(dy));
}

// An evaluation's casts record their amaxes but move no scale (TE under no_grad); the next training
// forward's update takes both passes' amaxes. A recomputed forward records nothing and casts with
// the scale of the forward it repeats.
TEST(Fp8Linears, EvaluationRecordsAndRecomputationRepeats) {
  std::mt19937 rng(2);
  const int64_t n = 32, w = 3;
  CpuFp8Linears f(delayed(3, AmaxComputeAlgo::Max));
  const auto big = randn(n, rng, 8.0f), small = randn(n, rng, 0.5f), W = randn(n, rng, 0.1f);
  f.set_layer(true, Fp8Pass::EvaluationForward);
  f.input(w, big.data(), 1, n);
  f.weight(w, W.data(), 1, n);
  f.pass_done(Fp8Pass::EvaluationForward);
  EXPECT_EQ(f.forward_scaling(w)->scale(0), 1.0f);
  EXPECT_EQ(f.forward_scaling(w)->history(0, 0), amax(big));

  f.set_layer(true, Fp8Pass::TrainingForward);
  f.input(w, small.data(), 1, n);
  f.pass_done(Fp8Pass::TrainingForward);
  EXPECT_EQ(f.forward_scaling(w)->scale(0), 448.0f / amax(big));

  f.set_layer(true, Fp8Pass::TrainingForward);
  const float used = f.input(w, small.data(), 1, n).scale_inv;
  f.set_layer(true, Fp8Pass::Recompute);
  const kernels::cpu::Fp8Operand again = f.input(w, big.data(), 1, n);
  EXPECT_EQ(again.scale_inv, used);
  EXPECT_EQ(f.forward_scaling(w)->history(0, 0), amax(small));  // the recomputation's amax not recorded
}

// Tensorwise (Float8CurrentScaling): each cast's own amax gives its scale; e4m3 casts the output
// gradient in E4M3.
TEST(Fp8Linears, TensorwiseCastsWithEachTensorsOwnScale) {
  std::mt19937 rng(3);
  const int64_t n = 48, w = 11;
  Fp8Spec s;
  s.recipe = Fp8ScalingRecipe::Tensorwise, s.formats = Fp8Formats::E4M3;
  CpuFp8Linears f(s);
  const auto x = randn(n, rng, 3.0f), W = randn(n, rng, 0.02f), dy = randn(n, rng, 1e-4f);
  f.set_layer(true, Fp8Pass::TrainingForward);
  const float sx = current_scaling_scale(amax(x), Fp8Format::E4M3);
  const kernels::cpu::Fp8Operand qx = f.input(w, x.data(), 1, n);
  EXPECT_EQ(qx.scale_inv, 1.0f / sx);
  EXPECT_EQ(as_vector(qx, n), fp8_values(x, sx, Fp8Format::E4M3));
  EXPECT_EQ(f.weight(w, W.data(), 1, n).scale_inv, 1.0f / current_scaling_scale(amax(W), Fp8Format::E4M3));
  f.set_layer(true, Fp8Pass::Backward);
  const float sg = current_scaling_scale(amax(dy), Fp8Format::E4M3);
  EXPECT_EQ(as_vector(f.output_grad(w, dy.data(), 1, n).dgrad, n), fp8_values(dy, sg, Fp8Format::E4M3));
  EXPECT_EQ(f.saved_input(w, x.data(), 1, n).scale_inv, 1.0f / sx);
}

// Blockwise (Float8BlockScaling, hybrid): the forward's input in 1 x 128 blocks along its features,
// the weight in 128 x 128 blocks made once a step, the backward's input in 128 x 1 blocks along the
// tokens, the output gradient both ways in E5M2; each operand already dequantized (scale_inv 1);
// no amax recorded, no scale moved by a pass.
TEST(Fp8Linears, BlockwiseCastsEachOperandInItsBlocks) {
  std::mt19937 rng(5);
  const int64_t T = 150, K = 200, N = 144, w = 13;
  Fp8Spec s;
  s.recipe = Fp8ScalingRecipe::Blockwise, s.formats = Fp8Formats::Hybrid;
  CpuFp8Linears f(s);
  auto x = randn(T * K, rng, 3.0f), dy = randn(T * N, rng, 1e-4f), W = randn(N * K, rng, 0.02f);
  // Tokens of magnitudes 2^0 .. 2^6 in x, 2^0 .. 2^36 in dy: blocks along the tokens span more than
  // the format's normal range (the scales being powers of two, only that sets the two directions'
  // values apart).
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t k = 0; k < K; ++k) x[size_t(t * K + k)] *= std::ldexp(1.0f, int(t % 7));
    for (int64_t n = 0; n < N; ++n) dy[size_t(t * N + n)] *= std::ldexp(1.0f, 6 * int(t % 7));
  }
  auto blocks = [](const std::vector<float>& v, int64_t rows, int64_t cols, int64_t br, int64_t bc, Fp8Format fmt) {
    std::vector<float> out(v.size());
    fp8_block_quantize_dequantized(v.data(), rows, cols, br, bc, fmt, true, out.data());
    return out;
  };
  auto values = [](kernels::cpu::Fp8Operand o, int64_t n) {
    EXPECT_EQ(o.scale_inv, 1.0f);
    return std::vector<float>(o.q, o.q + n);
  };
  f.new_weights();
  f.set_layer(true, Fp8Pass::TrainingForward);
  const auto want_x = blocks(x, T, K, 1, 128, Fp8Format::E4M3);
  EXPECT_EQ(values(f.input(w, x.data(), T, K), T * K), want_x);
  EXPECT_NE(want_x, blocks(x, T, K, 128, 1, Fp8Format::E4M3));  // (the two directions differ)
  const auto want_w = blocks(W, N, K, 128, 128, Fp8Format::E4M3);
  EXPECT_EQ(values(f.weight(w, W.data(), N, K), N * K), want_w);
  f.pass_done(Fp8Pass::TrainingForward);
  EXPECT_EQ(f.forward_scaling(w)->scale(0), 1.0f);
  EXPECT_EQ(f.forward_scaling(w)->history(0, 0), 0.0f);

  f.set_layer(true, Fp8Pass::Backward);
  EXPECT_EQ(values(f.saved_input(w, x.data(), T, K), T * K), blocks(x, T, K, 128, 1, Fp8Format::E4M3));
  const kernels::cpu::Fp8GradOperands g = f.output_grad(w, dy.data(), T, N);
  EXPECT_EQ(values(g.dgrad, T * N), blocks(dy, T, N, 1, 128, Fp8Format::E5M2));
  EXPECT_EQ(values(g.wgrad, T * N), blocks(dy, T, N, 128, 1, Fp8Format::E5M2));
  EXPECT_NE(values(g.dgrad, T * N), values(g.wgrad, T * N));
  f.pass_done(Fp8Pass::Backward);
  EXPECT_EQ(f.backward_scaling(w)->scale(0), 1.0f);

  // The step's weight copy stays until new_weights(), then the new values are cast.
  for (float& v : W) v *= 3.0f;
  f.set_layer(true, Fp8Pass::TrainingForward);
  EXPECT_EQ(values(f.weight(w, W.data(), N, K), N * K), want_w);
  f.new_weights();
  EXPECT_EQ(values(f.weight(w, W.data(), N, K), N * K), blocks(W, N, K, 128, 128, Fp8Format::E4M3));
}

namespace {

GptConfig llama(std::optional<Fp8Spec> fp8) {
  GptConfig c;
  c.num_layers = 2, c.hidden = 32, c.heads = 4, c.query_groups = 2, c.kv_channels = 8, c.ffn = 48;
  c.vocab = 40, c.max_positions = 16, c.init_std = 0.1, c.embedding_init_std = 0.5;
  c.norm = Norm::RMSNorm, c.activation = Activation::SwiGLU, c.add_bias_linear = false, c.add_qkv_bias = false;
  c.tied_embeddings = false, c.positions = Positions::Rope;
  c.fp8 = fp8;
  return c;
}

// The same with its second layer an MoE layer: 4 experts of ffn 24 (top-2) and a shared expert of 16.
GptConfig llama_moe(std::optional<Fp8Spec> fp8) {
  GptConfig c = llama(fp8);
  c.moe.num_experts = 4, c.moe.topk = 2, c.moe.ffn = 24, c.moe.shared_ffn = 16, c.moe.layers = {false, true};
  return c;
}

struct Batch {
  static constexpr int64_t b = 2, s = 16, T = b * s;
  std::vector<int64_t> tokens = std::vector<int64_t>(T), labels = std::vector<int64_t>(T);
  std::vector<float> dloss = std::vector<float>(T, 1.0f / T);
  bool first = true;
  explicit Batch(std::mt19937& rng) {
    std::uniform_int_distribution<int64_t> tok(0, 39);
    for (int64_t t = 0; t < T; ++t) tokens[t] = tok(rng), labels[t] = tok(rng);
  }
  MicroBatch micro() const {
    MicroBatch m{b, s, tokens.data(), labels.data()};
    m.is_first_microbatch = first;
    return m;
  }
};

struct Outcome {
  std::vector<float> losses, grads;
};

// One training micro-batch (forward and backward) of a model with the given FP8 spec, from the same
// initial weights.
Outcome train_micro_batch(std::optional<Fp8Spec> fp8, const Batch& in, bool moe = false) {
  GptModel m(moe ? llama_moe(fp8) : llama(fp8));
  init_parameters(m.table(), m.weights(), 9, true);
  Outcome r;
  r.losses.resize(Batch::T);
  m.zero_grads();
  m.forward(in.micro(), {}, r.losses.data(), true);
  m.backward(in.dloss.data());
  r.grads.assign(m.grads(), m.grads() + m.num_trainable());
  return r;
}

double relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, n = 0;
  for (size_t i = 0; i < a.size(); ++i) d += std::pow(double(a[i]) - b[i], 2), n += std::pow(double(b[i]), 2);
  return std::sqrt(d / n);
}

// Under both recipes the FP8 model's losses and gradients stay near the high-precision model's
// (`base`) without equalling them (FP8's rounding: a few percent).
void expect_both_recipes_near(const Outcome& base, const Batch& in, bool moe) {
  for (const Fp8ScalingRecipe recipe : {Fp8ScalingRecipe::Delayed, Fp8ScalingRecipe::Tensorwise}) {
    SCOPED_TRACE(static_cast<int>(recipe));
    Fp8Spec s;
    s.recipe = recipe;
    const Outcome fp8 = train_micro_batch(s, in, moe);
    const double dl = relative_difference(fp8.losses, base.losses), dg = relative_difference(fp8.grads, base.grads);
    EXPECT_GT(dl, 1e-6);
    EXPECT_LT(dl, 0.02);
    EXPECT_GT(dg, 1e-4);
    EXPECT_LT(dg, 0.15);
  }
}

}  // namespace

// The FP8 model's losses and gradients stay near the high-precision model's (FP8's rounding, a few
// percent) without equalling them; with every layer kept in high precision it is that model
// exactly; with only the first kept, it is not.
TEST(Fp8Model, LinearsInFp8StayNearTheHighPrecisionModel) {
  std::mt19937 rng(4);
  const Batch in(rng);
  const Outcome base = train_micro_batch(std::nullopt, in);
  expect_both_recipes_near(base, in, false);
  Fp8Spec all_high;
  all_high.recipe = Fp8ScalingRecipe::Tensorwise, all_high.bf16_layers_at_start = 1, all_high.bf16_layers_at_end = 1;
  const Outcome kept = train_micro_batch(all_high, in);
  EXPECT_EQ(kept.losses, base.losses);
  EXPECT_EQ(kept.grads, base.grads);
  all_high.bf16_layers_at_end = 0;
  EXPECT_NE(train_micro_batch(all_high, in).losses, base.losses);
}

// In the model: only the transformer layers' linears are FP8 (the output layer keeps no state);
// each training forward and backward moves delayed scales, an evaluation does not; a step's later
// micro-batches reuse the weight's FP8 copy (its amax unrecorded), the next step's first casts it
// again.
TEST(Fp8Model, DelayedScalesFollowTheStepsPasses) {
  std::mt19937 rng(5);
  Batch in(rng);
  GptModel m(llama(delayed(4)));
  init_parameters(m.table(), m.weights(), 9, true);
  const GptParameterLayout P = build_gpt_parameters(m.config());
  const int64_t fc1 = P.layers[1].fc1_w;
  std::vector<float> losses(Batch::T);
  m.zero_grads();
  m.forward(in.micro(), {}, losses.data(), true);
  EXPECT_EQ(m.fp8_linears()->forward_scaling(P.output_w), nullptr);
  for (const int64_t w : {P.layers[0].qkv_w, P.layers[0].proj_w, P.layers[0].fc1_w, P.layers[0].fc2_w}) {
    const DelayedScaling* s = m.fp8_linears()->forward_scaling(w);
    ASSERT_NE(s, nullptr);
    EXPECT_EQ(s->scale(0), 448.0f / s->history(3, 0));
    EXPECT_GT(s->history(3, 0), 0.0f);
  }
  const float wamax = m.fp8_linears()->forward_scaling(fc1)->history(3, 1);
  const int64_t n = m.config().fc1_rows(m.config().ffn) * m.config().hidden;
  EXPECT_EQ(wamax, fp8_amax(m.weights() + fc1, n));
  m.backward(in.dloss.data());
  const DelayedScaling* g = m.fp8_linears()->backward_scaling(fc1);
  EXPECT_EQ(g->scale(0), 57344.0f / g->history(3, 0));

  const float scale = m.fp8_linears()->forward_scaling(fc1)->scale(0);
  m.forward(in.micro(), {}, losses.data(), false);  // an evaluation
  EXPECT_EQ(m.fp8_linears()->forward_scaling(fc1)->scale(0), scale);

  for (int64_t i = 0; i < n; ++i) m.weights()[fc1 + i] *= 2;
  in.first = false;  // the same step's next micro-batch: the old copy
  m.forward(in.micro(), {}, losses.data(), true);
  EXPECT_EQ(m.fp8_linears()->forward_scaling(fc1)->history(3, 1), wamax);
  m.backward(in.dloss.data());
  in.first = true;
  m.forward(in.micro(), {}, losses.data(), true);
  EXPECT_EQ(m.fp8_linears()->forward_scaling(fc1)->history(3, 1), 2 * wamax);
}

// An MoE layer in FP8 (Transformer Engine's GroupedLinear: a scaling state per expert's linear, the
// shared expert's Linear its own): the model's losses and gradients stay near the high-precision
// model's; with the MoE layer kept in high precision they equal those of the model whose first layer
// alone is FP8.
TEST(Fp8Model, ExpertsRunInFp8NearTheHighPrecisionModel) {
  std::mt19937 rng(6);
  const Batch in(rng);
  const Outcome base = train_micro_batch(std::nullopt, in, true);
  expect_both_recipes_near(base, in, true);
  Fp8Spec first_only;
  first_only.recipe = Fp8ScalingRecipe::Tensorwise, first_only.bf16_layers_at_end = 1;
  const Outcome kept = train_micro_batch(first_only, in, true);
  Fp8Spec both = first_only;
  both.bf16_layers_at_end = 0;
  const Outcome all = train_micro_batch(both, in, true);
  EXPECT_NE(kept.losses, all.losses);  // the MoE layer's FP8 GEMMs change the losses
  // The dense first layer in FP8 moves the MoE layer's input, so kept is compared with base loosely.
  EXPECT_LT(relative_difference(kept.losses, base.losses), 0.02);
}

// Each expert's linears keep their own delayed-scaling state: every expert's weight is cast (its
// amax recorded) whether or not it got rows, an expert's input amax is the max over its rows only,
// the shared expert's linears have theirs; the backward records each routed expert's output
// gradient.
TEST(Fp8Model, EachExpertHasItsOwnScalingState) {
  std::mt19937 rng(7);
  Batch in(rng);
  GptModel m(llama_moe(delayed(4)));
  init_parameters(m.table(), m.weights(), 9, true);
  const GptParameterLayout P = build_gpt_parameters(m.config());
  const GptLayerOffsets& L = P.layers[1];
  const int64_t H = m.config().hidden, F = m.config().moe.ffn, F1 = 2 * F, E = m.config().moe.num_experts;
  std::vector<float> losses(Batch::T);
  m.zero_grads();
  m.forward(in.micro(), {}, losses.data(), true);
  const CpuFp8Linears& f = *m.fp8_linears();
  int with_input = 0;
  for (int64_t e = 0; e < E; ++e) {
    SCOPED_TRACE(e);
    const DelayedScaling* fc1 = f.forward_scaling(L.experts_fc1 + e * F1 * H);
    const DelayedScaling* fc2 = f.forward_scaling(L.experts_fc2 + e * H * F);
    ASSERT_NE(fc1, nullptr);
    ASSERT_NE(fc2, nullptr);
    EXPECT_EQ(fc1->history(3, 1), fp8_amax(m.weights() + L.experts_fc1 + e * F1 * H, F1 * H));
    EXPECT_EQ(fc2->history(3, 1), fp8_amax(m.weights() + L.experts_fc2 + e * H * F, H * F));
    EXPECT_EQ(fc1->scale(1), 448.0f / fc1->history(3, 1));
    with_input += fc1->history(3, 0) > 0.0f;
  }
  EXPECT_GE(with_input, 2);  // top-2 of 4: at least two experts took rows
  for (const int64_t w : {L.shared_fc1, L.shared_fc2}) {
    const DelayedScaling* s = f.forward_scaling(w);
    ASSERT_NE(s, nullptr);
    EXPECT_GT(s->history(3, 0), 0.0f);
    EXPECT_GT(s->history(3, 1), 0.0f);
  }
  // Experts' keys are distinct from the dense layer's and the shared expert's.
  EXPECT_NE(f.forward_scaling(P.layers[0].fc1_w), nullptr);
  m.backward(in.dloss.data());
  for (int64_t e = 0; e < E; ++e) {
    const DelayedScaling* fc1 = f.forward_scaling(L.experts_fc1 + e * F1 * H);
    const DelayedScaling* g = f.backward_scaling(L.experts_fc2 + e * H * F);
    ASSERT_NE(g, nullptr);
    // An expert with rows had its output gradient cast; one without kept an empty history.
    EXPECT_EQ(g->history(3, 0) > 0.0f, fc1->history(3, 0) > 0.0f) << e;
  }
}

// Multi-token prediction under FP8: Megatron runs the MTP block under its global FP8 context, so
// an MTP layer's linears and its eh_proj are FP8 even where --first-last-layers-bf16 keeps every
// decoder layer in high precision; the output layer it shares stays high precision. Their delayed
// scales move in the same training forward (the pass ends after the MTP block) and backward. With
// the decoder in high precision the main losses equal the high-precision model's (the MTP block
// runs after them); the MTP losses and the gradients do not.
TEST(Fp8Model, MtpLayersRunInFp8WithTheirEhProj) {
  std::mt19937 rng(8);
  const Batch in(rng);
  Fp8Spec s = delayed(4);
  s.bf16_layers_at_start = 1, s.bf16_layers_at_end = 1;
  GptConfig c = llama(s);
  c.mtp_num_layers = 1, c.mtp_loss_scaling_factor = 0.3;
  GptConfig high = c;
  high.fp8.reset();
  GptModel m(c), h(high);
  init_parameters(m.table(), m.weights(), 9, true);
  std::copy(m.weights(), m.weights() + m.num_parameters(), h.weights());
  const GptParameterLayout P = build_gpt_parameters(c);
  ASSERT_EQ(P.layers.size(), 3u);
  std::vector<float> losses(Batch::T), high_losses(Batch::T);
  m.zero_grads(), h.zero_grads();
  m.forward(in.micro(), {}, losses.data(), true);
  h.forward(in.micro(), {}, high_losses.data(), true);
  const CpuFp8Linears& f = *m.fp8_linears();
  for (const int64_t w : {P.layers[0].qkv_w, P.layers[1].fc2_w, P.output_w}) EXPECT_EQ(f.forward_scaling(w), nullptr);
  const GptLayerOffsets& L = P.layers[2];
  for (const int64_t w : {P.mtp[0].eh_proj, L.qkv_w, L.proj_w, L.fc1_w, L.fc2_w}) {
    SCOPED_TRACE(w);
    const DelayedScaling* d = f.forward_scaling(w);
    ASSERT_NE(d, nullptr);
    EXPECT_GT(d->history(3, 0), 0.0f);
    EXPECT_EQ(d->scale(0), 448.0f / d->history(3, 0));  // (updated by this forward's end)
    EXPECT_EQ(d->scale(1), 448.0f / d->history(3, 1));
  }
  m.backward(in.dloss.data());
  h.backward(in.dloss.data());
  const DelayedScaling* g = f.backward_scaling(P.mtp[0].eh_proj);
  ASSERT_NE(g, nullptr);
  EXPECT_GT(g->history(3, 0), 0.0f);
  EXPECT_EQ(g->scale(0), 57344.0f / g->history(3, 0));
  EXPECT_EQ(losses, high_losses);
  const std::vector<double> mtp = m.take_mtp_losses(), mtp_high = h.take_mtp_losses();
  ASSERT_EQ(mtp.size(), 1u);
  EXPECT_NE(mtp[0], mtp_high[0]);
  EXPECT_LT(std::fabs(mtp[0] - mtp_high[0]), 0.02 * mtp_high[0]);
  const std::vector<float> grads(m.grads(), m.grads() + m.num_trainable());
  const std::vector<float> high_grads(h.grads(), h.grads() + h.num_trainable());
  EXPECT_GT(relative_difference(grads, high_grads), 1e-4);
  EXPECT_LT(relative_difference(grads, high_grads), 0.15);
}
