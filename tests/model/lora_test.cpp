// LoRA (Megatron-Bridge's peft.scheme lora) in the module tree: the adapters' parameters after a
// frozen base, the adapted model equal to the base merged with scale * B A, and the adapters'
// gradients against finite differences of the whole model.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "finite_differences.hpp"
#include "model/gpt_model.hpp"

using namespace laoyao::model;

namespace {

GptConfig gpt() {
  GptConfig c;
  c.num_layers = 2, c.hidden = 8, c.heads = 2, c.query_groups = 2, c.kv_channels = 4, c.ffn = 12;
  c.vocab = 11, c.max_positions = 6, c.init_std = 0.4, c.embedding_init_std = 0.4;
  return c;
}

GptConfig llama() {
  GptConfig c = gpt();
  c.norm = Norm::RMSNorm, c.activation = Activation::SwiGLU, c.add_bias_linear = false, c.add_qkv_bias = false;
  c.tied_embeddings = false, c.heads = 4, c.query_groups = 2, c.kv_channels = 4, c.positions = Positions::Rope;
  return c;
}

LoraSpec lora(int64_t dim = 3, double alpha = 6) {
  LoraSpec s;
  s.dim = dim, s.alpha = alpha;
  return s;
}

struct Batch {
  static constexpr int64_t b = 2, s = 5, T = b * s;
  std::vector<int64_t> tokens = std::vector<int64_t>(T), labels = std::vector<int64_t>(T),
                       positions = std::vector<int64_t>(T);
  std::vector<float> weights = std::vector<float>(T);
  explicit Batch(int64_t vocab, std::mt19937& rng) {
    std::uniform_int_distribution<int64_t> tok(0, vocab - 1);
    for (int64_t t = 0; t < T; ++t) tokens[t] = tok(rng), labels[t] = tok(rng), positions[t] = t % s;
    for (auto& w : weights) w = std::uniform_real_distribution<float>(0.5f, 1.5f)(rng);
  }
  MicroBatch micro() const { return {b, s, tokens.data(), labels.data(), positions.data()}; }
};

// sum_t weight_t * loss_t of a forward at the model's weights.
double objective(GptModel& m, const Batch& in, const DropoutKey& key) {
  std::vector<float> losses(Batch::T);
  m.forward(in.micro(), key, losses.data());
  double L = 0;
  for (int64_t t = 0; t < Batch::T; ++t) L += static_cast<double>(in.weights[t]) * losses[t];
  return L;
}

// Random values for every trained parameter (B too: its zero init would hide A's gradient), small
// enough that the adapters' effect stays near linear for the finite differences.
void randomize_adapters(GptModel& m, std::mt19937& rng, float stddev = 0.1f) {
  std::normal_distribution<float> N(0.0f, stddev);
  for (const auto& p : m.table().specs)
    if (!p.frozen)
      for (int64_t i = 0; i < p.numel; ++i) m.weights()[p.offset + i] = N(rng);
}

const ParamSpec& spec(const GptModel& m, const std::string& name) {
  const ParamSpec* p = m.table().find(name);
  if (!p) throw laoyao::Error("no parameter " + name);
  return *p;
}

}  // namespace

TEST(Lora, AdaptersFollowAFrozenBaseWithBridgesNamesAndShapes) {
  GptConfig c = llama();
  const GptModel base(c);
  c.lora = lora(3);
  GptModel m(c);
  const ParameterTable& t = m.table();
  EXPECT_EQ(t.trainable_offset, base.num_parameters()) << "the base's parameters first, at the same offsets";
  for (size_t i = 0; i < base.table().specs.size(); ++i) {
    EXPECT_EQ(t.specs[i].name, base.table().specs[i].name);
    EXPECT_EQ(t.specs[i].offset, base.table().specs[i].offset);
    EXPECT_TRUE(t.specs[i].frozen) << t.specs[i].name;
  }
  const std::string l1 = "decoder.layers.1.";
  const int64_t qkv = (c.heads + 2 * c.query_groups) * c.kv_channels;
  EXPECT_EQ(spec(m, l1 + "self_attention.linear_qkv.adapter.linear_in.weight").shape, (std::vector<int64_t>{3, 8}));
  EXPECT_EQ(spec(m, l1 + "self_attention.linear_qkv.adapter.linear_out.weight").shape, (std::vector<int64_t>{qkv, 3}));
  EXPECT_EQ(spec(m, l1 + "self_attention.linear_proj.adapter.linear_in.weight").shape,
            (std::vector<int64_t>{3, c.heads * c.kv_channels}));
  EXPECT_EQ(spec(m, l1 + "self_attention.linear_proj.adapter.linear_out.weight").shape, (std::vector<int64_t>{8, 3}));
  EXPECT_EQ(spec(m, l1 + "mlp.linear_fc1.adapter.linear_out.weight").shape, (std::vector<int64_t>{2 * c.ffn, 3}));
  EXPECT_EQ(spec(m, l1 + "mlp.linear_fc2.adapter.linear_in.weight").shape, (std::vector<int64_t>{3, c.ffn}));
  int64_t adapters = 0;
  for (const auto& p : t.specs) adapters += p.frozen ? 0 : p.numel;
  EXPECT_EQ(adapters, t.trainable());
  EXPECT_EQ(m.num_trainable(), t.trainable());
  const int64_t per_layer = 3 * (8 + qkv) + 3 * (c.heads * c.kv_channels + 8) + 3 * (8 + 2 * c.ffn) + 3 * (c.ffn + 8);
  EXPECT_EQ(t.trainable(), 2 * per_layer);
  // Only the targeted modules.
  c.lora->fc1 = c.lora->fc2 = false;
  const GptModel attention_only(c);
  EXPECT_EQ(attention_only.table().find(l1 + "mlp.linear_fc1.adapter.linear_in.weight"), nullptr);
  EXPECT_NE(attention_only.table().find(l1 + "self_attention.linear_qkv.adapter.linear_in.weight"), nullptr);
}

TEST(Lora, InitIsBridgesXavierAAndZeroB) {
  GptConfig c = gpt();
  c.hidden = 64, c.heads = 4, c.kv_channels = 16, c.ffn = 256;
  c.lora = lora(16);
  GptModel m(c);
  init_parameters(m.table(), m.weights(), 3, false);
  auto moments = [&](const std::string& name) {
    const ParamSpec& p = spec(m, name);
    double s = 0, s2 = 0, top = 0;
    for (int64_t i = 0; i < p.numel; ++i) {
      const double v = m.weights()[p.offset + i];
      s += v, s2 += v * v, top = std::max(top, std::abs(v));
    }
    return std::vector<double>{s / p.numel, std::sqrt(s2 / p.numel), top};
  };
  // torch's xavier_normal_: std sqrt(2 / (fan_in + fan_out)) for A [16, 256] (linear_fc2's).
  const auto a = moments("decoder.layers.0.mlp.linear_fc2.adapter.linear_in.weight");
  EXPECT_NEAR(a[1], std::sqrt(2.0 / (256 + 16)), 0.05 * std::sqrt(2.0 / (256 + 16)));
  EXPECT_EQ(moments("decoder.layers.0.mlp.linear_fc2.adapter.linear_out.weight")[2], 0.0);
  // kaiming: torch's kaiming_uniform_(a = sqrt 5), bound 1 / sqrt(fan_in).
  c.lora->a_init = LoraInit::Kaiming;
  GptModel k(c);
  init_parameters(k.table(), k.weights(), 3, false);
  const ParamSpec& ka = spec(k, "decoder.layers.0.mlp.linear_fc2.adapter.linear_in.weight");
  double top = 0, s2 = 0;
  for (int64_t i = 0; i < ka.numel; ++i) top = std::max(top, double(std::abs(k.weights()[ka.offset + i]))),
                                         s2 += double(k.weights()[ka.offset + i]) * k.weights()[ka.offset + i];
  EXPECT_LE(top, 1.0 / 16.0);
  EXPECT_GT(top, 0.95 / 16.0);
  EXPECT_NEAR(std::sqrt(s2 / ka.numel), 1.0 / 16.0 / std::sqrt(3.0), 0.05 / 16.0);
}

// With B zero (its init) the adapted model is the base model; with A and B random it is the base
// whose targeted weights are W + (alpha / dim) B A (LoRA's merge).
TEST(Lora, TheAdaptedModelIsTheBaseMergedWithScaledBA) {
  for (const GptConfig& arch : {gpt(), llama()}) {
    SCOPED_TRACE(arch.norm == Norm::RMSNorm ? "llama" : "gpt");
    GptConfig c = arch;
    c.lora = lora(3, 12);
    GptModel m(c), plain(arch);
    init_parameters(m.table(), m.weights(), 5, false);
    std::copy(m.weights(), m.weights() + plain.num_parameters(), plain.weights());
    std::mt19937 rng(21);
    const Batch in(c.vocab, rng);
    const DropoutKey key{1, 0, false};
    const double base = objective(plain, in, key);
    EXPECT_NEAR(objective(m, in, key), base, 1e-5 * std::abs(base)) << "B = 0: the base model";

    randomize_adapters(m, rng);
    const float scale = c.lora->scale();
    for (const auto& L : m.table().specs) {
      const std::string suffix = ".adapter.linear_in.weight";
      if (!L.name.ends_with(suffix)) continue;
      const std::string linear = L.name.substr(0, L.name.size() - suffix.size());
      const ParamSpec& A = L;
      const ParamSpec& B = spec(m, linear + ".adapter.linear_out.weight");
      const ParamSpec& W = spec(plain, linear + ".weight");
      const int64_t r = A.shape[0], in_f = A.shape[1], out_f = B.shape[0];
      ASSERT_EQ(W.shape, (std::vector<int64_t>{out_f, in_f})) << linear;
      for (int64_t o = 0; o < out_f; ++o)
        for (int64_t i = 0; i < in_f; ++i) {
          double d = 0;
          for (int64_t k = 0; k < r; ++k)
            d += double(m.weights()[B.offset + o * r + k]) * m.weights()[A.offset + k * in_f + i];
          plain.weights()[W.offset + o * in_f + i] += static_cast<float>(scale * d);
        }
    }
    const double adapted = objective(m, in, key), merged = objective(plain, in, key);
    EXPECT_NEAR(adapted, merged, 1e-5 * std::abs(merged));
    EXPECT_GT(std::abs(adapted - base), 1e-2) << "the adapters change the model";
  }
}

// The adapters' gradients (and nothing of the frozen base's) against central differences, for each
// architecture, subsets of the targets, and LoRA's dropout on the adapters' input.
TEST(Lora, BackwardMatchesFiniteDifferencesOfTheWholeModel) {
  struct Case {
    const char* name;
    GptConfig cfg;
    bool training;
  };
  std::vector<Case> cases;
  GptConfig g = gpt();
  g.lora = lora(3, 6);
  cases.push_back({"gpt_all_targets", g, false});
  GptConfig l = llama();
  l.lora = lora(2, 3);
  cases.push_back({"llama_all_targets", l, false});
  GptConfig attn = l;
  attn.lora->fc1 = attn.lora->fc2 = false;
  cases.push_back({"llama_attention_only", attn, false});
  GptConfig mlp = g;
  mlp.lora->qkv = mlp.lora->proj = false, mlp.lora->fc2 = false;
  cases.push_back({"gpt_fc1_only", mlp, false});
  GptConfig drop = g;
  drop.lora->dropout = 0.4, drop.hidden_dropout = 0.2, drop.attention_dropout = 0.1;
  cases.push_back({"gpt_lora_dropout", drop, true});
  for (const Case& tc : cases) {
    SCOPED_TRACE(tc.name);
    GptModel m(tc.cfg);
    init_parameters(m.table(), m.weights(), 7, false);
    std::mt19937 rng(11);
    randomize_adapters(m, rng);
    const Batch in(tc.cfg.vocab, rng);
    const DropoutKey key{99, 5, tc.training};
    auto loss = [&] { return objective(m, in, key); };
    loss();
    m.zero_grads();
    m.backward(in.weights.data());
    std::vector<float> analytic(m.grads(), m.grads() + m.num_trainable());
    test::expect_gradients_match_finite_differences(m, analytic, loss, rng);
  }
}

TEST(Lora, TheFrozenBaseHasNoGradientsAndIsNotNormed) {
  GptConfig c = gpt();
  c.lora = lora(2, 2);
  GptModel m(c);
  init_parameters(m.table(), m.weights(), 7, false);
  std::mt19937 rng(3);
  randomize_adapters(m, rng);
  const Batch in(c.vocab, rng);
  objective(m, in, DropoutKey{});
  m.zero_grads();
  m.backward(in.weights.data());
  double sq = 0;
  for (int64_t i = 0; i < m.num_trainable(); ++i) sq += double(m.grads()[i]) * m.grads()[i];
  EXPECT_GT(sq, 0.0);
  EXPECT_NEAR(m.grad_norm(), std::sqrt(sq), 1e-6 * std::sqrt(sq)) << "the adapters' gradients alone";
  double wsq = 0;
  for (int64_t i = 0; i < m.num_parameters(); ++i) wsq += double(m.weights()[i]) * m.weights()[i];
  EXPECT_NEAR(m.params_norm(), std::sqrt(wsq), 1e-6 * std::sqrt(wsq)) << "every weight, as Megatron's";
}

TEST(Lora, ShapesItCannotTrainAreRefused) {
  GptConfig c = gpt();
  c.lora = lora(0);
  EXPECT_THROW(GptModel{c}, laoyao::Error);
}
