// FP8 from the config to a training run: Megatron-LM's --fp8-* flags and Megatron-Bridge's
// mixed_precision presets reach the model's Fp8Spec with each front end's defaults; what Megatron
// refuses, what laoyao cannot run yet and shapes cuBLASLt cannot take are refused by name; a CPU run
// in FP8 trains as near to the BF16 run as FP8's rounding allows.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "config/convert_args.hpp"
#include "config/front_ends.hpp"
#include "core/error.hpp"
#include "train/capabilities.hpp"
#include "train/run_setup.hpp"
#include "train/trainer.hpp"

using namespace laoyao;

namespace {

std::vector<std::string> tiny(std::vector<std::string> extra, int iters = 10) {
  std::vector<std::string> a = {
      "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "2", "--ffn-hidden-size", "64",
      "--seq-length", "32", "--max-position-embeddings", "32", "--micro-batch-size", "2", "--global-batch-size", "4",
      "--train-iters", std::to_string(iters), "--eval-iters", "0", "--eval-interval", std::to_string(iters),
      "--mock-data", "--bf16", "--tokenizer-type", "NullTokenizer", "--vocab-size", "96", "--lr", "3e-3",
      "--min-lr", "3e-4", "--seed", "1234", "--log-interval", "1000", "--hidden-dropout", "0",
      "--attention-dropout", "0", "--swiglu", "--normalization", "RMSNorm", "--disable-bias-linear",
      "--position-embedding-type", "rope"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

model::GptConfig model_of(const config::Resolved& r) { return train::model_config(r.cfg, r.validated.derived); }

config::Resolved recipe(std::vector<std::string> extra) {
  config::RecipeInvocation inv;
  inv.recipe = "llama32_1b_pretrain_config";
  inv.overrides = {"model.num_layers=4", "model.hidden_size=64", "model.ffn_hidden_size=128",
                   "model.num_attention_heads=4", "model.num_query_groups=2", "model.kv_channels=16",
                   "dataset.seq_length=64", "train.global_batch_size=4", "train.micro_batch_size=2",
                   "train.train_iters=2", "scheduler.lr_warmup_iters=0", "validation.eval_iters=0",
                   "tokenizer.vocab_size=128", "checkpoint.save=null", "checkpoint.load=null"};
  inv.overrides.insert(inv.overrides.end(), extra.begin(), extra.end());
  return config::resolve_recipe(inv, 1);
}

// The message of the UsageError that resolving, the capabilities or the model config gives.
std::string refusal(const std::function<config::Resolved()>& resolve, int64_t world_size = 1) {
  try {
    config::Resolved r = resolve();
    std::string all;
    for (const auto& m : train::missing_features(r.cfg, world_size)) all += m + "\n";
    if (!all.empty()) return all;
    model_of(r);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

std::string mlm_refusal(std::vector<std::string> extra, int64_t world_size = 1) {
  return refusal([&] { return config::resolve_mlm(tiny(extra), world_size); }, world_size);
}

}  // namespace

TEST(Fp8Config, MegatronLmFlagsReachTheModelWithMegatronsDefaults) {
  const model::GptConfig plain = model_of(config::resolve_mlm(tiny({}), 1));
  EXPECT_FALSE(plain.fp8.has_value());

  const model::GptConfig d = model_of(config::resolve_mlm(tiny({"--fp8-format", "hybrid"}), 1));
  ASSERT_TRUE(d.fp8.has_value());
  EXPECT_EQ(d.fp8->formats, Fp8Formats::Hybrid);
  EXPECT_EQ(d.fp8->recipe, Fp8ScalingRecipe::Delayed);  // TransformerConfig's default
  EXPECT_EQ(d.fp8->amax_history_len, 1);
  EXPECT_EQ(d.fp8->amax_compute_algo, AmaxComputeAlgo::MostRecent);
  EXPECT_EQ(d.fp8->margin, 0);
  EXPECT_EQ(d.fp8->bf16_layers_at_start, 0);
  EXPECT_EQ(d.fp8->bf16_layers_at_end, 0);
  EXPECT_TRUE(d.bf16);

  const model::GptConfig t = model_of(config::resolve_mlm(
      tiny({"--fp8-format", "e4m3", "--fp8-recipe", "tensorwise", "--first-last-layers-bf16", "--fp8-margin", "1",
            "--fp8-amax-history-len", "16", "--fp8-amax-compute-algo", "max", "--num-layers-at-end-in-bf16", "0"}),
      1));
  ASSERT_TRUE(t.fp8.has_value());
  EXPECT_EQ(t.fp8->formats, Fp8Formats::E4M3);
  EXPECT_EQ(t.fp8->recipe, Fp8ScalingRecipe::Tensorwise);
  EXPECT_EQ(t.fp8->bf16_layers_at_start, 1);  // Megatron's default of --num-layers-at-start-in-bf16
  EXPECT_EQ(t.fp8->bf16_layers_at_end, 0);
  EXPECT_EQ(t.fp8->margin, 1);
  EXPECT_EQ(t.fp8->amax_history_len, 16);
  EXPECT_EQ(t.fp8->amax_compute_algo, AmaxComputeAlgo::Max);
  EXPECT_TRUE(t.bf16);

  // convert-args' Bridge twin (the precision as one mixed_precision mapping) gives the same model.
  const std::vector<std::string> args =
      tiny({"--fp8-format", "e4m3", "--fp8-recipe", "tensorwise", "--first-last-layers-bf16", "--fp8-margin", "1"});
  const config::Conversion conv = config::convert_mlm_args(args, 1);
  config::RecipeInvocation inv;
  inv.recipe = conv.recipe, inv.mode = "pretrain", inv.overrides = conv.overrides;
  const model::GptConfig twin = model_of(config::resolve_recipe(inv, 1));
  ASSERT_TRUE(twin.fp8.has_value());
  EXPECT_EQ(twin.fp8->formats, Fp8Formats::E4M3);
  EXPECT_EQ(twin.fp8->recipe, Fp8ScalingRecipe::Tensorwise);
  EXPECT_EQ(twin.fp8->margin, 1);
  EXPECT_EQ(twin.fp8->bf16_layers_at_start, 1);
  EXPECT_EQ(twin.fp8->bf16_layers_at_end, 1);
  EXPECT_TRUE(twin.bf16);
}

TEST(Fp8Config, BridgePresetsSetEveryFp8Field) {
  const model::GptConfig cur = model_of(recipe({"mixed_precision=bf16_with_fp8_current_scaling_mixed"}));
  ASSERT_TRUE(cur.fp8.has_value());
  EXPECT_EQ(cur.fp8->formats, Fp8Formats::Hybrid);
  EXPECT_EQ(cur.fp8->recipe, Fp8ScalingRecipe::Tensorwise);
  EXPECT_EQ(cur.fp8->bf16_layers_at_start, 1);
  EXPECT_EQ(cur.fp8->bf16_layers_at_end, 1);
  const config::Resolved delayed = recipe({"mixed_precision=bf16_with_fp8_delayed_scaling_mixed"});
  EXPECT_TRUE(delayed.cfg.model.fp8_param);  // fp8_param_gather
  const model::GptConfig del = model_of(delayed);
  ASSERT_TRUE(del.fp8.has_value());
  EXPECT_EQ(del.fp8->recipe, Fp8ScalingRecipe::Delayed);
  EXPECT_EQ(del.fp8->amax_history_len, 1024);
  EXPECT_EQ(del.fp8->amax_compute_algo, AmaxComputeAlgo::Max);
  EXPECT_EQ(del.fp8->bf16_layers_at_start, 0);
  // The block-scaling presets: hybrid (E5M2 gradients), and Nemotron-Nano-v2's, blockwise despite
  // its name, with the first and last two layers in BF16.
  const model::GptConfig sub = model_of(recipe({"mixed_precision=bf16_with_fp8_subchannel_scaling_mixed"}));
  ASSERT_TRUE(sub.fp8.has_value());
  EXPECT_EQ(sub.fp8->formats, Fp8Formats::Hybrid);
  EXPECT_EQ(sub.fp8->recipe, Fp8ScalingRecipe::Blockwise);
  EXPECT_EQ(sub.fp8->bf16_layers_at_start, 0);
  const config::Resolved nano = recipe({"mixed_precision=nanov2_bf16_with_fp8_current_scaling_mixed",
                                        "model.num_layers=6"});
  const model::GptConfig nv = model_of(nano);
  ASSERT_TRUE(nv.fp8.has_value());
  EXPECT_EQ(nv.fp8->recipe, Fp8ScalingRecipe::Blockwise);
  EXPECT_EQ(nv.fp8->bf16_layers_at_start, 2);
  EXPECT_EQ(nv.fp8->bf16_layers_at_end, 2);
  EXPECT_TRUE(nv.bf16);
  EXPECT_TRUE(nano.cfg.model.fp8_param);
  // bf16_mixed replaces whatever the model said with MixedPrecisionConfig's fp8 None.
  EXPECT_FALSE(model_of(recipe({"model.fp8=hybrid"})).fp8.has_value());
}

TEST(Fp8Config, WhatMegatronRefusesOrLaoyaoCannotRunIsNamed) {
  EXPECT_EQ(mlm_refusal({"--fp8-format", "hybrid", "--fp8-recipe", "blockwise"}), "");
  EXPECT_EQ(mlm_refusal({"--fp8-format", "hybrid", "--fp8-recipe", "blockwise", "--first-last-layers-bf16"}), "");
  EXPECT_NE(mlm_refusal({"--fp8-format", "hybrid", "--fp8-recipe", "mxfp8"}).find("Blackwell"), std::string::npos);
  EXPECT_NE(mlm_refusal({"--fp8-format", "hybrid", "--fp8-recipe", "custom"}).find("custom"), std::string::npos);
  EXPECT_NE(mlm_refusal({"--fp8-format", "e5m2"}).find("choose from e4m3, hybrid"), std::string::npos);
  EXPECT_NE(mlm_refusal({"--fp8-format", "hybrid", "--first-last-layers-bf16"})
                .find("Delayed scaling does not support first / last layer in BF16"),
            std::string::npos);
  EXPECT_NE(mlm_refusal({"--fp8-format", "hybrid", "--fp8-recipe", "tensorwise", "--first-last-layers-bf16",
                         "--num-layers-at-start-in-bf16", "3"})
                .find("num_layers_at_start_in_bf16 (3) must be between 0 and"),
            std::string::npos);
  EXPECT_NE(mlm_refusal({"--fp8-param-gather"}).find("needs FP8"), std::string::npos);
  EXPECT_NE(refusal([] { return recipe({"mixed_precision=bf16_with_mxfp8_mixed"}); }).find("mxfp8"), std::string::npos);
  // Shapes cuBLASLt's FP8 GEMMs cannot take.
  const std::string narrow = mlm_refusal({"--fp8-format", "hybrid", "--ffn-hidden-size", "72"});
  EXPECT_NE(narrow.find("linear_fc2 is 72 -> 32"), std::string::npos) << narrow;
  const std::string tokens = mlm_refusal({"--fp8-format", "hybrid", "--seq-length", "12", "--micro-batch-size", "1"});
  EXPECT_NE(tokens.find("multiples of 16"), std::string::npos) << tokens;
  // Not joined yet: named, the run refused before anything is written.
  // Mixture of Experts: the experts' GEMMs in FP8 too, their sizes checked, over expert-parallel ranks too.
  EXPECT_EQ(mlm_refusal({"--fp8-format", "hybrid", "--num-experts", "4"}), "");
  const std::string experts = mlm_refusal({"--fp8-format", "hybrid", "--num-experts", "4", "--moe-ffn-hidden-size", "40"});
  EXPECT_NE(experts.find("experts' linear_fc2 is 40 -> 32"), std::string::npos) << experts;
  EXPECT_EQ(mlm_refusal({"--fp8-format", "hybrid", "--fp8-recipe", "tensorwise", "--num-experts", "4",
                         "--expert-model-parallel-size", "2"}, 2), "");
  // Tensor parallelism: each rank's shards in multiples of 16, the experts' shards among them.
  EXPECT_EQ(mlm_refusal({"--fp8-format", "hybrid", "--tensor-model-parallel-size", "2"}, 2), "");
  const std::string shard = mlm_refusal({"--fp8-format", "hybrid", "--tensor-model-parallel-size", "2",
                                         "--ffn-hidden-size", "80"}, 2);
  EXPECT_NE(shard.find("on each of the 2 tensor-parallel ranks: linear_fc2 is 40 -> 32"), std::string::npos) << shard;
  EXPECT_EQ(mlm_refusal({"--fp8-format", "hybrid", "--num-experts", "4", "--tensor-model-parallel-size", "2",
                         "--sequence-parallel"}, 2), "");
  const std::string expert_shard = mlm_refusal({"--fp8-format", "hybrid", "--num-experts", "4", "--moe-ffn-hidden-size",
                                                "48", "--tensor-model-parallel-size", "2", "--sequence-parallel"}, 2);
  EXPECT_NE(expert_shard.find("on each of the 2 tensor-parallel ranks: experts' linear_fc2 is 24 -> 32"),
            std::string::npos) << expert_shard;
  // Data-parallel ranks: delayed scaling reduces its amaxes over them (CPU ranks), tensorwise needs none.
  EXPECT_EQ(mlm_refusal({"--fp8-format", "hybrid"}, 2), "");
  EXPECT_EQ(mlm_refusal({"--fp8-format", "hybrid", "--fp8-recipe", "tensorwise"}, 2), "");
  // Context-parallel ranks: each rank's tokens (2 of every sequence's 2 x CP chunks) in multiples of 16.
  EXPECT_EQ(mlm_refusal({"--fp8-format", "hybrid", "--context-parallel-size", "2"}, 2), "");
  const std::string cp = mlm_refusal({"--fp8-format", "hybrid", "--context-parallel-size", "2", "--seq-length", "48",
                                      "--max-position-embeddings", "48", "--micro-batch-size", "1"}, 2);
  EXPECT_NE(cp.find("48 / model.context_parallel_size 2 x train.micro_batch_size (--micro-batch-size) 1 = 24"),
            std::string::npos) << cp;
  // Multi-token prediction: its layers and eh_proj in FP8 (Megatron's global FP8 context).
  EXPECT_EQ(mlm_refusal({"--fp8-format", "hybrid", "--mtp-num-layers", "1"}), "");
}

namespace {

// The CPU backend's FP8 run beside the BF16 run of the same config (`extra` flags beside tiny's):
// every recipe trains, and ends within FP8's reach of BF16 (1% of the loss), not on it.
void expect_fp8_runs_near_bf16(const std::vector<std::string>& extra) {
  auto run = [&](std::vector<std::string> fp8) {
    fp8.insert(fp8.begin(), extra.begin(), extra.end());
    const config::Resolved r = config::resolve_mlm(tiny(fp8, 20), 1);
    train::TrainOptions opt;
    opt.out = std::tmpfile();
    train::TrainSummary s = train::train(r.cfg, r.validated.derived, opt);
    std::fclose(opt.out);
    return s.lm_loss;
  };
  const std::vector<double> bf16 = run({});
  ASSERT_EQ(bf16.size(), 20u);
  EXPECT_LT(bf16.back(), bf16.front() - 0.3);
  for (const char* recipe : {"delayed", "tensorwise", "blockwise"}) {
    SCOPED_TRACE(recipe);
    const std::vector<double> fp8 = run({"--fp8-format", "hybrid", "--fp8-recipe", recipe});
    ASSERT_EQ(fp8.size(), bf16.size());
    EXPECT_NE(fp8.back(), bf16.back());
    EXPECT_LT(std::abs(fp8.back() - bf16.back()), 0.01 * bf16.back());
  }
}

}  // namespace

TEST(Fp8Training, CpuRunsInFp8EndNearTheBf16Run) { expect_fp8_runs_near_bf16({}); }

// With MoE layers (4 experts, top-2, a shared expert): the experts' GEMMs in FP8 too.
TEST(Fp8Training, CpuMoeRunsInFp8EndNearTheBf16Run) {
  expect_fp8_runs_near_bf16({"--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "32",
                             "--moe-shared-expert-intermediate-size", "16", "--moe-aux-loss-coeff", "1e-2"});
}

// With a multi-token prediction layer: its linears and eh_proj in FP8 too.
TEST(Fp8Training, CpuMtpRunsInFp8EndNearTheBf16Run) { expect_fp8_runs_near_bf16({"--mtp-num-layers", "1"}); }
