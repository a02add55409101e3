// Megatron-LM's own SFT as its user runs it: `pretrain-gpt --sft --tokenizer-type SFTTokenizer` on a
// JSONL file of conversations (data/mlm_sft_dataset.hpp), trained and evaluated on the CPU; the
// rows as `data-samples` prints them; what Megatron-LM asserts refused by name, exit status 2.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "../data/nemotron_like_tokenizer.hpp"
#include "core/file_io.hpp"
#include "run_binary.hpp"

using namespace laoyao::test;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::string conversations(int n) {
  std::string out;
  for (int i = 0; i < n; ++i)
    out += R"({"messages": [{"role": "system", "content": "Count."}, {"role": "user", "content": "After )" +
           std::to_string(i) + R"(?"}, {"role": "assistant", "content": ")" + std::to_string(i + 1) + R"(."}]})" + "\n";
  return out;
}

std::vector<std::string> sft_flags(const std::string& data, const std::string& tok) {
  return {"--sft", "--tokenizer-type", "SFTTokenizer", "--tokenizer-model", tok,
          "--no-create-attention-mask-in-dataloader", "--data-path", data, "--split", "80,20,0",
          "--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "48",
          "--max-position-embeddings", "48", "--micro-batch-size", "2", "--global-batch-size", "4",
          "--train-iters", "3", "--lr", "1e-3", "--eval-iters", "1", "--eval-interval", "3",
          "--position-embedding-type", "rope", "--log-interval", "1"};
}

// dir/alpha.jsonl and dir/beta.jsonl: n conversations each, the user saying the file's name.
void write_alpha_and_beta(const std::string& dir, int n) {
  for (const std::string name : {"alpha", "beta"}) {
    std::string rows;
    for (int i = 0; i < n; ++i)
      rows += R"({"messages": [{"role": "user", "content": ")" + name + " " + std::to_string(i) +
              R"("}, {"role": "assistant", "content": "ok"}]})" + "\n";
    laoyao::write_file_atomic(dir + "/" + name + ".jsonl", rows);
  }
}

}  // namespace

TEST(MlmSftCli, PretrainGptSftTrainsOnConversations) {
  const std::string dir = fresh_dir("mlm_sft"), tok = nemotron_like_tokenizer(), data = dir + "/chat.jsonl";
  laoyao::write_file_atomic(data, conversations(20));
  std::vector<std::string> run = {"pretrain-gpt"};
  for (const auto& f : sft_flags(data, tok)) run.push_back(f);
  auto r = run_laoyao(run, dir, "LAOYAO_DEVICE=cpu");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "iteration        3/       3")) << r.output;
  EXPECT_TRUE(contains(r.output, "validation loss at iteration 3")) << r.output;
  EXPECT_EQ(losses_in(r.output).size(), 5u) << r.output;  // three iterations, the validation twice (at 3, at the end)

  // The first row: line 0's conversation then line 1's, each from position 0, the loss on the
  // answers alone ("1.\n" and "2.\n": two tokens each), the padding after them.
  std::vector<std::string> samples = {"data-samples", "--iterations", "1"};
  for (const auto& f : sft_flags(data, tok)) samples.push_back(f);
  r = run_laoyao(samples, dir, "LAOYAO_DEVICE=cpu");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "\"sample_indices\":[0,1]")) << r.output;
  const size_t mask = r.output.find("\"loss_mask\":[[");
  ASSERT_NE(mask, std::string::npos) << r.output;
  const std::string first_row = r.output.substr(mask, r.output.find(']', mask) - mask);
  size_t ones = 0;
  for (size_t at = 0; (at = first_row.find("1.0", at)) != std::string::npos; at += 3) ++ones;
  EXPECT_EQ(ones, 2u) << first_row;
}

TEST(MlmSftCli, WhatMegatronLmAssertsIsRefusedByName) {
  const std::string dir = fresh_dir("mlm_sft_bad"), tok = nemotron_like_tokenizer(), data = dir + "/chat.jsonl";
  laoyao::write_file_atomic(data, conversations(8));
  auto without = [&](const std::string& flag, int values) {
    std::vector<std::string> run = {"pretrain-gpt"};
    const std::vector<std::string> flags = sft_flags(data, tok);
    for (size_t k = 0; k < flags.size(); ++k) {
      if (flags[k] == flag) {
        k += static_cast<size_t>(values);
        continue;
      }
      run.push_back(flags[k]);
    }
    return run;
  };
  auto r = run_laoyao(without("--no-create-attention-mask-in-dataloader", 0), dir, "LAOYAO_DEVICE=cpu");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "--no-create-attention-mask-in-dataloader")) << r.output;
  std::vector<std::string> hf = without("--tokenizer-type", 1);
  hf.insert(hf.end(), {"--tokenizer-type", "HuggingFaceTokenizer"});
  r = run_laoyao(hf, dir, "LAOYAO_DEVICE=cpu");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "SFTTokenizer")) << r.output;
  std::vector<std::string> format = sft_flags(data, tok);
  format.insert(format.begin(), "pretrain-gpt");
  format.insert(format.end(), {"--sft-tokenizer-prompt-format", "chatml"});
  r = run_laoyao(format, dir, "LAOYAO_DEVICE=cpu");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "unknown --sft-tokenizer-prompt-format 'chatml'")) << r.output;
}

// Several files with weights blend as Megatron's builder blends any datasets (equal weights: the
// files' rows in turn, each file from its first line); without weights refused, as Megatron-LM's
// SFTDataset fails on an unweighted blend.
TEST(MlmSftCli, WeightedFilesBlendInTurn) {
  const std::string dir = fresh_dir("mlm_sft_blend"), tok = nemotron_like_tokenizer();
  write_alpha_and_beta(dir, 10);
  auto flags = [&](const std::vector<std::string>& data) {
    std::vector<std::string> run = {"data-samples", "--iterations", "4"};
    for (const auto& f : sft_flags("X", tok)) run.push_back(f);
    auto at = std::find(run.begin(), run.end(), "X");
    at = run.erase(at);
    run.insert(at, data.begin(), data.end());
    for (auto& f : run)
      if (f == "80,20,0") f = "100,0,0";
    run.insert(run.end(), {"--train-iters", "4", "--global-batch-size", "1", "--micro-batch-size", "1"});
    return run;
  };
  auto r = run_laoyao(flags({"0.5", dir + "/alpha.jsonl", "0.5", dir + "/beta.jsonl"}), dir, "LAOYAO_DEVICE=cpu");
  ASSERT_EQ(r.status, 0) << r.output;
  // Each row's source, by the user text's first word (Qwen3's ids of "alpha" and "beta").
  std::vector<std::string> sources;
  for (size_t at = 0; (at = r.output.find("\"tokens\":[[", at)) != std::string::npos; ++at) {
    const std::string row = r.output.substr(at, r.output.find(']', at) - at);
    sources.push_back(contains(row, ",7141,") ? "alpha" : contains(row, ",19127,") ? "beta" : "?");
  }
  EXPECT_EQ(sources, (std::vector<std::string>{"alpha", "beta", "alpha", "beta"})) << r.output;
  r = run_laoyao(flags({dir + "/alpha.jsonl", dir + "/beta.jsonl"}), dir, "LAOYAO_DEVICE=cpu");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "needs a weight before each")) << r.output;
}

// Per-split paths (Megatron's blend_per_split): each split reads its own files whole; --data-path
// with them, or neither, refused by name.
TEST(MlmSftCli, PerSplitPathsReadTheirOwnFilesWhole) {
  const std::string dir = fresh_dir("mlm_sft_per_split"), tok = nemotron_like_tokenizer();
  write_alpha_and_beta(dir, 6);
  auto flags = [&](const std::string& command, const std::vector<std::string>& data) {
    std::vector<std::string> run = {command};
    const std::vector<std::string> base = sft_flags("X", tok);
    for (size_t k = 0; k < base.size(); ++k) {
      if (base[k] == "--data-path" || base[k] == "--split") {
        ++k;
        continue;
      }
      run.push_back(base[k]);
    }
    run.insert(run.end(), data.begin(), data.end());
    return run;
  };
  const std::vector<std::string> per_split = {"--train-data-path", dir + "/alpha.jsonl", "--valid-data-path",
                                              dir + "/beta.jsonl"};
  auto r = run_laoyao(flags("pretrain-gpt", per_split), dir, "LAOYAO_DEVICE=cpu");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "validation loss at iteration 3")) << r.output;
  // The training rows are alpha's alone, from its first line (Qwen3's ids of "alpha" and "beta").
  std::vector<std::string> samples = flags("data-samples", per_split);
  samples.insert(samples.begin() + 1, {"--iterations", "2"});
  r = run_laoyao(samples, dir, "LAOYAO_DEVICE=cpu");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, ",7141,")) << r.output;
  EXPECT_FALSE(contains(r.output, ",19127,")) << r.output;
  std::vector<std::string> both = per_split;
  both.insert(both.end(), {"--data-path", dir + "/alpha.jsonl"});
  r = run_laoyao(flags("pretrain-gpt", both), dir, "LAOYAO_DEVICE=cpu");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "not both")) << r.output;
  r = run_laoyao(flags("pretrain-gpt", {"--train-data-path", dir + "/alpha.jsonl", dir + "/beta.jsonl"}), dir,
                 "LAOYAO_DEVICE=cpu");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "several --train-data-path files needs a weight before each")) << r.output;
}
