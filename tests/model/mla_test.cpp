// Multi-latent attention in the whole model (Megatron-Core's MLASelfAttention): its parameters'
// names, shapes and registration order, and the model's backward against finite differences of
// its forward, with and without query compression, latent norms (RMSNorm and LayerNorm), YaRN
// and dropout. The ops it runs are checked against fp64 twins in tests/kernels_cpu/mla_test.cpp;
// tensor parallelism in tensor_parallel_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/error.hpp"
#include "finite_differences.hpp"
#include "model/gpt_model.hpp"

using namespace laoyao::model;

namespace {

GptConfig tiny_mla(int64_t q_lora_rank) {
  GptConfig c;
  c.num_layers = 2, c.hidden = 8, c.heads = 2, c.ffn = 12, c.vocab = 11, c.max_positions = 6;
  c.norm = Norm::RMSNorm, c.activation = Activation::SwiGLU, c.add_bias_linear = false, c.add_qkv_bias = false;
  c.tied_embeddings = false, c.positions = Positions::Rope, c.init_std = 0.4, c.embedding_init_std = 0.4;
  MlaSpec m;
  m.q_lora_rank = q_lora_rank, m.kv_lora_rank = 5, m.qk_head_dim = 3, m.qk_pos_emb_head_dim = 4, m.v_head_dim = 3;
  m.softmax_scale = 1.0 / std::sqrt(7.0);
  c.mla = m;
  c.query_groups = c.heads, c.kv_channels = m.v_head_dim;
  return c;
}

}  // namespace

TEST(MlaModel, ParametersFollowMegatronCoresNamesShapesAndOrder) {
  GptConfig c = tiny_mla(6);
  const GptModel m(c);
  std::vector<std::string> attn;
  for (const auto& p : m.table().specs)
    if (p.name.rfind("decoder.layers.0.self_attention.", 0) == 0) attn.push_back(p.name.substr(32));
  // MultiLatentAttention registers linear_proj, then MLASelfAttention its projections and norms.
  EXPECT_EQ(attn, (std::vector<std::string>{"linear_proj.weight", "linear_q_down_proj.weight", "linear_q_up_proj.weight",
                                            "linear_kv_down_proj.weight", "linear_kv_up_proj.weight",
                                            "q_layernorm.weight", "kv_layernorm.weight"}));
  auto shape = [&](const std::string& n) { return m.table().find("decoder.layers.1.self_attention." + n)->shape; };
  EXPECT_EQ(shape("linear_q_down_proj.weight"), (std::vector<int64_t>{6, 8}));
  EXPECT_EQ(shape("linear_q_up_proj.weight"), (std::vector<int64_t>{2 * 7, 6}));
  EXPECT_EQ(shape("linear_kv_down_proj.weight"), (std::vector<int64_t>{5 + 4, 8}));
  EXPECT_EQ(shape("linear_kv_up_proj.weight"), (std::vector<int64_t>{2 * (3 + 3), 5}));
  EXPECT_EQ(shape("linear_proj.weight"), (std::vector<int64_t>{8, 2 * 3}));
  EXPECT_EQ(shape("q_layernorm.weight"), (std::vector<int64_t>{6}));
  EXPECT_EQ(shape("kv_layernorm.weight"), (std::vector<int64_t>{5}));
  EXPECT_EQ(m.table().find("decoder.layers.0.self_attention.linear_qkv.weight"), nullptr);
  // Without query compression: linear_q_proj, and no q_layernorm (Megatron-Core builds none).
  const GptModel plain(tiny_mla(0));
  attn.clear();
  for (const auto& p : plain.table().specs)
    if (p.name.rfind("decoder.layers.0.self_attention.", 0) == 0) attn.push_back(p.name.substr(32));
  EXPECT_EQ(attn, (std::vector<std::string>{"linear_proj.weight", "linear_q_proj.weight", "linear_kv_down_proj.weight",
                                            "linear_kv_up_proj.weight", "kv_layernorm.weight"}));
  EXPECT_EQ(plain.table().find("decoder.layers.0.self_attention.linear_q_proj.weight")->shape,
            (std::vector<int64_t>{2 * 7, 8}));
  // DeepSeek-V2-Lite's attention: 16 heads, kv latent 512, 128 + 64 q/k and 128 v dims per head.
  GptConfig lite = tiny_mla(0);
  lite.num_layers = 1, lite.hidden = 2048, lite.heads = 16, lite.query_groups = 16, lite.kv_channels = 128;
  lite.ffn = 10944, lite.vocab = 64;
  lite.mla->kv_lora_rank = 512, lite.mla->qk_head_dim = 128, lite.mla->qk_pos_emb_head_dim = 64;
  lite.mla->v_head_dim = 128;
  const GptModel big(lite);
  int64_t attention = 0;
  for (const auto& p : big.table().specs)
    if (p.name.find(".self_attention.") != std::string::npos) attention += p.numel;
  // q: 2048 x 16*192; kv_down: 2048 x 576; kv_up: 512 x 16*256; kv_layernorm 512; proj: 16*128 x 2048.
  EXPECT_EQ(attention, 2048 * 3072 + 576 * 2048 + 4096 * 512 + 512 + 2048 * 2048);
}

TEST(MlaModel, BadShapesAreRefused) {
  GptConfig c = tiny_mla(6);
  c.positions = Positions::LearnedAbsolute;
  EXPECT_THROW(GptModel{c}, laoyao::Error);
  c = tiny_mla(6);
  c.kv_channels = 4;  // linear_proj reads heads x v_head_dim
  EXPECT_THROW(GptModel{c}, laoyao::Error);
  c = tiny_mla(6);
  c.mla->kv_lora_rank = 0;
  EXPECT_THROW(GptModel{c}, laoyao::Error);
}

// d(sum_t r_t * loss_t)/d(param) by central differences of the fp32 forward, for every parameter.
TEST(MlaModel, BackwardMatchesFiniteDifferencesOfTheWholeModel) {
  struct Case {
    const char* name;
    GptConfig cfg;
    bool training;
  };
  std::vector<Case> cases;
  cases.push_back({"q_latent_rmsnorm", tiny_mla(6), false});
  cases.push_back({"q_proj", tiny_mla(0), false});
  GptConfig ln = tiny_mla(6);
  ln.norm = Norm::LayerNorm, ln.add_bias_linear = true;  // latent norms with biases; linear_proj's bias
  cases.push_back({"layernorm_latents_with_biases", ln, false});
  GptConfig no_norms = tiny_mla(6);
  no_norms.mla->latent_norms = false;
  cases.push_back({"no_latent_norms", no_norms, false});
  GptConfig yarn = tiny_mla(0);  // DeepSeek's YaRN: scaled frequencies, cos/sin and softmax scaled by mscale
  yarn.yarn = laoyao::kernels::cpu::YarnParams{40.0, 2, 32.0, 1.0, 0.707, 0.0, true};
  yarn.mla->softmax_scale = std::pow(0.1 * 0.0 * std::log(40.0) + 1.0, 2) / std::sqrt(7.0);
  cases.push_back({"yarn", yarn, false});
  GptConfig drop = tiny_mla(6);
  drop.hidden_dropout = 0.3, drop.attention_dropout = 0.2;
  cases.push_back({"with_dropout", drop, true});
  for (const auto& tc : cases) {
    SCOPED_TRACE(tc.name);
    GptModel m(tc.cfg);
    std::mt19937 rng(11);
    auto g = laoyao::model::test::prepare_gradient_check(m, rng);
    const DropoutKey key{99, 5, tc.training};
    auto loss = [&] { return g.weighted_loss(m, key); };
    loss();
    m.zero_grads();
    m.backward(g.r.data());
    std::vector<float> analytic(m.grads(), m.grads() + m.num_parameters());
    for (const auto& p : m.table().specs) {  // every MLA parameter has a gradient
      double sq = 0;
      for (int64_t i = 0; i < p.numel; ++i) sq += std::pow(analytic[p.offset + i], 2);
      EXPECT_GT(sq, 0.0) << p.name;
    }
    laoyao::model::test::expect_gradients_match_finite_differences(m, analytic, loss, rng);
  }
}
