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

static std::string yaml_error(const std::string& text, const std::string& source) {
  try {
    yaml_to_value(text, source);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

// yaml-cpp keeps an alias as the node it names: an alias inside its own anchor is a cycle, which
// once recursed until the stack ran out (SIGSEGV).
TEST(Yaml, AnAliasCycleIsAUsageErrorNamingTheFile) {
  std::string m = yaml_error("model: &m\n  self: *m\n", "cycle.yaml");
  EXPECT_NE(m.find("YAML file 'cycle.yaml' nests deeper than 64 levels (an alias that refers to itself?)"),
            std::string::npos)
      << m;
  ConfigContainer c;
  EXPECT_THROW(apply_yaml(c, "model: &m\n  self: *m\n", "cycle.yaml"), UsageError);
}

// "Billion laughs": nine levels of aliases of aliases, 9^9 scalars if copied out; refused once
// the copy passes the node limit.
TEST(Yaml, AliasesOfAliasesAreRefusedBeforeTheyExpand) {
  const std::string text = laoyao::config::test::billion_laughs_yaml();
  ASSERT_LT(text.size(), 400u);
  std::string m = yaml_error(text, "laughs.yaml");
  EXPECT_NE(m.find("YAML file 'laughs.yaml' expands to more than 100000 nodes (YAML aliases of aliases?)"),
            std::string::npos)
      << m;
}

TEST(Yaml, DeepNestingIsAUsageErrorAndAliasesWithinTheLimitsWork) {
  std::string m = yaml_error("model:\n  x: " + std::string(100, '[') + std::string(100, ']') + "\n", "deep.yaml");
  EXPECT_NE(m.find("'deep.yaml' nests deeper than 64 levels"), std::string::npos) << m;
  // Deeper than yaml-cpp's own guard: its error, still a UsageError naming the file.
  m = yaml_error("model:\n  x: " + std::string(100000, '[') + std::string(100000, ']') + "\n", "deeper.yaml");
  EXPECT_NE(m.find("deeper.yaml"), std::string::npos) << m;
  // An ordinary alias is copied out as before.
  Value v = yaml_to_value("a: &a [1, 2]\nb: *a\n", "ok.yaml");
  ASSERT_EQ(v.map.size(), 2u);
  EXPECT_EQ(v.map[1].second, v.map[0].second);
  ConfigContainer c;
  apply_yaml(c, "model:\n  num_layers: &n 3\n  hidden_size: *n\n", "ok.yaml");
  EXPECT_EQ(c.model.num_layers, 3);
  EXPECT_EQ(c.model.hidden_size, 3);
}
