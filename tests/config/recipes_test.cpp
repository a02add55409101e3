#include <gtest/gtest.h>

#include "config/front_ends.hpp"
#include "config/recipes.hpp"
#include "core/error.hpp"
#include "test_util.hpp"

using namespace laoyao;
using namespace laoyao::config;

static Resolved run(const std::string& recipe, std::vector<std::string> overrides, int64_t world = 1) {
  RecipeInvocation inv;
  inv.recipe = recipe;
  inv.mode = "pretrain";
  inv.overrides = std::move(overrides);
  return resolve_recipe(inv, world);
}

TEST(Recipes, AllAreRegisteredWithAliases) {
  std::vector<std::string> expected = {
      "vanilla_gpt_pretrain_config", "llama32_1b_pretrain_config", "llama3_8b_pretrain_config",
      "qwen3_8b_pretrain_config",    "deepseek_v2_lite_pretrain_config", "llama32_1b_sft_config",
      "llama32_1b_peft_config",      "llama3_8b_sft_config",       "llama3_8b_peft_config",
      "qwen3_8b_sft_config",         "qwen3_8b_peft_config",       "moe_2b_pretrain_config"};
  for (auto& n : expected) EXPECT_EQ(find_recipe(n).name, n);
  EXPECT_EQ(find_recipe("llama32_1b_pretrain_1gpu_h100_bf16_config").name, "llama32_1b_pretrain_config");
  EXPECT_EQ(find_recipe("vanilla_gpt_pretrain_1gpu_h100_bf16_config").name, "vanilla_gpt_pretrain_config");
  try {
    find_recipe("llama32_1b_pretrain_confg");
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("did you mean llama32_1b_pretrain_config?"), std::string::npos) << e.what();
  }
}

TEST(Recipes, VanillaGptMatchesTheReference) {
  ConfigContainer c = find_recipe("vanilla_gpt_pretrain_config").build();
  EXPECT_EQ(c.model.num_layers, 0) << "the user must set the shape";
  EXPECT_EQ(c.model.normalization, "LayerNorm");
  EXPECT_EQ(c.model.position_embedding_type, "learned_absolute");
  EXPECT_DOUBLE_EQ(c.model.hidden_dropout, 0.1);
  EXPECT_EQ(c.model.seq_length, 1024);
  EXPECT_EQ(*c.train.train_iters, 300000);
  EXPECT_EQ(*c.train.global_batch_size, 32);
  EXPECT_EQ(*c.train.micro_batch_size, 2);
  EXPECT_EQ(*c.validation.eval_interval, 500);
  EXPECT_EQ(c.validation.eval_iters, 32);
  EXPECT_EQ(c.scheduler.lr_decay_style, "cosine");
  EXPECT_DOUBLE_EQ(*c.optimizer.lr, 3e-4);
  EXPECT_DOUBLE_EQ(*c.optimizer.min_lr, 3e-5);
  EXPECT_EQ(c.scheduler.lr_warmup_iters, 500);
  EXPECT_DOUBLE_EQ(c.optimizer.adam_beta2, 0.95);
  EXPECT_DOUBLE_EQ(c.optimizer.weight_decay, 0.1);
  EXPECT_DOUBLE_EQ(*c.scheduler.end_weight_decay, 0.033);
  EXPECT_FALSE(c.ddp.use_distributed_optimizer);
  EXPECT_TRUE(c.optimizer.use_distributed_optimizer);
  EXPECT_EQ(*c.dataset.split, "9999,8,2");
  EXPECT_EQ(c.logger.log_interval, 10);
  EXPECT_EQ(*c.tokenizer.tokenizer_type, "NullTokenizer");
  EXPECT_EQ(*c.tokenizer.vocab_size, 32000);
  EXPECT_EQ(*c.checkpoint.save_interval, 500);
  EXPECT_TRUE(c.checkpoint.save.has_value());
  EXPECT_FALSE(c.checkpoint.load.has_value()) << "only vanilla leaves load unset";
  EXPECT_EQ(c.mixed_precision.s, "bf16_mixed");
  EXPECT_EQ(c.env_vars.at("NCCL_NVLS_ENABLE"), "0");
}

TEST(Recipes, SeedBridgeCommandResolves) {
  Resolved r = run("vanilla_gpt_pretrain_config", test::seed_bridge_overrides());
  auto& c = r.cfg;
  EXPECT_TRUE(c.ddp.use_distributed_optimizer) << "the OR rule turns it on for both";
  bool warned = false;
  for (auto& w : r.validated.warnings) warned = warned || w.find("Distributed optimizer settings were not in sync") != std::string::npos;
  EXPECT_TRUE(warned);
  // Bridge's pinned NullTokenizer: 32000 -> 32001 -> padded 32128.
  EXPECT_EQ(r.validated.derived.tokenizer_vocab_size, 32001);
  EXPECT_EQ(r.validated.derived.eod_id, 32000);
  EXPECT_EQ(r.validated.derived.padded_vocab_size, 32128);
  EXPECT_EQ(*c.dataset.split, "1,1,1") << "mock data forces an even split";
  EXPECT_EQ(*c.scheduler.lr_warmup_steps, 32);
  EXPECT_EQ(*c.scheduler.lr_decay_steps, 320);
  EXPECT_EQ(r.validated.derived.num_microbatches, 8);
}

TEST(Recipes, DenseModelShapesMatchTheReference) {
  ConfigContainer l1 = find_recipe("llama32_1b_pretrain_config").build();
  EXPECT_EQ(l1.model.num_layers, 16);
  EXPECT_EQ(l1.model.hidden_size, 2048);
  EXPECT_EQ(*l1.model.ffn_hidden_size, 8192);
  EXPECT_EQ(*l1.model.num_query_groups, 8);
  EXPECT_EQ(*l1.model.kv_channels, 64);
  EXPECT_TRUE(l1.model.share_embeddings_and_output_weights);
  EXPECT_TRUE(l1.model.rope_scaling);
  EXPECT_DOUBLE_EQ(l1.model.rope_scaling_factor, 32.0);
  EXPECT_DOUBLE_EQ(l1.model.rotary_base, 500000);
  EXPECT_EQ(l1.model.seq_length, 8192);
  EXPECT_EQ(*l1.train.global_batch_size, 512);
  EXPECT_EQ(*l1.train.train_iters, 1168251);
  EXPECT_EQ(l1.scheduler.lr_warmup_iters, 2000);
  EXPECT_EQ(*l1.validation.eval_interval, 2000);
  EXPECT_EQ(l1.model.cross_entropy_fusion_impl, "te");
  EXPECT_EQ(*l1.checkpoint.load, *l1.checkpoint.save) << "load == save: the stale-checkpoint trap";

  ConfigContainer l8 = find_recipe("llama3_8b_pretrain_config").build();
  EXPECT_EQ(l8.model.num_layers, 32);
  EXPECT_EQ(*l8.model.ffn_hidden_size, 14336);
  EXPECT_FALSE(l8.model.share_embeddings_and_output_weights);
  EXPECT_FALSE(l8.model.rope_scaling);
  EXPECT_EQ(l8.model.context_parallel_size, 2);

  ConfigContainer q = find_recipe("qwen3_8b_pretrain_config").build();
  EXPECT_EQ(q.model.num_layers, 36);
  EXPECT_EQ(*q.model.ffn_hidden_size, 12288);
  EXPECT_TRUE(q.model.qk_layernorm);
  EXPECT_DOUBLE_EQ(q.model.layernorm_epsilon, 1e-6);
  EXPECT_DOUBLE_EQ(q.model.rotary_base, 1e6);
  EXPECT_EQ(q.model.seq_length, 4096);
  EXPECT_EQ(*q.train.global_batch_size, 1024);
  EXPECT_EQ(*q.train.train_iters, 100);
  EXPECT_EQ(q.scheduler.lr_warmup_iters, 40);
  EXPECT_EQ(*q.scheduler.lr_decay_iters, 100);
  EXPECT_EQ(*q.tokenizer.tokenizer_type, "HuggingFaceTokenizer");
  validate(q, {FrontEnd::Bridge, 16});
  EXPECT_FALSE(q.ddp.grad_reduce_in_fp32) << "the cohort's mixed precision keeps bf16 gradient reduction";
  EXPECT_TRUE(q.model.bf16);
}

TEST(Recipes, DeepSeekV2LiteMoeFields) {
  ConfigContainer d = find_recipe("deepseek_v2_lite_pretrain_config").build();
  EXPECT_EQ(d.model.num_layers, 27);
  EXPECT_EQ(*d.model.num_moe_experts, 64);
  EXPECT_EQ(d.model.moe_router_topk, 6);
  EXPECT_EQ(*d.model.moe_ffn_hidden_size, 1408);
  EXPECT_EQ(*d.model.moe_shared_expert_intermediate_size, 2816);
  ASSERT_EQ(d.model.moe_layer_freq.list.size(), 27u);
  EXPECT_EQ(d.model.moe_layer_freq.list[0].i, 0);
  EXPECT_EQ(d.model.moe_layer_freq.list[1].i, 1);
  EXPECT_EQ(d.model.moe_router_load_balancing_type.s, "seq_aux_loss");
  EXPECT_DOUBLE_EQ(d.model.moe_aux_loss_coeff.f, 1e-3);
  EXPECT_TRUE(d.model.moe_router_pre_softmax);
  EXPECT_TRUE(d.model.multi_latent_attention);
  EXPECT_FALSE(d.model.q_lora_rank.has_value());
  EXPECT_EQ(d.model.kv_lora_rank, 512);
  EXPECT_EQ(d.model.expert_model_parallel_size, 8);
  EXPECT_EQ(*d.model.recompute_granularity, "full");
  EXPECT_EQ(d.model.cross_entropy_fusion_impl, "te");
  // NullTokenizer 32001 padded to a multiple of 3200 = 35200, on 8 ranks (EP 8, DP 8).
  Resolved r = run("deepseek_v2_lite_pretrain_config", {}, 8);
  EXPECT_EQ(r.validated.derived.padded_vocab_size, 35200);
  EXPECT_EQ(*r.cfg.model.expert_tensor_parallel_size, 1) << "Bridge: ETP 1 when EP > 1";
}

TEST(Recipes, DeepSeekV3FromItsConfigAndTheRecipe) {
  ConfigContainer d = find_recipe("deepseek_v3_pretrain_config").build();
  EXPECT_EQ(d.model.num_layers, 61);
  EXPECT_EQ(d.model.hidden_size, 7168);
  EXPECT_EQ(*d.model.q_lora_rank, 1536);
  EXPECT_EQ(*d.model.num_moe_experts, 256);
  EXPECT_EQ(d.model.moe_router_topk, 8);
  EXPECT_EQ(d.model.moe_layer_freq.list[2].i, 0);
  EXPECT_EQ(d.model.moe_layer_freq.list[3].i, 1);
  EXPECT_EQ(d.model.moe_router_score_function, "sigmoid");
  EXPECT_TRUE(d.model.moe_router_enable_expert_bias);
  EXPECT_EQ(*d.model.moe_router_num_groups, 8);
  EXPECT_EQ(*d.model.mtp_num_layers, 1);
  EXPECT_EQ(d.model.tensor_model_parallel_size, 2);
  EXPECT_EQ(d.model.pipeline_model_parallel_size, 16);
  EXPECT_EQ(d.model.expert_model_parallel_size, 64);
  EXPECT_EQ(*d.train.global_batch_size, 4096);
  EXPECT_EQ(find_recipe("deepseek_v3_pretrain_1024gpu_h100_bf16_config").name, "deepseek_v3_pretrain_config");
}

TEST(Recipes, FinetuneVariants) {
  ConfigContainer s = find_recipe("llama32_1b_sft_config").build();
  EXPECT_DOUBLE_EQ(*s.optimizer.lr, 5e-6);
  EXPECT_DOUBLE_EQ(*s.optimizer.min_lr, 0.0);
  EXPECT_DOUBLE_EQ(s.optimizer.adam_beta2, 0.98);
  EXPECT_EQ(s.scheduler.lr_warmup_iters, 50);
  EXPECT_EQ(*s.train.train_iters, 1000);
  EXPECT_EQ(*s.train.global_batch_size, 8);
  EXPECT_EQ(s.model.seq_length, 4096);
  EXPECT_EQ(s.rng.seed, 5678);
  EXPECT_EQ(*s.validation.eval_interval, 30);
  EXPECT_EQ(*s.checkpoint.save_interval, 50);
  EXPECT_FALSE(s.peft.scheme.has_value());
  EXPECT_TRUE(s.optimizer.use_distributed_optimizer);

  ConfigContainer p = find_recipe("llama32_1b_peft_config").build();
  EXPECT_DOUBLE_EQ(*p.optimizer.lr, 1e-4);
  EXPECT_EQ(*p.peft.scheme, "lora");
  EXPECT_EQ(p.peft.dim, 32);
  EXPECT_DOUBLE_EQ(p.peft.alpha, 32);
  EXPECT_FALSE(p.optimizer.use_distributed_optimizer);
  EXPECT_FALSE(p.model.cross_entropy_loss_fusion);

  ConfigContainer l8p = find_recipe("llama3_8b_peft_config").build();
  EXPECT_EQ(l8p.peft.dim, 8);
  EXPECT_DOUBLE_EQ(l8p.peft.alpha, 16);
  EXPECT_EQ(find_recipe("llama3_8b_sft_config").build().model.tensor_model_parallel_size, 2);

  ConfigContainer qp = find_recipe("qwen3_8b_peft_config").build();
  EXPECT_EQ(qp.peft.target_modules, (std::vector<std::string>{"linear_qkv", "linear_proj"}));
  EXPECT_EQ(*qp.train.train_iters, 100);
  EXPECT_EQ(qp.scheduler.lr_warmup_iters, 10);
  EXPECT_EQ(qp.model.seq_length, 2048);
  EXPECT_EQ(qp.dataset.pad_seq_to_mult, 4);
  EXPECT_TRUE(qp.optimizer.use_distributed_optimizer) << "the Qwen3 PEFT recipe keeps it on (bridge §4.5)";
  ConfigContainer qs = find_recipe("qwen3_8b_sft_config").build();
  EXPECT_EQ(qs.model.tensor_model_parallel_size, 4);
  EXPECT_EQ(*qs.train.global_batch_size, 32);
}

TEST(Recipes, BridgePostProcessingRules) {
  // model.seq_length follows dataset.seq_length, and says so.
  Resolved r = run("vanilla_gpt_pretrain_config",
                   {"model.num_layers=2", "model.hidden_size=64", "model.num_attention_heads=4",
                    "model.seq_length=128", "dataset.seq_length=256", "train.train_iters=100",
                    "scheduler.lr_warmup_iters=1"});
  EXPECT_EQ(r.cfg.model.seq_length, 256);
  bool noted = false;
  for (auto& n : r.notes) noted = noted || n.find("follows dataset.seq_length") != std::string::npos;
  EXPECT_TRUE(noted);
  // The small-train_iters pitfall: warmup capped at decay-1 with Bridge's warning.
  Resolved w = run("vanilla_gpt_pretrain_config", {"model.num_layers=2", "model.hidden_size=64",
                                                   "model.num_attention_heads=4", "train.train_iters=10"});
  EXPECT_EQ(*w.cfg.scheduler.lr_warmup_steps, 10 * 32 - 1);
  bool capped = false;  // Bridge's UserWarning text, word for word
  for (auto& m : w.validated.warnings)
    capped = capped || m == "lr_warmup_steps (16000) >= lr_decay_steps (320); capping lr_warmup_steps to 319. Reduce "
                           "lr_warmup_iters (or lr_warmup_samples) for short training runs.";
  EXPECT_TRUE(capped);
  // lr_decay_steps <= 0 is an error that names the overrides to set.
  try {
    run("vanilla_gpt_pretrain_config", {"model.num_layers=2", "model.hidden_size=64", "model.num_attention_heads=4",
                                        "train.train_iters=10", "scheduler.lr_decay_iters=0"});
    FAIL();
  } catch (const UsageError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("lr_decay_steps must be > 0, got 0"), std::string::npos) << m;
    EXPECT_NE(m.find("scheduler.lr_decay_iters"), std::string::npos) << m;
  }
  // Bridge's throughput window must hold an iteration.
  try {
    run("vanilla_gpt_pretrain_config", {"model.num_layers=2", "model.hidden_size=64", "model.num_attention_heads=4",
                                        "logger.log_throughput_to_tensorboard=true", "logger.throughput_window_size=0"});
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("logger.throughput_window_size must be a positive integer, got 0"),
              std::string::npos)
        << e.what();
  }
  // Bridge's timing levels go down to -1 (no timers); its options are Megatron's choices.
  for (const auto& [override_, want] :
       {std::pair<std::string, std::string>{"logger.timing_log_level=3", "logger.timing_log_level must be -1, 0, 1 or 2, got 3"},
        {"logger.timing_log_option=median", "bad value 'median' for logger.timing_log_option: choose from max, minmax, all"}}) {
    try {
      run("vanilla_gpt_pretrain_config", {"model.num_layers=2", "model.hidden_size=64", "model.num_attention_heads=4",
                                          override_});
      ADD_FAILURE() << override_;
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  }
  EXPECT_NO_THROW(run("vanilla_gpt_pretrain_config", {"model.num_layers=2", "model.hidden_size=64",
                                                      "model.num_attention_heads=4", "logger.timing_log_level=-1"}));
  // model/dataset seq_length mismatch can only come from a YAML file or code; validate catches it.
  ConfigContainer c = find_recipe("llama32_1b_pretrain_config").build();
  c.model.seq_length = 4096;
  EXPECT_THROW(validate(c, {}), UsageError);
}

TEST(Recipes, MixedPrecisionIsAPresetOrAMappingOfItsFields) {
  std::vector<std::string> shape = {"model.num_layers=2", "model.hidden_size=64", "model.num_attention_heads=4",
                                    "train.train_iters=100", "scheduler.lr_warmup_iters=1"};
  auto with = [&](std::string o) {
    auto v = shape;
    v.push_back(std::move(o));
    return v;
  };
  Resolved preset = run("vanilla_gpt_pretrain_config", with("mixed_precision=bf16-mixed"));
  EXPECT_EQ(preset.cfg.mixed_precision.s, "bf16_mixed") << "'-' aliases normalise to '_'";
  EXPECT_TRUE(preset.cfg.ddp.grad_reduce_in_fp32);
  Resolved map = run("vanilla_gpt_pretrain_config", with("mixed_precision={bf16:true,params_dtype:bf16,grad_reduce_in_fp32:false}"));
  EXPECT_TRUE(map.cfg.model.bf16);
  EXPECT_EQ(map.cfg.optimizer.params_dtype, "bf16");
  EXPECT_FALSE(map.cfg.ddp.grad_reduce_in_fp32);
  try {
    run("vanilla_gpt_pretrain_config", with("mixed_precision={bf16:true,grad_reduce_in_fp33:false}"));
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("did you mean grad_reduce_in_fp32?"), std::string::npos) << e.what();
  }
  try {
    run("vanilla_gpt_pretrain_config", with("mixed_precision=16-mixed"));
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("use fp16_mixed"), std::string::npos) << e.what();
  }
}

TEST(Recipes, RunRecipeCommandLine) {
  RecipeInvocation inv = parse_run_recipe_args({"--recipe", "llama32_1b_pretrain_config", "-ms", "10", "--lr=1e-3",
                                                "train.train_iters=20", "--dry-run"});
  EXPECT_EQ(inv.mode, "pretrain");
  EXPECT_TRUE(inv.dry_run);
  EXPECT_EQ(inv.convenience, (std::vector<std::string>{"train.train_iters=10", "optimizer.lr=1e-3"}));
  Resolved r = resolve_recipe(inv, 1);
  EXPECT_EQ(*r.cfg.train.train_iters, 20) << "a trailing override wins over a convenience flag";
  EXPECT_EQ(parse_run_recipe_args({"--model", "llama3_8b", "--mode", "lora"}).recipe, "llama3_8b_peft_config");
  auto err = [](std::vector<std::string> a) {
    try {
      parse_run_recipe_args(a);
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(err({"--recipe", "llama32_1b_pretrain_config", "--mode", "sft"}).find("incompatible"), std::string::npos);
  EXPECT_NE(err({"--recipe", "x", "--bogus"}).find("Unknown option: --bogus"), std::string::npos);
  EXPECT_NE(err({"--recipe", "llama32_1b_pretrain_config", "train"}).find("KEY=VALUE"), std::string::npos);
  EXPECT_NE(err({}).find("--recipe --model is required"), std::string::npos);
}

TEST(Recipes, EveryRecipeResolvesOnItsGpuCountOnceTheShapeIsGiven) {
  for (const auto& r : all_recipes()) {
    std::vector<std::string> o;
    if (r.name == "vanilla_gpt_pretrain_config")
      o = {"model.num_layers=2", "model.hidden_size=64", "model.num_attention_heads=4", "train.train_iters=1000"};
    ConfigContainer c = r.build();
    int64_t world = c.model.tensor_model_parallel_size * c.model.pipeline_model_parallel_size *
                    c.model.context_parallel_size;  // DP 1
    RecipeInvocation inv;
    inv.recipe = r.name;
    inv.mode = r.mode == "peft" ? "lora" : r.mode;
    inv.overrides = o;
    EXPECT_NO_THROW(resolve_recipe(inv, world)) << r.name;
  }
}

// #9's flagship: a Qwen3-MoE-style model of about 2.2B parameters, about 0.6B of them active.
TEST(Recipes, MoeFlagshipShape) {
  Resolved r = run("moe_2b_pretrain_config", {});
  const auto& m = r.cfg.model;
  EXPECT_EQ(m.num_layers, 24);
  EXPECT_EQ(m.hidden_size, 1024);
  EXPECT_EQ(m.num_attention_heads, 16);
  EXPECT_EQ(*m.num_query_groups, 4);
  EXPECT_EQ(*m.kv_channels, 64);
  EXPECT_TRUE(m.qk_layernorm);
  EXPECT_EQ(m.normalization, "RMSNorm");
  EXPECT_EQ(m.position_embedding_type, "rope");
  EXPECT_FALSE(m.add_bias_linear);
  EXPECT_FALSE(m.share_embeddings_and_output_weights);
  EXPECT_EQ(*m.num_moe_experts, 64);
  EXPECT_EQ(m.moe_router_topk, 8);
  EXPECT_EQ(*m.moe_ffn_hidden_size, 384);
  EXPECT_EQ(m.moe_router_score_function, "softmax");
  EXPECT_EQ(m.moe_router_load_balancing_type.s, "aux_loss");
  EXPECT_DOUBLE_EQ(m.moe_aux_loss_coeff.f, 1e-3);
  EXPECT_EQ(m.seq_length, 4096);
  EXPECT_EQ(r.validated.derived.padded_vocab_size, 152064) << "Bridge's NullTokenizer: 151936 + 1, padded to 128";
}
