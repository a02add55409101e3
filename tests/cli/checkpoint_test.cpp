// `laoyao checkpoint import-hf` as a user types it: a Hugging Face Llama folder imported, then
// trained from with the flags it wrote (`pretrain-gpt $(cat OUT/model_flags.txt) ...`) and with its
// Bridge overrides; bad arguments and folders exit 2 with nothing written.
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>

#include "../train/hf_folder.hpp"
#include "core/file_io.hpp"
#include "run_binary.hpp"

using namespace laoyao::test;
namespace fs = std::filesystem;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::vector<std::string> words(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

// A tiny training run on top of a model's flags: mock data, NullTokenizer (63 + EOD = the 64 rows).
std::vector<std::string> tiny_run(std::vector<std::string> args) {
  for (const char* a : {"--seq-length", "16", "--micro-batch-size", "1", "--global-batch-size", "2", "--train-iters",
                        "2", "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "63", "--lr", "1e-4",
                        "--eval-iters", "1", "--eval-interval", "2", "--log-interval", "1"})
    args.emplace_back(a);
  return args;
}

}  // namespace

TEST(CheckpointCli, AnImportedLlamaTrainsFromItsFlagsAndItsOverrides) {
  const std::string dir = fresh_dir("import_hf"), in = dir + "/hf", out = dir + "/imported";
  fs::create_directories(in);
  llama_folder(in, false).write(llama_config("LlamaForCausalLM"), laoyao::Dtype::BF16);
  auto r = run_laoyao({"checkpoint", "import-hf", in, out}, dir);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "imported LlamaForCausalLM: 15 tensors")) << r.output;
  EXPECT_TRUE(contains(r.output, "no tokenizer files")) << r.output;

  std::vector<std::string> mlm = {"pretrain-gpt"};
  for (auto& w : words(laoyao::read_file(out + "/model_flags.txt"))) mlm.push_back(w);
  r = run_laoyao(tiny_run(mlm), dir);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "loaded pretrained weights from " + fs::absolute(out).string())) << r.output;
  EXPECT_TRUE(contains(r.output, "iteration        2/       2")) << r.output;

  // The Bridge overrides on a recipe: the same model, read from the same folder.
  std::vector<std::string> bridge = {"run-recipe", "--recipe", "vanilla_gpt_pretrain_config"};
  for (auto& w : words(laoyao::read_file(out + "/model_overrides.txt"))) bridge.push_back(w);
  for (const char* a : {"dataset.seq_length=16", "train.train_iters=2", "train.global_batch_size=2",
                        "train.micro_batch_size=1", "validation.eval_interval=2", "validation.eval_iters=1",
                        "scheduler.lr_warmup_iters=0", "tokenizer.vocab_size=63", "logger.log_interval=1"})
    bridge.emplace_back(a);
  r = run_laoyao(bridge, dir);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "loaded pretrained weights from " + fs::absolute(out).string())) << r.output;
  EXPECT_TRUE(contains(r.output, "iteration        2/       2")) << r.output;
  fs::remove_all(dir);
}

TEST(CheckpointCli, BadArgumentsAndFoldersExitTwoWritingNothing) {
  const std::string dir = fresh_dir("import_hf_bad"), in = dir + "/hf";
  fs::create_directories(in);
  llama_folder(in, false).write(llama_config("FalconForCausalLM"));
  auto r = run_laoyao({"checkpoint", "import-hf", in}, dir);
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(contains(r.output, "import-hf takes HF_DIR OUT_DIR")) << r.output;
  r = run_laoyao({"checkpoint", "import-hff", in, dir + "/out"}, dir);
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(contains(r.output, "did you mean import-hf")) << r.output;
  r = run_laoyao({"checkpoint", "import-hf", in, dir + "/out"}, dir);
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(contains(r.output, "\"FalconForCausalLM\" is not supported")) << r.output;
  EXPECT_TRUE(contains(r.output, "LlamaForCausalLM")) << r.output;
  for (const auto& e : fs::directory_iterator(dir)) EXPECT_EQ(e.path().filename(), "hf");  // nothing written
  fs::remove_all(dir);
}
