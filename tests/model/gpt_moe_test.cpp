// Mixture-of-Experts layers in the GPT model (Megatron-Core's MoELayer in place of the MLP): the
// parameters under Megatron-Core's names, and the backward against finite differences of the lm
// loss plus the MoE losses (load-balancing, sequence load-balancing, z) they add.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "finite_differences.hpp"
#include "model/gpt_layout.hpp"
#include "model/gpt_model.hpp"

using namespace laoyao::model;

namespace {

// A small Llama-style model whose first layer is an MoE layer with a shared expert.
GptConfig moe_config() {
  GptConfig c;
  c.num_layers = 2, c.hidden = 8, c.heads = 2, c.query_groups = 2, c.kv_channels = 4, c.ffn = 12;
  c.vocab = 11, c.max_positions = 6, c.init_std = 0.4, c.embedding_init_std = 0.4;
  c.norm = Norm::RMSNorm, c.activation = Activation::SwiGLU, c.add_bias_linear = false, c.add_qkv_bias = false;
  c.tied_embeddings = false, c.positions = Positions::Rope;
  c.moe.num_experts = 4, c.moe.layers = {true, false}, c.moe.ffn = 6, c.moe.topk = 2, c.moe.shared_ffn = 5;
  c.moe.aux_loss_coeff = 0.1, c.moe.z_loss_coeff = 0.01;
  return c;
}

// LoRA's gradient checks on an MoE model: the adapters drawn from N(0, sd) (B too: its zero init
// would hide A's gradient), a random micro-batch of 2 sequences of 5, the objective finite
// differences take (the tokens' losses plus the MoE losses at their coefficients) and the
// analytic gradients of the trainable parameters from one backward.
struct LoraMoeProbe {
  LoraMoeProbe(GptModel& model, const GptConfig& config, std::mt19937& rng, float sd) : m(model), c(config) {
    std::normal_distribution<float> N(0.0f, sd);
    for (const auto& p : m.table().specs)
      if (!p.frozen)
        for (int64_t i = 0; i < p.numel; ++i) m.weights()[p.offset + i] = N(rng);
    std::uniform_int_distribution<int64_t> tok(0, c.vocab - 1);
    for (int64_t t = 0; t < T; ++t) tokens[t] = tok(rng), labels[t] = tok(rng), positions[t] = t % s;
  }
  double objective() {
    m.forward(mb, DropoutKey{}, losses.data());
    double L = 0;
    for (int64_t t = 0; t < T; ++t) L += losses[t];
    const GptModel::MoeLosses moe = m.last_moe_losses();
    return L + c.moe.aux_loss_coeff * moe.aux + c.moe.z_loss_coeff * moe.z;
  }
  std::vector<float> analytic() {
    std::vector<float> r(T, 1.0f);
    m.zero_grads();
    m.backward(r.data());
    return {m.grads(), m.grads() + m.num_trainable()};
  }
  GptModel& m;
  const GptConfig& c;
  static constexpr int64_t b = 2, s = 5, T = b * s;
  std::vector<int64_t> tokens = std::vector<int64_t>(T), labels = std::vector<int64_t>(T),
                       positions = std::vector<int64_t>(T);
  std::vector<float> losses = std::vector<float>(T);
  MicroBatch mb{b, s, tokens.data(), labels.data(), positions.data()};
};

}  // namespace

TEST(GptMoe, ParametersFollowMegatronCoresNames) {
  GptModel m(moe_config());
  const ParameterTable& t = m.table();
  const ParamSpec* router = t.find("decoder.layers.0.mlp.router.weight");
  ASSERT_NE(router, nullptr);
  EXPECT_EQ(router->shape, (std::vector<int64_t>{4, 8}));
  for (int e = 0; e < 4; ++e) {
    const std::string p = "decoder.layers.0.mlp.experts.local_experts." + std::to_string(e) + ".";
    ASSERT_NE(t.find(p + "linear_fc1.weight"), nullptr) << p;
    EXPECT_EQ(t.find(p + "linear_fc1.weight")->shape, (std::vector<int64_t>{12, 8})) << "SwiGLU: gate and up";
    EXPECT_EQ(t.find(p + "linear_fc2.weight")->shape, (std::vector<int64_t>{8, 6}));
    EXPECT_DOUBLE_EQ(t.find(p + "linear_fc2.weight")->std, 0.4 / 2.0) << "an output layer: std / sqrt(2L)";
  }
  EXPECT_EQ(t.find("decoder.layers.0.mlp.shared_experts.linear_fc1.weight")->shape, (std::vector<int64_t>{10, 8}));
  EXPECT_EQ(t.find("decoder.layers.0.mlp.shared_experts.linear_fc2.weight")->shape, (std::vector<int64_t>{8, 5}));
  EXPECT_EQ(t.find("decoder.layers.0.mlp.linear_fc1.weight"), nullptr) << "no dense MLP in an MoE layer";
  EXPECT_NE(t.find("decoder.layers.1.mlp.linear_fc1.weight"), nullptr) << "layer 1 is dense";
  EXPECT_EQ(t.find("decoder.layers.1.mlp.router.weight"), nullptr);
  EXPECT_EQ(m.num_moe_layers(), 1);
  // Active per token: all but the 4 routed experts (12 x 8 + 8 x 6 each), and 2 of those.
  EXPECT_EQ(m.num_active_parameters(), m.num_parameters() - 4 * (12 * 8 + 8 * 6) + 2 * (12 * 8 + 8 * 6));
  // The experts' linear_fc1 lie together, then their linear_fc2 (the layer op's grouped layout).
  EXPECT_EQ(t.find("decoder.layers.0.mlp.experts.local_experts.1.linear_fc1.weight")->offset,
            t.find("decoder.layers.0.mlp.experts.local_experts.0.linear_fc1.weight")->offset + 12 * 8);
  // A dense model of the same shape has none of these and the same non-MLP parameters.
  GptConfig dense = moe_config();
  dense.moe = {};
  EXPECT_EQ(GptModel(dense).table().find("decoder.layers.0.mlp.router.weight"), nullptr);
}

// d(sum_t r_t * loss_t + sum of coeff * MoE loss)/d(param) by central differences of the fp32
// forward, against backward() with the MoE aux-loss scale 1, for every parameter tensor.
// Which gradients a backward's GEMMs write whole (gradient_writers, the CUDA model's first backward
// of a step writes those and zeroes the rest): every linear, router, routed expert (each local one,
// also under expert parallelism) and shared expert weight; the norms, the embeddings, biases, the
// expert_bias buffer and a tied output layer are zeroed. Every parameter is in exactly one of them.
TEST(GptMoe, GradientWritersCoverEveryParameterOnce) {
  auto is_gemm_weight = [](const std::string& n) {
    for (const char* k : {"linear_qkv.weight", "linear_proj.weight", "linear_fc1.weight", "linear_fc2.weight",
                          "router.weight", "output_layer.weight"})
      if (n.size() >= std::string(k).size() && n.compare(n.size() - std::string(k).size(), std::string::npos, k) == 0)
        return true;
    return false;
  };
  GptConfig ep = moe_config();
  ep.moe.expert_parallel = 2, ep.moe.sigmoid = true, ep.moe.expert_bias = true;
  GptConfig tied = moe_config();
  tied.tied_embeddings = true, tied.add_bias_linear = false, tied.moe = {};
  for (const GptConfig& c : {moe_config(), ep, tied}) {
    const GptParameterLayout layout = build_gpt_parameters(c);
    const GradientWriters w = gradient_writers(layout);
    std::vector<int> owners(static_cast<size_t>(layout.table.total), 0);
    for (int64_t o : w.gemm_written) {
      const auto& specs = layout.table.specs;
      const auto it = std::find_if(specs.begin(), specs.end(), [&](const ParamSpec& s) { return s.offset == o; });
      ASSERT_NE(it, specs.end());
      EXPECT_TRUE(is_gemm_weight(it->name)) << it->name;
      for (int64_t i = 0; i < it->numel; ++i) ++owners[static_cast<size_t>(o + i)];
    }
    for (const auto& r : w.zeroed)
      for (int64_t i = 0; i < r.count; ++i) ++owners[static_cast<size_t>(r.offset + i)];
    EXPECT_EQ(std::count(owners.begin(), owners.end(), 1), layout.table.total) << "each parameter once";
    for (const ParamSpec& s : layout.table.specs) {
      const bool written = std::binary_search(w.gemm_written.begin(), w.gemm_written.end(), s.offset);
      const bool want = is_gemm_weight(s.name) && !(c.tied_embeddings && s.offset == layout.word_emb);
      EXPECT_EQ(written, want) << s.name;
    }
  }
  EXPECT_EQ(build_gpt_parameters(ep).table.find("decoder.layers.0.mlp.experts.local_experts.2.linear_fc1.weight"),
            nullptr)
      << "two local experts under EP 2";
}

TEST(GptMoe, BackwardMatchesFiniteDifferencesOfLossAndMoeLosses) {
  for (const bool seq_aux : {false, true}) {
    SCOPED_TRACE(seq_aux ? "seq_aux_loss" : "aux_loss");
    GptConfig c = moe_config();
    if (seq_aux) c.moe.seq_aux_loss_coeff = c.moe.aux_loss_coeff, c.moe.aux_loss_coeff = 0, c.moe.sigmoid = true;
    GptModel m(c);
    init_parameters(m.table(), m.weights(), 7, false);
    std::mt19937 rng(13);
    std::normal_distribution<float> N(0.0f, 0.3f);
    for (const auto& p : m.table().specs)
      if (p.init != Init::Normal)
        for (int64_t i = 0; i < p.numel; ++i) m.weights()[p.offset + i] += N(rng);
    const int64_t b = 2, s = 5, T = b * s;
    std::vector<int64_t> tokens(T), labels(T), positions(T);
    std::uniform_int_distribution<int64_t> tok(0, c.vocab - 1);
    for (int64_t t = 0; t < T; ++t) tokens[t] = tok(rng), labels[t] = tok(rng), positions[t] = t % s;
    std::vector<float> r(T), losses(T);
    for (auto& x : r) x = std::uniform_real_distribution<float>(0.5f, 1.5f)(rng);
    const MicroBatch mb{b, s, tokens.data(), labels.data(), positions.data()};
    const DropoutKey key{99, 5, false};
    auto objective = [&] {
      m.forward(mb, key, losses.data());
      double L = 0;
      for (int64_t t = 0; t < T; ++t) L += static_cast<double>(r[t]) * losses[t];
      const GptModel::MoeLosses moe = m.last_moe_losses();  // each / its coefficient
      return L + c.moe.aux_loss_coeff * moe.aux + c.moe.seq_aux_loss_coeff * moe.seq_aux + c.moe.z_loss_coeff * moe.z;
    };
    const double at = objective();
    EXPECT_GT(at, 0.0);
    m.zero_grads();
    m.backward(r.data());
    std::vector<float> analytic(m.grads(), m.grads() + m.num_parameters());
    test::expect_gradients_match_finite_differences(m, analytic, objective, rng);
  }
}

// LoRA on an MoE model's attention (peft target_modules linear_qkv, linear_proj): the base, its
// router and experts among it, frozen; the adapters' gradients, through the MoE layers and their
// losses, against finite differences.
TEST(GptMoe, LoraOnTheAttentionOfAnMoeModelMatchesFiniteDifferences) {
  GptConfig c = moe_config();
  LoraSpec lora;
  lora.dim = 2, lora.alpha = 4, lora.fc1 = lora.fc2 = false;
  c.lora = lora;
  GptModel m(c);
  init_parameters(m.table(), m.weights(), 7, false);
  std::mt19937 rng(17);
  LoraMoeProbe probe(m, c, rng, 0.1f);
  probe.objective();
  const std::vector<float> analytic = probe.analytic();
  ASSERT_LT(m.num_trainable(), m.num_parameters() / 2);
  test::expect_gradients_match_finite_differences(m, analytic, [&] { return probe.objective(); }, rng);
}

// LoRA on an MoE model's experts (target_modules linear_fc1, linear_fc2, whose names match the
// experts' and the shared expert's linears as Bridge matches them): one adapter pair shared by
// every routed expert (Bridge's share_expert_adapters, its default), the shared expert its own.
// The adapters' gradients, through the routing and the MoE losses, against finite differences; the
// adapted model computes the losses of the base with W + (alpha/dim) B A merged into every
// expert's, the shared expert's and the dense layers' weights.
TEST(GptMoe, LoraOnTheExpertsMatchesFiniteDifferencesAndTheMergedModel) {
  GptConfig c = moe_config();
  LoraSpec lora;
  lora.dim = 2, lora.alpha = 3;
  c.lora = lora;
  GptModel m(c);
  const ParameterTable& t = m.table();
  auto shape = [&](const std::string& name) {
    const ParamSpec* p = t.find(name);
    return p ? p->shape : std::vector<int64_t>{};
  };
  const std::string e = "decoder.layers.0.mlp.experts.", sh = "decoder.layers.0.mlp.shared_experts.";
  EXPECT_EQ(shape(e + "linear_fc1.adapter.linear_in.weight"), (std::vector<int64_t>{2, 8}));
  EXPECT_EQ(shape(e + "linear_fc1.adapter.linear_out.weight"), (std::vector<int64_t>{12, 2}));
  EXPECT_EQ(shape(e + "linear_fc2.adapter.linear_in.weight"), (std::vector<int64_t>{2, 6}));
  EXPECT_EQ(shape(e + "linear_fc2.adapter.linear_out.weight"), (std::vector<int64_t>{8, 2}));
  EXPECT_EQ(shape(sh + "linear_fc1.adapter.linear_out.weight"), (std::vector<int64_t>{10, 2}));
  EXPECT_EQ(shape(sh + "linear_fc2.adapter.linear_in.weight"), (std::vector<int64_t>{2, 5}));
  EXPECT_EQ(shape("decoder.layers.1.mlp.linear_fc1.adapter.linear_out.weight"), (std::vector<int64_t>{24, 2}));
  EXPECT_TRUE(shape(e + "local_experts.0.linear_fc1.adapter.linear_in.weight").empty()) << "one pair for all experts";

  init_parameters(m.table(), m.weights(), 7, false);
  std::mt19937 rng(23);
  LoraMoeProbe probe(m, c, rng, 0.2f);
  probe.objective();
  const std::vector<float> adapted = probe.losses;
  const std::vector<float> analytic = probe.analytic();
  test::expect_gradients_match_finite_differences(m, analytic, [&] { return probe.objective(); }, rng);

  // The merged base: every adapted linear's weight + (alpha/dim) B A (each routed expert's with
  // the experts' one pair).
  GptConfig base_cfg = c;
  base_cfg.lora.reset();
  GptModel base(base_cfg);
  for (const auto& p : base.table().specs) {
    const ParamSpec* q = t.find(p.name);
    ASSERT_NE(q, nullptr) << p.name;
    std::copy(m.weights() + q->offset, m.weights() + q->offset + q->numel, base.weights() + p.offset);
  }
  int merged = 0;
  for (const auto& a : t.specs) {
    const std::string suffix = ".adapter.linear_in.weight";
    if (!a.name.ends_with(suffix)) continue;
    const std::string linear = a.name.substr(0, a.name.size() - suffix.size());
    const ParamSpec* B = t.find(linear + ".adapter.linear_out.weight");
    std::vector<std::string> targets = {linear + ".weight"};
    if (linear.ends_with("mlp.experts.linear_fc1") || linear.ends_with("mlp.experts.linear_fc2")) {
      targets.clear();
      const std::string which = linear.substr(linear.rfind('.') + 1), stem = linear.substr(0, linear.rfind('.'));
      for (int x = 0; x < c.moe.num_experts; ++x)
        targets.push_back(stem + ".local_experts." + std::to_string(x) + "." + which + ".weight");
    }
    for (const auto& name : targets) {
      const ParamSpec* W = base.table().find(name);
      ASSERT_NE(W, nullptr) << name;
      const int64_t rows = W->shape[0], cols = W->shape[1];
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) {
          double d = 0;
          for (int64_t k = 0; k < lora.dim; ++k)
            d += static_cast<double>(m.weights()[B->offset + i * lora.dim + k]) * m.weights()[a.offset + k * cols + j];
          base.weights()[W->offset + i * cols + j] += static_cast<float>(lora.alpha / lora.dim * d);
        }
      ++merged;
    }
  }
  EXPECT_EQ(merged, 8 + 2 + 2 + 4);  // 4 experts x fc1, fc2; the shared expert's; the dense layer's; qkv, proj x 2 layers
  std::vector<float> base_losses(LoraMoeProbe::T);
  base.forward(probe.mb, DropoutKey{}, base_losses.data());
  for (int64_t i = 0; i < LoraMoeProbe::T; ++i) EXPECT_NEAR(adapted[i], base_losses[i], 2e-5 * std::abs(base_losses[i])) << i;
}

// The MoE losses are logged for training steps only (a forward a backward follows), each divided
// by its coefficient: with four experts chosen two at a time a balanced router gives about 1
// (Megatron's aux / coeff).
TEST(GptMoe, MoeLossesAreReportedForTrainingStepsOnly) {
  GptConfig c = moe_config();
  GptModel m(c);
  init_parameters(m.table(), m.weights(), 3, false);
  const int64_t b = 1, s = 6;
  std::vector<int64_t> tokens = {1, 2, 3, 4, 5, 6}, labels = {2, 3, 4, 5, 6, 7}, positions = {0, 1, 2, 3, 4, 5};
  std::vector<float> losses(b * s), dloss(b * s, 1.0f / 6);
  const MicroBatch mb{b, s, tokens.data(), labels.data(), positions.data()};
  m.forward(mb, {1, 1, false}, losses.data());
  const GptModel::MoeLosses eval = m.last_moe_losses();
  EXPECT_GT(eval.aux, 0.5);
  EXPECT_LT(eval.aux, 4.0);
  EXPECT_GT(eval.z, 0.0);
  EXPECT_EQ(eval.seq_aux, 0.0);
  EXPECT_EQ(m.take_moe_losses().aux, 0.0) << "an evaluation forward is not counted";
  for (int step = 0; step < 2; ++step) {
    m.forward(mb, {1, 1, false}, losses.data());
    m.backward(dloss.data());
  }
  const GptModel::MoeLosses two = m.take_moe_losses();
  EXPECT_NEAR(two.aux, 2 * eval.aux, 1e-9 * two.aux) << "the same micro-batch twice";
  EXPECT_NEAR(two.z, 2 * eval.z, 1e-9 * two.z);
  EXPECT_EQ(m.take_moe_losses().aux, 0.0) << "take resets";
}

// Aux-loss-free balancing (Megatron's --moe-router-enable-expert-bias): the router's expert_bias
// is a buffer (saved, no gradient, not counted as a parameter); the training forwards count each
// expert's tokens, and update_expert_bias moves every bias by the update rate toward balance
// (sign(mean - load)), then restarts the counts. The bias then changes the next routing.
TEST(GptMoe, ExpertBiasMovesTowardBalanceAfterEachStep) {
  GptConfig c = moe_config();
  c.moe.sigmoid = true, c.moe.expert_bias = true, c.moe.bias_update_rate = 0.25;
  GptModel m(c);
  const ParamSpec* bias = m.table().find("decoder.layers.0.mlp.router.expert_bias");
  ASSERT_NE(bias, nullptr);
  EXPECT_TRUE(bias->buffer);
  EXPECT_FALSE(bias->weight_decay);
  EXPECT_EQ(bias->offset, m.table().find("decoder.layers.0.mlp.router.weight")->offset + 4 * 8) << "after the weight";
  EXPECT_EQ(m.num_buffer_elements(), 4);
  GptConfig plain = c;
  plain.moe.expert_bias = false;
  EXPECT_EQ(m.num_whole_parameters(), GptModel(plain).num_parameters()) << "the buffer is not a parameter";
  init_parameters(m.table(), m.weights(), 3, false);
  std::vector<int64_t> tokens = {1, 2, 3, 4, 5, 6}, labels = {2, 3, 4, 5, 6, 7}, positions = {0, 1, 2, 3, 4, 5};
  std::vector<float> losses(6), dloss(6, 1.0f / 6);
  const MicroBatch mb{1, 6, tokens.data(), labels.data(), positions.data()};
  m.forward(mb, {1, 1, false}, losses.data());
  EXPECT_EQ(m.expert_load(0), std::vector<double>(4, 0.0)) << "an evaluation forward is not counted";
  m.zero_grads();
  for (int step = 0; step < 2; ++step) {
    m.forward(mb, {1, 1, false}, losses.data());
    m.backward(dloss.data());
  }
  const std::vector<double> load = m.expert_load(0);
  double total = 0;
  for (double x : load) total += x;
  EXPECT_EQ(total, 2.0 * 6 * 2) << "two micro-batches of 6 tokens, top-2";
  for (int64_t e = 0; e < 4; ++e) EXPECT_EQ(m.grads()[bias->offset + e], 0.0f) << "no gradient for the bias";
  m.update_expert_bias(nullptr);
  bool moved = false;
  for (int64_t e = 0; e < 4; ++e) {
    const double mean = total / 4, want = mean > load[e] ? 0.25 : mean < load[e] ? -0.25 : 0.0;
    EXPECT_FLOAT_EQ(m.weights()[bias->offset + e], static_cast<float>(want)) << "expert " << e;
    moved = moved || want != 0.0;
  }
  EXPECT_TRUE(moved) << "an unbalanced load: the test needs one";
  EXPECT_EQ(m.expert_load(0), std::vector<double>(4, 0.0)) << "the counts restart";
  EXPECT_TRUE(m.expert_load(1).empty()) << "a dense layer has none";
}
