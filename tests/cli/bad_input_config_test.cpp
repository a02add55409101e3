// Hostile or absurd configurations through the built binary: each is refused with exit status 2
// and one message naming the flag, field or file, and nothing is written — not the --save
// directory, not Bridge's nemo_experiments/ — rather than crashing (an alias cycle), exhausting the
// memory (aliases of aliases, sizes no machine holds) or blaming an unrelated rule.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "../config/test_util.hpp"
#include "run_binary.hpp"

using laoyao::test::count_entries;
using laoyao::test::fresh_dir;
using laoyao::test::run_laoyao;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A tiny run that trains on the CPU in a moment; each test changes one thing.
std::vector<std::string> tiny_mlm(const std::string& save_dir) {
  return {"pretrain-gpt", "--num-layers", "1", "--hidden-size", "16", "--num-attention-heads", "2",
          "--seq-length", "16", "--max-position-embeddings", "16", "--micro-batch-size", "1",
          "--global-batch-size", "1", "--train-iters", "1", "--eval-interval", "1", "--eval-iters", "1",
          "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "64", "--lr", "1e-3",
          "--save", save_dir, "--save-interval", "1"};
}

std::vector<std::string> tiny_recipe() {
  return {"run-recipe", "--recipe", "vanilla_gpt_pretrain_config", "model.num_layers=1", "model.hidden_size=16",
          "model.num_attention_heads=2", "dataset.seq_length=16", "train.train_iters=1", "train.global_batch_size=1",
          "train.micro_batch_size=1", "validation.eval_interval=1", "validation.eval_iters=1",
          "scheduler.lr_warmup_iters=0", "tokenizer.vocab_size=64"};
}

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& extra) {
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

// Runs pretrain-gpt with `extra` in a fresh directory that is also its --save directory's parent;
// expects exit 2, every `parts` in the output and an untouched directory.
void expect_mlm_refused(const std::string& name, const std::vector<std::string>& extra,
                        const std::vector<std::string>& parts) {
  const std::string dir = fresh_dir("bad_mlm_" + name);
  auto r = run_laoyao(with(tiny_mlm(dir + "/ckpt"), extra), dir);
  EXPECT_EQ(r.status, 2) << name << ": " << r.output;
  for (const auto& p : parts) EXPECT_TRUE(contains(r.output, p)) << name << ": " << p << "\n" << r.output;
  EXPECT_FALSE(contains(r.output, "bad_alloc")) << name;
  EXPECT_EQ(count_entries(dir), 0u) << name << ": nothing may be written";
}

// The same for run-recipe: the directory holds only `files` (the inputs written before the run).
void expect_recipe_refused(const std::string& dir, const std::vector<std::string>& args,
                           const std::vector<std::string>& parts, size_t files = 0) {
  auto r = run_laoyao(args, dir);
  EXPECT_EQ(r.status, 2) << r.output.substr(0, 2000);
  for (const auto& p : parts) EXPECT_TRUE(contains(r.output, p)) << p << "\n" << r.output.substr(0, 2000);
  EXPECT_FALSE(std::filesystem::exists(dir + "/nemo_experiments")) << "Bridge's default output folder";
  EXPECT_EQ(count_entries(dir), files) << "nothing may be written";
}

}  // namespace

TEST(BadInputConfig, TheTinyRunTrains) {
  const std::string dir = fresh_dir("bad_mlm_baseline");
  auto r = run_laoyao(tiny_mlm(dir + "/ckpt"), dir);
  ASSERT_EQ(r.status, 0) << r.output;
}

// Sizes no 32-bit kernel takes: refused by validation.
TEST(BadInputConfig, DimensionsBeyond32BitsNameTheFlag) {
  expect_mlm_refused("hidden", {"--hidden-size", "4294967296"},
                     {"--hidden-size (4294967296) is too large: at most 2147483647"});
  expect_mlm_refused("vocab", {"--vocab-size", "3000000000"}, {"--vocab-size (3000000000) is too large"});
  expect_mlm_refused("ffn", {"--ffn-hidden-size", "100000000000"}, {"--ffn-hidden-size (100000000000) is too large"});
}

// Sizes that fit the kernels but no machine's memory: refused before the datasets or the model
// allocate, naming the settings behind the largest term (the values are absurd on any machine).
TEST(BadInputConfig, ConfigsLargerThanTheMemoryNameTheFlagsBehindThem) {
  const std::string machine = "more than this machine's";
  expect_mlm_refused("mem_hidden", {"--hidden-size", "1048576"},
                     {"the model needs at least", "weights, gradients and optimizer state", "--hidden-size 1048576",
                      "--ffn-hidden-size 4194304", machine});
  expect_mlm_refused("mem_layers", {"--num-layers", "1000000000"}, {"--num-layers 1000000000", machine});
  expect_mlm_refused("mem_ffn", {"--num-layers", "1000", "--ffn-hidden-size", "2000000000"},
                     {"--ffn-hidden-size 2000000000", machine});
  expect_mlm_refused("mem_experts",
                     {"--num-experts", "1000000000", "--moe-ffn-hidden-size", "1024", "--disable-bias-linear"},
                     {"--num-experts 1000000000", machine});
  expect_mlm_refused("mem_seq", {"--seq-length", "2147483647", "--max-position-embeddings", "2147483647"},
                     {"2147483647", machine});  // the position table, or (more memory) the attention's
  expect_mlm_refused("mem_batch", {"--micro-batch-size", "1000000000", "--global-batch-size", "1000000000"},
                     {"one micro-batch needs at least", "--micro-batch-size 1000000000", machine});
  expect_mlm_refused("mem_iters", {"--train-iters", "1000000000000000"},
                     {"the datasets' sample and shuffle indices", "--train-iters 1000000000000000", machine});
}

TEST(BadInputConfig, OverflowNaNAndHalfPrecisionConflictNameTheFlag) {
  expect_mlm_refused("iters", {"--global-batch-size", "4", "--micro-batch-size", "4", "--train-iters",
                               "9223372036854775807"},
                     {"--train-iters (9223372036854775807) is too large", "overflows a 64-bit integer"});
  expect_mlm_refused("nan", {"--weight-decay", "nan"}, {"--weight-decay must be a finite number, got nan"});
  expect_mlm_refused("inf", {"--init-method-std", "inf"}, {"--init-method-std must be a finite number, got inf"});
  expect_mlm_refused("half", {"--bf16", "--fp16"}, {"cannot specify both fp16 and bf16: --fp16 and --bf16"});
}

// An alias inside its own anchor once recursed until SIGSEGV.
TEST(BadInputConfig, AYamlAliasCycleIsRefusedNamingTheFile) {
  const std::string dir = fresh_dir("bad_yaml_cycle");
  std::ofstream(dir + "/cycle.yaml") << "model: &m\n  self: *m\n";
  expect_recipe_refused(dir, with(tiny_recipe(), {"--config-file", "cycle.yaml"}),
                        {"YAML file 'cycle.yaml' nests deeper than 64 levels (an alias that refers to itself?)"}, 1);
}

// 342 bytes of aliases of aliases (9^9 scalars copied out): refused at once (exit 2).
TEST(BadInputConfig, YamlAliasesOfAliasesAreRefusedNamingTheFile) {
  const std::string dir = fresh_dir("bad_yaml_laughs");
  const std::string text = laoyao::config::test::billion_laughs_yaml();
  std::ofstream(dir + "/laughs.yaml") << text;
  expect_recipe_refused(dir, with(tiny_recipe(), {"--config-file", "laughs.yaml"}),
                        {"YAML file 'laughs.yaml' expands to more than 100000 nodes (YAML aliases of aliases?)"}, 1);
}

TEST(BadInputConfig, DeeplyNestedYamlAndOverridesAreRefused) {
  const std::string dir = fresh_dir("bad_nesting");
  std::ofstream(dir + "/deep.yaml") << "model:\n  x: " << std::string(100000, '[') << std::string(100000, ']')
                                    << "\n";
  expect_recipe_refused(dir, with(tiny_recipe(), {"--config-file", "deep.yaml"}), {"deep.yaml"}, 1);
  expect_recipe_refused(dir, with(tiny_recipe(), {"model.moe_layer_freq=" + std::string(100000, '[')}),
                        {"cannot parse the value of model.moe_layer_freq: lists and dicts nest deeper than 64 levels"},
                        1);
}

// The Bridge front end meets the same rules, named by field path.
TEST(BadInputConfig, RecipeRunsMeetTheSameRules) {
  const std::string dir = fresh_dir("bad_recipe");
  expect_recipe_refused(dir, with(tiny_recipe(), {"model.hidden_size=1048576"}),
                        {"the model needs at least", "model.hidden_size=1048576", "more than this machine's"});
  expect_recipe_refused(dir, with(tiny_recipe(), {"model.hidden_size=4294967296"}),
                        {"model.hidden_size (4294967296) is too large"});
  expect_recipe_refused(dir, with(tiny_recipe(), {"optimizer.weight_decay=nan"}),
                        {"optimizer.weight_decay must be a finite number, got nan"});
  expect_recipe_refused(dir, with(tiny_recipe(), {"train.train_iters=9223372036854775807", "train.global_batch_size=4"}),
                        {"train.train_iters (9223372036854775807) is too large"});
  expect_recipe_refused(dir, with(tiny_recipe(), {"mixed_precision=null", "model.bf16=true", "model.fp16=true"}),
                        {"cannot specify both fp16 and bf16: model.fp16 and model.bf16 are both true"});
}

// A directory given as --config-file is refused by name, not read as an empty config.
TEST(BadInputConfig, ADirectoryAsTheConfigFileIsRefusedByName) {
  const std::string dir = fresh_dir("bad_yaml_dir");
  std::filesystem::create_directories(dir + "/conf.yaml");
  expect_recipe_refused(dir, with(tiny_recipe(), {"--config-file", "conf.yaml"}),
                        {"'conf.yaml' is a directory; a file was expected there"}, 1);
}
