// `laoyao launch`: the ranks' environment, prefixed output, and a failing rank stopping the others
// quickly (never a hang).
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "core/file_io.hpp"
#include "dist/tcp_store.hpp"
#include "run_binary.hpp"

using laoyao::test::grad_norms_in;
using laoyao::test::losses_in;
using laoyao::test::run_laoyao;

TEST(Launch, StartsTheRanksWithTorchrunsEnvironment) {
  const auto r = run_laoyao({"launch", "--nproc-per-node", "3", "--", "sh", "-c",
                             "echo rank=$RANK world=$WORLD_SIZE local=$LOCAL_RANK/$LOCAL_WORLD_SIZE "
                             "master=$MASTER_ADDR:$MASTER_PORT"});
  EXPECT_EQ(r.status, 0) << r.output;
  for (int k = 0; k < 3; ++k)
    EXPECT_NE(r.output.find("[rank" + std::to_string(k) + "]: rank=" + std::to_string(k) +
                            " world=3 local=" + std::to_string(k) + "/3 master=127.0.0.1:29500"),
              std::string::npos)
        << r.output;
}

TEST(Launch, SecondNodeRanksAndTorchrunSpellings) {
  const auto r = run_laoyao({"launch", "--nproc_per_node=2", "--nnodes", "2", "--node_rank", "1", "--master_addr",
                             "node0", "--master-port=6001", "sh", "-c", "echo r=$RANK w=$WORLD_SIZE g=$GROUP_RANK"});
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("[rank2]: r=2 w=4 g=1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[rank3]: r=3 w=4 g=1"), std::string::npos) << r.output;
}

TEST(Launch, AFailingRankStopsTheOthersAndIsNamed) {
  const auto start = std::chrono::steady_clock::now();
  const auto r = run_laoyao({"launch", "--nproc-per-node", "3", "--", "sh", "-c",
                             "if [ \"$RANK\" = 1 ]; then echo failing; exit 3; fi; sleep 60"});
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_LT(seconds, 20.0) << "the sleeping ranks must be stopped, not waited for";
  EXPECT_NE(r.output.find("[rank1]: failing"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank 1 exited with status 3; the other ranks were stopped"), std::string::npos)
      << r.output;
}

TEST(Launch, LaoyaoAsTheCommandIsThisBinary) {
  const auto r = run_laoyao({"launch", "--nproc-per-node", "2", "--", "laoyao", "recipes"});
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("[rank1]: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("vanilla_gpt_pretrain_config"), std::string::npos) << r.output;
}

TEST(Launch, BadOptionsExitTwoWithAMessage) {
  auto r = run_laoyao({"launch", "--nproc-per-node", "0", "--", "true"});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("--nproc-per-node takes an integer from 1"), std::string::npos) << r.output;
  r = run_laoyao({"launch", "--nproc-per-nod", "2", "--", "true"});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("--nproc-per-node"), std::string::npos) << r.output;
  r = run_laoyao({"launch", "--nproc-per-node", "2"});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("no command to launch"), std::string::npos) << r.output;
  r = run_laoyao({"launch", "--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "2", "--", "true"});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("--node-rank 2 is not below --nnodes 2"), std::string::npos) << r.output;
  r = run_laoyao({"launch", "--nproc-per-node", "1", "--", "/nonexistent/program"});
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("cannot run '/nonexistent/program'"), std::string::npos) << r.output;
}

namespace {

std::vector<std::string> tiny_run(const std::vector<std::string>& extra) {
  std::vector<std::string> a = {"pretrain-gpt", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads",
                                "2", "--ffn-hidden-size", "128", "--seq-length", "32", "--max-position-embeddings",
                                "32", "--micro-batch-size", "2", "--global-batch-size", "8", "--eval-iters", "2",
                                "--eval-interval", "2", "--mock-data", "--tokenizer-type", "NullTokenizer",
                                "--vocab-size", "256", "--lr", "1e-3", "--log-interval", "1", "--seed", "7"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

// Megatron's timers over two data-parallel CPU ranks: each level-1 start waits for both ranks, the
// last rank prints every rank's time (--timing-log-option all) for the regions with work in them.
TEST(Launch, TimersGatherEveryRanksTimes) {
  const std::string dir = laoyao::test::fresh_dir("launch_timers");
  std::vector<std::string> a = {"launch", "--nproc-per-node", "2", "--", "laoyao"};
  const auto run = tiny_run({"--train-iters", "3", "--timing-log-level", "2", "--timing-log-option", "all"});
  a.insert(a.end(), run.begin(), run.end());
  const auto r = run_laoyao(a, dir, "LAOYAO_DEVICE=cpu");
  ASSERT_EQ(r.status, 0) << r.output;
  // (The launcher prefixes each rank's lines with "[rankN]: ".)
  const size_t at = r.output.find("[rank1]: times across ranks (ms):\n[rank1]:   forward-backward:\n"
                                  "[rank1]:      rank  0: ");
  ASSERT_NE(at, std::string::npos) << r.output;
  const std::string block = r.output.substr(at, r.output.find("iteration ", at) - at);
  EXPECT_NE(block.find("\n[rank1]:      rank  1: "), std::string::npos) << block;
  EXPECT_NE(block.find("\n[rank1]:   optimizer:\n[rank1]:      rank  0: "), std::string::npos) << block;
  EXPECT_NE(block.find("\n[rank1]:   batch-generator:"), std::string::npos) << block;
  EXPECT_EQ(r.output.find("[rank0]: times across ranks"), std::string::npos) << "the last rank prints";
}

// A run resumed from a checkpoint saved after iteration 2 of 3: its iteration 3 and the evaluations
// after it (which see step 3: the restored moments) are the uninterrupted run's `want` from its
// fourth value on, to `rel`.
void expect_resumed_tail(const std::string& output, const std::vector<double>& want, double rel,
                         const std::string& what) {
  const auto tail = losses_in(output);
  ASSERT_EQ(tail.size() + 3, want.size()) << output;
  for (size_t i = 0; i < tail.size(); ++i)
    EXPECT_NEAR(tail[i], want[3 + i], rel * want[3 + i]) << "value " << i << " " << what << "\n" << output;
}

// The tiny MoE model the tensor- and expert-parallel tests train: 4 experts, top-2, a shared expert.
std::vector<std::string> tiny_moe_run(const std::vector<std::string>& extra = {}) {
  std::vector<std::string> a = {"--train-iters", "3", "--num-attention-heads", "4", "--num-experts", "4",
                                "--moe-router-topk", "2", "--moe-aux-loss-coeff", "0.01", "--moe-z-loss-coeff", "0.001",
                                "--moe-shared-expert-intermediate-size", "32", "--disable-bias-linear", "--swiglu",
                                "--normalization", "RMSNorm"};
  a.insert(a.end(), extra.begin(), extra.end());
  return tiny_run(a);
}

// `laoyao launch --nproc-per-node n -- laoyao` + the training command `one` + `extra` flags.
std::vector<std::string> on_ranks(const char* n, const std::vector<std::string>& one,
                                  const std::vector<std::string>& extra = {}) {
  std::vector<std::string> a = {"launch", "--nproc-per-node", n, "--", "laoyao"};
  a.insert(a.end(), one.begin(), one.end());
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

}  // namespace

// FP8 delayed scaling over two data-parallel CPU ranks: each training pass's amaxes are MAX-reduced
// over them before the scales move (Megatron's amax reduction group); the run trains as near to the
// BF16 run on the same ranks as FP8 allows, not on it.
TEST(Launch, Fp8DelayedScalingOverDataParallelCpuRanks) {
  const std::string dir = laoyao::test::fresh_dir("launch_fp8_dp");
  const std::vector<std::string> one = tiny_run({"--train-iters", "3", "--bf16"});
  const auto bf16 = run_laoyao(on_ranks("2", one), dir, "LAOYAO_DEVICE=cpu");
  ASSERT_EQ(bf16.status, 0) << bf16.output;
  const auto fp8 = run_laoyao(on_ranks("2", one, {"--fp8-format", "hybrid", "--fp8-recipe", "delayed"}), dir,
                              "LAOYAO_DEVICE=cpu");
  ASSERT_EQ(fp8.status, 0) << fp8.output;
  const auto want = losses_in(bf16.output), got = losses_in(fp8.output);
  ASSERT_EQ(got.size(), want.size()) << fp8.output;
  ASSERT_FALSE(got.empty());
  EXPECT_NE(got, want);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 0.02 * std::abs(want[i])) << "value " << i;
}

namespace {

// The losses of `one` in FP8 (hybrid, `recipe`) on `ranks` CPU ranks with `extra` flags.
std::vector<double> fp8_losses_on_ranks(const std::string& dir, const std::vector<std::string>& one, const char* ranks,
                                        const char* recipe, std::vector<std::string> extra) {
  extra.insert(extra.end(), {"--fp8-format", "hybrid", "--fp8-recipe", recipe});
  const auto r = run_laoyao(on_ranks(ranks, one, extra), dir, "LAOYAO_DEVICE=cpu");
  EXPECT_EQ(r.status, 0) << r.output;
  return losses_in(r.output);
}

// got within first (its first value) and rest (the others) relative to want.
void expect_losses_near(const std::vector<double>& got, const std::vector<double>& want, double first, double rest,
                        const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  ASSERT_FALSE(got.empty()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], (i == 0 ? first : rest) * std::abs(want[i])) << what << ", value " << i;
}

}  // namespace

// FP8 over tensor-parallel CPU ranks. Delayed scaling MAX-reduces each pass's amaxes over every
// rank (Megatron's amax reduction group, TP x DP): the scales are the one rank's, so the first
// iteration's loss (its later micro-batches cast with scales from the earlier ones' amaxes) is the
// one rank's to float rounding, where unreduced shards' amaxes would move it, and the later values
// stay within the partial sums' reordering, magnified by FP8's rounding; over TP x DP the same
// against DP alone (the micro-batches' order of amaxes is DP's). Tensorwise scales each rank's
// shard by its own amax, as Transformer Engine does: near the one rank's, and DP changes nothing.
TEST(Launch, Fp8OverTensorParallelCpuRanks) {
  const std::string dir = laoyao::test::fresh_dir("launch_fp8_tp");
  const std::vector<std::string> one = tiny_run({"--train-iters", "3", "--bf16", "--num-attention-heads", "4"});
  auto losses = [&](const char* ranks, const char* recipe, const std::vector<std::string>& extra) {
    return fp8_losses_on_ranks(dir, one, ranks, recipe, extra);
  };
  const std::vector<std::string> tp2 = {"--tensor-model-parallel-size", "2"};
  std::vector<std::string> tp2_sp = tp2;
  tp2_sp.push_back("--sequence-parallel");
  const auto delayed = losses("1", "delayed", {}), delayed_dp = losses("2", "delayed", {});
  expect_losses_near(losses("2", "delayed", tp2), delayed, 2e-6, 2e-4, "delayed, TP=2");
  expect_losses_near(losses("2", "delayed", tp2_sp), delayed, 2e-6, 2e-4, "delayed, TP=2 with sequence parallelism");
  expect_losses_near(losses("4", "delayed", tp2), delayed_dp, 2e-6, 2e-4, "delayed, TP=2 x DP=2 against DP=2");
  const auto tensorwise = losses("1", "tensorwise", {}), tensorwise_tp = losses("2", "tensorwise", tp2);
  expect_losses_near(tensorwise_tp, tensorwise, 1e-3, 1e-3, "tensorwise, TP=2");
  expect_losses_near(losses("4", "tensorwise", tp2), tensorwise_tp, 1e-5, 1e-5, "tensorwise, TP=2 x DP=2 against TP=2");
}

// FP8 over context-parallel CPU ranks: each rank casts its own chunks' tokens. Delayed scaling's
// amaxes are MAX-reduced over the ranks (Megatron's amax reduction group includes the context-parallel
// ranks), tensorwise scales each rank's tokens by their own amax. CP=2 and CP=2 x DP=2 stay within
// the attention's reordered sums, magnified by FP8's rounding, of one rank and DP=2 (measured: the
// first iteration's loss 5.6e-6 from one rank's, the rest up to 6.3e-5; the losses cannot tell the
// reduction apart, 1.2e-5 without it: Fp8Linears.DelayedScalingReducesAmaxesOverTheDataParallelRanks
// checks it).
TEST(Launch, Fp8OverContextParallelCpuRanks) {
  const std::string dir = laoyao::test::fresh_dir("launch_fp8_cp");
  const std::vector<std::string> one = tiny_run({"--train-iters", "3", "--bf16"});
  auto losses = [&](const char* ranks, const char* recipe, const std::vector<std::string>& extra) {
    return fp8_losses_on_ranks(dir, one, ranks, recipe, extra);
  };
  const std::vector<std::string> cp2 = {"--context-parallel-size", "2"};
  expect_losses_near(losses("2", "delayed", cp2), losses("1", "delayed", {}), 2e-5, 2e-4, "delayed, CP=2");
  expect_losses_near(losses("4", "delayed", cp2), losses("2", "delayed", {}), 2e-5, 2e-4,
                     "delayed, CP=2 x DP=2 against DP=2");
  expect_losses_near(losses("2", "tensorwise", cp2), losses("1", "tensorwise", {}), 1e-3, 1e-3, "tensorwise, CP=2");
}

// FP8 experts over tensor- and expert-parallel CPU ranks: each rank casts the rows its experts get.
// Delayed scaling MAX-reduces every rank's amaxes slot by slot, as Transformer Engine reduces its
// global amax buffer over the amax reduction group (TP x DP x CP, the expert-parallel ranks inside
// it): split experts' shards and whole experts folded across TP are the one rank's experts, so TP=2
// prints the one rank's first loss to float rounding; under EP the slot of local expert e holds a
// different global expert on each rank, so the pair's larger amax scales both, and the first loss
// is DP's to float rounding all the same (its first micro-batch casts with the initial scales).
// Measured with the experts' GEMMs left in BF16 behind the stages, the first losses move 1.8e-5 to
// 3.3e-5. Tensorwise: each rank's rows by their own amax, near the one rank's.
TEST(Launch, Fp8ExpertsOverTensorAndExpertParallelCpuRanks) {
  const std::string dir = laoyao::test::fresh_dir("launch_fp8_moe");
  const std::vector<std::string> one = tiny_moe_run({"--bf16"});
  auto losses = [&](const char* ranks, const char* recipe, const std::vector<std::string>& extra) {
    return fp8_losses_on_ranks(dir, one, ranks, recipe, extra);
  };
  const std::vector<std::string> tp2 = {"--tensor-model-parallel-size", "2", "--sequence-parallel"};
  const std::vector<std::string> folded = {"--tensor-model-parallel-size", "2", "--sequence-parallel",
                                           "--expert-tensor-parallel-size", "1"};
  const std::vector<std::string> ep2 = {"--expert-model-parallel-size", "2"};
  std::vector<std::string> tp2_ep2 = tp2;
  tp2_ep2.insert(tp2_ep2.end(), ep2.begin(), ep2.end());
  const auto delayed = losses("1", "delayed", {});
  expect_losses_near(losses("2", "delayed", tp2), delayed, 2e-6, 2e-4, "delayed, TP=2 (experts split)");
  expect_losses_near(losses("2", "delayed", folded), delayed, 2e-6, 2e-4, "delayed, TP=2 (whole experts, folded)");
  expect_losses_near(losses("4", "delayed", ep2), losses("4", "delayed", {}), 2e-6, 2e-4,
                     "delayed, EP=2 on 4 ranks against DP=4");
  expect_losses_near(losses("4", "delayed", tp2_ep2), losses("2", "delayed", ep2), 2e-6, 2e-4,
                     "delayed, TP=2 x EP=2 against EP=2 on 2 ranks");
  const auto tensorwise = losses("1", "tensorwise", {});
  expect_losses_near(losses("2", "tensorwise", tp2), tensorwise, 1e-3, 1e-3, "tensorwise, TP=2");
  expect_losses_near(losses("4", "tensorwise", ep2), tensorwise, 1e-3, 1e-3, "tensorwise, EP=2 on 4 ranks");
}

// FP8 block scaling over CPU ranks: no amax crosses a rank and each cast is of one micro-batch's
// blocks, so data-, tensor- (with sequence parallelism), context- and expert-parallel runs print the
// one rank's losses to the reordered sums (measured: equal to 7 digits but TP=2 x EP=2's last, 8e-6).
// (A tensor-parallel shard's blocks start at the shard, as Transformer Engine casts a rank's local
// tensor; with power-of-two scales that moves a value only where a block's range would push it
// under the format's normal range.)
TEST(Launch, Fp8BlockScalingOverCpuRanksReproducesOneRank) {
  const std::string dir = laoyao::test::fresh_dir("launch_fp8_blockwise");
  const std::vector<std::string> dense = tiny_run({"--train-iters", "3", "--bf16", "--num-attention-heads", "4"});
  const std::vector<std::string> moe = tiny_moe_run({"--bf16"});
  const auto one = fp8_losses_on_ranks(dir, dense, "1", "blockwise", {});
  expect_losses_near(fp8_losses_on_ranks(dir, dense, "2", "blockwise", {}), one, 1e-5, 1e-5, "DP=2");
  expect_losses_near(fp8_losses_on_ranks(dir, dense, "2", "blockwise", {"--tensor-model-parallel-size", "2",
                                                                        "--sequence-parallel"}),
                     one, 1e-5, 1e-5, "TP=2 with sequence parallelism");
  expect_losses_near(fp8_losses_on_ranks(dir, dense, "2", "blockwise", {"--context-parallel-size", "2"}), one, 1e-5,
                     1e-5, "CP=2");
  const auto one_moe = fp8_losses_on_ranks(dir, moe, "1", "blockwise", {});
  expect_losses_near(fp8_losses_on_ranks(dir, moe, "2", "blockwise", {"--expert-model-parallel-size", "2"}), one_moe,
                     1e-5, 1e-5, "EP=2");
  expect_losses_near(fp8_losses_on_ranks(dir, moe, "4", "blockwise", {"--tensor-model-parallel-size", "2",
                                                                      "--sequence-parallel",
                                                                      "--expert-model-parallel-size", "2"}),
                     one_moe, 2e-5, 2e-5, "TP=2 x EP=2");
  EXPECT_NE(one, fp8_losses_on_ranks(dir, dense, "1", "tensorwise", {})) << "blockwise ran as tensorwise";
}

// Data parallelism over CPU ranks (Gloo): 2 and 4 ranks print the single rank's losses (dropout on:
// the masks follow the samples), and a checkpoint saved by 2 ranks resumes on 1.
TEST(Launch, DataParallelCpuRanksReproduceOneRank) {
  const std::string dir = laoyao::test::fresh_dir("launch_dp");
  std::vector<std::string> one = tiny_run({"--train-iters", "4"});
  const auto single = run_laoyao(one, dir, "LAOYAO_DEVICE=cpu");
  ASSERT_EQ(single.status, 0) << single.output;
  const auto want = losses_in(single.output);
  ASSERT_EQ(want.size(), 8u) << single.output;  // 4 iterations, 2 evaluations, validation, test
  // With and without the distributed optimizer (each rank steps its share of the parameters), and
  // with it and --overlap-grad-reduce (its shares cut at the model's parts).
  for (const int mode : {0, 1, 2})
    for (const char* n : {"2", "4"}) {
      if (mode == 2 && std::string(n) == "4") continue;
      std::vector<std::string> dp = {"launch", "--nproc-per-node", n, "--", "laoyao"};
      dp.insert(dp.end(), one.begin(), one.end());
      if (mode >= 1) dp.push_back("--use-distributed-optimizer");
      if (mode == 2) dp.push_back("--overlap-grad-reduce");
      const auto r = run_laoyao(dp, dir, "LAOYAO_DEVICE=cpu");
      ASSERT_EQ(r.status, 0) << r.output;
      const auto got = losses_in(r.output);
      ASSERT_EQ(got.size(), want.size()) << "only the last rank prints the log\n" << r.output;
      for (size_t i = 0; i < want.size(); ++i)
        EXPECT_NEAR(got[i], want[i], 1e-5 * std::abs(want[i]))
            << n << " ranks" << (mode >= 1 ? " (distributed optimizer)" : "") << (mode == 2 ? " (overlap)" : "")
            << ", value " << i;
    }
  // --calculate-per-token-loss with --eod-mask-loss (the ranks' token counts differ): the ranks sum
  // their gradients and divide them by every rank's tokens, the one rank's step.
  const std::vector<std::string> per_token =
      tiny_run({"--train-iters", "3", "--eod-mask-loss", "--calculate-per-token-loss"});
  const auto one_rank = run_laoyao(per_token, dir, "LAOYAO_DEVICE=cpu");
  ASSERT_EQ(one_rank.status, 0) << one_rank.output;
  const auto want_per_token = losses_in(one_rank.output);
  ASSERT_EQ(want_per_token.size(), 6u) << one_rank.output;
  for (const bool dist_opt : {false, true}) {
    const auto r = run_laoyao(on_ranks("2", per_token, dist_opt ? std::vector<std::string>{"--use-distributed-optimizer"}
                                                                : std::vector<std::string>{}),
                              dir, "LAOYAO_DEVICE=cpu");
    ASSERT_EQ(r.status, 0) << r.output;
    const auto got = losses_in(r.output);
    ASSERT_EQ(got.size(), want_per_token.size()) << r.output;
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_NEAR(got[i], want_per_token[i], 1e-5 * want_per_token[i])
          << "per-token loss on 2 ranks" << (dist_opt ? " (distributed optimizer)" : "") << ", value " << i;
    // The gradient norms too (Adam's step barely sees a gradient's scale; the norm does).
    const auto norms = grad_norms_in(r.output), want_norms = grad_norms_in(one_rank.output);
    ASSERT_EQ(norms.size(), 3u) << r.output;
    ASSERT_EQ(want_norms.size(), 3u) << one_rank.output;
    for (size_t i = 0; i < norms.size(); ++i)
      EXPECT_NEAR(norms[i], want_norms[i], std::max(2e-3 * want_norms[i], 1e-3)) << "grad norm of iteration " << i + 1;
  }
  // --decoupled-lr under the distributed optimizer: each rank's shares of the embeddings step at
  // their own rate, as one rank's whole embeddings do.
  const std::vector<std::string> decoupled = tiny_run({"--train-iters", "3", "--decoupled-lr", "1e-2"});
  const auto decoupled_one = run_laoyao(decoupled, dir, "LAOYAO_DEVICE=cpu");
  ASSERT_EQ(decoupled_one.status, 0) << decoupled_one.output;
  const auto want_decoupled = losses_in(decoupled_one.output);
  const auto decoupled_two = run_laoyao(on_ranks("2", decoupled, {"--use-distributed-optimizer"}), dir,
                                        "LAOYAO_DEVICE=cpu");
  ASSERT_EQ(decoupled_two.status, 0) << decoupled_two.output;
  const auto got_decoupled = losses_in(decoupled_two.output);
  ASSERT_EQ(got_decoupled.size(), want_decoupled.size()) << decoupled_two.output;
  for (size_t i = 0; i < got_decoupled.size(); ++i)
    EXPECT_NEAR(got_decoupled[i], want_decoupled[i], 1e-5 * want_decoupled[i]) << "--decoupled-lr, value " << i;
  EXPECT_NE(want_decoupled[3], want[3]) << "the embeddings' rate changes iteration 3";
  // Saved at DP=2 with the distributed optimizer (whole moments gathered from shares cut at the
  // model's parts) after 2 iterations, resumed on one rank for iterations 3 and 4.
  std::vector<std::string> save = {"launch", "--nproc-per-node", "2", "--", "laoyao"};
  const auto first = tiny_run({"--train-iters", "4", "--exit-interval", "2", "--save", dir + "/ckpt",
                               "--save-interval", "2", "--use-distributed-optimizer", "--overlap-grad-reduce"});
  save.insert(save.end(), first.begin(), first.end());
  const auto saved = run_laoyao(save, dir, "LAOYAO_DEVICE=cpu");
  ASSERT_EQ(saved.status, 0) << saved.output;
  const auto resumed = run_laoyao(tiny_run({"--train-iters", "4", "--load", dir + "/ckpt"}), dir, "LAOYAO_DEVICE=cpu");
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  const auto tail = losses_in(resumed.output);
  ASSERT_GE(tail.size(), 2u) << resumed.output;
  // want: iterations 1, 2, the evaluation at 2, iterations 3, 4, ...
  EXPECT_NEAR(tail[0], want[3], 1e-5 * want[3]) << "iteration 3 after the resume\n" << resumed.output;
  // A resumed run's first line resets nothing (Megatron-LM core 0.20's is_first_iteration): at log
  // interval 1 its iteration-4 line is the mean of iterations 3 and 4.
  const double mean34 = (want[3] + want[4]) / 2;
  EXPECT_NEAR(tail[1], mean34, 1e-5 * mean34) << "iteration 4 after the resume";
}

// An MoE model over two data-parallel CPU ranks prints the single rank's losses, load-balancing
// loss included (averaged over the ranks as Megatron does); with aux-loss-free balancing (a sigmoid
// router's expert bias, moved after each step by the tokens counted over both ranks) too, and its
// checkpoint (the biases saved as the router's buffers) resumes on one rank.
TEST(Launch, DataParallelCpuRanksTrainAnMoeModelAsOneRank) {
  const std::string dir = laoyao::test::fresh_dir("launch_moe");
  auto balance = [](const std::string& log) {
    std::vector<double> out;
    for (size_t at = 0; (at = log.find("load_balancing_loss: ", at)) != std::string::npos; at += 21)
      out.push_back(std::stod(log.substr(at + 21)));
    return out;
  };
  const std::vector<std::vector<std::string>> routers = {
      {"--moe-aux-loss-coeff", "0.01"},
      {"--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias", "--moe-router-bias-update-rate",
       "0.05", "--moe-router-load-balancing-type", "none"}};
  for (const auto& router : routers) {
    const bool bias = router.size() > 2;
    SCOPED_TRACE(bias ? "expert bias" : "aux loss");
    std::vector<std::string> one = tiny_run({"--train-iters", "3", "--num-experts", "4", "--moe-router-topk", "2",
                                             "--disable-bias-linear"});
    one.insert(one.end(), router.begin(), router.end());
    const auto single = run_laoyao(one, dir, "LAOYAO_DEVICE=cpu");
    ASSERT_EQ(single.status, 0) << single.output;
    std::vector<std::string> dp = {"launch", "--nproc-per-node", "2", "--", "laoyao"};
    dp.insert(dp.end(), one.begin(), one.end());
    const auto two = run_laoyao(dp, dir, "LAOYAO_DEVICE=cpu");
    ASSERT_EQ(two.status, 0) << two.output;
    const auto want = losses_in(single.output), got = losses_in(two.output);
    ASSERT_EQ(got.size(), want.size()) << two.output;
    ASSERT_FALSE(want.empty());
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5 * std::abs(want[i])) << "value " << i;
    const auto lb1 = balance(single.output), lb2 = balance(two.output);
    ASSERT_EQ(lb1.size(), bias ? 0u : 3u) << single.output;
    ASSERT_EQ(lb2.size(), lb1.size()) << two.output;
    for (size_t i = 0; i < lb1.size(); ++i) EXPECT_NEAR(lb2[i], lb1[i], 1e-5 * lb1[i]) << "iteration " << i + 1;
    if (!bias) continue;
    // Saved by the two ranks after iteration 2, resumed on one: iteration 3 as uninterrupted.
    std::vector<std::string> save = dp;
    save.insert(save.end(), {"--exit-interval", "2", "--save", dir + "/bias_ckpt", "--save-interval", "2"});
    ASSERT_EQ(run_laoyao(save, dir, "LAOYAO_DEVICE=cpu").status, 0);
    std::vector<std::string> load = one;
    load.insert(load.end(), {"--load", dir + "/bias_ckpt"});
    const auto resumed = run_laoyao(load, dir, "LAOYAO_DEVICE=cpu");
    ASSERT_EQ(resumed.status, 0) << resumed.output;
    const auto tail = losses_in(resumed.output);
    ASSERT_GE(tail.size(), 1u) << resumed.output;
    EXPECT_NEAR(tail[0], want[3], 1e-5 * want[3]) << "iteration 3 after the resume\n" << resumed.output;
  }
}

// Expert parallelism over CPU ranks: EP=2 on 2 ranks and EP=2 x expert-DP 2 on 4 ranks, with and
// without the distributed optimizer (the experts sharded over the expert-DP ranks, the rest over
// all), print the single rank's losses and load-balancing losses (the experts' weights do not
// depend on the EP size: each rank keeps its part of the whole model's initialisation); a
// checkpoint saved at EP=2 holds every expert under its global number and resumes on one rank and
// at EP=2, with the distributed optimizer too.
TEST(Launch, ExpertParallelCpuRanksReproduceOneRank) {
  const std::string dir = laoyao::test::fresh_dir("launch_ep");
  const std::vector<std::string> one =
      tiny_run({"--train-iters", "3", "--num-experts", "4", "--moe-router-topk", "2", "--moe-aux-loss-coeff", "0.01",
                "--moe-z-loss-coeff", "0.001", "--disable-bias-linear", "--swiglu"});
  const auto single = run_laoyao(one, dir, "LAOYAO_DEVICE=cpu");
  ASSERT_EQ(single.status, 0) << single.output;
  const auto want = losses_in(single.output);
  ASSERT_GE(want.size(), 4u) << single.output;
  for (const bool dist_opt : {false, true})
    for (const char* n : {"2", "4"}) {
      std::vector<std::string> extra = {"--expert-model-parallel-size", "2"};
      if (dist_opt) extra.push_back("--use-distributed-optimizer");
      const auto r = run_laoyao(on_ranks(n, one, extra), dir, "LAOYAO_DEVICE=cpu");
      ASSERT_EQ(r.status, 0) << r.output;
      const auto got = losses_in(r.output);
      ASSERT_EQ(got.size(), want.size()) << r.output;
      for (size_t i = 0; i < want.size(); ++i)
        EXPECT_NEAR(got[i], want[i], 1e-5 * std::abs(want[i]))
            << n << " ranks at EP=2" << (dist_opt ? " (distributed optimizer)" : "") << ", value " << i;
      EXPECT_NE(r.output.find("load_balancing_loss"), std::string::npos) << r.output;
    }
  // With token dropping and random router logits too (each rank drops within its own micro-batch, as
  // one rank does within each of its micro-batches).
  std::vector<std::string> dropping = one;
  dropping.insert(dropping.end(), {"--moe-expert-capacity-factor", "0.5", "--moe-router-force-load-balancing"});
  const auto single_drop = run_laoyao(dropping, dir, "LAOYAO_DEVICE=cpu");
  ASSERT_EQ(single_drop.status, 0) << single_drop.output;
  const auto want_drop = losses_in(single_drop.output);
  const auto ep_drop = run_laoyao(on_ranks("2", dropping, {"--expert-model-parallel-size", "2"}), dir,
                                  "LAOYAO_DEVICE=cpu");
  ASSERT_EQ(ep_drop.status, 0) << ep_drop.output;
  const auto got_drop = losses_in(ep_drop.output);
  ASSERT_EQ(got_drop.size(), want_drop.size()) << ep_drop.output;
  for (size_t i = 0; i < want_drop.size(); ++i)
    EXPECT_NEAR(got_drop[i], want_drop[i], 1e-5 * std::abs(want_drop[i])) << "dropping at EP=2, value " << i;
  EXPECT_NE(want_drop[0], want[0]) << "dropping and random logits changed nothing";
  // Saved at EP=2 after iteration 2, resumed for iteration 3 on one rank and again at EP=2.
  const auto saved = run_laoyao(on_ranks("2", one, {"--expert-model-parallel-size", "2", "--exit-interval", "2",
                                                    "--save", dir + "/ep_ckpt", "--save-interval", "2"}),
                                dir, "LAOYAO_DEVICE=cpu");
  ASSERT_EQ(saved.status, 0) << saved.output;
  // And saved on 4 ranks at EP=2 with the distributed optimizer (the moments gathered over both
  // kinds of share), resumed on one rank.
  const auto saved_dist = run_laoyao(on_ranks("4", one, {"--expert-model-parallel-size", "2", "--exit-interval", "2",
                                                         "--use-distributed-optimizer", "--save", dir + "/ep_dist_ckpt",
                                                         "--save-interval", "2"}),
                                     dir, "LAOYAO_DEVICE=cpu");
  ASSERT_EQ(saved_dist.status, 0) << saved_dist.output;
  const std::vector<std::pair<const char*, std::vector<std::string>>> loads = {
      {"1", {"--load", dir + "/ep_ckpt"}},
      {"2", {"--load", dir + "/ep_ckpt", "--expert-model-parallel-size", "2", "--use-distributed-optimizer"}},
      {"1", {"--load", dir + "/ep_dist_ckpt"}}};
  for (const auto& [n, extra] : loads) {
    const auto resumed = run_laoyao(on_ranks(n, one, extra), dir, "LAOYAO_DEVICE=cpu");
    ASSERT_EQ(resumed.status, 0) << resumed.output;
    expect_resumed_tail(resumed.output, want, 1e-5, std::string("resumed on ") + n + " rank(s) from " + extra[1]);
  }
}

// Mixture of Experts under tensor parallelism over CPU ranks (sequence parallel, every expert split
// over the TP ranks): TP=2 on 2 ranks, TP=2 x DP=2 on 4 with the distributed optimizer, and TP=2 x
// EP=2 on 4 (each rank's two experts split over its TP pair), with and without the distributed
// optimizer. With whole experts (--expert-tensor-parallel-size 1, the EP groups folded across the
// TP ranks): without EP on 2 ranks and on 4 (DP=2, the distributed optimizer), EP=2 on 2 and 4
// ranks (on 4 with and without the distributed optimizer, which then shards the experts over the
// data-parallel pairs holding the same ones), EP=4 on 4. Each prints the single rank's losses and
// load-balancing losses; checkpoints saved at TP=2, at TP=2 x EP=2 and with whole experts (EP=2 on
// 4, the distributed optimizer) resume on one rank. Without sequence
// parallelism the run is refused as Megatron-Core's MoELayer refuses it, before anything is written.
TEST(Launch, TensorParallelCpuRanksTrainAnMoeModelAsOneRank) {
  const std::string dir = laoyao::test::fresh_dir("launch_tp_moe");
  const std::vector<std::string> one = tiny_moe_run({"--log-num-zeros-in-grad", "--log-params-norm"});
  const auto single = run_laoyao(one, dir, "LAOYAO_DEVICE=cpu");
  ASSERT_EQ(single.status, 0) << single.output;
  const auto want = losses_in(single.output);
  ASSERT_GE(want.size(), 4u) << single.output;
  // A log field's values in order (the norms and the zero count count every split part once).
  auto values = [](const std::string& log, const std::string& key) {
    std::vector<double> out;
    for (size_t at = 0; (at = log.find(key, at)) != std::string::npos; at += key.size())
      out.push_back(std::stod(log.substr(at + key.size())));
    return out;
  };
  const char* fields[] = {"load_balancing_loss: ", "grad norm: ", "num zeros: ", "params norm: "};
  for (const char* f : fields) ASSERT_EQ(values(single.output, f).size(), 3u) << f << single.output;
  // TP=2, TP=2 x DP=2, TP=2 x EP=2 and TP=2 x DP=4 x EP=2 (an expert data-parallel group of two).
  const std::vector<std::pair<const char*, std::vector<std::string>>> layouts = {
      {"2", {}},
      {"4", {"--use-distributed-optimizer"}},
      {"4", {"--expert-model-parallel-size", "2"}},
      {"4", {"--expert-model-parallel-size", "2", "--use-distributed-optimizer"}},
      {"8", {"--expert-model-parallel-size", "2", "--use-distributed-optimizer"}},
      // Whole experts (expert TP size 1): the EP groups fold across the TP ranks.
      {"2", {"--expert-tensor-parallel-size", "1"}},
      {"4", {"--expert-tensor-parallel-size", "1", "--use-distributed-optimizer"}},
      {"2", {"--expert-model-parallel-size", "2", "--expert-tensor-parallel-size", "1"}},
      {"4", {"--expert-model-parallel-size", "2", "--expert-tensor-parallel-size", "1"}},
      // (EP = TP: the ranks holding the same experts are the data-parallel pairs, which shard them.)
      {"4",
       {"--expert-model-parallel-size", "2", "--expert-tensor-parallel-size", "1", "--use-distributed-optimizer"}},
      {"4",
       {"--expert-model-parallel-size", "4", "--expert-tensor-parallel-size", "1", "--use-distributed-optimizer"}}};
  for (const auto& [n, flags] : layouts) {
    std::string what = std::string(n) + " ranks";
    for (const auto& f : flags) what += " " + f;
    SCOPED_TRACE(what);
    std::vector<std::string> extra = {"--tensor-model-parallel-size", "2", "--sequence-parallel"};
    extra.insert(extra.end(), flags.begin(), flags.end());
    const auto r = run_laoyao(on_ranks(n, one, extra), dir, "LAOYAO_DEVICE=cpu");
    ASSERT_EQ(r.status, 0) << r.output;
    const auto got = losses_in(r.output);
    ASSERT_EQ(got.size(), want.size()) << r.output;
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_NEAR(got[i], want[i], 1e-4 * std::abs(want[i])) << n << " ranks at TP=2, value " << i;
    for (const char* f : fields) {
      const auto w = values(single.output, f), g = values(r.output, f);
      ASSERT_EQ(g.size(), w.size()) << f << r.output;
      // The norms print 3 decimals. The zero count may differ by a gradient element that is zero
      // in exact arithmetic and lands on 0.0f in one summation order only (tests/model/
      // tensor_parallel_test.cpp checks the counts exactly up to such elements): 1 against 0 at
      // iteration 3 with the distributed optimizer on one build machine, equal on others.
      const double slack = std::string(f) == "num zeros: " ? 2.0 : 1.5e-3;
      for (size_t i = 0; i < w.size(); ++i) EXPECT_NEAR(g[i], w[i], 1e-4 * w[i] + slack) << f << "iteration " << i + 1;
    }
  }
  const std::vector<std::pair<const char*, std::vector<std::string>>> saves = {
      {"2", {}},
      {"4", {"--expert-model-parallel-size", "2", "--use-distributed-optimizer"}},
      {"4",
       {"--expert-model-parallel-size", "2", "--expert-tensor-parallel-size", "1", "--use-distributed-optimizer"}}};
  int saved_runs = 0;
  for (const auto& [n, flags] : saves) {
    const std::string ckpt = dir + "/ckpt" + std::to_string(saved_runs++);
    std::vector<std::string> extra = {"--tensor-model-parallel-size", "2", "--sequence-parallel", "--exit-interval",
                                      "2", "--save", ckpt, "--save-interval", "2"};
    extra.insert(extra.end(), flags.begin(), flags.end());
    const auto saved = run_laoyao(on_ranks(n, one, extra), dir, "LAOYAO_DEVICE=cpu");
    ASSERT_EQ(saved.status, 0) << saved.output;
    // Resumed on one rank, and on the ranks that saved it (their shards kept from the whole).
    std::vector<std::string> again = {"--load", ckpt, "--tensor-model-parallel-size", "2", "--sequence-parallel"};
    again.insert(again.end(), flags.begin(), flags.end());
    for (const auto& load : {on_ranks("1", one, {"--load", ckpt}), on_ranks(n, one, again)}) {
      const auto resumed = run_laoyao(load, dir, "LAOYAO_DEVICE=cpu");
      ASSERT_EQ(resumed.status, 0) << resumed.output;
      expect_resumed_tail(resumed.output, want, 1e-4, std::string("saved on ") + n + " ranks, resumed by " + load[2]);
    }
  }
  // Without --sequence-parallel: refused by name, exit 2, no checkpoint.
  const auto refused = run_laoyao(on_ranks("2", one, {"--tensor-model-parallel-size", "2", "--save", dir + "/no_sp",
                                                      "--save-interval", "1"}),
                                  dir, "LAOYAO_DEVICE=cpu");
  EXPECT_NE(refused.status, 0) << refused.output;
  EXPECT_NE(refused.output.find("need sequence parallelism (--sequence-parallel"), std::string::npos) << refused.output;
  EXPECT_FALSE(std::filesystem::exists(dir + "/no_sp")) << refused.output;
}

// SIGTERM to the launcher (a scheduler's stop, Ctrl-C's sibling) stops every rank promptly. The
// signal is sent once both ranks have printed, so the launcher's handler is surely in place (a
// fixed delay raced a slow start on a loaded machine).
TEST(Launch, ASignalToTheLauncherStopsTheRanks) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    close(fds[0]);
    close(fds[1]);
    execl(LAOYAO_BINARY, "laoyao", "launch", "--nproc-per-node", "2", "--", "sh", "-c", "echo started; sleep 60",
          static_cast<char*>(nullptr));
    _exit(127);
  }
  close(fds[1]);
  std::string out;
  bool eof = false;
  // Reads what the launcher prints until `done` holds, its output ends or `seconds` pass.
  auto read_until = [&](auto done, double seconds) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (!eof && !done()) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
      if (left.count() <= 0) return;
      pollfd pfd{fds[0], POLLIN, 0};
      if (poll(&pfd, 1, static_cast<int>(left.count())) <= 0) continue;
      char buf[4096];
      const ssize_t n = read(fds[0], buf, sizeof buf);
      if (n <= 0) eof = true;
      else out.append(buf, static_cast<size_t>(n));
    }
  };
  auto both_started = [&] {
    return out.find("[rank0]: started") != std::string::npos && out.find("[rank1]: started") != std::string::npos;
  };
  read_until(both_started, 120.0);
  const bool started = both_started();
  const auto signalled = std::chrono::steady_clock::now();
  kill(pid, SIGTERM);
  read_until([] { return false; }, 30.0);
  close(fds[0]);
  if (!eof) kill(pid, SIGKILL);
  int st = 0;
  waitpid(pid, &st, 0);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - signalled).count();
  ASSERT_TRUE(started) << out;
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 1) << out;
  EXPECT_LT(seconds, 15.0) << out;
  EXPECT_NE(out.find("the launcher received"), std::string::npos) << out;
}

// Tensor parallelism over CPU ranks (Megatron's layout: TP ranks consecutive): TP=2, TP=2 x DP=2
// on 4 ranks, TP=2 with sequence parallelism and TP=2 x DP=2 with sequence parallelism and the
// distributed optimizer print the single rank's losses up to fp32 summation order; a Llama-style
// model (GQA, RoPE, SwiGLU, RMSNorm, untied) too. Dropout on: the masks are the whole model's.
TEST(Launch, TensorParallelCpuRanksReproduceOneRank) {
  const std::string dir = laoyao::test::fresh_dir("launch_tp");
  const std::vector<std::vector<std::string>> models = {
      {"--num-attention-heads", "4"},
      {"--num-attention-heads", "4", "--group-query-attention", "--num-query-groups", "2", "--normalization",
       "RMSNorm", "--swiglu", "--position-embedding-type", "rope", "--disable-bias-linear",
       "--untie-embeddings-and-output-weights"}};
  for (const auto& model : models) {
    std::vector<std::string> one = tiny_run({"--train-iters", "3"});
    one.insert(one.end(), model.begin(), model.end());
    const auto single = run_laoyao(one, dir, "LAOYAO_DEVICE=cpu");
    ASSERT_EQ(single.status, 0) << single.output;
    const auto want = losses_in(single.output);
    ASSERT_GE(want.size(), 4u) << single.output;
    // TP=2, TP=2 x DP=2, TP=2 with sequence parallelism, and TP=2 x DP=2 with both.
    const std::vector<std::pair<const char*, std::vector<std::string>>> layouts = {
        {"2", {}}, {"4", {}}, {"2", {"--sequence-parallel"}},
        {"4", {"--sequence-parallel", "--use-distributed-optimizer"}}};
    for (const auto& [n, flags] : layouts) {
      const bool sp = !flags.empty();
      std::vector<std::string> tp = {"launch", "--nproc-per-node", n, "--", "laoyao"};
      tp.insert(tp.end(), one.begin(), one.end());
      tp.insert(tp.end(), {"--tensor-model-parallel-size", "2"});
      tp.insert(tp.end(), flags.begin(), flags.end());
      const auto r = run_laoyao(tp, dir, "LAOYAO_DEVICE=cpu");
      ASSERT_EQ(r.status, 0) << r.output;
      const auto got = losses_in(r.output);
      ASSERT_EQ(got.size(), want.size()) << r.output;
      for (size_t i = 0; i < want.size(); ++i)
        EXPECT_NEAR(got[i], want[i], 1e-4 * std::abs(want[i]))
            << n << " ranks at TP=2" << (sp ? " with " + flags.back() : "") << ", value " << i;
    }
  }
  // Checkpoints hold whole tensors: saved at TP=2 x DP=2 with sequence parallelism and the
  // distributed optimizer after 2 iterations, resumed on one rank, at DP=2 with the distributed
  // optimizer and at TP=2: iteration 3 and the evaluations after it (which see step 3: the restored
  // moments) are the uninterrupted run's.
  std::vector<std::string> one = tiny_run({"--train-iters", "3", "--num-attention-heads", "4"});
  const auto want = losses_in(run_laoyao(one, dir, "LAOYAO_DEVICE=cpu").output);
  ASSERT_GE(want.size(), 4u);
  const auto saved = run_laoyao(on_ranks("4", one, {"--tensor-model-parallel-size", "2", "--sequence-parallel",
                                                    "--use-distributed-optimizer", "--exit-interval", "2", "--save",
                                                    dir + "/tp_ckpt", "--save-interval", "2"}),
                                dir, "LAOYAO_DEVICE=cpu");
  ASSERT_EQ(saved.status, 0) << saved.output;
  const std::vector<std::pair<const char*, std::vector<std::string>>> loads = {
      {"1", {}}, {"2", {"--use-distributed-optimizer"}}, {"2", {"--tensor-model-parallel-size", "2"}}};
  for (const auto& [n, extra] : loads) {
    std::vector<std::string> flags = {"--load", dir + "/tp_ckpt"};
    flags.insert(flags.end(), extra.begin(), extra.end());
    const auto resumed = run_laoyao(on_ranks(n, one, flags), dir, "LAOYAO_DEVICE=cpu");
    ASSERT_EQ(resumed.status, 0) << resumed.output;
    expect_resumed_tail(resumed.output, want, 1e-4,
                        std::string("resumed on ") + n + " rank(s)" + (extra.empty() ? "" : " with " + extra[0]));
  }
}

// A run's parallel layout is its own, not its checkpoint's: a checkpoint saved by four CPU ranks as
// TP=2 x DP=2 (plain, or with the distributed optimizer, also saved asynchronously at iterations 1
// and 2) resumes on one rank and as EP=2 (two
// data-parallel ranks sharing out the experts), and those saved as EP=2 or on one rank resume as
// TP=2 x DP=2, each continuing the single rank's losses. Each rank writes its own parts.
TEST(Launch, ACheckpointMovesBetweenTp2Dp2AndEp2AndOneRank) {
  const std::string dir = laoyao::test::fresh_dir("launch_ckpt_layouts");
  const std::vector<std::string> one = tiny_moe_run();
  const auto single = run_laoyao(one, dir, "LAOYAO_DEVICE=cpu");
  ASSERT_EQ(single.status, 0) << single.output;
  const auto want = losses_in(single.output);
  const std::vector<std::string> tp2dp2 = {"--tensor-model-parallel-size", "2", "--sequence-parallel"};
  const std::vector<std::string> ep2 = {"--expert-model-parallel-size", "2"};
  struct Layout {
    const char* ranks;
    std::vector<std::string> flags;
    std::string name;
  };
  std::vector<std::string> tp2dp2_dist = tp2dp2;
  tp2dp2_dist.push_back("--use-distributed-optimizer");
  std::vector<std::string> tp2dp2_dist_async = tp2dp2_dist;
  tp2dp2_dist_async.push_back("--async-save");
  const Layout one_rank{"1", {}, "1 rank"}, tp_dp{"4", tp2dp2, "TP=2 x DP=2"}, ep{"2", ep2, "EP=2"},
      tp_dp_dist{"4", tp2dp2_dist, "TP=2 x DP=2 with the distributed optimizer"},
      tp_dp_async{"4", tp2dp2_dist_async, "TP=2 x DP=2, distributed optimizer, --async-save"};
  // Each rank writes the parts no lower rank holds: at TP=2 x DP=2 the two TP ranks of the first
  // data-parallel rank hold every weight and moment (the second's are replicas); with the
  // distributed optimizer each rank writes its share of the main parameters and moments.
  struct Saved {
    Layout saver;
    std::vector<Layout> loaders;
    std::vector<std::string> files;  // the iteration folder's
  };
  const std::vector<std::string> two_tp_ranks = {"model.rank00000.safetensors", "model.rank00001.safetensors",
                                                 "optimizer.rank00000.safetensors", "optimizer.rank00001.safetensors",
                                                 "run_config.yaml", "train_state.json"};
  const std::vector<Saved> moves = {
      {tp_dp, {one_rank, ep}, two_tp_ranks},
      {ep, {tp_dp}, {}},
      {one_rank, {tp_dp_dist}, {"model.safetensors", "optimizer.safetensors", "run_config.yaml", "train_state.json"}},
      {tp_dp_dist, {one_rank, ep}, {}},
      {tp_dp_async, {one_rank}, {}}};
  int saved_runs = 0;
  for (const auto& [saver, loaders, files] : moves) {
    const std::string ckpt = dir + "/ckpt" + std::to_string(saved_runs++);
    std::vector<std::string> save = saver.flags;
    for (const char* f : {"--exit-interval", "2", "--save-interval", "2", "--save"}) save.push_back(f);
    save.push_back(ckpt);
    // Asynchronous saves at 1 and 2: the first finalized by all ranks together while training goes on.
    if (saver.name == tp_dp_async.name) save.insert(save.end(), {"--save-interval", "1"});
    const auto saved = run_laoyao(on_ranks(saver.ranks, one, save), dir, "LAOYAO_DEVICE=cpu");
    ASSERT_EQ(saved.status, 0) << saved.output;
    std::vector<std::string> written;
    for (const auto& e : std::filesystem::directory_iterator(ckpt + "/iter_0000002"))
      written.push_back(e.path().filename().string());
    std::sort(written.begin(), written.end());
    if (!files.empty()) {
      EXPECT_EQ(written, files) << saver.name;
    }
    if (saver.name == tp_dp_async.name) {
      for (const char* it : {"1", "2"}) {
        EXPECT_NE(saved.output.find(std::string("successfully saved checkpoint from iteration       ") + it),
                  std::string::npos)
            << saved.output;
      }
    }
    if (saver.name == tp_dp_dist.name || saver.name == tp_dp_async.name) {  // every rank its share
      for (const char* f : {"model.rank00002.safetensors", "model.rank00003.safetensors",
                            "optimizer.rank00002.safetensors", "optimizer.rank00003.safetensors"})
        EXPECT_NE(std::find(written.begin(), written.end(), f), written.end()) << f;
    }
    for (const Layout& loader : loaders) {
      std::vector<std::string> load = loader.flags;
      load.push_back("--load");
      load.push_back(ckpt);
      const auto resumed = run_laoyao(on_ranks(loader.ranks, one, load), dir, "LAOYAO_DEVICE=cpu");
      ASSERT_EQ(resumed.status, 0) << resumed.output;
      expect_resumed_tail(resumed.output, want, 1e-4, "saved as " + saver.name + ", resumed as " + loader.name);
    }
  }
  // A shard of the TP=2 x DP=2 checkpoint truncated, then missing: the resume stops before training
  // (exit 2; `launch` exits 1 when a rank fails, as torchrun does), naming the file.
  const std::string it_dir = dir + "/ckpt0/iter_0000002";
  const std::string shard = it_dir + "/model.rank00001.safetensors";
  std::filesystem::resize_file(shard, std::filesystem::file_size(shard) - 16);
  std::vector<std::string> alone = one;
  alone.insert(alone.end(), {"--load", dir + "/ckpt0"});
  const auto truncated = run_laoyao(alone, dir, "LAOYAO_DEVICE=cpu");
  EXPECT_EQ(truncated.status, 2) << truncated.output;
  EXPECT_NE(truncated.output.find("'" + shard + "' is corrupt: it is"), std::string::npos) << truncated.output;
  EXPECT_EQ(truncated.output.find(" iteration        3/"), std::string::npos) << truncated.output;
  std::filesystem::remove(shard);
  const auto missing = run_laoyao(on_ranks("2", one, {"--load", dir + "/ckpt0", "--expert-model-parallel-size", "2"}),
                                  dir, "LAOYAO_DEVICE=cpu");
  EXPECT_NE(missing.status, 0) << missing.output;
  EXPECT_NE(missing.output.find("'" + shard + "' is missing"), std::string::npos) << missing.output;
}

// The DeepSeek-V2-Lite recipe (multi-latent attention with YaRN, a dense first layer, then MoE
// layers with shared experts and the sequence-level aux loss), shrunk: one rank, TP=2 with sequence
// parallelism and EP=2 over CPU ranks print the same losses and grad norms. (A vocabulary that
// pads alike at TP 1 and 2: Megatron pads to a multiple of make_vocab_size_divisible_by x TP.)
TEST(Launch, TheDeepseekV2LiteRecipeTrainsShrunkAloneAndOverTpAndEpRanks) {
  const std::string dir = laoyao::test::fresh_dir("launch_dsv2");
  const std::vector<std::string> one = {
      "run-recipe", "--recipe", "deepseek_v2_lite_pretrain_config", "model.num_layers=2", "model.hidden_size=32",
      "model.ffn_hidden_size=64", "model.num_attention_heads=4", "model.num_query_groups=4", "model.kv_lora_rank=16", "model.qk_head_dim=8",
      "model.qk_pos_emb_head_dim=4", "model.v_head_dim=8", "model.num_moe_experts=4", "model.moe_router_topk=2",
      "model.moe_ffn_hidden_size=16", "model.moe_shared_expert_intermediate_size=32", "model.moe_layer_freq=[0,1]",
      "model.expert_model_parallel_size=1", "model.seq_length=64", "dataset.seq_length=64", "train.train_iters=4",
      "train.global_batch_size=4", "train.micro_batch_size=2", "scheduler.lr_warmup_iters=1", "checkpoint.save=null",
      "logger.log_interval=1", "model.make_vocab_size_divisible_by=64", "tokenizer.vocab_size=1023"};
  const auto single = run_laoyao(one, dir, "LAOYAO_DEVICE=cpu");
  ASSERT_EQ(single.status, 0) << single.output;
  EXPECT_NE(single.output.find("seq_load_balancing_loss"), std::string::npos) << single.output;
  const auto want = losses_in(single.output), want_norms = grad_norms_in(single.output);
  ASSERT_EQ(want.size(), 6u) << single.output;  // 4 iterations, the validation and test losses
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{"model.tensor_model_parallel_size=2", "model.sequence_parallel=true"},
        std::vector<std::string>{"model.expert_model_parallel_size=2"}}) {
    const auto r = run_laoyao(on_ranks("2", one, extra), dir, "LAOYAO_DEVICE=cpu");
    ASSERT_EQ(r.status, 0) << r.output;
    const auto got = losses_in(r.output);
    ASSERT_EQ(got.size(), want.size()) << r.output;
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5 * std::abs(want[i])) << extra[0] << " " << i;
    EXPECT_EQ(grad_norms_in(r.output), want_norms) << extra[0];
  }
}

// Multi-latent attention under context parallelism (YaRN on the decoupled dims at the chunks'
// places; the keys and values gathered, their gradients summed back): CP=2, and TP=2 x CP=2 with
// sequence parallelism, with hidden dropout, reproduce one rank's losses and grad norms.
TEST(Launch, ContextParallelCpuRanksWithMultiLatentAttentionReproduceOneRank) {
  const std::string dir = laoyao::test::fresh_dir("launch_cp_mla");
  const std::vector<std::string> one =
      tiny_run({"--train-iters", "3", "--attention-dropout", "0", "--num-attention-heads", "4", "--normalization",
                "RMSNorm", "--swiglu", "--disable-bias-linear", "--multi-latent-attention", "--q-lora-rank", "24",
                "--kv-lora-rank", "16", "--qk-head-dim", "8", "--qk-pos-emb-head-dim", "4", "--v-head-dim", "8",
                "--position-embedding-type", "yarn", "--rotary-scaling-factor", "4"});
  const auto single = run_laoyao(one, dir, "LAOYAO_DEVICE=cpu");
  ASSERT_EQ(single.status, 0) << single.output;
  const auto want = losses_in(single.output), want_norms = grad_norms_in(single.output);
  for (const auto& [n, extra] : std::vector<std::pair<const char*, std::vector<std::string>>>{
           {"2", {"--context-parallel-size", "2"}},
           {"4", {"--context-parallel-size", "2", "--tensor-model-parallel-size", "2", "--sequence-parallel"}}}) {
    const auto r = run_laoyao(on_ranks(n, one, extra), dir, "LAOYAO_DEVICE=cpu");
    ASSERT_EQ(r.status, 0) << r.output;
    const auto got = losses_in(r.output);
    ASSERT_EQ(got.size(), want.size()) << r.output;
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5 * std::abs(want[i])) << n << " " << i;
    EXPECT_EQ(grad_norms_in(r.output), want_norms) << n;
  }
  std::filesystem::remove_all(dir);
}

// Multi-token prediction (--mtp-num-layers 2): its losses printed after the lm loss as Megatron's
// "mtp_1 loss" / "mtp_2 loss"; two data-parallel CPU ranks print one rank's; a checkpoint saved
// after iteration 2 resumes to the same losses; an MoE model's MTP layer under expert parallelism.
TEST(Launch, MultiTokenPredictionLogsItsLossesAndDataParallelRanksReproduceOneRank) {
  const std::string dir = laoyao::test::fresh_dir("launch_mtp");
  const std::vector<std::string> one =
      tiny_run({"--train-iters", "3", "--mtp-num-layers", "2", "--mtp-loss-scaling-factor", "0.3"});
  const auto single = run_laoyao(one, dir, "LAOYAO_DEVICE=cpu");
  ASSERT_EQ(single.status, 0) << single.output;
  for (const char* key : {"| lm loss: ", "| mtp_1 loss: ", "| mtp_2 loss: "})
    EXPECT_NE(single.output.find(key), std::string::npos) << key << "\n" << single.output;
  auto mtp_losses = [](const std::string& log) {
    std::vector<double> out;
    for (size_t at = 0; (at = log.find(" loss: ", at)) != std::string::npos; at += 7)
      if (log.compare(at - 5, 5, "mtp_1") == 0 || log.compare(at - 5, 5, "mtp_2") == 0)
        out.push_back(std::stod(log.substr(at + 7)));
    return out;
  };
  const auto want = losses_in(single.output), want_mtp = mtp_losses(single.output);
  ASSERT_EQ(want_mtp.size(), 6u) << single.output;
  const auto dp = run_laoyao(on_ranks("2", one), dir, "LAOYAO_DEVICE=cpu");
  ASSERT_EQ(dp.status, 0) << dp.output;
  const auto got = losses_in(dp.output), got_mtp = mtp_losses(dp.output);
  ASSERT_EQ(got.size(), want.size()) << dp.output;
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5 * std::abs(want[i])) << i;
  ASSERT_EQ(got_mtp.size(), want_mtp.size()) << dp.output;
  for (size_t i = 0; i < want_mtp.size(); ++i) EXPECT_NEAR(got_mtp[i], want_mtp[i], 1e-5 * want_mtp[i]) << i;
  // Saved after iteration 2, resumed for the rest.
  std::vector<std::string> save = one;
  save.insert(save.end(), {"--save", dir + "/ckpt", "--save-interval", "2", "--exit-interval", "2"});
  ASSERT_EQ(run_laoyao(save, dir, "LAOYAO_DEVICE=cpu").status, 0);
  std::vector<std::string> load = one;
  load.insert(load.end(), {"--load", dir + "/ckpt"});
  const auto resumed = run_laoyao(load, dir, "LAOYAO_DEVICE=cpu");
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  expect_resumed_tail(resumed.output, want, 1e-6, "resumed with MTP layers");
  // --calculate-per-token-loss: Megatron weighs each MTP layer's masked sum by the micro-batch's
  // tokens over the layer's, then divides every gradient by the step's tokens; with every token
  // counted (mock data, no EOD masking) that is the same step as the per-micro-batch means, so the
  // same losses (the later ones after the updates) and grad norms.
  std::vector<std::string> per_token = one;
  per_token.push_back("--calculate-per-token-loss");
  const auto pt = run_laoyao(per_token, dir, "LAOYAO_DEVICE=cpu");
  ASSERT_EQ(pt.status, 0) << pt.output;
  const auto pt_lm = losses_in(pt.output), pt_mtp = mtp_losses(pt.output), pt_norms = grad_norms_in(pt.output);
  ASSERT_EQ(pt_lm.size(), want.size()) << pt.output;
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(pt_lm[i], want[i], 1e-5 * std::abs(want[i])) << "per token " << i;
  ASSERT_EQ(pt_mtp.size(), want_mtp.size()) << pt.output;
  for (size_t i = 0; i < want_mtp.size(); ++i) EXPECT_NEAR(pt_mtp[i], want_mtp[i], 1e-5 * want_mtp[i]) << "per token " << i;
  const auto want_norms = grad_norms_in(single.output);
  ASSERT_EQ(pt_norms.size(), want_norms.size()) << pt.output;
  for (size_t i = 0; i < want_norms.size(); ++i) EXPECT_NEAR(pt_norms[i], want_norms[i], 1.5e-3) << "per token " << i;
  // Context parallelism (CP=2): the MTP inputs rolled across the ranks' chunks (Megatron's
  // roll_tensor), each rank's MTP losses normalised by its own tokens as Megatron's (so the logged
  // MTP loss is the ranks' mean of their means, within a few percent of one rank's whole-sequence
  // mean); the main loss of the first iteration (before any update) is one rank's.
  const auto cp = run_laoyao(on_ranks("2", one, {"--context-parallel-size", "2"}), dir, "LAOYAO_DEVICE=cpu");
  ASSERT_EQ(cp.status, 0) << cp.output;
  const auto cp_lm = losses_in(cp.output), cp_mtp = mtp_losses(cp.output);
  ASSERT_EQ(cp_lm.size(), want.size()) << cp.output;
  EXPECT_NEAR(cp_lm[0], want[0], 1e-5 * want[0]) << cp.output;
  ASSERT_EQ(cp_mtp.size(), want_mtp.size()) << cp.output;
  for (size_t i = 0; i < 2; ++i) EXPECT_NEAR(cp_mtp[i], want_mtp[i], 0.05 * want_mtp[i]) << "CP=2, the first iteration's";
  // An MoE model's MTP layer is an MoE layer: without dropout, on one rank and at EP=2 the same
  // losses, the MTP loss among them.
  const std::vector<std::string> moe =
      tiny_run({"--train-iters", "3", "--mtp-num-layers", "1", "--hidden-dropout", "0", "--attention-dropout", "0",
                "--num-experts", "4", "--moe-router-topk", "2", "--moe-aux-loss-coeff", "0.01", "--disable-bias-linear",
                "--swiglu"});
  const auto moe_one = run_laoyao(moe, dir, "LAOYAO_DEVICE=cpu");
  ASSERT_EQ(moe_one.status, 0) << moe_one.output;
  const auto moe_mtp = mtp_losses(moe_one.output);
  ASSERT_EQ(moe_mtp.size(), 3u) << moe_one.output;
  for (double x : moe_mtp) EXPECT_GT(x, 1.0) << moe_one.output;
  const auto ep = run_laoyao(on_ranks("2", moe, {"--expert-model-parallel-size", "2"}), dir, "LAOYAO_DEVICE=cpu");
  ASSERT_EQ(ep.status, 0) << ep.output;
  const auto ep_mtp = mtp_losses(ep.output), ep_lm = losses_in(ep.output), moe_lm = losses_in(moe_one.output);
  ASSERT_EQ(ep_mtp.size(), moe_mtp.size()) << ep.output;
  for (size_t i = 0; i < moe_mtp.size(); ++i) EXPECT_NEAR(ep_mtp[i], moe_mtp[i], 1e-5 * moe_mtp[i]) << i;
  ASSERT_EQ(ep_lm.size(), moe_lm.size()) << ep.output;
  for (size_t i = 0; i < moe_lm.size(); ++i) EXPECT_NEAR(ep_lm[i], moe_lm[i], 1e-5 * moe_lm[i]) << i;
}

// The DeepSeek-V3 recipe (MLA with a q latent, 3 dense layers then the sigmoid router with its
// expert bias and groups, one MTP layer), shrunk to one rank: it trains and prints the MTP loss
// beside the sequence-level load-balancing loss.
TEST(Launch, TheDeepseekV3RecipeTrainsShrunk) {
  const std::string dir = laoyao::test::fresh_dir("launch_dsv3");
  const auto r = run_laoyao(
      {"run-recipe", "--recipe", "deepseek_v3_pretrain_config", "model.num_layers=4", "model.hidden_size=32",
       "model.ffn_hidden_size=64", "model.num_attention_heads=4", "model.num_query_groups=4", "model.q_lora_rank=24",
       "model.kv_lora_rank=16", "model.qk_head_dim=8", "model.qk_pos_emb_head_dim=4", "model.v_head_dim=8",
       "model.num_moe_experts=8", "model.moe_router_topk=2", "model.moe_router_num_groups=4",
       "model.moe_router_group_topk=2", "model.moe_ffn_hidden_size=16", "model.moe_shared_expert_intermediate_size=16",
       "model.moe_layer_freq=[0,0,0,1]", "model.tensor_model_parallel_size=1", "model.pipeline_model_parallel_size=1",
       "model.expert_model_parallel_size=1", "model.sequence_parallel=false", "model.seq_length=32",
       "dataset.seq_length=32", "train.train_iters=3", "train.global_batch_size=4", "train.micro_batch_size=2",
       "scheduler.lr_warmup_iters=1", "checkpoint.save=null", "logger.log_interval=1"},
      dir, "LAOYAO_DEVICE=cpu");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("iteration        3/       3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("| seq_load_balancing_loss: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("| mtp_1 loss: "), std::string::npos) << r.output;
  EXPECT_EQ(losses_in(r.output).size(), 5u) << r.output;  // 3 iterations, the validation and test losses
}

namespace {

// Runs a shell command line, its stdout and stderr together.
laoyao::test::RunResult run_shell(const std::string& cmd) {
  laoyao::test::RunResult r;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

int free_port() {
  laoyao::dist::TcpStoreServer probe(0);
  return probe.port();
}

// `laoyao launch` of one node of `nnodes` at the loopback master, as a shell word list.
std::string node_command(int node, int nnodes, int port, const std::vector<std::string>& run) {
  // Appended piece by piece (GCC 12 misreads `"literal" + std::string&&` as an overlapping copy).
  std::string cmd = "LAOYAO_DEVICE=cpu ";
  cmd += laoyao::test::shell_word(LAOYAO_BINARY);
  cmd += " launch --nproc-per-node 1 --nnodes ";
  cmd += std::to_string(nnodes);
  cmd += " --node-rank ";
  cmd += std::to_string(node);
  cmd += " --master-addr 127.0.0.1 --master-port ";
  cmd += std::to_string(port);
  cmd += " --";
  for (const auto& a : run) {
    cmd += ' ';
    cmd += laoyao::test::shell_word(a);
  }
  return cmd;
}

}  // namespace

// Two "nodes" on loopback sharing no folder (the TCP store rank 0 serves on the master port): they
// train as one node's two ranks; a node whose rank dies mid-training stops the other within seconds,
// which names its rank.
TEST(Launch, TwoNodesMeetOverTheMasterPortWithoutASharedFolder) {
  const std::string dir = laoyao::test::fresh_dir("launch_nodes");
  const std::vector<std::string> one = tiny_run({"--train-iters", "3"});
  const auto single = run_laoyao(on_ranks("2", one), dir, "LAOYAO_DEVICE=cpu");
  ASSERT_EQ(single.status, 0) << single.output;
  const auto want = losses_in(single.output);
  std::vector<std::string> ranked = {"laoyao"};
  ranked.insert(ranked.end(), one.begin(), one.end());
  const std::string in_dir = "cd " + laoyao::test::shell_word(dir) + " && unset LAOYAO_RENDEZVOUS_DIR; ";
  int port = free_port();
  auto r = run_shell(in_dir + node_command(1, 2, port, ranked) + " > node1.txt 2>&1 & " +
                     node_command(0, 2, port, ranked) + "; s=$?; wait; exit $s");
  const std::string node1 = laoyao::read_file(dir + "/node1.txt");
  ASSERT_EQ(r.status, 0) << r.output << "\nnode 1:\n" << node1;
  const auto got = losses_in(node1);  // (the last rank prints: node 1's)
  ASSERT_EQ(got.size(), want.size()) << node1;
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5 * std::abs(want[i])) << i;

  // Node 1's rank is killed once it has trained an iteration of a long run (so both ranks have met;
  // a fixed delay could land before the rendezvous on a loaded machine): node 0 stops soon after,
  // naming its rank.
  std::string long_run = laoyao::test::shell_word(LAOYAO_BINARY);
  for (const auto& a : tiny_run({"--train-iters", "100000", "--eval-interval", "100000"})) {
    long_run += ' ';
    long_run += laoyao::test::shell_word(a);
  }
  std::vector<std::string> node0_run = {"laoyao"};
  for (const auto& a : tiny_run({"--train-iters", "100000", "--eval-interval", "100000"})) node0_run.push_back(a);
  port = free_port();
  const auto start = std::chrono::steady_clock::now();
  const std::string kill_after_an_iteration =
      long_run + " > node1_rank.log 2>&1 & pid=$!; for i in $(seq 600); do grep -q ' iteration ' node1_rank.log && "
                 "break; sleep 0.1; done; kill -KILL $pid; wait $pid";
  r = run_shell(in_dir + node_command(1, 2, port, {"sh", "-c", kill_after_an_iteration}) +
                " > node1_dies.txt 2>&1 & " + node_command(0, 2, port, node0_run) +
                "; echo \"node 0 exit status $?\"; wait");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(r.output.find("node 0 exit status 1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank 0 "), std::string::npos) << r.output;
  EXPECT_LT(seconds, 30.0) << r.output;
  std::filesystem::remove_all(dir);
}

// Context parallelism over CPU ranks (each rank two of every sequence's 2 x CP chunks, attention
// over the whole sequence's keys): CP=2, CP=4, CP=2 x DP=2 with the distributed optimizer and
// TP=2 x CP=2 with sequence parallelism print one rank's losses and grad norms, CP=2 with dropout
// too; a CP=2 checkpoint resumes on one rank and a one-rank checkpoint
// at CP=2; what it does not take yet is refused by name.
TEST(Launch, ContextParallelCpuRanksReproduceOneRank) {
  const std::string dir = laoyao::test::fresh_dir("launch_cp");
  const std::vector<std::string> one =
      tiny_run({"--train-iters", "3", "--hidden-dropout", "0", "--attention-dropout", "0", "--position-embedding-type",
                "rope", "--normalization", "RMSNorm", "--swiglu", "--disable-bias-linear", "--num-attention-heads",
                "4", "--group-query-attention", "--num-query-groups", "2"});
  const auto single = run_laoyao(one, dir, "LAOYAO_DEVICE=cpu");
  ASSERT_EQ(single.status, 0) << single.output;
  const auto want = losses_in(single.output), want_norms = grad_norms_in(single.output);
  const std::vector<std::pair<const char*, std::vector<std::string>>> runs = {
      {"2", {"--context-parallel-size", "2"}},
      {"4", {"--context-parallel-size", "4", "--cp-comm-type", "all_gather"}},
      {"4", {"--context-parallel-size", "2", "--use-distributed-optimizer"}},
      {"4", {"--context-parallel-size", "2", "--tensor-model-parallel-size", "2", "--sequence-parallel"}}};
  for (const auto& [n, extra] : runs) {
    const auto r = run_laoyao(on_ranks(n, one, extra), dir, "LAOYAO_DEVICE=cpu");
    ASSERT_EQ(r.status, 0) << r.output;
    const auto got = losses_in(r.output);
    ASSERT_EQ(got.size(), want.size()) << r.output;
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5 * std::abs(want[i])) << n << " " << extra[1];
    EXPECT_EQ(grad_norms_in(r.output), want_norms) << n << " " << extra[1];
  }
  // With dropout (Megatron-LM's 0.1 defaults): the masks are the whole model's, sliced.
  const std::vector<std::string> dropout = tiny_run({"--train-iters", "3", "--position-embedding-type", "rope"});
  const auto drop_one = run_laoyao(dropout, dir, "LAOYAO_DEVICE=cpu");
  ASSERT_EQ(drop_one.status, 0) << drop_one.output;
  const auto drop_cp = run_laoyao(on_ranks("2", dropout, {"--context-parallel-size", "2"}), dir, "LAOYAO_DEVICE=cpu");
  ASSERT_EQ(drop_cp.status, 0) << drop_cp.output;
  const auto drop_want = losses_in(drop_one.output), drop_got = losses_in(drop_cp.output);
  ASSERT_EQ(drop_got.size(), drop_want.size()) << drop_cp.output;
  for (size_t i = 0; i < drop_want.size(); ++i)
    EXPECT_NEAR(drop_got[i], drop_want[i], 1e-5 * std::abs(drop_want[i])) << "with dropout, value " << i;
  EXPECT_NE(drop_want, want) << "dropout changed nothing";
  // Saved at CP=2 after iteration 2, resumed on one rank; saved on one rank, resumed at CP=2.
  ASSERT_EQ(run_laoyao(on_ranks("2", one, {"--context-parallel-size", "2", "--save", dir + "/cp2", "--save-interval",
                                           "2", "--exit-interval", "2"}),
                       dir, "LAOYAO_DEVICE=cpu")
                .status,
            0);
  auto resumed = run_laoyao(on_ranks("1", one, {"--load", dir + "/cp2"}), dir, "LAOYAO_DEVICE=cpu");
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  expect_resumed_tail(resumed.output, want, 1e-5, "CP=2 resumed on one rank");
  ASSERT_EQ(run_laoyao(on_ranks("1", one, {"--save", dir + "/one", "--save-interval", "2", "--exit-interval", "2"}),
                       dir, "LAOYAO_DEVICE=cpu")
                .status,
            0);
  resumed = run_laoyao(on_ranks("2", one, {"--load", dir + "/one", "--context-parallel-size", "2"}), dir,
                       "LAOYAO_DEVICE=cpu");
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  expect_resumed_tail(resumed.output, want, 1e-5, "one rank resumed at CP=2");
  // Refused by name: a sequence that does not split into 2 x CP chunks, a2a.
  for (const auto& [extra, message] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--context-parallel-size", "2", "--seq-length", "30", "--max-position-embeddings", "30"},
            "must be divisible by 2 x --context-parallel-size (4)"},
           {{"--context-parallel-size", "2", "--cp-comm-type", "a2a"}, "--cp-comm-type a2a"}}) {
    const auto r = run_laoyao(on_ranks("2", one, extra), dir, "LAOYAO_DEVICE=cpu");
    EXPECT_NE(r.status, 0) << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << message << "\n" << r.output;
  }
  std::filesystem::remove_all(dir);
}

// Mixture of Experts under context parallelism: each rank routes its chunks' tokens, the aux
// losses' tokens per expert summed over the CP ranks (Megatron's tp_cp group), the z-loss's
// coefficient divided by CP, the aux gradients scaled by CP (the gradients are averaged over
// dp_cp), the logged aux losses summed over CP; expert parallelism over the flattened
// context- and data-parallel ranks (and folded across TP with whole experts). Each layout prints
// one rank's losses, load-balancing and z losses and grad norms (CP=2 alone, with EP=2 over the
// CP ranks, CP=2 x DP=2 with EP=2 and the distributed optimizer, TP=2 x CP=2 with EP=2 over CP and
// folded across TP); so do the sequence-level aux loss and the expert bias (its counts over
// dp_cp), and the global aux loss prints two data-parallel ranks' at CP=2 x DP=2 x EP=4 (its
// running counts are of each forward's data-parallel micro-batches, so they depend on DP, as
// Megatron's, but not on CP).
TEST(Launch, ContextParallelCpuRanksWithExpertsReproduceOneRank) {
  const std::string dir = laoyao::test::fresh_dir("launch_cp_moe");
  auto values = [](const std::string& log, const std::string& key) {
    std::vector<double> out;
    for (size_t at = 0; (at = log.find(key, at)) != std::string::npos; at += key.size())
      out.push_back(std::stod(log.substr(at + key.size())));
    return out;
  };
  const std::vector<std::string> base = {"--train-iters", "3", "--hidden-dropout", "0", "--attention-dropout", "0",
                                         "--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu",
                                         "--disable-bias-linear", "--num-attention-heads", "4", "--num-experts", "4",
                                         "--moe-router-topk", "2"};
  struct Case {
    std::vector<std::string> router, fields;
    std::vector<std::pair<const char*, std::vector<std::string>>> layouts;
    const char* reference_ranks = "1";  // (data-parallel, without CP)
  };
  const std::vector<std::string> cp2 = {"--context-parallel-size", "2"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), cp2.begin(), cp2.end());
    return extra;
  };
  const std::vector<Case> cases = {
      {{"--moe-aux-loss-coeff", "0.01", "--moe-z-loss-coeff", "0.001"},
       {"| load_balancing_loss: ", "| z_loss: "},
       {{"2", cp2},
        {"2", with({"--expert-model-parallel-size", "2"})},
        {"4", with({"--expert-model-parallel-size", "2", "--use-distributed-optimizer"})},
        {"4", with({"--tensor-model-parallel-size", "2", "--sequence-parallel", "--expert-model-parallel-size", "2"})},
        {"4", with({"--tensor-model-parallel-size", "2", "--sequence-parallel", "--expert-model-parallel-size", "2",
                    "--expert-tensor-parallel-size", "1"})}}},
      {{"--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias", "--moe-router-bias-update-rate",
        "0.05", "--moe-router-load-balancing-type", "seq_aux_loss", "--moe-aux-loss-coeff", "0.01"},
       {"| seq_load_balancing_loss: "},
       {{"2", cp2}}},
      {{"--moe-router-load-balancing-type", "global_aux_loss", "--moe-aux-loss-coeff", "0.01"},
       {"| global_load_balancing_loss: "},
       {{"4", with({"--expert-model-parallel-size", "4"})}},
       "2"}};
  for (const Case& c : cases) {
    std::vector<std::string> flags = base;
    flags.insert(flags.end(), c.router.begin(), c.router.end());
    const std::vector<std::string> one = tiny_run(flags);
    SCOPED_TRACE(c.fields[0]);
    const auto single = run_laoyao(on_ranks(c.reference_ranks, one, {}), dir, "LAOYAO_DEVICE=cpu");
    ASSERT_EQ(single.status, 0) << single.output;
    const auto want = losses_in(single.output), want_norms = grad_norms_in(single.output);
    for (const auto& f : c.fields) ASSERT_EQ(values(single.output, f).size(), 3u) << f << single.output;
    for (const auto& [n, extra] : c.layouts) {
      std::string what = std::string(n) + " ranks";
      for (const auto& f : extra) what += " " + f;
      SCOPED_TRACE(what);
      const auto r = run_laoyao(on_ranks(n, one, extra), dir, "LAOYAO_DEVICE=cpu");
      ASSERT_EQ(r.status, 0) << r.output;
      const auto got = losses_in(r.output);
      ASSERT_EQ(got.size(), want.size()) << r.output;
      for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5 * std::abs(want[i])) << i;
      EXPECT_EQ(grad_norms_in(r.output), want_norms);
      for (const auto& f : c.fields) EXPECT_EQ(values(r.output, f), values(single.output, f)) << f;
    }
  }
  std::filesystem::remove_all(dir);
}

// Bridge's llama3_8b_pretrain_config as written (CP=2), shrunk, on two CPU ranks.
TEST(Launch, TheLlama3_8bRecipeTrainsAsWrittenWithContextParallelism) {
  const std::string dir = laoyao::test::fresh_dir("launch_llama3_cp");
  const auto r = run_laoyao(
      on_ranks("2", {"run-recipe", "--recipe", "llama3_8b_pretrain_config", "model.num_layers=2",
                     "model.hidden_size=64", "model.ffn_hidden_size=128", "model.num_attention_heads=4",
                     "model.num_query_groups=2", "model.kv_channels=16", "dataset.seq_length=32", "model.seq_length=32",
                     "train.train_iters=2", "train.global_batch_size=4", "train.micro_batch_size=1",
                     "scheduler.lr_warmup_iters=1", "checkpoint.save=null", "logger.log_interval=1"}),
      dir, "LAOYAO_DEVICE=cpu");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("iteration        2/       2"), std::string::npos) << r.output;
  std::filesystem::remove_all(dir);
}
