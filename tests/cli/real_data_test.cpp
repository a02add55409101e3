// Real text end to end: fortunes -> laoyao preprocess-data (GPT-2 BPE) -> laoyao pretrain-gpt on
// the .bin/.idx with Megatron's split, the GPT-2 vocabulary padded as Megatron pads it.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "run_binary.hpp"

using laoyao::test::fresh_dir;
using laoyao::test::run_laoyao;

static std::string vocabs() {
  const char* env = std::getenv("LAOYAO_TEST_VOCABS");
  return env ? env : std::string(LAOYAO_SOURCE_DIR) + "/build/test-vocabs";
}

TEST(RealData, PreprocessedFortunesTrainWithTheGpt2Tokenizer) {
  const std::string v = vocabs();
  ASSERT_TRUE(std::filesystem::exists(v + "/gpt2/vocab.json")) << "run scripts/fetch_test_vocabs.sh first";
  ASSERT_TRUE(std::filesystem::exists("/usr/share/games/fortunes/fortunes")) << "install Debian's fortunes";
  const std::string dir = fresh_dir("real_data");
  {  // one JSON document per fortune
    std::ifstream in("/usr/share/games/fortunes/fortunes");
    std::ofstream out(dir + "/corpus.jsonl");
    std::string line, doc;
    auto flush = [&] {
      if (!doc.empty()) out << nlohmann::json{{"text", doc}}.dump() << "\n";
      doc.clear();
    };
    while (std::getline(in, line)) {
      if (line == "%") flush();
      else doc += line + "\n";
    }
    flush();
  }
  auto pp = run_laoyao({"preprocess-data", "--input", "corpus.jsonl", "--output-prefix", "fortunes",
                        "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", v + "/gpt2/vocab.json",
                        "--merge-file", v + "/gpt2/merges.txt", "--append-eod", "--workers", "2"},
                       dir);
  ASSERT_EQ(pp.status, 0) << pp.output;
  auto r = run_laoyao({"pretrain-gpt", "--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2",
                       "--seq-length", "32", "--max-position-embeddings", "32", "--micro-batch-size", "2",
                       "--global-batch-size", "4", "--train-iters", "3", "--eval-iters", "1", "--eval-interval", "3",
                       "--data-path", "fortunes_text_document", "--split", "98,2,0", "--tokenizer-type",
                       "GPT2BPETokenizer", "--vocab-file", v + "/gpt2/vocab.json", "--merge-file",
                       v + "/gpt2/merges.txt", "--lr", "1e-3", "--log-interval", "1"},
                      dir);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find(" > padded vocab (size: 50257) with 47 dummy tokens (new size: 50304)"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("iteration        3/       3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("validation loss at iteration 3 on validation set"), std::string::npos) << r.output;
  // split 98,2,0: no test documents, so no test evaluation.
  EXPECT_EQ(r.output.find("on test set"), std::string::npos) << r.output;
  // data-samples shows the tokens the run read: real GPT-2 ids.
  auto ds = run_laoyao({"data-samples", "--iterations", "1", "--splits", "train", "--num-layers", "1", "--hidden-size",
                        "32", "--num-attention-heads", "2", "--seq-length", "32", "--max-position-embeddings", "32",
                        "--micro-batch-size", "2", "--global-batch-size", "4", "--train-iters", "3", "--eval-iters",
                        "1", "--eval-interval", "3", "--data-path", "fortunes_text_document", "--split", "98,2,0",
                        "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", v + "/gpt2/vocab.json",
                        "--merge-file", v + "/gpt2/merges.txt", "--lr", "1e-3"},
                       dir);
  ASSERT_EQ(ds.status, 0) << ds.output.substr(0, 1000);
  auto first = nlohmann::json::parse(ds.output.substr(0, ds.output.find('\n')));
  for (auto& t : first["tokens"][0]) EXPECT_LT(t.get<int64_t>(), 50257);

  // Per-split paths (Megatron's blend_per_split): train and validation files, no test file.
  std::vector<std::string> per_split = {
      "pretrain-gpt", "--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "32",
      "--max-position-embeddings", "32", "--micro-batch-size", "2", "--global-batch-size", "4", "--train-iters", "2",
      "--eval-iters", "1", "--eval-interval", "2", "--train-data-path", "fortunes_text_document",
      "--valid-data-path", "1.0", "fortunes_text_document", "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file",
      v + "/gpt2/vocab.json", "--merge-file", v + "/gpt2/merges.txt", "--lr", "1e-3", "--log-interval", "1"};
  auto ps = run_laoyao(per_split, dir);
  ASSERT_EQ(ps.status, 0) << ps.output;
  EXPECT_NE(ps.output.find("validation loss at iteration 2 on validation set"), std::string::npos) << ps.output;
  EXPECT_EQ(ps.output.find("on test set"), std::string::npos) << ps.output;
  // The GPT-2 ids do not fit a NullTokenizer of 1000 tokens: a clear error naming an id, exit 2.
  auto mismatch = run_laoyao({"pretrain-gpt", "--num-layers", "1", "--hidden-size", "32", "--num-attention-heads",
                              "2", "--seq-length", "32", "--micro-batch-size", "2", "--train-iters", "1",
                              "--eval-interval", "1", "--eval-iters", "1", "--data-path", "fortunes_text_document", "--tokenizer-type", "NullTokenizer",
                              "--vocab-size", "1000", "--lr", "1e-3", "--split", "98,2,0"},
                             dir);
  EXPECT_EQ(mismatch.status, 2) << mismatch.output;
  EXPECT_NE(mismatch.output.find("outside the model's vocabulary [0, 1024)"), std::string::npos) << mismatch.output;
  per_split.insert(per_split.end(), {"--split", "98,2,0"});
  auto bad = run_laoyao(per_split, dir);
  EXPECT_EQ(bad.status, 2);
  EXPECT_NE(bad.output.find("--split cannot be combined with per-split data paths"), std::string::npos) << bad.output;
}
