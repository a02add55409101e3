// The whole GPT model: Megatron-Core's parameter names and count, and the hand-written backward
// against finite differences of the forward (several architectures, with and without dropout).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "core/error.hpp"
#include "finite_differences.hpp"
#include "model/gpt_model.hpp"

using namespace laoyao::model;

TEST(GptModel, ParameterNamesAndCountMatchMegatron) {
  GptConfig c;
  c.num_layers = 2, c.hidden = 256, c.heads = 4, c.query_groups = 4, c.kv_channels = 64, c.ffn = 1024;
  c.vocab = 32000, c.max_positions = 512;
  GptModel m(c);
  // megatron-lm.md §3.9: the seed model prints 9,903,104 parameters.
  EXPECT_EQ(m.num_parameters(), 9903104);
  const auto& s = m.table().specs;
  EXPECT_EQ(s[0].name, "embedding.word_embeddings.weight");
  EXPECT_EQ(s[1].name, "embedding.position_embeddings.weight");
  EXPECT_EQ(s[2].name, "decoder.layers.0.input_layernorm.weight");
  EXPECT_EQ(s.back().name, "decoder.final_layernorm.bias");
  const ParamSpec* qkv = m.table().find("decoder.layers.1.self_attention.linear_qkv.weight");
  ASSERT_NE(qkv, nullptr);
  EXPECT_EQ(qkv->shape, (std::vector<int64_t>{768, 256}));
  EXPECT_TRUE(qkv->weight_decay);
  EXPECT_FALSE(m.table().find("decoder.layers.1.self_attention.linear_qkv.bias")->weight_decay);
  EXPECT_FALSE(m.table().find("decoder.layers.0.input_layernorm.weight")->weight_decay);
  EXPECT_TRUE(m.table().find("embedding.position_embeddings.weight")->weight_decay);
  EXPECT_EQ(m.table().find("output_layer.weight"), nullptr) << "tied to the word embedding";
  // Megatron-Core's is_embedding_or_output_parameter (--decoupled-lr): the word embeddings and an
  // untied output layer, nothing else (not the position embeddings).
  for (const ParamSpec& p : s)
    EXPECT_EQ(p.embedding_or_output, p.name == "embedding.word_embeddings.weight") << p.name;
  GptConfig untied = c;
  untied.tied_embeddings = false;
  const GptModel u(untied);
  for (const ParamSpec& p : u.table().specs)
    EXPECT_EQ(p.embedding_or_output, p.name == "embedding.word_embeddings.weight" || p.name == "output_layer.weight")
        << p.name;
  // Output layers get std / sqrt(2L).
  EXPECT_DOUBLE_EQ(m.table().find("decoder.layers.0.mlp.linear_fc2.weight")->std, 0.02 / 2.0);
  EXPECT_DOUBLE_EQ(m.table().find("decoder.layers.0.mlp.linear_fc1.weight")->std, 0.02);
}

TEST(GptModel, InitFollowsMegatronsDistributions) {
  GptConfig c;
  c.num_layers = 4, c.hidden = 64, c.heads = 4, c.query_groups = 4, c.kv_channels = 16, c.ffn = 256;
  c.vocab = 512, c.max_positions = 64;
  GptModel m(c);
  init_parameters(m.table(), m.weights(), 1234, true);
  auto stats = [&](const std::string& name) {
    const ParamSpec* p = m.table().find(name);
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < p->numel; ++i) s += m.weights()[p->offset + i], s2 += std::pow(m.weights()[p->offset + i], 2);
    return std::make_pair(s / p->numel, std::sqrt(s2 / p->numel));
  };
  EXPECT_NEAR(stats("embedding.word_embeddings.weight").second, 0.02, 0.001);
  EXPECT_NEAR(stats("decoder.layers.2.self_attention.linear_proj.weight").second, 0.02 / std::sqrt(8.0), 0.0005);
  EXPECT_EQ(stats("decoder.layers.2.self_attention.linear_proj.bias").second, 0.0);
  EXPECT_EQ(stats("decoder.layers.1.pre_mlp_layernorm.weight").first, 1.0);
  // bf16-rounded: every value has a zero low half.
  const float* w = m.weights();
  for (int64_t i = 0; i < 1000; ++i) {
    uint32_t u;
    std::memcpy(&u, &w[i], 4);
    ASSERT_EQ(u & 0xffffu, 0u);
  }
}

namespace {

struct Case {
  const char* name;
  GptConfig cfg;
  bool training;
};

std::vector<Case> cases() {
  GptConfig base;
  base.num_layers = 2, base.hidden = 8, base.heads = 2, base.query_groups = 2, base.kv_channels = 4, base.ffn = 12;
  base.vocab = 11, base.max_positions = 6, base.init_std = 0.4, base.embedding_init_std = 0.4;
  std::vector<Case> out;
  out.push_back({"vanilla_gpt", base, false});
  GptConfig llama = base;
  llama.norm = Norm::RMSNorm, llama.activation = Activation::SwiGLU, llama.add_bias_linear = false;
  llama.add_qkv_bias = false, llama.tied_embeddings = false, llama.heads = 4, llama.query_groups = 2;
  llama.kv_channels = 3, llama.positions = Positions::None;
  out.push_back({"rmsnorm_swiglu_gqa_untied", llama, false});
  GptConfig qwen = llama;  // Qwen3/Llama 3 style: RoPE (with Llama 3 scaling), QK layernorm, GQA
  qwen.positions = Positions::Rope, qwen.qk_layernorm = true, qwen.kv_channels = 4, qwen.max_positions = 5;
  qwen.rotary_base = 500000, qwen.rope_scaling = true, qwen.rope_scaling_factor = 32;
  out.push_back({"rope_qk_layernorm_gqa", qwen, false});
  GptConfig yarn = qwen;  // YaRN's frequencies, cos and sin scaled by 1 + 0.1 ln 4
  yarn.rope_scaling = false;
  yarn.yarn = laoyao::kernels::cpu::YarnParams{4.0, 2, 32.0, 1.0, 1.0, 0.0, true};
  out.push_back({"yarn_qk_layernorm_gqa", yarn, false});
  GptConfig rope_half = base;
  rope_half.positions = Positions::Rope, rope_half.rotary_percent = 0.5, rope_half.max_positions = 5;
  out.push_back({"rope_half_with_dropout", rope_half, true});
  GptConfig erf = base;
  erf.activation = Activation::GeluErf, erf.zero_centered_gamma = true;
  out.push_back({"erf_gelu_layernorm_1p", erf, false});
  GptConfig drop = base;
  drop.hidden_dropout = 0.3, drop.attention_dropout = 0.2;
  out.push_back({"with_dropout", drop, true});
  return out;
}

}  // namespace

// d(sum_t r_t * loss_t)/d(param) by central differences of the fp32 forward (loss summed in
// double), against backward(), for every parameter tensor.
TEST(GptModel, BackwardMatchesFiniteDifferencesOfTheWholeModel) {
  for (const auto& tc : cases()) {
    SCOPED_TRACE(tc.name);
    GptModel m(tc.cfg);
    std::mt19937 rng(11);
    auto g = test::prepare_gradient_check(m, rng);
    const DropoutKey key{99, 5, tc.training};
    auto loss = [&] { return g.weighted_loss(m, key); };
    loss();
    m.zero_grads();
    m.backward(g.r.data());
    std::vector<float> analytic(m.grads(), m.grads() + m.num_parameters());
    test::expect_gradients_match_finite_differences(m, analytic, loss, rng);
  }
}

TEST(GptModel, QkLayernormParametersFollowLinearQkv) {
  GptConfig c = cases()[2].cfg;
  GptModel m(c);
  const auto& s = m.table().specs;
  size_t qkv = 0;
  while (s[qkv].name != "decoder.layers.0.self_attention.linear_qkv.weight") ++qkv;
  EXPECT_EQ(s[qkv + 1].name, "decoder.layers.0.self_attention.q_layernorm.weight");
  EXPECT_EQ(s[qkv + 2].name, "decoder.layers.0.self_attention.k_layernorm.weight");
  EXPECT_EQ(s[qkv + 1].shape, (std::vector<int64_t>{4}));
  EXPECT_EQ(m.table().find("embedding.position_embeddings.weight"), nullptr) << "RoPE has no position table";
}

// --apply-wd-to-qk-layernorm (Megatron-Core's Qwen3-Next rule): 1-D parameters and biases take no
// weight decay, except the q/k layernorm weights; without the flag they take none either.
TEST(GptModel, ApplyWdToQkLayernormDecaysOnlyTheQkNorms) {
  for (bool apply : {false, true}) {
    GptConfig c = cases()[2].cfg;  // QK layernorm
    c.apply_wd_to_qk_layernorm = apply;
    const GptModel m(c);
    int qk = 0;
    for (const ParamSpec& p : m.table().specs) {
      const bool is_qk = p.name.find("q_layernorm.") != std::string::npos || p.name.find("k_layernorm.") != std::string::npos;
      qk += is_qk;
      const bool standard = !(p.shape.size() == 1 || p.name.ends_with(".bias"));
      EXPECT_EQ(p.weight_decay, is_qk ? apply : standard) << p.name;
    }
    EXPECT_EQ(qk, 2 * c.num_layers);
  }
}

// An embedding init std (--embedding-init-method-std) exempts the embeddings from weight decay
// (Megatron's default_skip_embedding_weight_decay); the untied output layer still decays.
TEST(GptModel, SkipEmbeddingWeightDecayLeavesOnlyTheEmbeddings) {
  GptConfig c = cases()[0].cfg;  // learned positions
  c.tied_embeddings = false;
  c.skip_embedding_weight_decay = true;
  const GptModel m(c);
  for (const ParamSpec& p : m.table().specs) {
    const bool standard = !(p.shape.size() == 1 || p.name.ends_with(".bias"));
    EXPECT_EQ(p.weight_decay, p.name.find("embedding") == std::string::npos && standard) << p.name;
  }
  EXPECT_TRUE(m.table().find("output_layer.weight")->weight_decay);
  EXPECT_FALSE(m.table().find("embedding.position_embeddings.weight")->weight_decay);
}

TEST(GptModel, GradientsAccumulateAcrossMicroBatches) {
  GptConfig c = cases()[0].cfg;
  GptModel m(c);
  init_parameters(m.table(), m.weights(), 3, false);
  std::vector<int64_t> tok = {1, 2, 3, 4, 5, 6}, lab = {2, 3, 4, 5, 6, 7}, pos = {0, 1, 2, 0, 1, 2};
  std::vector<float> losses(6), d(6, 1.0f);
  MicroBatch mb{2, 3, tok.data(), lab.data(), pos.data()};
  m.zero_grads();
  m.forward(mb, {}, losses.data());
  m.backward(d.data());
  std::vector<float> once(m.grads(), m.grads() + m.num_parameters());
  m.forward(mb, {}, losses.data());
  m.backward(d.data());
  for (int64_t i = 0; i < m.num_parameters(); i += 7) ASSERT_NEAR(m.grads()[i], 2 * once[i], 1e-6 + 1e-5 * std::abs(once[i]));
}

// --reset-attention-mask: the documents of a packed sequence do not see each other. With positions
// restarting at each document (--reset-position-ids) for learned positions, or RoPE (relative:
// Megatron does not restart its positions), each document's losses and gradients are those of
// the document alone as its own sequence.
TEST(GptModel, DocumentsOfAPackedSequenceTrainAsIfAlone) {
  for (int which : {0, 2}) {  // learned absolute positions; RoPE with QK layernorm and GQA
    GptConfig c = cases()[which].cfg;
    c.max_positions = 9;
    SCOPED_TRACE(cases()[which].name);
    GptModel m(c);
    init_parameters(m.table(), m.weights(), 5, false);
    std::vector<int64_t> tok = {1, 2, 3, 4, 5, 6, 7, 8, 9}, lab = {2, 3, 4, 5, 6, 7, 8, 9, 10};
    const std::vector<int64_t> pos = {0, 1, 2, 3, 0, 1, 2, 3, 4};
    const std::vector<int32_t> key_start = {0, 0, 0, 0, 4, 4, 4, 4, 4};  // an EOD at position 3
    std::vector<float> packed(9), alone(9), ones(9, 1.0f);
    m.zero_grads();
    m.forward({1, 9, tok.data(), lab.data(), pos.data(), key_start.data()}, {}, packed.data());
    m.backward(ones.data());
    const std::vector<float> packed_grads(m.grads(), m.grads() + m.num_parameters());
    m.zero_grads();
    m.forward({1, 4, tok.data(), lab.data(), pos.data()}, {}, alone.data());
    m.backward(ones.data());
    m.forward({1, 5, tok.data() + 4, lab.data() + 4, pos.data() + 4}, {}, alone.data() + 4);
    m.backward(ones.data());
    for (int t = 0; t < 9; ++t) EXPECT_NEAR(packed[t], alone[t], 1e-5 * (1 + std::abs(alone[t]))) << "token " << t;
    double diff = 0, norm = 0;
    for (int64_t i = 0; i < m.num_parameters(); ++i) {
      diff += std::pow(double(packed_grads[i]) - m.grads()[i], 2);
      norm += std::pow(double(m.grads()[i]), 2);
    }
    EXPECT_LT(std::sqrt(diff), 1e-5 * std::sqrt(norm));
    // Without the documents the second one sees the first: its losses move.
    std::vector<float> causal(9);
    m.forward({1, 9, tok.data(), lab.data(), pos.data()}, {}, causal.data());
    EXPECT_GT(std::abs(causal[6] - packed[6]), 1e-4);
    // Documents as a dataset makes them, or an error (as on the CUDA backend): never decreasing.
    const std::vector<int32_t> bad = {0, 0, 0, 0, 4, 4, 2, 4, 4};
    EXPECT_THROW(m.forward({1, 9, tok.data(), lab.data(), pos.data(), bad.data()}, {}, causal.data()), laoyao::Error);
  }
}
