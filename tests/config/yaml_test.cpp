#include <gtest/gtest.h>

#include "config/front_ends.hpp"
#include "config/recipes.hpp"
#include "config/yaml_io.hpp"
#include "core/error.hpp"
#include "test_util.hpp"

using namespace laoyao;
using namespace laoyao::config;

TEST(Yaml, EveryRecipeRoundTrips) {
  for (const auto& r : all_recipes()) {
    ConfigContainer c = r.build();
    std::string y = to_yaml(c);
    ConfigContainer back;
    apply_yaml(back, y, r.name);
    // Derived fields are skipped on read; recipes have none set before validation.
    EXPECT_EQ(test::differing_fields(c, back), std::vector<std::string>{}) << r.name;
  }
}

TEST(Yaml, ResolvedConfigRoundTripsAndRevalidatesToTheSameConfig) {
  RecipeInvocation inv;
  inv.recipe = "vanilla_gpt_pretrain_config";
  inv.mode = "pretrain";
  inv.overrides = test::seed_bridge_overrides();
  Resolved r = resolve_recipe(inv, 1);
  std::string y = to_yaml(r.cfg);
  ConfigContainer back;
  apply_yaml(back, y, "run_config.yaml");
  validate(back, {FrontEnd::Bridge, 1});
  EXPECT_EQ(test::differing_fields(r.cfg, back), std::vector<std::string>{});
  EXPECT_EQ(to_yaml(back), y);
}

TEST(Yaml, HasEverySectionInBridgeOrder) {
  ConfigContainer c;
  std::string y = to_yaml(c);
  size_t last = 0;
  for (auto s : section_names()) {
    size_t at = y.find("\n" + s + ":");
    if (y.rfind(s + ":", 0) == 0) at = 0;
    ASSERT_NE(at, std::string::npos) << s;
    EXPECT_GE(at, last) << s;
    last = at;
  }
  for (auto s : {"model", "train", "optimizer", "scheduler", "dataset", "tokenizer", "logger", "checkpoint", "rng",
                 "validation", "dist", "ddp", "mixed_precision"})
    EXPECT_NE(y.find(std::string(s) + ":"), std::string::npos) << s;
}

TEST(Yaml, StringsThatLookLikeOtherTypesStayStrings) {
  ConfigContainer c;
  c.dataset.split = "1,1,1";
  c.tokenizer.tokenizer_model = "123";
  c.env_vars["X"] = "true";
  c.logger.wandb_project = "a: b";
  std::string y = to_yaml(c);
  ConfigContainer back;
  apply_yaml(back, y, "t");
  EXPECT_EQ(*back.dataset.split, "1,1,1");
  EXPECT_EQ(*back.tokenizer.tokenizer_model, "123");
  EXPECT_EQ(back.env_vars.at("X"), "true");
  EXPECT_EQ(*back.logger.wandb_project, "a: b");
}

TEST(Yaml, BadFilesNameTheFileAndTheKey) {
  ConfigContainer c;
  try {
    apply_yaml(c, "model:\n  num_layer: 2\n", "my.yaml");
    FAIL();
  } catch (const UsageError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("my.yaml"), std::string::npos) << m;
    EXPECT_NE(m.find("did you mean model.num_layers?"), std::string::npos) << m;
  }
  EXPECT_THROW(apply_yaml(c, "modle:\n  num_layers: 2\n", "f"), UsageError);
  EXPECT_THROW(apply_yaml(c, "model: [1, 2\n", "f"), UsageError);
  EXPECT_THROW(apply_yaml(c, "model:\n  num_layers: two\n", "f"), UsageError);
  EXPECT_THROW(apply_yaml(c, "- a\n- b\n", "f"), UsageError);
  apply_yaml(c, "", "empty.yaml");  // an empty file changes nothing
  apply_yaml(c, "model:\n  num_layers: 7\ntrain:\n  train_iters: 3\n", "ok.yaml");
  EXPECT_EQ(c.model.num_layers, 7);
  EXPECT_EQ(*c.train.train_iters, 3);
}
