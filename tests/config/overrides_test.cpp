#include <gtest/gtest.h>

#include "config/overrides.hpp"
#include "config/recipes.hpp"
#include "core/error.hpp"
#include "test_util.hpp"

using namespace laoyao;
using namespace laoyao::config;

static std::string error_of(ConfigContainer& c, const std::string& token) {
  try {
    apply_override(c, parse_override(token));
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(Overrides, ValuesAreTypedByTheField) {
  ConfigContainer c;
  apply_overrides(c, {"optimizer.lr=3e-4", "train.train_iters=10", "model.qk_layernorm=true",
                      "checkpoint.load=null", "dataset.data_path=[0.3,/a,0.7,/b]", "dataset.split='969,30,1'",
                      "model.rotary_base=500000", "train.rampup_batch_size=[16,16,1000]",
                      "tokenizer.tokenizer_model=123"});
  EXPECT_DOUBLE_EQ(*c.optimizer.lr, 3e-4);
  EXPECT_EQ(*c.train.train_iters, 10);
  EXPECT_TRUE(c.model.qk_layernorm);
  EXPECT_FALSE(c.checkpoint.load.has_value());
  EXPECT_EQ(c.dataset.data_path, (std::vector<std::string>{"0.3", "/a", "0.7", "/b"}));
  EXPECT_EQ(*c.dataset.split, "969,30,1");
  EXPECT_DOUBLE_EQ(c.model.rotary_base, 500000.0) << "an int is accepted for a float field";
  EXPECT_EQ(c.train.rampup_batch_size, (std::vector<int64_t>{16, 16, 1000}));
  EXPECT_EQ(*c.tokenizer.tokenizer_model, "123");
}

TEST(Overrides, WrongTypesAndChoicesAreErrorsNamingTheKey) {
  ConfigContainer c;
  std::string e = error_of(c, "train.train_iters=3.5");
  EXPECT_NE(e.find("train.train_iters"), std::string::npos) << e;
  EXPECT_NE(e.find("integer"), std::string::npos) << e;
  e = error_of(c, "model.qk_layernorm=yes");
  EXPECT_NE(e.find("true or false"), std::string::npos) << e;
  e = error_of(c, "scheduler.lr_decay_style=cosin");
  EXPECT_NE(e.find("did you mean cosine?"), std::string::npos) << e;
  e = error_of(c, "model.num_layers=null");
  EXPECT_NE(e.find("model.num_layers"), std::string::npos) << e;
}

TEST(Overrides, UnknownKeysNameTheNearestField) {
  ConfigContainer c;
  std::string e = error_of(c, "model.num_layer=2");
  EXPECT_NE(e.find("unknown config key 'model.num_layer'"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean model.num_layers?"), std::string::npos) << e;
  e = error_of(c, "trian.train_iters=2");
  EXPECT_NE(e.find("train.train_iters"), std::string::npos) << e;
}

TEST(Overrides, AddForceAndDelete) {
  ConfigContainer c = find_recipe("vanilla_gpt_pretrain_config").build();
  ASSERT_TRUE(c.checkpoint.save.has_value());
  // '+' adds only what does not exist yet.
  EXPECT_NE(error_of(c, "+model.num_layers=2").find("already exists"), std::string::npos);
  apply_overrides(c, {"+env_vars.MY_FLAG=1", "++model.num_layers=3", "~checkpoint.save",
                      "~optimizer.adam_beta2", "~env_vars.NCCL_NVLS_ENABLE"});
  EXPECT_EQ(c.env_vars.at("MY_FLAG"), "1");
  EXPECT_EQ(c.model.num_layers, 3);
  EXPECT_FALSE(c.checkpoint.save.has_value()) << "~ resets to the config class's default";
  EXPECT_DOUBLE_EQ(c.optimizer.adam_beta2, 0.999) << "the dataclass default, not the recipe's 0.95";
  EXPECT_EQ(c.env_vars.count("NCCL_NVLS_ENABLE"), 0u);
  EXPECT_NE(error_of(c, "+env_vars.MY_FLAG=2").find("already set"), std::string::npos);
}

TEST(Overrides, MalformedTokensAndDerivedFieldsAreRefused) {
  ConfigContainer c;
  EXPECT_NE(error_of(c, "model.num_layers").find("KEY=VALUE"), std::string::npos);
  EXPECT_NE(error_of(c, "--foo=1").find("unknown option"), std::string::npos);
  EXPECT_NE(error_of(c, "scheduler.lr_decay_steps=5").find("computed from other fields"), std::string::npos);
  EXPECT_NE(error_of(c, "=5").find("names no key"), std::string::npos);
}
