// The user's surface, through the built binary: exit statuses, messages, nothing half-written.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "run_binary.hpp"

using laoyao::test::count_entries;
using laoyao::test::fresh_dir;
using laoyao::test::run_laoyao;

static std::vector<std::string> seed_mlm() {
  return {"pretrain-gpt", "--num-layers", "2", "--hidden-size", "256", "--num-attention-heads", "4",
          "--ffn-hidden-size", "1024", "--seq-length", "512", "--max-position-embeddings", "512",
          "--micro-batch-size", "4", "--global-batch-size", "32", "--train-iters", "10", "--eval-iters", "2",
          "--eval-interval", "10", "--mock-data", "--bf16", "--use-mcore-models", "--tokenizer-type",
          "NullTokenizer", "--vocab-size", "32000", "--lr", "3e-4", "--min-lr", "3e-5", "--seed", "1234",
          "--log-interval", "1"};
}

static bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(Cli, UnknownCommandAndHelp) {
  auto r = run_laoyao({"pretrain-gtp"});
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(contains(r.output, "did you mean pretrain-gpt?")) << r.output;
  r = run_laoyao({"--help"});
  EXPECT_EQ(r.status, 0);
  EXPECT_TRUE(contains(r.output, "run-recipe")) << r.output;
  EXPECT_EQ(run_laoyao({}).status, 2);
}

// A valid command asking for something the engine lacks is refused after validation, with the
// missing feature named and nothing written (not even the run's config or checkpoint folder).
TEST(Cli, UnsupportedFeatureIsRefusedAfterValidationWritingNothing) {
  std::string dir = fresh_dir("seed_mlm");
  auto args = seed_mlm();
  args.insert(args.end(), {"--save", dir + "/ckpt", "--save-interval", "5", "--num-experts", "4"});
  auto r = run_laoyao(args, dir);
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "setting number of microbatches to constant 8")) << r.output;
  EXPECT_TRUE(contains(r.output, " > padded vocab (size: 32000) with 0 dummy tokens (new size: 32000)")) << r.output;
  EXPECT_TRUE(contains(r.output, "Mixture-of-Experts layers")) << r.output;
  EXPECT_EQ(count_entries(dir), 0u) << "nothing may be written";
}

TEST(Cli, TypoInAFlagIsExitTwoWithTheNearestFlag) {
  auto args = seed_mlm();
  args[1] = "--num-layer";
  auto r = run_laoyao(args);
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(contains(r.output, "unrecognized argument --num-layer (did you mean --num-layers?)")) << r.output;
}

TEST(Cli, RecipesListAndShow) {
  auto r = run_laoyao({"recipes"});
  EXPECT_EQ(r.status, 0);
  for (auto n : {"vanilla_gpt_pretrain_config", "llama32_1b_pretrain_config", "llama3_8b_peft_config",
                 "deepseek_v2_lite_pretrain_config", "qwen3_8b_sft_config"})
    EXPECT_TRUE(contains(r.output, n)) << n;
  r = run_laoyao({"recipes", "show", "llama32_1b_pretrain_config"}, ".", "WORLD_SIZE=1");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "  num_layers: 16\n")) << r.output;
  EXPECT_TRUE(contains(r.output, "  lr_warmup_steps: 1024000.0\n")) << "resolved: warmup 2000 x GBS 512";
  r = run_laoyao({"recipes", "show", "vanilla_gpt_pretrain_config"});
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "NOT resolved: model.num_layers must be a positive integer")) << r.output;
  r = run_laoyao({"recipes", "show", "nope"});
  EXPECT_EQ(r.status, 2);
}

// `recipes show` output, fed back through --config-file, gives the same resolved config.
TEST(Cli, ShowOutputFeedsBackThroughConfigFile) {
  std::string dir = fresh_dir("yaml_round_trip");
  std::vector<std::string> o = {"model.num_layers=2", "model.hidden_size=256", "model.num_attention_heads=4",
                                "train.train_iters=10", "scheduler.lr_warmup_iters=1"};
  std::vector<std::string> show = {"recipes", "show", "vanilla_gpt_pretrain_config"};
  show.insert(show.end(), o.begin(), o.end());
  auto shown = run_laoyao(show, dir);
  ASSERT_EQ(shown.status, 0) << shown.output;
  std::ofstream(dir + "/cfg.yaml") << shown.output;
  auto r = run_laoyao({"run-recipe", "--recipe", "vanilla_gpt_pretrain_config", "--config-file", "cfg.yaml",
                       "--dry-run", "logger.save_config_filepath=" + dir + "/out.yaml"},
                      dir);
  ASSERT_EQ(r.status, 0) << r.output;
  std::ifstream in(dir + "/out.yaml");
  std::string written((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string shown_yaml = shown.output.substr(shown.output.find('\n') + 1);  // drop the comment line
  // The only difference: the save path the dry run was told to write to.
  auto strip = [](std::string s) {
    auto at = s.find("  save_config_filepath:");
    return s.substr(0, at) + s.substr(s.find('\n', at));
  };
  EXPECT_EQ(strip(written), strip(shown_yaml));
}

TEST(Cli, RunRecipeSeedCommandAndBadOverrides) {
  std::string dir = fresh_dir("seed_bridge");
  std::vector<std::string> a = {"run-recipe", "--recipe", "vanilla_gpt_pretrain_config", "model.num_layers=2",
                                "model.hidden_size=256", "model.num_attention_heads=4", "model.ffn_hidden_size=1024",
                                "model.seq_length=512", "dataset.seq_length=512", "train.train_iters=10",
                                "train.global_batch_size=32", "train.micro_batch_size=4",
                                "validation.eval_interval=10", "validation.eval_iters=2", "optimizer.lr=3e-4",
                                "optimizer.min_lr=3e-5", "scheduler.lr_warmup_iters=1",
                                "scheduler.lr_decay_iters=10", "rng.seed=1234", "logger.log_interval=1",
                                "model.num_moe_experts=4"};
  auto r = run_laoyao(a, dir);
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "Final configuration:")) << r.output;
  EXPECT_TRUE(contains(r.output, "Automatically enabling distributed optimizer")) << r.output;
  EXPECT_TRUE(contains(r.output, "Mixture-of-Experts layers")) << r.output;
  EXPECT_EQ(count_entries(dir), 0u) << "nothing may be written";
  a.push_back("model.num_layer=3");
  r = run_laoyao(a, dir);
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(contains(r.output, "did you mean model.num_layers?")) << r.output;
  EXPECT_EQ(count_entries(dir), 0u);
}

// The convert-args command, executed as printed, resolves to the Megatron-LM command's config.
TEST(Cli, ConvertArgsPrintsACommandThatRuns) {
  std::string dir = fresh_dir("convert");
  auto mlm = seed_mlm();
  mlm[0] = "convert-args";
  auto conv = run_laoyao(mlm, dir);
  ASSERT_EQ(conv.status, 0) << conv.output;
  ASSERT_TRUE(contains(conv.output, "laoyao run-recipe --recipe vanilla_gpt_pretrain_config")) << conv.output;
  std::string cmd = conv.output;
  cmd.replace(cmd.find("laoyao "), 7, laoyao::test::shell_word(LAOYAO_BINARY) + " ");
  std::ofstream(dir + "/cmd.sh") << cmd.substr(0, cmd.size() - 1) << " --dry-run logger.save_config_filepath=a.yaml\n";
  int st = std::system(("cd " + dir + " && bash cmd.sh >/dev/null 2>&1").c_str());
  ASSERT_EQ(WEXITSTATUS(st), 0);
  mlm.insert(mlm.begin() + 1, {"--emit", "yaml"});
  auto yaml = run_laoyao(mlm, dir);
  ASSERT_EQ(yaml.status, 0);
  std::ifstream in(dir + "/a.yaml");
  std::string written((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto strip = [](std::string s) {
    auto at = s.find("  save_config_filepath:");
    return s.substr(0, at) + s.substr(s.find('\n', at));
  };
  EXPECT_EQ(strip(written), strip(yaml.output));
}

// A run writes its resolved config and a JSON-lines metrics file beside its outputs, and prints
// Bridge's lines (Step Time, the training line without microseconds).
TEST(Cli, RunRecipeTrainsAndWritesConfigAndMetricsBesideItsOutputs) {
  std::string dir = fresh_dir("recipe_train");
  auto r = run_laoyao({"run-recipe", "--recipe", "vanilla_gpt_pretrain_config", "model.num_layers=1",
                       "model.hidden_size=32", "model.num_attention_heads=2", "dataset.seq_length=32",
                       "train.train_iters=4", "train.global_batch_size=4", "train.micro_batch_size=2",
                       "validation.eval_interval=2", "validation.eval_iters=1", "scheduler.lr_warmup_iters=1",
                       "tokenizer.vocab_size=100", "logger.log_interval=1", "checkpoint.save=null",
                       "logger.tensorboard_dir=" + dir + "/tb"},
                      dir);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "Step Time : ")) << r.output;
  EXPECT_TRUE(contains(r.output, "] iteration        4/       4 | consumed samples:           16 |")) << r.output;
  EXPECT_TRUE(contains(r.output, "validation loss at iteration 4 on test set")) << r.output;
  std::ifstream cfg(dir + "/tb/run_config.yaml");
  std::string yaml((std::istreambuf_iterator<char>(cfg)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(contains(yaml, "  num_layers: 1\n")) << yaml.substr(0, 500);
  std::ifstream metrics(dir + "/tb/metrics.jsonl");
  std::string line;
  int train_lines = 0, eval_lines = 0;
  while (std::getline(metrics, line)) {
    if (contains(line, "\"learning_rate\"")) ++train_lines;
    if (contains(line, "\"split\"")) ++eval_lines;
  }
  EXPECT_EQ(train_lines, 4);
  EXPECT_EQ(eval_lines, 4) << "evaluations at 2 and 4, then the final validation and test";
}

// --profile: Nsight Systems' capture range starts before iteration profile_step_start + 1 and stops
// after iteration profile_step_end (Megatron's loop, counting completed iterations), on the ranks of
// --profile-ranks only.
TEST(Cli, ProfileStartsAndStopsTheCaptureRangeAtMegatronsIterations) {
  std::string dir = fresh_dir("profile");
  const std::vector<std::string> run = {
      "pretrain-gpt", "--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "32",
      "--max-position-embeddings", "32", "--micro-batch-size", "2", "--global-batch-size", "2", "--train-iters", "4",
      "--eval-iters", "0", "--eval-interval", "4",
      "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "64", "--lr", "1e-3",
      "--log-interval", "1", "--profile", "--profile-step-start", "1", "--profile-step-end", "3"};
  auto r = run_laoyao(run, dir, "LAOYAO_DEVICE=cpu");
  ASSERT_EQ(r.status, 0) << r.output;
  const size_t start = r.output.find("laoyao: --profile: cudaProfilerStart before iteration 2 on rank 0");
  const size_t stop = r.output.find("laoyao: --profile: cudaProfilerStop after iteration 3 on rank 0");
  ASSERT_NE(start, std::string::npos) << r.output;
  ASSERT_NE(stop, std::string::npos) << r.output;
  EXPECT_LT(r.output.find(" iteration        1/"), start) << r.output;
  EXPECT_LT(start, r.output.find(" iteration        2/")) << r.output;
  EXPECT_LT(r.output.find(" iteration        3/"), stop) << r.output;
  EXPECT_LT(stop, r.output.find(" iteration        4/")) << r.output;
  EXPECT_EQ(r.output.find("cudaProfilerStart", stop), std::string::npos) << "once";
  // Another rank's profile: nothing here.
  std::vector<std::string> other = run;
  other.insert(other.end(), {"--profile-ranks", "1"});
  r = run_laoyao(other, dir, "LAOYAO_DEVICE=cpu");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.output.find("cudaProfiler"), std::string::npos) << r.output;
}

// --log-memory-to-tensorboard writes the CUDA backend's device memory; on the CPU backend it is
// refused by name (exit 2) before anything is written.
TEST(Cli, MemoryScalarsInTensorBoardAreRefusedOnTheCpuBackend) {
  std::string dir = fresh_dir("memory_tb");
  const std::string tb = dir + "/tb";
  const std::vector<std::string> run = {
      "pretrain-gpt", "--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "32",
      "--max-position-embeddings", "32", "--micro-batch-size", "2", "--global-batch-size", "2", "--train-iters", "2",
      "--eval-iters", "0", "--eval-interval", "2",
      "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "64", "--lr", "1e-3",
      "--tensorboard-dir", tb, "--log-memory-to-tensorboard"};
  auto r = run_laoyao(run, dir, "LAOYAO_DEVICE=cpu");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("--log-memory-to-tensorboard"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find(" iteration "), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(tb)) << "nothing written";
}

// --async-save: the checkpoints a thread writes while training goes on are the synchronous save's,
// byte for byte, with Megatron's lines (scheduled, then successfully saved once written, each
// save finalized before the next). A write that fails on its thread: tests/train/async_save_test.
TEST(Cli, AsyncSaveWritesTheSynchronousCheckpoints) {
  std::string dir = fresh_dir("async_save");
  auto train = [&](const std::string& save, bool async) {
    std::vector<std::string> a = {"pretrain-gpt", "--num-layers", "1", "--hidden-size", "32", "--num-attention-heads",
                                  "2", "--seq-length", "32", "--max-position-embeddings", "32", "--micro-batch-size",
                                  "2", "--global-batch-size", "2", "--train-iters", "4", "--eval-iters", "0",
                                  "--eval-interval", "4", "--mock-data", "--tokenizer-type", "NullTokenizer",
                                  "--vocab-size", "64", "--lr", "1e-3", "--log-interval", "1", "--save", save,
                                  "--save-interval", "2"};
    if (async) a.push_back("--async-save");
    return run_laoyao(a, dir, "LAOYAO_DEVICE=cpu");
  };
  const auto sync = train("sync", false), async = train("async", true);
  ASSERT_EQ(sync.status, 0) << sync.output;
  ASSERT_EQ(async.status, 0) << async.output;
  for (const char* it : {"2", "4"}) {
    const std::string scheduled = std::string("  scheduled an async checkpoint save at iteration       ") + it +
                                  " to async\n",
                      saved = std::string("  successfully saved checkpoint from iteration       ") + it + " to async";
    const size_t s = async.output.find(scheduled), done = async.output.find(saved);
    ASSERT_NE(s, std::string::npos) << async.output;
    ASSERT_NE(done, std::string::npos) << async.output;
    EXPECT_LT(s, done) << async.output;
  }
  EXPECT_LT(async.output.find("from iteration       2 to async"), async.output.find("saving checkpoint at iteration       4"))
      << "the first save is finalized before the second starts\n" << async.output;
  auto bytes = [](const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  };
  for (const char* iter : {"iter_0000002", "iter_0000004"})
    for (const char* file : {"model.safetensors", "optimizer.safetensors"}) {  // (run_config.yaml names the paths)
      const std::string a = bytes(dir + "/sync/" + iter + "/" + file), b = bytes(dir + "/async/" + iter + "/" + file);
      EXPECT_FALSE(a.empty()) << iter << "/" << file;
      EXPECT_EQ(a, b) << iter << "/" << file;
    }
  EXPECT_EQ(bytes(dir + "/async/latest_checkpointed_iteration.txt"), "4");
}

// --exit-signal-handler: SIGTERM mid-run saves a checkpoint and exits cleanly (status 0).
TEST(Cli, SigtermSavesACheckpointAndExitsCleanly) {
  std::string dir = fresh_dir("sigterm");
  std::string cmd = laoyao::test::shell_word(LAOYAO_BINARY) +
                    " pretrain-gpt --num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 32"
                    " --max-position-embeddings 32 --micro-batch-size 2 --global-batch-size 4 --train-iters 100000"
                    " --eval-iters 1 --eval-interval 100000 --mock-data --tokenizer-type NullTokenizer --vocab-size 64"
                    " --lr 1e-3 --log-interval 1 --exit-signal-handler --save ckpt --save-interval 100000";
  std::string script = "cd " + laoyao::test::shell_word(dir) + " && (" + cmd + " > log.txt 2>&1 & pid=$!; " +
                       "for i in $(seq 600); do grep -q 'iteration        3/' log.txt && break; sleep 0.1; done; " +
                       "kill -TERM $pid; wait $pid; echo $? > rc.txt)";
  ASSERT_EQ(std::system(("bash -c " + laoyao::test::shell_word(script)).c_str()), 0);
  std::ifstream rc(dir + "/rc.txt"), log(dir + "/log.txt");
  std::string status, text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  rc >> status;
  EXPECT_EQ(status, "0") << text;
  EXPECT_TRUE(contains(text, "exiting program after receiving SIGTERM.")) << text;
  EXPECT_TRUE(contains(text, "successfully saved checkpoint from iteration")) << text;
  EXPECT_TRUE(std::filesystem::exists(dir + "/ckpt/latest_checkpointed_iteration.txt"));
}

TEST(Cli, DumpEnvRedactsSecrets) {
  std::string dir = fresh_dir("dump_env");
  auto r = run_laoyao({"run-recipe", "--recipe", "vanilla_gpt_pretrain_config", "--dump-env", "--dry-run",
                       "model.num_layers=1", "model.hidden_size=32", "model.num_attention_heads=2",
                       "logger.save_config_filepath=" + dir + "/c.yaml"},
                      dir, "LAOYAO_TEST_API_KEY=hunter2 LAOYAO_TEST_PLAIN=visible");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "  LAOYAO_TEST_API_KEY=<redacted>\n")) << r.output;
  EXPECT_FALSE(contains(r.output, "hunter2"));
  EXPECT_TRUE(contains(r.output, "  LAOYAO_TEST_PLAIN=visible\n"));
}

// Full recomputation: Megatron-Core's rules on the flags (exit 2, one message naming them); a valid
// setting trains, and on the CPU backend the run says that it keeps every activation.
TEST(Cli, RecomputeFlagsFollowMegatronsRules) {
  const std::vector<std::string> args = {"pretrain-gpt", "--num-layers", "2", "--hidden-size", "64",
                                         "--num-attention-heads", "2", "--seq-length", "32", "--micro-batch-size", "2",
                                         "--global-batch-size", "2", "--train-iters", "1", "--eval-iters", "0",
                                         "--eval-interval", "1", "--mock-data", "--tokenizer-type", "NullTokenizer",
                                         "--vocab-size", "128", "--lr", "1e-3"};
  auto with = [&](std::vector<std::string> extra) {
    auto a = args;
    a.insert(a.end(), extra.begin(), extra.end());
    return run_laoyao(a, ".", "LAOYAO_DEVICE=cpu");
  };
  auto r = with({"--recompute-granularity", "full"});
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "--recompute-method")) << r.output;
  r = with({"--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "3"});
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "--recompute-num-layers) 3 is outside 1..2")) << r.output;
  r = with({"--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", "1"});
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "the CPU backend keeps every activation")) << r.output;
  r = with({"--recompute-activations"});
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "nothing to recompute")) << r.output;
}
