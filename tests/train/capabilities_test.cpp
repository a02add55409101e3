// What this build refuses: every setting that would otherwise be silently ignored is named.
#include <gtest/gtest.h>

#include <functional>

#include "config/mlm_args.hpp"
#include "dist/process_group.hpp"
#include "train/capabilities.hpp"

using namespace laoyao;

static std::string missing(std::vector<std::string> extra) {
  std::vector<std::string> a = {"--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2",
                                "--seq-length", "16", "--micro-batch-size", "1", "--train-iters", "2",
                                "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "64", "--lr", "1e-3"};
  a.insert(a.end(), extra.begin(), extra.end());
  std::string all;
  for (auto& m : train::missing_features(config::parse_mlm_args(a), 1)) all += m + "\n";
  return all;
}

TEST(Capabilities, TheSeedFeaturesAreSupported) { EXPECT_EQ(missing({}), ""); }

TEST(Capabilities, SettingsTheEngineWouldIgnoreAreNamed) {
  EXPECT_NE(missing({"--optimizer", "sgd"}).find("'sgd' optimizer"), std::string::npos);
  EXPECT_EQ(missing({"--decoupled-lr", "1.0", "--decoupled-min-lr", "0.1"}), "") << "both backends train it";
  EXPECT_EQ(missing({"--calculate-per-token-loss"}), "");
  EXPECT_EQ(missing({"--async-save", "--save", "/tmp/x", "--save-interval", "5"}), "");
  EXPECT_NE(missing({"--skip-train"}).find("--skip-train"), std::string::npos);
  EXPECT_NE(missing({"--iterations-to-skip", "3"}).find("--iterations-to-skip"), std::string::npos);
  EXPECT_EQ(missing({"--position-embedding-type", "rope", "--qk-layernorm", "--normalization", "RMSNorm"}), "");
  EXPECT_EQ(missing({"--position-embedding-type", "yarn"}), "");
  EXPECT_NE(missing({"--position-embedding-type", "mrope"}).find("'mrope'"), std::string::npos);
  EXPECT_NE(missing({"--qk-layernorm"}).find("QK layernorm with LayerNorm"), std::string::npos);
  // Mixture of Experts trains on one rank; expert parallelism is named.
  EXPECT_EQ(missing({"--num-experts", "8"}), "");
  EXPECT_NE(missing({"--num-experts", "8", "--expert-model-parallel-size", "2"}).find("expert parallelism"),
            std::string::npos);
  // Its experts split over the tensor-parallel ranks, or not at all: another expert TP size is named.
  EXPECT_EQ(missing({"--num-experts", "8", "--expert-tensor-parallel-size", "1"}), "");
  EXPECT_NE(missing({"--num-experts", "8", "--expert-tensor-parallel-size", "2"}).find(
                "model.expert_tensor_parallel_size must be 1 or model.tensor_model_parallel_size"),
            std::string::npos);
  // Expert parallelism with tensor parallelism (4 ranks: TP 2 x DP 2): the experts split over the
  // TP ranks too; EP 4 does not divide DP 2.
  auto on_four = [](std::vector<std::string> extra) {
    std::vector<std::string> a = {"--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2",
                                  "--seq-length", "16", "--micro-batch-size", "1", "--train-iters", "2", "--mock-data",
                                  "--tokenizer-type", "NullTokenizer", "--vocab-size", "64", "--lr", "1e-3",
                                  "--num-experts", "8", "--tensor-model-parallel-size", "2"};
    a.insert(a.end(), extra.begin(), extra.end());
    std::string all;
    for (auto& m : train::missing_features(config::parse_mlm_args(a), 4)) all += m + "\n";
    return all;
  };
  if (dist::gloo_built()) {
    EXPECT_EQ(on_four({"--expert-model-parallel-size", "2"}), "");
    EXPECT_NE(on_four({"--expert-model-parallel-size", "4"}).find("must divide the data-parallel size"),
              std::string::npos);
  }
  // Whole experts under TP (expert TP size 1): the expert-parallel groups fold across the TP ranks,
  // so EP must divide the world (not the data-parallel size).
  if (dist::gloo_built()) {
    EXPECT_EQ(on_four({"--expert-model-parallel-size", "2", "--expert-tensor-parallel-size", "1"}), "");
    EXPECT_EQ(on_four({"--expert-model-parallel-size", "4", "--expert-tensor-parallel-size", "1"}), "");
    EXPECT_NE(on_four({"--expert-model-parallel-size", "8", "--expert-tensor-parallel-size", "1"})
                  .find("must divide the world size when model.expert_tensor_parallel_size is 1"),
              std::string::npos);
    EXPECT_EQ(on_four({"--expert-tensor-parallel-size", "1"}), "");  // every TP rank holds every expert
  }
  EXPECT_NE(missing({"--ckpt-format", "zarr"}).find("'zarr'"), std::string::npos);
  EXPECT_NE(missing({"--fp16"}).find("fp16"), std::string::npos);
  // The precision-aware optimizer with fp32 states is the plain AdamW; lower-precision states are named.
  EXPECT_EQ(missing({"--use-precision-aware-optimizer"}), "");
  EXPECT_NE(missing({"--use-precision-aware-optimizer", "--exp-avg-dtype", "bf16"}).find("optimizer.exp_avg_dtype bf16"),
            std::string::npos);
  EXPECT_NE(missing({"--use-precision-aware-optimizer", "--exp-avg-sq-dtype", "fp16"}).find("--exp-avg-sq-dtype"),
            std::string::npos);
  EXPECT_NE(missing({"--use-precision-aware-optimizer", "--main-grads-dtype", "bf16"}).find("main_grads_dtype"),
            std::string::npos);
  EXPECT_NE(missing({"--use-precision-aware-optimizer", "--main-params-dtype", "fp16"}).find("main_params_dtype"),
            std::string::npos);
}

// Settings Megatron honours and laoyao does not build: each named, none passed over.
TEST(Capabilities, SettingsThatWouldChangeTheRunAreNamed) {
  EXPECT_NE(missing({"--bf16", "--loss-scale", "1024"}).find("--loss-scale"), std::string::npos);
  EXPECT_NE(missing({"--dataloader-type", "cyclic"}).find("'cyclic' data loader"), std::string::npos);
  EXPECT_NE(missing({"--dataloader-type", "external"}).find("'external' data loader"), std::string::npos);
  EXPECT_EQ(missing({"--dataloader-type", "single"}), "");
  EXPECT_NE(missing({"--use-checkpoint-args"}).find("--use-checkpoint-args"), std::string::npos);
  EXPECT_NE(missing({"--no-load-rng"}).find("--no-load-rng"), std::string::npos);
  EXPECT_EQ(missing({"--no-save-rng"}), "") << "laoyao's checkpoints need no RNG state to resume the same masks";
  EXPECT_NE(missing({"--log-energy"}).find("--log-energy"), std::string::npos);
  EXPECT_EQ(missing({"--log-memory-to-tensorboard"}), "") << "the CUDA backend writes them (the CPU one refuses)";
  EXPECT_EQ(missing({"--tensorboard-dir", "/tmp/tb", "--log-timers-to-tensorboard", "--log-validation-ppl-to-tensorboard"}),
            "");
  EXPECT_NE(missing({"--wandb-project", "p"}).find("Weights & Biases"), std::string::npos);
  EXPECT_EQ(missing({"--profile", "--profile-step-start", "2", "--profile-step-end", "4"}), "")
      << "Nsight Systems' capture range (cudaProfilerStart/Stop)";
  EXPECT_NE(missing({"--record-memory-history"}).find("--record-memory-history"), std::string::npos);
  // The same through the recipe front end's fields.
  auto with = [](const std::function<void(config::ConfigContainer&)>& set) {
    config::ConfigContainer c = config::parse_mlm_args({"--num-layers", "1", "--hidden-size", "32",
                                                        "--num-attention-heads", "2", "--seq-length", "16",
                                                        "--micro-batch-size", "1", "--train-iters", "2", "--mock-data",
                                                        "--tokenizer-type", "NullTokenizer", "--vocab-size", "64",
                                                        "--lr", "1e-3"});
    set(c);
    std::string all;
    for (auto& m : train::missing_features(c, 1)) all += m + "\n";
    return all;
  };
  EXPECT_EQ(with([](auto& c) { c.scheduler.no_weight_decay_cond_type = "qwen3_next"; }), "")
      << "the q/k layernorm weights decay (as optimizer.apply_wd_to_qk_layernorm)";
  EXPECT_NE(with([](auto& c) { c.scheduler.no_weight_decay_cond_type = "other"; }).find("'other'"), std::string::npos);
  EXPECT_EQ(with([](auto& c) { c.logger.log_throughput_to_tensorboard = true; }), "")
      << "Bridge's throughput/* scalars are written";
  EXPECT_NE(with([](auto& c) { c.ddp.use_megatron_fsdp = true; }).find("FSDP"), std::string::npos);
  EXPECT_NE(with([](auto& c) { c.profiling.use_pytorch_profiler = true; }).find("PyTorch profiler"),
            std::string::npos);
  EXPECT_NE(with([](auto& c) { c.dist.use_torch_fsdp2 = true; }).find("FSDP"), std::string::npos);
}

TEST(Capabilities, SeveralRanksTrainDataAndTensorParallel) {
  std::vector<std::string> a = {"--num-layers", "1"};
  const auto plain = train::missing_features(config::parse_mlm_args(a), 2);
  if (dist::gloo_built())
    EXPECT_TRUE(plain.empty()) << plain.front();
  else
    EXPECT_NE(plain.front().find("world size 2"), std::string::npos);
  a.push_back("--use-distributed-optimizer");  // data parallel: sharded over the ranks
  const auto dist_opt = train::missing_features(config::parse_mlm_args(a), 2);
  if (dist::gloo_built()) {
    EXPECT_TRUE(dist_opt.empty()) << dist_opt.front();
  }
  EXPECT_TRUE(train::missing_features(config::parse_mlm_args(a), 1).empty()) << "one rank: nothing to shard";
  // With tensor parallelism and sequence parallelism, the distributed optimizer sharding over the
  // data-parallel ranks (TP=2 x DP=2) or with nothing to shard (TP=2 on two ranks).
  a.insert(a.end(), {"--tensor-model-parallel-size", "2", "--sequence-parallel"});
  if (dist::gloo_built()) {
    const auto tp_dp = train::missing_features(config::parse_mlm_args(a), 4);
    EXPECT_TRUE(tp_dp.empty()) << tp_dp.front();
    const auto tp_only = train::missing_features(config::parse_mlm_args(a), 2);
    EXPECT_TRUE(tp_only.empty()) << tp_only.front();
  }
}
