#include <gtest/gtest.h>

#include "config/front_ends.hpp"
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

TEST(Overrides, DeeplyNestedValuesAreRefusedNamingTheKey) {
  ConfigContainer c;
  std::string m = error_of(c, "model.moe_layer_freq=" + std::string(100000, '['));
  EXPECT_NE(m.find("model.moe_layer_freq: lists and dicts nest deeper than 64 levels"), std::string::npos) << m;
}

namespace {

std::string recipe_error(std::vector<std::string> extra) {
  RecipeInvocation inv;
  inv.recipe = "vanilla_gpt_pretrain_config";
  inv.mode = "pretrain";
  inv.overrides = test::seed_bridge_overrides();
  inv.overrides.insert(inv.overrides.end(), extra.begin(), extra.end());
  try {
    resolve_recipe(inv, 1);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

// Bridge's front end meets the same rules as Megatron-LM's flags, named by their field paths.
TEST(Overrides, NonFiniteNumbersAreRefusedNamingTheField) {
  for (const char* path : {"optimizer.weight_decay", "optimizer.lr", "optimizer.min_lr", "optimizer.adam_beta1",
                           "optimizer.adam_beta2", "optimizer.adam_eps", "model.init_method_std",
                           "model.hidden_dropout", "model.attention_dropout", "model.layernorm_epsilon",
                           "optimizer.loss_scale", "optimizer.initial_loss_scale", "scheduler.lr_warmup_init"}) {
    for (const char* bad : {"nan", "inf", "-inf"}) {
      std::string m = recipe_error({std::string(path) + "=" + bad});
      EXPECT_TRUE(has(m, std::string(path) + " must be a finite number, got " + bad)) << path << "=" << bad << ": " << m;
    }
  }
  // Lists are searched too (the load-balancing coefficients pair with the types).
  std::string m = recipe_error({"model.moe_aux_loss_coeff=[0.1,nan]"});
  EXPECT_TRUE(has(m, "model.moe_aux_loss_coeff must be a finite number, got nan")) << m;
  // clip_grad inf is torch's "no clipping" and stays accepted.
  EXPECT_EQ(recipe_error({"optimizer.clip_grad=inf"}), "");
  EXPECT_TRUE(has(recipe_error({"optimizer.clip_grad=nan"}), "optimizer.clip_grad must be a finite number"));
}

TEST(Overrides, Bf16AndFp16TogetherAreAConflict) {
  std::string m = recipe_error({"mixed_precision=null", "model.bf16=true", "model.fp16=true"});
  EXPECT_TRUE(has(m, "cannot specify both fp16 and bf16: model.fp16 and model.bf16 are both true")) << m;
  m = recipe_error({"mixed_precision={bf16:true,fp16:true}"});
  EXPECT_TRUE(has(m, "cannot specify both fp16 and bf16: mixed_precision.fp16 and mixed_precision.bf16")) << m;
}

TEST(Overrides, LengthsThatOverflowASampleCountNameTheField) {
  std::string m = recipe_error({"train.train_iters=9223372036854775807"});
  EXPECT_TRUE(has(m, "train.train_iters (9223372036854775807) is too large: train.train_iters x "
                     "train.global_batch_size (32) x dataset.seq_length (512)"))
      << m;
  m = recipe_error({"train.train_iters=null", "train.train_samples=9223372036854775807", "scheduler.lr_warmup_iters=0",
                    "scheduler.lr_decay_iters=null"});
  EXPECT_TRUE(has(m, "train.train_samples (9223372036854775807) is too large")) << m;
  m = recipe_error({"scheduler.lr_decay_iters=4611686018427387904"});
  EXPECT_TRUE(has(m, "scheduler.lr_decay_iters (4611686018427387904) is too large: scheduler.lr_decay_iters x "
                     "train.global_batch_size (32) overflows a 64-bit count of samples"))
      << m;
  m = recipe_error({"validation.eval_iters=4611686018427387904"});
  EXPECT_TRUE(has(m, "validation.eval_iters (4611686018427387904) is too large")) << m;
  m = recipe_error({"validation.eval_micro_batch_size=0"});
  EXPECT_TRUE(has(m, "validation.eval_micro_batch_size must be a positive integer, got 0")) << m;
}

TEST(Overrides, DimensionsBeyond32BitsNameTheField) {
  for (const char* path : {"model.hidden_size", "model.num_layers", "model.ffn_hidden_size", "model.kv_channels",
                           "train.micro_batch_size", "tokenizer.vocab_size", "model.num_moe_experts"}) {
    std::string m = recipe_error({std::string(path) + "=4294967296"});
    EXPECT_TRUE(has(m, std::string(path) + " (4294967296) is too large: at most 2147483647")) << path << ": " << m;
  }
  std::string m = recipe_error({"dataset.seq_length=4294967296", "model.max_position_embeddings=null"});
  EXPECT_TRUE(has(m, "dataset.seq_length (4294967296) is too large")) << m;
  m = recipe_error({"model.ffn_hidden_size=null", "model.hidden_size=1073741824", "model.num_attention_heads=1"});
  EXPECT_TRUE(has(m, "model.ffn_hidden_size defaults to 4 x model.hidden_size (4294967296), too large")) << m;
  // Parallel sizes whose product wraps around are a world-size mismatch, not a division by zero.
  m = recipe_error({"model.tensor_model_parallel_size=4294967296", "model.pipeline_model_parallel_size=4294967296"});
  EXPECT_TRUE(has(m, "world size (1) is not divisible by")) << m;
}
