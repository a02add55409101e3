// laoyao data-samples: what a run feeds the model, as JSON lines.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "run_binary.hpp"

using laoyao::test::run_laoyao;

static std::vector<std::string> seed_flags() {
  return {"--num-layers", "2", "--hidden-size", "256", "--num-attention-heads", "4", "--ffn-hidden-size", "1024",
          "--seq-length", "512", "--max-position-embeddings", "512", "--micro-batch-size", "4",
          "--global-batch-size", "32", "--train-iters", "10", "--eval-iters", "2", "--eval-interval", "10",
          "--mock-data", "--bf16", "--use-mcore-models", "--tokenizer-type", "NullTokenizer", "--vocab-size",
          "32000", "--lr", "3e-4", "--min-lr", "3e-5", "--seed", "1234", "--log-interval", "1"};
}

static std::vector<nlohmann::json> lines_of(const std::string& out) {
  std::vector<nlohmann::json> v;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty() && line[0] == '{') v.push_back(nlohmann::json::parse(line));
  return v;
}

TEST(DataSamples, SeedCommandFeedsMegatronsMockSamplesInOrder) {
  std::vector<std::string> a = {"data-samples", "--iterations", "2", "--splits", "train"};
  auto f = seed_flags();
  a.insert(a.end(), f.begin(), f.end());
  auto r = run_laoyao(a);
  ASSERT_EQ(r.status, 0) << r.output.substr(0, 2000);
  auto lines = lines_of(r.output);
  ASSERT_EQ(lines.size(), 16u) << "2 iterations x 8 micro-batches";
  // Iteration k, micro-batch m reads dataset indices ((k-1)*8 + m)*4 + [0, 4).
  EXPECT_EQ(lines[9]["iteration"], 2);
  EXPECT_EQ(lines[9]["microbatch"], 1);
  EXPECT_EQ(lines[9]["sample_indices"], nlohmann::json({36, 37, 38, 39}));
  const auto& tokens = lines[0]["tokens"][0];
  ASSERT_EQ(tokens.size(), 512u);
  // Megatron's first training sample of this command starts inside a mock document at 3138.
  EXPECT_EQ(tokens[0], 3138);
  for (size_t i = 0; i + 1 < 512; ++i) ASSERT_EQ(lines[0]["labels"][0][i], tokens[i + 1]) << i;
  EXPECT_EQ(lines[0]["position_ids"][0][511], 511);
  EXPECT_EQ(lines[0]["loss_mask"][0][100], 1.0);
}

// --reset-attention-mask: each token's first visible key restarts after every EOD (the NullTokenizer's
// EOD is vocab_size - 1); where Megatron's attention ignores the mask there is no such field.
TEST(DataSamples, ResetAttentionMaskPrintsEachTokensFirstKey) {
  std::vector<std::string> a = {"data-samples", "--iterations", "1", "--splits", "train"};
  auto f = seed_flags();
  a.insert(a.end(), f.begin(), f.end());
  // Where Megatron's attention applies the mask: the local implementation, unfused softmax.
  a.insert(a.end(), {"--reset-attention-mask", "--transformer-impl", "local", "--no-masked-softmax-fusion"});
  auto r = run_laoyao(a);
  ASSERT_EQ(r.status, 0) << r.output.substr(0, 2000);
  auto lines = lines_of(r.output);
  ASSERT_EQ(lines.size(), 8u);
  int eods = 0;
  for (const auto& line : lines)
    for (size_t row = 0; row < 4; ++row) {
      const auto& tokens = line["tokens"][row];
      const auto& first = line["attention_key_start"][row];
      ASSERT_EQ(first.size(), 512u);
      int64_t start = 0;
      for (size_t i = 0; i < 512; ++i) {
        ASSERT_EQ(first[i], start) << "token " << i;
        if (tokens[i] == 31999) start = static_cast<int64_t>(i) + 1, ++eods;
      }
    }
  EXPECT_GT(eods, 0) << "no EOD in 32 samples: the test shows nothing";
  a.resize(a.size() - 3);  // Transformer Engine's attention (the default) ignores the mask
  const auto te = run_laoyao(a);
  EXPECT_FALSE(lines_of(te.output)[0].contains("attention_key_start"));
}

TEST(DataSamples, EvaluationsContinueTheValidationStreamAndTestStartsAtZero) {
  std::vector<std::string> a = {"data-samples", "--splits", "valid,test"};
  auto f = seed_flags();
  a.insert(a.end(), f.begin(), f.end());
  auto r = run_laoyao(a);
  ASSERT_EQ(r.status, 0) << r.output.substr(0, 2000);
  auto lines = lines_of(r.output);
  // Evaluation at iteration 10 and the final one: 2 eval iterations x 8 micro-batches each; test: 16.
  ASSERT_EQ(lines.size(), 48u);
  EXPECT_EQ(lines[0]["split"], "valid");
  EXPECT_EQ(lines[0]["sample_indices"], nlohmann::json({0, 1, 2, 3}));
  EXPECT_EQ(lines[16]["final"], true);
  EXPECT_EQ(lines[16]["sample_indices"], nlohmann::json({64, 65, 66, 67})) << "the final validation continues";
  EXPECT_EQ(lines[32]["split"], "test");
  EXPECT_EQ(lines[32]["sample_indices"], nlohmann::json({0, 1, 2, 3}));
}

TEST(DataSamples, RecipeCommandLinesAndBadInput) {
  auto r = run_laoyao({"data-samples", "--iterations", "1", "--splits", "train", "--recipe",
                       "vanilla_gpt_pretrain_config", "model.num_layers=2", "model.hidden_size=64",
                       "model.num_attention_heads=4", "dataset.seq_length=64", "train.train_iters=10",
                       "train.global_batch_size=4", "train.micro_batch_size=2", "scheduler.lr_warmup_iters=1"});
  ASSERT_EQ(r.status, 0) << r.output.substr(0, 2000);
  EXPECT_EQ(lines_of(r.output).size(), 2u);
  EXPECT_EQ(run_laoyao({"data-samples", "--splits", "training"}).status, 2);
  EXPECT_EQ(run_laoyao({"data-samples", "--num-layer", "2"}).status, 2);
}

// Sample-based training with a batch-size ramp (8 -> 32 by 8 over 96 samples, micro-batches of 4):
// iterations read 8, 8, 8, 8, 16, ... samples, each from where the last one stopped.
TEST(DataSamples, BatchRampupReadsEachIterationsBatchInOrder) {
  std::vector<std::string> a = {"data-samples", "--iterations", "6", "--splits", "train"};
  auto f = seed_flags();
  for (size_t i = 0; i + 1 < f.size(); ++i)
    if (f[i] == "--train-iters") f[i] = "--train-samples", f[i + 1] = "400";
  a.insert(a.end(), f.begin(), f.end());
  a.insert(a.end(), {"--rampup-batch-size", "8", "8", "96"});
  auto r = run_laoyao(a);
  ASSERT_EQ(r.status, 0) << r.output.substr(0, 2000);
  auto lines = lines_of(r.output);
  ASSERT_EQ(lines.size(), 2u * 4 + 4 + 4) << "2 micro-batches x 4 iterations, then 4 x 2";
  EXPECT_EQ(lines[7]["iteration"], 4);
  EXPECT_EQ(lines[7]["sample_indices"], nlohmann::json({28, 29, 30, 31}));
  EXPECT_EQ(lines[8]["iteration"], 5);
  EXPECT_EQ(lines[8]["sample_indices"], nlohmann::json({32, 33, 34, 35}));
  EXPECT_EQ(lines[15]["iteration"], 6);
  EXPECT_EQ(lines[15]["microbatch"], 3);
  EXPECT_EQ(lines[15]["sample_indices"], nlohmann::json({60, 61, 62, 63}));
}
