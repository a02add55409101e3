// Bad input that reaches a run: a checkpoint whose train_state.json was edited, a save folder
// another run holds, evaluations the validation split cannot serve. Each ends before training with
// exit status 2, one message naming the file or setting, and nothing written.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/file_io.hpp"
#include "data/indexed_dataset.hpp"
#include "run_binary.hpp"
#include "train/checkpoint.hpp"

using laoyao::test::count_entries;
using laoyao::test::fresh_dir;
using laoyao::test::run_laoyao;
namespace fs = std::filesystem;

namespace {

const std::vector<std::string> kTiny = {
    "pretrain-gpt", "--num-layers", "1", "--hidden-size", "16", "--num-attention-heads", "2", "--seq-length", "16",
    "--max-position-embeddings", "16", "--micro-batch-size", "1", "--global-batch-size", "2", "--eval-iters", "1",
    "--tokenizer-type", "NullTokenizer", "--vocab-size", "64", "--lr", "1e-3", "--log-interval", "1"};

std::vector<std::string> tiny(std::vector<std::string> more) {
  std::vector<std::string> a = kTiny;
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

const std::string kCpu = "LAOYAO_DEVICE=cpu";

void expect_has(const std::string& out, const std::string& part) {
  EXPECT_NE(out.find(part), std::string::npos) << "missing '" << part << "' in:\n" << out;
}

// Replaces the value of `field` in a train_state.json.
void set_field(const std::string& file, const std::string& field, const std::string& value) {
  std::string s = laoyao::read_file(file);
  const size_t at = s.find("\"" + field + "\": ");
  ASSERT_NE(at, std::string::npos) << field;
  const size_t from = at + field.size() + 4, to = s.find_first_of(",\n", from);
  std::ofstream(file, std::ios::trunc) << s.substr(0, from) + value + s.substr(to);
}

}  // namespace

TEST(BadInputRun, AnEditedTrainStateIsRefusedNamingTheFileBeforeTraining) {
  const std::string dir = fresh_dir("bad_state");
  auto first = run_laoyao(tiny({"--mock-data", "--train-iters", "2", "--eval-interval", "2", "--save", "ckpt",
                                "--save-interval", "2"}),
                          dir, kCpu);
  ASSERT_EQ(first.status, 0) << first.output;
  const std::string state = "ckpt/iter_0000002/train_state.json";  // as --load names it
  const std::string good = laoyao::read_file(dir + "/" + state);
  const auto resume = tiny({"--mock-data", "--train-iters", "4", "--eval-interval", "2", "--save", "ckpt",
                            "--save-interval", "2", "--load", "ckpt", "--override-opt_param-scheduler"});
  struct Case {
    const char* field;
    const char* value;
    const char* says;
  };
  for (const Case& k : {Case{"optimizer_steps", "-1", "field 'optimizer_steps' is -1"},
                        Case{"consumed_train_samples", "-5", "field 'consumed_train_samples' is -5"},
                        Case{"consumed_train_samples", "1000000000000000", "no samples left to consume"},
                        Case{"consumed_valid_samples", "1000000000000000", "past the end of the validation dataset"}}) {
    SCOPED_TRACE(std::string(k.field) + "=" + k.value);
    set_field(dir + "/" + state, k.field, k.value);
    const size_t entries = count_entries(dir + "/ckpt");
    auto r = run_laoyao(resume, dir, kCpu);
    EXPECT_EQ(r.status, 2) << r.output;
    expect_has(r.output, state);
    expect_has(r.output, k.says);
    EXPECT_EQ(r.output.find(" iteration        3/"), std::string::npos) << "trained:\n" << r.output;
    EXPECT_EQ(count_entries(dir + "/ckpt"), entries);
    std::ofstream(dir + "/" + state, std::ios::trunc) << good;
  }
  auto ok = run_laoyao(resume, dir, kCpu);
  EXPECT_EQ(ok.status, 0) << ok.output;
}

TEST(BadInputRun, ASecondRunOnOneSaveFolderIsRefusedNamingTheFirst) {
  const std::string dir = fresh_dir("save_lock");
  const std::string save = dir + "/ckpt";
  laoyao::train::SaveDirLock other_run(save);  // this test process plays the first run
  const size_t entries = count_entries(save);
  auto r = run_laoyao(tiny({"--mock-data", "--train-iters", "2", "--eval-interval", "2", "--save", save,
                            "--save-interval", "1"}),
                      dir, kCpu);
  EXPECT_EQ(r.status, 2) << r.output;
  expect_has(r.output, "'" + save + "' is in use by another run (host ");
  expect_has(r.output, "pid " + std::to_string(::getpid()) + ")");
  EXPECT_EQ(r.output.find(" iteration        1/"), std::string::npos) << "trained:\n" << r.output;
  EXPECT_EQ(count_entries(save), entries);
}

// Bridge's budget for a run without validation.eval_interval asks no validation samples, so a real
// corpus's validation split is one epoch of its documents, while the end of training still
// evaluates validation.eval_iters batches. That is refused before training, not found out after it.
TEST(BadInputRun, EvaluationsTheValidationSplitCannotServeAreRefusedBeforeTraining) {
  const std::string dir = fresh_dir("eval_budget");
  {
    laoyao::data::IndexedDatasetBuilder b(dir + "/corpus", laoyao::data::TokenDType::kUInt16);
    for (int64_t d = 0; d < 200; ++d) {
      std::vector<int64_t> doc(40);
      for (size_t i = 0; i < doc.size(); ++i) doc[i] = static_cast<int64_t>((d * 7 + i * 3) % 63) + 1;
      doc.back() = 0;
      b.add_item(doc);
      b.end_document();
    }
    b.finalize();
  }
  const std::vector<std::string> bridge = {
      "run-recipe", "--recipe", "vanilla_gpt_pretrain_config", "model.num_layers=1", "model.hidden_size=16",
      "model.num_attention_heads=2", "model.seq_length=16", "dataset.seq_length=16", "train.train_iters=2",
      "train.global_batch_size=2", "train.micro_batch_size=1", "tokenizer.tokenizer_type=NullTokenizer",
      "tokenizer.vocab_size=64", "dataset.data_path=[corpus]", "dataset.split=90,5,5", "dataset.mock=false",
      "validation.eval_iters=100", "checkpoint.save=ckpt", "checkpoint.save_interval=1"};
  std::vector<std::string> unset = bridge;
  unset.push_back("validation.eval_interval=null");
  auto r = run_laoyao(unset, dir, kCpu);
  EXPECT_EQ(r.status, 2) << r.output;
  expect_has(r.output, "the validation dataset has");
  expect_has(r.output, "without validation.eval_interval / --eval-interval");
  EXPECT_FALSE(fs::exists(dir + "/ckpt")) << r.output;  // not even its run_config.yaml
  EXPECT_EQ(r.output.find(" iteration        1/"), std::string::npos) << "trained:\n" << r.output;
  // With an interval the budget sizes the split for every evaluation: the run goes through.
  std::vector<std::string> set = bridge;
  set.push_back("validation.eval_interval=2");
  set.push_back("validation.eval_iters=2");
  auto ok = run_laoyao(set, dir, kCpu);
  EXPECT_EQ(ok.status, 0) << ok.output;
  expect_has(ok.output, "validation loss at iteration 2 on validation set");
}

// Megatron-LM stops with a TypeError when --eval-interval is unset (its validation budget divides
// by it), so pretrain-gpt refuses the command line by name; the Bridge front end leaves it unset by
// default (no evaluation until the end), as the test above shows.
TEST(BadInputRun, MegatronLmFlagsWithoutAnEvalIntervalAreRefusedByName) {
  const std::string dir = fresh_dir("no_eval_interval");
  auto r = run_laoyao(tiny({"--mock-data", "--train-iters", "2", "--save", "ckpt", "--save-interval", "1"}), dir, kCpu);
  EXPECT_EQ(r.status, 2) << r.output;
  expect_has(r.output, "--eval-interval is required");
  EXPECT_EQ(count_entries(dir), 0u) << r.output;
  auto ok = run_laoyao(tiny({"--mock-data", "--train-iters", "2", "--eval-interval", "5"}), dir, kCpu);
  EXPECT_EQ(ok.status, 0) << ok.output;
  expect_has(ok.output, "validation loss at iteration 2 on validation set");
}

// An .idx whose dtype byte says uint8 over a .bin of uint16 ids trained on garbage; refused, with
// the likely cause, before anything is written.
TEST(BadInputRun, AnIndexWhoseDtypeDoesNotMatchItsBinIsRefused) {
  const std::string dir = fresh_dir("idx_dtype");
  {
    laoyao::data::IndexedDatasetBuilder b(dir + "/corpus", laoyao::data::TokenDType::kUInt16);
    for (int64_t d = 0; d < 50; ++d) {
      const std::vector<int64_t> doc(40, d % 60 + 1);
      b.add_item(doc);
      b.end_document();
    }
    b.finalize();
  }
  {  // the dtype byte follows the 9-byte magic and the 8-byte version
    std::fstream f(dir + "/corpus.idx", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(17);
    f.put(static_cast<char>(laoyao::data::TokenDType::kUInt8));
  }
  const size_t before = count_entries(dir);
  auto r = run_laoyao(tiny({"--data-path", "corpus", "--split", "90,5,5", "--train-iters", "2", "--eval-interval",
                            "2", "--save", "ckpt", "--save-interval", "1"}),
                      dir, kCpu);
  EXPECT_EQ(r.status, 2) << r.output;
  expect_has(r.output, "corpus.idx");
  expect_has(r.output, "probably does not match the dtype the .bin was written with");
  EXPECT_EQ(count_entries(dir), before) << r.output;
}

// laoyao's LAOYAO_* switches are read once at the start of every command: a bad value stops it by
// name before anything runs; a run prints the switches and writes them into run_config.yaml.
TEST(BadInputRun, ABadRuntimeOptionStopsTheCommandAndARunRecordsTheOptions) {
  const std::string dir = fresh_dir("runtime_options");
  const auto args =
      tiny({"--mock-data", "--train-iters", "1", "--eval-interval", "1", "--save", "ckpt", "--save-interval", "1"});
  auto bad = run_laoyao(args, dir, kCpu + " LAOYAO_CUDA_GRAPHS=off");
  EXPECT_EQ(bad.status, 2) << bad.output;
  expect_has(bad.output, "environment variable LAOYAO_CUDA_GRAPHS='off': accepted values are 0 or 1");
  EXPECT_FALSE(fs::exists(dir + "/ckpt"));
  auto recipes = run_laoyao({"recipes"}, dir, "LAOYAO_DEVICE=gpu");
  EXPECT_EQ(recipes.status, 2) << recipes.output;
  expect_has(recipes.output, "LAOYAO_DEVICE='gpu': accepted values are auto, cpu or cuda");

  auto run = run_laoyao(args, dir, kCpu + " LAOYAO_GEMM_AUTOTUNE=0");
  ASSERT_EQ(run.status, 0) << run.output;
  expect_has(run.output, "laoyao: runtime options: LAOYAO_DEVICE=cpu LAOYAO_CUDA_GRAPHS=1 LAOYAO_GEMM_AUTOTUNE=0");
  const std::string yaml = laoyao::read_file(dir + "/ckpt/run_config.yaml");
  expect_has(yaml, "#   LAOYAO_DEVICE: cpu\n#   LAOYAO_RENDEZVOUS_DIR: \n#   LAOYAO_CUDA_GRAPHS: 1\n");
  expect_has(yaml, "#   LAOYAO_GEMM_AUTOTUNE: 0\n");
}

// Multi-latent attention from Megatron-LM's flags: a model it can build trains (YaRN by default, as
// MLATransformerConfig's rope_type; --rope-type rope too); the shapes it cannot are refused by name
// before anything is written.
TEST(BadInputRun, MultiLatentAttentionShapesItCannotBuildAreRefusedByName) {
  const std::string dir = fresh_dir("bad_mla");
  const std::vector<std::string> mla = {"--multi-latent-attention", "--kv-lora-rank", "8", "--qk-head-dim", "4",
                                        "--qk-pos-emb-head-dim", "4", "--v-head-dim", "4", "--train-iters", "2", "--eval-interval", "2",
                                        "--mock-data", "--normalization", "RMSNorm", "--qk-layernorm"};
  for (const char* rope : {"yarn", "rope"}) {
    std::vector<std::string> ok = tiny(mla);
    ok.insert(ok.end(), {"--position-embedding-type", "rope", "--rope-type", rope, "--q-lora-rank", "6"});
    const auto r = run_laoyao(ok, dir, kCpu);
    ASSERT_EQ(r.status, 0) << r.output;
    expect_has(r.output, "iteration        2/       2");
  }
  const std::vector<std::pair<std::vector<std::string>, std::string>> bad = {
      {{"--position-embedding-type", "rope", "--qk-pos-emb-head-dim", "3"}, "qk_pos_emb_head_dim (--qk-pos-emb-head-dim) 3 is odd"},
      {{"--position-embedding-type", "learned_absolute"}, "learned positions beside it are not built"},
      {{"--position-embedding-type", "rope", "--kv-lora-rank", "0"}, "model.kv_lora_rank (--kv-lora-rank) 0"},
      {{"--position-embedding-type", "rope", "--v-head-dim", "-2"}, "model.v_head_dim (--v-head-dim) -2"}};
  for (const auto& [extra, message] : bad) {
    std::vector<std::string> a = tiny(mla);
    a.insert(a.end(), extra.begin(), extra.end());
    a.insert(a.end(), {"--save", dir + "/ckpt", "--save-interval", "1"});
    const auto r = run_laoyao(a, dir, kCpu);
    EXPECT_EQ(r.status, 2) << r.output;
    expect_has(r.output, message);
    EXPECT_FALSE(fs::exists(dir + "/ckpt")) << message;
  }
}
