// --position-embedding-type yarn as Megatron-LM maps its flags (argument_utils'
// _apply_yarn_config_from_args: --rotary-scaling-factor, --yarn-*, --mscale, --mscale-all-dim, with
// YarnRotaryEmbedding's defaults), reaching the model's rotary table; what it cannot be combined
// with is refused by name.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "config/front_ends.hpp"
#include "model/rotary.hpp"
#include "train/capabilities.hpp"
#include "train/run_setup.hpp"

using namespace laoyao;

namespace {

config::Resolved mlm(std::vector<std::string> args) {
  const std::vector<std::string> common = {
      "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "512", "--lr", "1e-4", "--train-iters", "10",
      "--eval-interval", "10", "--micro-batch-size", "2", "--seq-length", "64", "--max-position-embeddings", "64",
      "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4"};
  args.insert(args.end(), common.begin(), common.end());
  return config::resolve_mlm(args, 1);
}

model::GptConfig model_of(const config::Resolved& r) { return train::model_config(r.cfg, r.validated.derived); }

}  // namespace

TEST(RotaryConfig, YarnFlagsReachTheModelAsMegatronLmMapsThem) {
  const model::GptConfig d = model_of(mlm({"--position-embedding-type", "yarn"}));
  ASSERT_EQ(d.positions, model::Positions::Rope);
  ASSERT_TRUE(d.yarn.has_value());
  EXPECT_EQ(d.yarn->scaling_factor, 1.0);  // --rotary-scaling-factor's default (Bridge's MLA config has 40)
  EXPECT_EQ(d.yarn->original_max_position_embeddings, 4096);
  EXPECT_EQ(d.yarn->beta_fast, 32.0);
  EXPECT_EQ(d.yarn->beta_slow, 1.0);
  EXPECT_EQ(d.yarn->mscale, 1.0);
  EXPECT_EQ(d.yarn->mscale_all_dim, 0.0);
  EXPECT_TRUE(d.yarn->correction_range_round_to_int);

  const model::GptConfig g = model_of(
      mlm({"--position-embedding-type", "yarn", "--rotary-scaling-factor", "4", "--yarn-original-max-position-embeddings",
           "128", "--yarn-beta-fast", "16", "--yarn-beta-slow", "2", "--no-yarn-correction-range-round-to-int",
           "--mscale", "0.8", "--mscale-all-dim", "0.5", "--rotary-base", "20000"}));
  ASSERT_TRUE(g.yarn.has_value());
  EXPECT_EQ(g.yarn->scaling_factor, 4.0);
  EXPECT_EQ(g.yarn->original_max_position_embeddings, 128);
  EXPECT_EQ(g.yarn->beta_fast, 16.0);
  EXPECT_EQ(g.yarn->beta_slow, 2.0);
  EXPECT_EQ(g.yarn->mscale, 0.8);
  EXPECT_EQ(g.yarn->mscale_all_dim, 0.5);
  EXPECT_FALSE(g.yarn->correction_range_round_to_int);
  // The table both backends use: scaled by (0.1 * 0.8 * ln 4 + 1) / (0.1 * 0.5 * ln 4 + 1) at
  // position 0, where every angle is 0.
  const kernels::cpu::RopeTable t = model::rotary_table(g);
  const double concentration = (0.08 * std::log(4.0) + 1.0) / (0.05 * std::log(4.0) + 1.0);
  EXPECT_NEAR(t.cos[0], concentration, 1e-6);
  EXPECT_EQ(t.sin[0], 0.0f);
  EXPECT_FALSE(model_of(mlm({"--position-embedding-type", "rope"})).yarn.has_value());
  EXPECT_TRUE(train::missing_features(mlm({"--position-embedding-type", "yarn"}).cfg, 1).empty());
}

TEST(RotaryConfig, YarnWithLlama3ScalingIsRefusedByName) {
  const std::vector<std::string> missing =
      train::missing_features(mlm({"--position-embedding-type", "yarn", "--use-rope-scaling"}).cfg, 1);
  ASSERT_EQ(missing.size(), 1u);
  EXPECT_NE(missing[0].find("YaRN"), std::string::npos) << missing[0];
}
