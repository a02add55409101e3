// Multi-token prediction (Megatron-Core's MultiTokenPredictionBlock) in the whole model: its
// parameters' names and order, and the backward of the main loss plus the MTP losses (weighted
// mtp_loss_scaling_factor / mtp_num_layers, each its masked mean over the labels rolled ahead)
// against finite differences of the forward, for dense and MoE layers, one and two MTP layers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "finite_differences.hpp"
#include "model/gpt_model.hpp"

using namespace laoyao::model;

namespace {

GptConfig tiny(int64_t mtp) {
  GptConfig c;
  c.num_layers = 2, c.hidden = 8, c.heads = 2, c.query_groups = 2, c.kv_channels = 4, c.ffn = 12, c.vocab = 11;
  c.max_positions = 6, c.init_std = 0.4, c.embedding_init_std = 0.4;
  c.mtp_num_layers = mtp, c.mtp_loss_scaling_factor = 0.3;
  return c;
}

}  // namespace

TEST(MtpModel, ParametersFollowTheDecoderAsMegatronCoreRegistersThem) {
  const GptModel m(tiny(2));
  std::vector<std::string> names;
  for (const auto& p : m.table().specs)
    if (p.name.rfind("mtp.layers.1.", 0) == 0) names.push_back(p.name.substr(13));
  ASSERT_GE(names.size(), 5u);
  EXPECT_EQ(names[0], "enorm.weight");
  EXPECT_EQ(names[1], "enorm.bias");
  EXPECT_EQ(names[2], "hnorm.weight");
  EXPECT_EQ(names[3], "hnorm.bias");
  EXPECT_EQ(names[4], "eh_proj.weight");
  EXPECT_EQ(names[5], "mtp_model_layer.input_layernorm.weight");
  EXPECT_EQ(names[names.size() - 2], "final_layernorm.weight");
  EXPECT_EQ(m.table().find("mtp.layers.1.eh_proj.weight")->shape, (std::vector<int64_t>{8, 16}));
  // After the decoder's final layernorm, before the (tied: absent) output layer.
  const auto& s = m.table().specs;
  size_t final_norm = 0, first_mtp = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i].name == "decoder.final_layernorm.bias") final_norm = i;
    if (first_mtp == 0 && s[i].name.rfind("mtp.", 0) == 0) first_mtp = i;
  }
  EXPECT_EQ(first_mtp, final_norm + 1);
  EXPECT_EQ(s.back().name, "mtp.layers.1.final_layernorm.bias");
  // PEFT: each MTP layer's transformer layer gets the decoder layers' adapters, after theirs.
  GptConfig peft = tiny(2);
  peft.lora = LoraSpec{};
  const GptModel p(peft);
  const std::string a = "mtp.layers.1.mtp_model_layer.";
  for (const char* linear : {"self_attention.linear_proj", "self_attention.linear_qkv", "mlp.linear_fc1", "mlp.linear_fc2"})
    for (const char* half : {".adapter.linear_in.weight", ".adapter.linear_out.weight"}) {
      const ParamSpec* q = p.table().find(a + linear + half);
      ASSERT_NE(q, nullptr) << a + linear + half;
      EXPECT_FALSE(q->frozen);
    }
  EXPECT_TRUE(p.table().find("mtp.layers.1.eh_proj.weight")->frozen);
  EXPECT_EQ(p.table().specs.back().name, a + "mlp.linear_fc2.adapter.linear_out.weight");
}

// d(sum_t r_t * loss_t + f / D * sum_k mtp_k)/d(param), mtp_k the masked mean of layer k's losses
// (GptModel::take_mtp_losses of a training forward), against central differences.
TEST(MtpModel, BackwardOfTheMainAndMtpLossesMatchesFiniteDifferences) {
  struct Case {
    const char* name;
    GptConfig cfg;
  };
  std::vector<Case> cases = {{"dense_one_layer", tiny(1)}, {"dense_two_layers", tiny(2)}};
  GptConfig llama = tiny(2);
  llama.norm = Norm::RMSNorm, llama.activation = Activation::SwiGLU, llama.add_bias_linear = false;
  llama.add_qkv_bias = false, llama.tied_embeddings = false, llama.positions = Positions::Rope;
  cases.push_back({"rope_untied", llama});
  GptConfig moe = llama;  // the MTP layer repeats the last layer's kind: MoE
  moe.moe.num_experts = 4, moe.moe.topk = 2, moe.moe.ffn = 6, moe.moe.layers = {false, true};
  moe.moe.seq_aux_loss_coeff = 0.01, moe.moe.shared_ffn = 6;
  cases.push_back({"moe_last_layer", moe});
  GptConfig lora = llama;  // PEFT: adapters on the MTP layers' linears too, the base frozen
  lora.lora = LoraSpec{};
  lora.lora->dim = 2, lora.lora->alpha = 3;
  cases.push_back({"lora", lora});
  for (const auto& tc : cases) {
    SCOPED_TRACE(tc.name);
    GptModel m(tc.cfg);
    std::mt19937 rng(11);
    auto g = laoyao::model::test::prepare_gradient_check(m, rng);
    const int64_t T = g.b * g.s;
    std::vector<float> mask(T);
    for (int64_t t = 0; t < T; ++t) mask[t] = t % 4 == 3 ? 0.0f : 1.0f;  // some labels left out
    for (int64_t t = 0; t < T; ++t) g.r[t] *= mask[t];
    MicroBatch mb = g.micro_batch();
    mb.loss_mask = mask.data();
    const DropoutKey key{99, 5, false};  // (no dropout; a training forward's MTP losses are logged)
    const double weight = tc.cfg.mtp_loss_scaling_factor / static_cast<double>(tc.cfg.mtp_num_layers);
    auto objective = [&] {
      m.forward(mb, key, g.losses.data(), true);
      double L = 0;
      for (int64_t t = 0; t < T; ++t) L += static_cast<double>(g.r[t]) * g.losses[t];
      for (double x : m.take_mtp_losses()) {
        EXPECT_TRUE(std::isfinite(x) && x > 0);
        L += weight * x;
      }
      // (and the MoE layers' load-balancing loss, the MTP layer's included, whose gradient the
      // backward adds too)
      return L + tc.cfg.moe.seq_aux_loss_coeff * m.last_moe_losses().seq_aux;
    };
    objective();
    m.zero_grads();
    m.backward(g.r.data());
    (void)m.take_moe_losses();
    std::vector<float> analytic(m.grads(), m.grads() + m.table().trainable());
    if (tc.cfg.lora)  // the MTP layers' adapters are in the MTP losses' path (else their gradient is 0)
      for (const auto& p : m.table().specs)
        if (!p.frozen && p.name.rfind("mtp.", 0) == 0) {
          const float* gp = analytic.data() + (p.offset - m.table().trainable_offset);
          EXPECT_TRUE(std::any_of(gp, gp + p.numel, [](float v) { return v != 0.0f; })) << p.name;
        }
    // (Steps of 1e-2 flip a token's top 2 experts here: a kink, not a gradient.)
    const float eps = tc.cfg.moe.num_experts > 0 ? 2e-3f : 1e-2f;
    laoyao::model::test::expect_gradients_match_finite_differences(m, analytic, objective, rng, eps);
  }
}

// Under context parallelism each rank's MTP inputs are Megatron's roll_tensor of its two chunks:
// each chunk rolled left by one, its last element then traded with the neighbouring ranks (rank r's
// first chunk ends with rank r+1's first chunk's first element, the last rank's with its own second
// chunk's; the second chunk ends with rank r-1's second chunk's first, rank 0's with 0), once per
// layer. Simulated here rank by rank, against roll_mtp_inputs_cp on the whole sequences.
TEST(MtpModel, ContextParallelInputsAreMegatronsRollTensorOfEachRanksChunks) {
  for (const int64_t n : {2, 3}) {
    const int64_t b = 2, c = 3, s = 2 * c, S = s * n;
    MtpLayerInputs whole;
    for (int64_t t = 0; t < b * S; ++t) {
      whole.tokens.push_back(100 + t), whole.positions.push_back(t % S), whole.labels.push_back(500 + t);
      whole.mask.push_back(t % 5 == 0 ? 0.0f : 1.0f);
    }
    // Each rank's local rows: chunks r and 2n-1-r of each sequence.
    std::vector<std::vector<int64_t>> ranks(static_cast<size_t>(n));
    for (int64_t r = 0; r < n; ++r)
      for (int64_t q = 0; q < b; ++q)
        for (const int64_t chunk : {r, 2 * n - 1 - r})
          for (int64_t i = 0; i < c; ++i) ranks[static_cast<size_t>(r)].push_back(whole.labels[q * S + chunk * c + i]);
    for (int64_t k = 0; k < 2; ++k) {
      // One roll_tensor: per sequence, per part, roll left; then the boundary trade.
      std::vector<std::vector<int64_t>> next = ranks;
      for (int64_t r = 0; r < n; ++r)
        for (int64_t q = 0; q < b; ++q)
          for (int64_t part = 0; part < 2; ++part) {
            const auto& src = ranks[static_cast<size_t>(r)];
            auto& dst = next[static_cast<size_t>(r)];
            const int64_t base = q * s + part * c;
            for (int64_t i = 0; i + 1 < c; ++i) dst[static_cast<size_t>(base + i)] = src[static_cast<size_t>(base + i + 1)];
            int64_t last;
            if (part == 0)
              last = r + 1 < n ? ranks[static_cast<size_t>(r + 1)][static_cast<size_t>(q * s)]  // its first chunk's first
                               : src[static_cast<size_t>(q * s + c)];                          // own second chunk's first
            else
              last = r > 0 ? ranks[static_cast<size_t>(r - 1)][static_cast<size_t>(q * s + c)] : 0;
            dst[static_cast<size_t>(base + c - 1)] = last;
          }
      ranks = next;
      for (int64_t r = 0; r < n; ++r) {
        MtpLayerInputs got;
        roll_mtp_inputs_cp(got, whole, b, s, r, n, k);
        EXPECT_EQ(got.labels, ranks[static_cast<size_t>(r)]) << "cp " << n << " rank " << r << " layer " << k;
        ASSERT_EQ(got.mask.size(), static_cast<size_t>(b * s));
        for (int64_t q = 0; q < b; ++q)  // the mask and ids roll alike: the whole sequence's, shifted k + 1
          for (int64_t i = 0; i < s; ++i) {
            const int64_t at = cp_place(i, s, r, n) + k + 1;
            const float want = at < S ? whole.mask[static_cast<size_t>(q * S + at)] : 0.0f;
            EXPECT_EQ(got.mask[static_cast<size_t>(q * s + i)], want);
            EXPECT_EQ(got.tokens[static_cast<size_t>(q * s + i)], at < S ? whole.tokens[static_cast<size_t>(q * S + at)] : 0);
          }
      }
    }
  }
}
