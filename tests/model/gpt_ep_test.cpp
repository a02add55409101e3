// Expert parallelism's parameter mapping (model/gpt_ep.hpp): a rank's local_experts.I is the whole
// model's expert rank*El + I; shard and place are inverse over the group, so that the whole
// model's weights split identically at any EP size and gather back bit for bit.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/rng.hpp"
#include "model/gpt_ep.hpp"
#include "model/gpt_layout.hpp"

using namespace laoyao;
using namespace laoyao::model;

namespace {

GptConfig moe_config(int64_t ep) {
  GptConfig c;
  c.num_layers = 3, c.hidden = 16, c.heads = 2, c.query_groups = 2, c.kv_channels = 8, c.ffn = 32, c.vocab = 64;
  c.max_positions = 16, c.add_bias_linear = false, c.activation = Activation::SwiGLU;
  c.moe.num_experts = 4, c.moe.topk = 2, c.moe.ffn = 8, c.moe.shared_ffn = 8;
  c.moe.layers = {false, true, true};
  c.moe.expert_parallel = ep;
  return c;
}

}  // namespace

TEST(GptExpertParallel, LocalExpertsAreTheRanksShareUnderTheirGlobalNumbers) {
  EXPECT_EQ(ep_whole_name("decoder.layers.3.mlp.experts.local_experts.1.linear_fc2.weight", 2, 4),
            "decoder.layers.3.mlp.experts.local_experts.9.linear_fc2.weight");
  EXPECT_EQ(ep_whole_name("decoder.layers.3.mlp.router.weight", 2, 4), "decoder.layers.3.mlp.router.weight");
  EXPECT_TRUE(is_routed_expert("decoder.layers.0.mlp.experts.local_experts.0.linear_fc1.weight"));
  EXPECT_FALSE(is_routed_expert("decoder.layers.0.mlp.shared_experts.linear_fc1.weight"));
  EXPECT_FALSE(is_routed_expert("decoder.layers.0.mlp.router.weight"));
  // A rank's table holds its two of the four experts; the whole config holds all four.
  const ParameterTable local = build_gpt_parameters(moe_config(2)).table;
  const ParameterTable whole = build_gpt_parameters(ep_whole_config(moe_config(2))).table;
  EXPECT_NE(local.find("decoder.layers.1.mlp.experts.local_experts.1.linear_fc1.weight"), nullptr);
  EXPECT_EQ(local.find("decoder.layers.1.mlp.experts.local_experts.2.linear_fc1.weight"), nullptr);
  EXPECT_NE(whole.find("decoder.layers.1.mlp.experts.local_experts.3.linear_fc1.weight"), nullptr);
  EXPECT_EQ(whole.total, build_gpt_parameters(moe_config(1)).table.total);
}

TEST(GptExpertParallel, ShardThenPlaceOverTheGroupGivesTheWholeModelBack) {
  const ParameterTable whole = build_gpt_parameters(moe_config(1)).table;
  std::vector<float> w(static_cast<size_t>(whole.total));
  Rng rng(3, "ep weights");
  for (auto& x : w) x = static_cast<float>(rng.normal());
  for (const int64_t ep : {int64_t{2}, int64_t{4}}) {
    SCOPED_TRACE("EP " + std::to_string(ep));
    const ParameterTable local = build_gpt_parameters(moe_config(ep)).table;
    const int64_t El = 4 / ep;
    std::vector<float> sum(w.size(), 0.0f);
    for (int64_t r = 0; r < ep; ++r) {
      std::vector<float> mine(static_cast<size_t>(local.total), -1.0f);
      ep_shard(whole, w.data(), local, mine.data(), r, El);
      // Local expert 0 of rank r is global expert r * El.
      const ParamSpec* lp = local.find("decoder.layers.2.mlp.experts.local_experts.0.linear_fc2.weight");
      const ParamSpec* wp =
          whole.find("decoder.layers.2.mlp.experts.local_experts." + std::to_string(r * El) + ".linear_fc2.weight");
      ASSERT_TRUE(lp && wp);
      for (int64_t i = 0; i < lp->numel; ++i) ASSERT_EQ(mine[lp->offset + i], w[wp->offset + i]) << "rank " << r;
      std::vector<float> placed(w.size(), 0.0f);
      ep_place(whole, placed.data(), local, mine.data(), r, El, r == 0);
      for (size_t i = 0; i < w.size(); ++i) sum[i] += placed[i];
    }
    EXPECT_EQ(sum, w) << "every expert from its rank, the rest from rank 0";
  }
}
