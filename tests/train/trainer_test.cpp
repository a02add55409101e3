// End-to-end training on the CPU reference backend: mock data, Megatron's loop.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>

#include "config/convert_args.hpp"
#include "core/error.hpp"
#include "core/runtime_options.hpp"
#include "config/front_ends.hpp"
#include "core/device.hpp"
#include "train/engine.hpp"
#include "train/trainer.hpp"
#include "train/log_parse.hpp"
#include "train/run_setup.hpp"
#include "train/tensorboard_reader.hpp"
#include "train/training_log_compare.hpp"
#include "tfevents_reader.hpp"

using namespace laoyao;

namespace {

// A tiny GPT with the seed command's flag set (dropout off, so runs are comparable).
std::vector<std::string> tiny_args(int iters, int log_interval = 10) {
  return {"--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "2", "--ffn-hidden-size", "64",
          "--seq-length", "32", "--max-position-embeddings", "32", "--micro-batch-size", "2",
          "--global-batch-size", "4", "--train-iters", std::to_string(iters), "--eval-iters", "1",
          "--eval-interval", std::to_string(iters), "--mock-data", "--bf16", "--tokenizer-type", "NullTokenizer",
          "--vocab-size", "96", "--lr", "3e-3", "--min-lr", "3e-4", "--seed", "1234", "--log-interval",
          std::to_string(log_interval), "--hidden-dropout", "0", "--attention-dropout", "0"};
}

train::TrainSummary run(const config::Resolved& r, std::string* log = nullptr) {
  std::FILE* f = std::tmpfile();
  train::TrainOptions opt;
  opt.out = f;
  opt.flavor = r.front_end == config::FrontEnd::MegatronLM ? train::LogFlavor::kMegatronLM : train::LogFlavor::kBridge;
  auto read_log = [&] {
    if (log) {
      std::rewind(f);
      char buf[4096];
      size_t n;
      while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) log->append(buf, n);
    }
    std::fclose(f);
  };
  try {
    auto s = train::train(r.cfg, r.validated.derived, opt);
    read_log();
    return s;
  } catch (...) {
    read_log();  // the log up to the failure is part of what tests check
    throw;
  }
}

// The Bridge twin of an MLM command line (convert-args' recipe and overrides), with extra overrides.
config::Resolved bridge_twin(const std::vector<std::string>& mlm_args, const std::vector<std::string>& extra = {}) {
  config::Conversion conv = config::convert_mlm_args(mlm_args, 1);
  config::RecipeInvocation inv;
  inv.recipe = conv.recipe;
  inv.mode = "pretrain";
  inv.overrides = conv.overrides;
  inv.overrides.insert(inv.overrides.end(), extra.begin(), extra.end());
  return config::resolve_recipe(inv, 1);
}

// The log line of training iteration `it` ("" when there is none).
std::string iteration_line(const std::string& log, int it) {
  char key[32];
  std::snprintf(key, sizeof key, "iteration %8d/", it);
  const size_t at = log.find(key);
  if (at == std::string::npos) return "";
  const std::string line = log.substr(at);
  return line.substr(0, line.find('\n'));
}

}  // namespace

TEST(Trainer, TinyGptLossFallsWellBelowLnVocab) {
  auto r = config::resolve_mlm(tiny_args(300, 50), 1);
  std::string log;
  auto s = run(r, &log);
  ASSERT_EQ(s.lm_loss.size(), 300u);
  // Vocabulary 96 is padded to 128: the padded rows are ordinary logits (Megatron does not mask them).
  const double ln_v = std::log(128.0);
  EXPECT_NEAR(s.lm_loss.front(), ln_v, 0.1) << "a fresh model predicts about uniformly";
  double tail = 0;
  for (size_t i = 290; i < 300; ++i) tail += s.lm_loss[i] / 10;
  // Mock documents count 1, 2, 3, ...: all but the EOD and document starts are predictable.
  EXPECT_LT(tail, 0.35 * ln_v) << log;
  EXPECT_LT(s.valid_loss.back(), 0.35 * ln_v);
  EXPECT_LT(s.test_loss, 0.35 * ln_v);
  EXPECT_NE(log.find(" iteration      300/     300 | consumed samples:         1200 |"), std::string::npos) << log;
  EXPECT_NE(log.find("validation loss at iteration 300 on test set"), std::string::npos);
}

TEST(Trainer, SameSeedTwiceIsBitwiseIdentical) {
  auto r = config::resolve_mlm(tiny_args(6, 1), 1);
  auto a = run(r), b = run(r);
  EXPECT_EQ(a.lm_loss, b.lm_loss);
  EXPECT_EQ(a.grad_norm, b.grad_norm);
  auto other = config::resolve_mlm([] {
    auto v = tiny_args(6, 1);
    v[v.size() - 7] = "4321";  // --seed
    return v;
  }(), 1);
  EXPECT_NE(run(other).lm_loss, a.lm_loss) << "the seed changes the weights and the data order";
}

// --reset-attention-mask keeps attention inside each document where Megatron's attention applies
// the dataloader's mask: the local implementation's unfused softmax. Transformer Engine's attention
// (the default --transformer-impl) and Megatron-Core's fused causal softmax ignore it, and without
// the dataloader's mask (--no-create-attention-mask-in-dataloader, Bridge's default) there is none.
TEST(Trainer, ResetAttentionMaskActsWhereMegatronsAttentionAppliesTheMask) {
  auto with = [](std::vector<std::string> extra) {
    auto a = tiny_args(3, 1);
    a.insert(a.end(), extra.begin(), extra.end());
    return run(config::resolve_mlm(a, 1));
  };
  const std::vector<std::string> local = {"--reset-attention-mask", "--transformer-impl", "local"};
  auto plus = [&](std::vector<std::string> more) {
    std::vector<std::string> v = local;
    v.insert(v.end(), more.begin(), more.end());
    return v;
  };
  const auto causal = with({}), documents = with(plus({"--no-masked-softmax-fusion"}));
  ASSERT_EQ(documents.lm_loss.size(), 3u);
  EXPECT_NE(documents.lm_loss[0], causal.lm_loss[0]) << "mock samples of 33 tokens hold EODs";
  EXPECT_NE(documents.grad_norm, causal.grad_norm);
  // 2 sequences x 2 heads: too few rows for the fused softmax at 32 keys (8 a block), which then
  // falls back to the masked one.
  EXPECT_EQ(with(local).lm_loss, documents.lm_loss);
  for (const auto& ignored : {with({"--reset-attention-mask"}),
                              with(plus({"--no-masked-softmax-fusion", "--no-create-attention-mask-in-dataloader"}))}) {
    EXPECT_EQ(ignored.lm_loss, causal.lm_loss);
    EXPECT_EQ(ignored.grad_norm, causal.grad_norm);
  }
}

TEST(Trainer, DocumentMaskFollowsMegatronsAttentionPaths) {
  auto mask = [](std::vector<std::string> extra) {
    auto a = tiny_args(3, 1);
    a.insert(a.end(), extra.begin(), extra.end());
    return train::document_mask(config::resolve_mlm(a, 1).cfg);
  };
  EXPECT_FALSE(mask({}).applied);
  EXPECT_EQ(mask({}).ignored, "");
  const auto te = mask({"--reset-attention-mask"});
  EXPECT_FALSE(te.applied);
  EXPECT_NE(te.ignored.find("#2357"), std::string::npos) << te.ignored;
  EXPECT_TRUE(mask({"--reset-attention-mask", "--transformer-impl", "local"}).applied);
  // 4 sequences x 2 heads = 8 rows: the fused causal softmax runs, and ignores the mask.
  const auto fused = mask({"--reset-attention-mask", "--transformer-impl", "local", "--micro-batch-size", "4"});
  EXPECT_FALSE(fused.applied);
  EXPECT_NE(fused.ignored.find("--no-masked-softmax-fusion"), std::string::npos) << fused.ignored;
  EXPECT_TRUE(mask({"--reset-attention-mask", "--transformer-impl", "local", "--micro-batch-size", "4",
                    "--no-masked-softmax-fusion"})
                  .applied);
}

// --calculate-per-token-loss: the step's gradients are its summed token losses' over its tokens,
// however the global batch is cut into micro-batches; Megatron's default (each micro-batch's mean
// over the micro-batches) depends on the cut once --eod-mask-loss makes the micro-batches' token
// counts differ. With one micro-batch a step the two agree.
TEST(Trainer, PerTokenLossDoesNotDependOnTheMicroBatches) {
  auto with = [](const std::string& mbs, bool per_token) {
    auto a = tiny_args(4, 1);
    a[std::find(a.begin(), a.end(), "--micro-batch-size") - a.begin() + 1] = mbs;
    a.push_back("--eod-mask-loss");
    if (per_token) a.push_back("--calculate-per-token-loss");
    return run(config::resolve_mlm(a, 1));
  };
  const auto two = with("2", true), one = with("4", true), mean_two = with("2", false), mean_one = with("4", false);
  ASSERT_EQ(two.grad_norm.size(), 4u);
  bool split_matters = false;
  for (size_t i = 0; i < 4; ++i) {
    SCOPED_TRACE("iteration " + std::to_string(i + 1));
    EXPECT_NEAR(two.grad_norm[i], one.grad_norm[i], 1e-4 * one.grad_norm[i]);
    EXPECT_NEAR(two.lm_loss[i], one.lm_loss[i], 1e-5 * one.lm_loss[i]);
    EXPECT_NEAR(mean_one.grad_norm[i], one.grad_norm[i], 1e-4 * one.grad_norm[i]);
    split_matters = split_matters || std::abs(mean_two.grad_norm[i] - two.grad_norm[i]) > 1e-3 * two.grad_norm[i];
  }
  EXPECT_TRUE(split_matters) << "the micro-batches' token counts never differed: the test shows nothing";
  // Megatron-Core's DDP refuses to average a per-token loss's gradients in the collective.
  auto averaged = tiny_args(2);
  averaged.insert(averaged.end(), {"--calculate-per-token-loss", "--ddp-average-in-collective"});
  try {
    config::resolve_mlm(averaged, 1);
    ADD_FAILURE() << "accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("Cannot average in collective when calculating per-token loss"),
              std::string::npos)
        << e.what();
  }
}

// With every token counted and equal micro-batches the per-token normalisation is the default's,
// MoE aux and z losses included: Megatron's router multiplies them by the tokens it sees, undoing
// the division by the step's tokens (without that factor their gradients would be ~1/64 here).
TEST(Trainer, PerTokenLossOfAnMoeModelWithoutMaskingIsTheDefaults) {
  auto with = [](bool per_token) {
    auto a = tiny_args(4, 1);
    a.insert(a.end(), {"--num-experts", "4", "--moe-router-topk", "2", "--moe-aux-loss-coeff", "0.5",
                       "--moe-z-loss-coeff", "0.05", "--disable-bias-linear"});
    if (per_token) a.push_back("--calculate-per-token-loss");
    return run(config::resolve_mlm(a, 1));
  };
  const auto mean = with(false), per_token = with(true);
  ASSERT_EQ(per_token.grad_norm.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    SCOPED_TRACE("iteration " + std::to_string(i + 1));
    EXPECT_NEAR(per_token.grad_norm[i], mean.grad_norm[i], 1e-4 * mean.grad_norm[i]);
    EXPECT_NEAR(per_token.lm_loss[i], mean.lm_loss[i], 1e-5 * mean.lm_loss[i]);
  }
}

// Megatron's weight-decay exceptions: --apply-wd-to-qk-layernorm (the q/k layernorm weights decay too,
// optimizer.apply_wd_to_qk_layernorm) and --embedding-init-method-std (the embeddings do not); the
// runs part after the first step. Without QK layernorm the first flag changes nothing.
TEST(Trainer, ApplyWdToQkLayernormDecaysTheQkNorms) {
  auto with = [](std::vector<std::string> extra) {
    auto a = tiny_args(3, 1);
    a.insert(a.end(), {"--weight-decay", "0.5"});
    a.insert(a.end(), extra.begin(), extra.end());
    const auto r = config::resolve_mlm(a, 1);
    EXPECT_EQ(r.cfg.optimizer.apply_wd_to_qk_layernorm,
              std::find(extra.begin(), extra.end(), "--apply-wd-to-qk-layernorm") != extra.end() ||
                  std::find(extra.begin(), extra.end(), "apply_wd_to_qk_layernorm") != extra.end());
    return run(r);
  };
  const auto qk = with({"--qk-layernorm"}), qk_wd = with({"--qk-layernorm", "--apply-wd-to-qk-layernorm"});
  EXPECT_EQ(qk_wd.lm_loss[0], qk.lm_loss[0]);
  EXPECT_NE(qk_wd.lm_loss[2], qk.lm_loss[2]);
  // Bridge's scheduler.no_weight_decay_cond_type: qwen3_next is the same rule here.
  auto a = tiny_args(3, 1);
  a.insert(a.end(), {"--weight-decay", "0.5", "--qk-layernorm"});
  auto qwen3_next = config::resolve_mlm(a, 1);
  qwen3_next.cfg.scheduler.no_weight_decay_cond_type = "qwen3_next";
  EXPECT_EQ(run(qwen3_next).lm_loss, qk_wd.lm_loss);
  // Megatron-LM's deprecated --no-weight-decay-cond-type: its one accepted value is the same flag.
  EXPECT_EQ(with({"--qk-layernorm", "--no-weight-decay-cond-type", "apply_wd_to_qk_layernorm"}).lm_loss, qk_wd.lm_loss);
  a.insert(a.end(), {"--no-weight-decay-cond-type", "qwen3_next"});
  EXPECT_THROW(config::resolve_mlm(a, 1), UsageError);
  // --embedding-init-method-std: the embeddings take no weight decay (the same std as the default
  // init, so only the decay differs).
  const auto plain = with({}), emb_std = with({"--embedding-init-method-std", "0.02"});
  EXPECT_EQ(emb_std.lm_loss[0], plain.lm_loss[0]);
  EXPECT_NE(emb_std.lm_loss[2], plain.lm_loss[2]);
  EXPECT_EQ(with({"--apply-wd-to-qk-layernorm"}).lm_loss, with({}).lm_loss);
}

// --decoupled-lr / --decoupled-min-lr: the word embeddings (tied to the output layer here) step
// at their own schedule, the log line printing its value after the learning rate (Megatron-LM's
// " decoupled learning rate: ... |"). At the common rates the run is the plain one bit for bit.
TEST(Trainer, DecoupledLearningRateStepsTheEmbeddingsOnItsOwnSchedule) {
  auto with = [](const std::vector<std::string>& extra, std::string* log) {
    auto a = tiny_args(4, 1);
    a.insert(a.end(), extra.begin(), extra.end());
    return run(config::resolve_mlm(a, 1), log);
  };
  std::string plain_log, same_log, own_log;
  const auto plain = with({}, &plain_log);
  const auto same = with({"--decoupled-lr", "3e-3", "--decoupled-min-lr", "3e-4"}, &same_log);
  const auto own = with({"--decoupled-lr", "3e-2"}, &own_log);
  EXPECT_EQ(same.lm_loss, plain.lm_loss);
  EXPECT_EQ(same.grad_norm, plain.grad_norm);
  EXPECT_EQ(plain_log.find("decoupled learning rate"), std::string::npos);
  EXPECT_NE(iteration_line(same_log, 2).find("| learning rate: "), std::string::npos);
  EXPECT_NE(iteration_line(same_log, 2).find(" decoupled learning rate: "), std::string::npos) << same_log;
  // Linear decay over the 4 iterations (halfway at iteration 2: 3e-4 + (3e-2 - 3e-4) / 2); the
  // last line prints each schedule's minimum (the decoupled one's defaults to --min-lr).
  const std::string last = iteration_line(own_log, 4);
  EXPECT_NE(last.find("| learning rate: 3.000000E-04 | decoupled learning rate: 3.000000E-04 | global batch size:"),
            std::string::npos)
      << last;
  EXPECT_NE(iteration_line(own_log, 2).find(" decoupled learning rate: 1.515000E-02 |"), std::string::npos)
      << iteration_line(own_log, 2);
  EXPECT_NE(own.lm_loss[1], plain.lm_loss[1]) << "the embeddings' rate changes the run";
}

// Megatron's training_log gets the learning rate through a float32 tensor (its model-parallel
// max): the line prints the float32 value's digits, which differ from the double's now and then.
TEST(Trainer, LearningRateIsPrintedAsMegatronsFloat32) {
  auto a = tiny_args(11, 1);
  a[std::find(a.begin(), a.end(), "--lr") - a.begin() + 1] = "1e-3";  // (iterations 3 and 4 then tell)
  a[std::find(a.begin(), a.end(), "--min-lr") - a.begin() + 1] = "1e-4";
  a.insert(a.end(), {"--lr-decay-style", "cosine", "--lr-warmup-iters", "1"});
  const auto r = config::resolve_mlm(a, 1);
  std::string log;
  run(r, &log);
  const optim::ParamSchedule schedule = train::param_schedule(r.cfg);
  const int64_t gbs = *r.cfg.train.global_batch_size;
  int double_differs = 0;
  for (int it = 1; it <= 11; ++it) {
    const double lr = optim::lr_at(schedule, it * gbs);
    char as_float[32], as_double[32];
    std::snprintf(as_float, sizeof as_float, "learning rate: %.6E |", static_cast<double>(static_cast<float>(lr)));
    std::snprintf(as_double, sizeof as_double, "learning rate: %.6E |", lr);
    EXPECT_NE(iteration_line(log, it).find(as_float), std::string::npos) << iteration_line(log, it);
    double_differs += std::string(as_float) != as_double;
  }
  EXPECT_GT(double_differs, 0) << "no iteration tells float32 from double: the test shows nothing";
}

// The same resolved config from either front end gives identical loss lines.
TEST(Trainer, FrontEndParity) {
  auto args = tiny_args(5, 1);
  auto mlm = config::resolve_mlm(args, 1);
  auto bridge = bridge_twin(args);
  bridge.front_end = config::FrontEnd::MegatronLM;  // same log flavour, to compare the text too
  std::string la, lb;
  auto a = run(mlm, &la), b = run(bridge, &lb);
  EXPECT_EQ(a.lm_loss, b.lm_loss);
  EXPECT_EQ(a.grad_norm, b.grad_norm);
  auto strip_times = [](std::string s) {  // and the other measurements
    std::string out;
    for (size_t p = 0; p < s.size();) {
      size_t e = s.find('\n', p);
      std::string line = s.substr(p, e - p);
      if (auto at = line.find("] iteration"); at != std::string::npos) line = line.substr(at);
      if (auto at = line.find("elapsed time"); at != std::string::npos) line.erase(at, line.find('|', at) - at);
      if (auto at = line.find("] datetime: "); at != std::string::npos) line.erase(at + 11);
      if (auto at = line.find("-setup ..."); at != std::string::npos) line.erase(at);  // the setup timers
      if (line.find("host memory peak") == std::string::npos) out += line + "\n";  // a measurement too
      if (e == std::string::npos) break;
      p = e + 1;
    }
    return out;
  };
  EXPECT_EQ(strip_times(la), strip_times(lb));
}

TEST(Trainer, LogLinesFollowMegatronsIntervalsAndLearningRates) {
  // 10 iterations, log every 4: lines at 1 (always), 4 and 8; linear decay over 10*4 samples.
  auto args = tiny_args(10, 4);
  auto r = config::resolve_mlm(args, 1);
  std::string log;
  auto s = run(r, &log);
  EXPECT_NE(log.find("iteration        1/      10 |"), std::string::npos);
  EXPECT_NE(log.find("iteration        4/      10 |"), std::string::npos);
  EXPECT_NE(log.find("iteration        8/      10 |"), std::string::npos);
  EXPECT_EQ(log.find("iteration        2/      10 |"), std::string::npos);
  // Iteration 4 prints the post-step LR: lr(n = 4*4) = 3e-4 + (1 - 16/40) * (3e-3 - 3e-4) = 1.92e-3.
  auto line4 = log.substr(log.find("iteration        4/"));
  EXPECT_NE(line4.find("learning rate: 1.920000E-03"), std::string::npos) << line4.substr(0, 300);
  // The loss printed at 8 is the mean of iterations 5..8.
  double mean = (s.lm_loss[4] + s.lm_loss[5] + s.lm_loss[6] + s.lm_loss[7]) / 4;
  char want[64];
  std::snprintf(want, sizeof want, "lm loss: %.6E", mean);
  auto line8 = log.substr(log.find("iteration        8/"));
  EXPECT_NE(line8.substr(0, line8.find('\n')).find(want), std::string::npos) << line8.substr(0, 300) << " want " << want;
}

TEST(Trainer, NonFiniteIterationsAreCountedSkippedAndStopTheRunWhenRepeated) {
  // A learning rate of 1e30 blows the weights up after the first update: every later loss is
  // non-finite, so those iterations are skipped (counted in the log), and 10 in a row stop the run.
  auto args = tiny_args(30, 1);
  args.push_back("--no-check-for-nan-in-loss-and-grad");
  for (size_t k = 0; k + 1 < args.size(); ++k)
    if (args[k] == "--lr") args[k + 1] = "1e30";
  for (size_t k = 0; k + 1 < args.size(); ++k)
    if (args[k] == "--min-lr") args[k + 1] = "1e29";
  auto r = config::resolve_mlm(args, 1);
  std::string log;
  try {
    run(r, &log);
    FAIL() << "expected the run to stop";
  } catch (const laoyao::Error& e) {
    EXPECT_NE(std::string(e.what()).find("10 consecutive iterations"), std::string::npos) << e.what();
  }
  EXPECT_NE(log.find("number of nan iterations:   1 |"), std::string::npos) << log.substr(0, 3000);
  EXPECT_NE(log.find("number of skipped iterations:   1 |"), std::string::npos);
}

TEST(Trainer, NonFiniteLossIsFatalByDefaultAsInMegatron) {
  auto args = tiny_args(30, 1);
  for (size_t k = 0; k + 1 < args.size(); ++k) {
    if (args[k] == "--lr") args[k + 1] = "1e30";
    if (args[k] == "--min-lr") args[k + 1] = "1e29";
  }
  try {
    run(config::resolve_mlm(args, 1));
    FAIL() << "expected the run to stop";
  } catch (const laoyao::Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("NaN or Inf in the loss or the gradients at iteration 2"), std::string::npos) << m;
    EXPECT_NE(m.find("--no-check-for-nan-in-loss-and-grad"), std::string::npos) << m;
  }
}

// Megatron-LM prints iteration 1 without resetting its interval sums, so with --log-interval 1 the
// iteration-2 line shows the mean of iterations 1 and 2 (visible in the reference run's curve:
// 10.42071, 10.35622, 10.15883). Megatron-Bridge prints no first-iteration line.
TEST(Trainer, FirstIterationLineDoesNotResetMegatronLmsInterval) {
  auto r = config::resolve_mlm(tiny_args(3, 1), 1);
  std::string log;
  auto s = run(r, &log);
  char want[64];
  std::snprintf(want, sizeof want, "lm loss: %.6E", (s.lm_loss[0] + s.lm_loss[1]) / 2);
  auto line2 = log.substr(log.find("iteration        2/"));
  EXPECT_NE(line2.substr(0, line2.find('\n')).find(want), std::string::npos) << line2.substr(0, 400);
  std::snprintf(want, sizeof want, "lm loss: %.6E", s.lm_loss[2]);
  auto line3 = log.substr(log.find("iteration        3/"));
  EXPECT_NE(line3.substr(0, line3.find('\n')).find(want), std::string::npos);
  r.front_end = config::FrontEnd::Bridge;
  auto args = tiny_args(4, 2);
  auto rb = config::resolve_mlm(args, 1);
  rb.front_end = config::FrontEnd::Bridge;
  std::string blog;
  run(rb, &blog);
  EXPECT_EQ(blog.find("iteration        1/"), std::string::npos) << blog;
  EXPECT_NE(blog.find("iteration        2/"), std::string::npos);
}

// A Mixture-of-Experts model (every layer MoE: 4 experts, top-2, aux loss) trains on the CPU: the
// loss falls and each log line carries Megatron's load_balancing_loss after the lm loss (the aux
// loss / its coefficient, about 1 for a balanced router).
TEST(Trainer, MoeModelTrainsAndLogsTheLoadBalancingLoss) {
  auto a = tiny_args(8, 1);
  a.insert(a.end(), {"--num-experts", "4", "--moe-router-topk", "2", "--moe-aux-loss-coeff", "0.01",
                     "--moe-z-loss-coeff", "0.001", "--disable-bias-linear"});
  std::string log;
  auto s = run(config::resolve_mlm(a, 1), &log);
  ASSERT_EQ(s.lm_loss.size(), 8u);
  EXPECT_LT(s.lm_loss.back(), s.lm_loss.front());
  const std::string first = iteration_line(log, 3);
  const auto at = first.find("| load_balancing_loss: ");
  ASSERT_NE(at, std::string::npos) << first;
  EXPECT_LT(first.find("lm loss:"), at);
  const double lb = std::stod(first.substr(at + 23));
  EXPECT_GT(lb, 0.5);
  EXPECT_LT(lb, 4.0);
  EXPECT_NE(first.find("| z_loss: "), std::string::npos) << first;
  EXPECT_NE(log.find("laoyao: Mixture of Experts: "), std::string::npos) << "the active-parameter count";
  EXPECT_NE(log.find(" active per token (top-2 of 4 routed experts"), std::string::npos);
}

// DeepSeek-style routing on the CPU backend: a sigmoid router with group-limited top-k (2 groups
// of 2 experts, the best group's 2) and aux-loss-free balancing trains, its loss falling.
TEST(Trainer, GroupLimitedSigmoidRoutingWithExpertBiasTrains) {
  auto a = tiny_args(8, 1);
  a.insert(a.end(), {"--num-experts", "4", "--moe-router-topk", "2", "--moe-router-num-groups", "2",
                     "--moe-router-group-topk", "1", "--moe-router-score-function", "sigmoid",
                     "--moe-router-enable-expert-bias", "--moe-router-load-balancing-type", "none",
                     "--disable-bias-linear"});
  auto s = run(config::resolve_mlm(a, 1));
  ASSERT_EQ(s.lm_loss.size(), 8u);
  EXPECT_LT(s.lm_loss.back(), s.lm_loss.front());
}

// global_aux_loss (the tokens per expert over the step's micro-batches and data-parallel ranks):
// trains and logs global_load_balancing_loss, about 1 for a near-balanced router.
TEST(Trainer, GlobalAuxLossTrainsAndIsLogged) {
  auto a = tiny_args(8, 1);
  a.insert(a.end(), {"--num-experts", "4", "--moe-router-topk", "2", "--moe-router-load-balancing-type",
                     "global_aux_loss", "--moe-aux-loss-coeff", "0.01", "--disable-bias-linear"});
  std::string log;
  auto s = run(config::resolve_mlm(a, 1), &log);
  ASSERT_EQ(s.lm_loss.size(), 8u);
  EXPECT_LT(s.lm_loss.back(), s.lm_loss.front());
  const std::string last = iteration_line(log, 8);
  const auto at = last.find("| global_load_balancing_loss: ");
  ASSERT_NE(at, std::string::npos) << last;
  const double lb = std::stod(last.substr(at + 30));
  EXPECT_GT(lb, 0.5) << last;
  EXPECT_LT(lb, 4.0) << last;
  EXPECT_EQ(last.find("| load_balancing_loss: "), std::string::npos) << last;
}

// Lists of load-balancing types and coefficients (Megatron's nargs='+', paired by position): both
// losses train the router and are logged.
TEST(Trainer, ListedLoadBalancingTypesAreBothApplied) {
  auto a = tiny_args(4, 1);
  a.insert(a.end(), {"--num-experts", "4", "--moe-router-topk", "2", "--moe-router-load-balancing-type", "aux_loss",
                     "seq_aux_loss", "--moe-aux-loss-coeff", "0.01", "0.001", "--disable-bias-linear"});
  std::string log;
  auto s = run(config::resolve_mlm(a, 1), &log);
  ASSERT_EQ(s.lm_loss.size(), 4u);
  const std::string last = iteration_line(log, 4);
  EXPECT_NE(last.find("| load_balancing_loss: "), std::string::npos) << last;
  EXPECT_NE(last.find("| seq_load_balancing_loss: "), std::string::npos) << last;
  // The same router with the aux loss alone: the seq_aux loss changed the training.
  auto one = tiny_args(4, 1);
  one.insert(one.end(), {"--num-experts", "4", "--moe-router-topk", "2", "--moe-aux-loss-coeff", "0.01",
                         "--disable-bias-linear"});
  auto alone = run(config::resolve_mlm(one, 1));
  EXPECT_NE(alone.lm_loss.back(), s.lm_loss.back());
}

// Megatron's --moe-router-force-load-balancing (benchmarks): random router logits, so the aux loss
// over its coefficient sits near a balanced router's 1; the model still trains.
TEST(Trainer, ForceLoadBalancingTrainsBalanced) {
  auto a = tiny_args(8, 1);
  a.insert(a.end(), {"--num-experts", "4", "--moe-router-topk", "2", "--moe-aux-loss-coeff", "0.01",
                     "--moe-router-force-load-balancing", "--disable-bias-linear"});
  std::string log;
  auto s = run(config::resolve_mlm(a, 1), &log);
  ASSERT_EQ(s.lm_loss.size(), 8u);
  EXPECT_LT(s.lm_loss.back(), s.lm_loss.front());
  const auto at = log.rfind("| load_balancing_loss: ");
  ASSERT_NE(at, std::string::npos) << log;
  const double lb = std::stod(log.substr(at + 23));
  EXPECT_GT(lb, 0.9);
  EXPECT_LT(lb, 1.25);
}

// Token dropping (--moe-expert-capacity-factor, both drop policies, padding accepted): trains.
TEST(Trainer, CapacityFactorDropsTokensAndTrains) {
  for (const char* policy : {"probs", "position"}) {
    auto a = tiny_args(6, 1);
    a.insert(a.end(), {"--num-experts", "4", "--moe-router-topk", "2", "--moe-aux-loss-coeff", "0.01",
                       "--moe-expert-capacity-factor", "0.5", "--moe-token-drop-policy", policy,
                       "--moe-pad-expert-input-to-capacity", "--disable-bias-linear"});
    auto s = run(config::resolve_mlm(a, 1));
    ASSERT_EQ(s.lm_loss.size(), 6u) << policy;
    EXPECT_LT(s.lm_loss.back(), s.lm_loss.front()) << policy;
  }
}

// MoE settings laoyao's layers do not support yet are refused by name.
TEST(Trainer, UnsupportedMoeSettingsAreRefusedByName) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> refused = {
      {{"--moe-pad-expert-input-to-capacity"}, "needs model.moe_expert_capacity_factor"},
      {{"--moe-router-load-balancing-type", "sinkhorn"}, "'sinkhorn'"},
      {{"--moe-router-topk", "5"}, "moe_router_topk"},
      {{"--moe-layer-freq", "[1,0,1]"}, "lists 3 layers"},
      {{"--moe-router-num-groups", "2"}, "needs both --moe-router-num-groups and --moe-router-group-topk"},
      {{"--moe-router-num-groups", "3", "--moe-router-group-topk", "1"}, "model.moe_router_num_groups (3) must divide"},
      {{"--moe-router-enable-expert-bias"}, "needs --moe-router-score-function sigmoid"},
      {{"--moe-router-load-balancing-type", "aux_loss", "seq_aux_loss"}, "give one coefficient per type"},
      {{"--moe-router-load-balancing-type", "aux_loss", "aux_loss", "--moe-aux-loss-coeff", "0.1", "0.2"},
       "lists 'aux_loss' twice"},
  };
  for (const auto& [extra, want] : refused) {
    auto a = tiny_args(2, 1);
    a.insert(a.end(), {"--num-experts", "4", "--disable-bias-linear"});
    a.insert(a.end(), extra.begin(), extra.end());
    try {
      run(config::resolve_mlm(a, 1));
      ADD_FAILURE() << "accepted: " << extra[0];
    } catch (const laoyao::UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  }
  auto biased = tiny_args(2, 1);
  biased.insert(biased.end(), {"--num-experts", "4"});
  EXPECT_THROW(run(config::resolve_mlm(biased, 1)), laoyao::UsageError) << "MoE experts with biases";
}

// --train-samples (Megatron-LM's sample-based training): a multiple of the global batch trains as
// the same --train-iters does, bit for bit; 42 samples at 4 a step train 10 iterations whose LR
// decays over all 42 samples (update_train_iters drops the partial batch, the schedule keeps it).
TEST(Trainer, SampleBasedTrainingRunsTheWholeBatchesInIt) {
  auto samples = [](int n) {
    auto a = tiny_args(10, 4);
    for (size_t i = 0; i + 1 < a.size(); ++i)
      if (a[i] == "--train-iters") a[i] = "--train-samples", a[i + 1] = std::to_string(n);
    return a;
  };
  std::string by_iters, by_samples, partial;
  const auto a = run(config::resolve_mlm(tiny_args(10, 4), 1), &by_iters);
  const auto b = run(config::resolve_mlm(samples(40), 1), &by_samples);
  EXPECT_EQ(b.iterations, 10);
  EXPECT_EQ(a.lm_loss, b.lm_loss);
  auto past_the_time = [](const std::string& line) { return line.substr(line.find("learning rate")); };
  EXPECT_EQ(past_the_time(iteration_line(by_iters, 8)), past_the_time(iteration_line(by_samples, 8)));
  const auto c = run(config::resolve_mlm(samples(42), 1), &partial);
  EXPECT_EQ(c.iterations, 10);
  EXPECT_NE(partial.find("iteration        8/      10 |"), std::string::npos) << "10 iterations to train";
  // Iteration 4 prints lr(n = 16) = 3e-4 + (1 - 16/42) * (3e-3 - 3e-4) = 1.971429e-3.
  EXPECT_NE(iteration_line(partial, 4).find("learning rate: 1.971429E-03"), std::string::npos)
      << iteration_line(partial, 4);
}

// --rampup-batch-size 2 2 24 with a global batch of 8 and 60 samples (data/batch_rampup.hpp's
// test works the schedule out): iterations of 2, 2, 2, 2, 4, 4, 6, 6 samples, then 4 of 8; each
// logs its batch and the LR after its samples. Until the batch grows, the run is the one with a
// global batch of 2 (the same samples, micro-batches and schedule), bit for bit.
TEST(Trainer, BatchRampupGrowsTheGlobalBatchWithTheConsumedSamples) {
  auto args = [](std::vector<std::string> extra) {
    auto a = tiny_args(10, 1);
    for (size_t i = 0; i + 1 < a.size(); ++i)
      if (a[i] == "--train-iters") a[i] = "--train-samples", a[i + 1] = "60";
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  std::string log;
  const auto s = run(config::resolve_mlm(args({"--global-batch-size", "8", "--rampup-batch-size", "2", "2", "24"}), 1),
                     &log);
  EXPECT_EQ(s.iterations, 12);
  const int batch[] = {2, 2, 2, 2, 4, 4, 6, 6, 8, 8, 8, 8};
  int64_t consumed = 0;
  for (int it = 1; it <= 12; ++it) {
    consumed += batch[it - 1];
    const std::string line = iteration_line(log, it);
    char want[96];
    std::snprintf(want, sizeof want, "consumed samples: %12lld", static_cast<long long>(consumed));
    EXPECT_NE(line.find(want), std::string::npos) << line;
    std::snprintf(want, sizeof want, "global batch size: %5d", batch[it - 1]);
    EXPECT_NE(line.find(want), std::string::npos) << line;
  }
  // Iteration 5 prints lr(n = 12) = 3e-4 + (1 - 12/60) * (3e-3 - 3e-4) = 2.46e-3.
  EXPECT_NE(iteration_line(log, 5).find("learning rate: 2.460000E-03"), std::string::npos) << iteration_line(log, 5);
  const auto fixed = run(config::resolve_mlm(args({"--global-batch-size", "2"}), 1));
  ASSERT_GE(fixed.lm_loss.size(), 5u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(s.lm_loss[i], fixed.lm_loss[i]) << "iteration " << i + 1;
  EXPECT_NE(s.lm_loss[4], fixed.lm_loss[4]) << "iteration 5 trains on 4 samples";
}

TEST(Trainer, ExitIntervalStopsWithoutTheFinalEvaluations) {
  auto args = tiny_args(10, 1);
  args.insert(args.end(), {"--exit-interval", "3"});
  auto r = config::resolve_mlm(args, 1);
  std::string log;
  auto s = run(r, &log);
  EXPECT_EQ(s.iterations, 3);
  EXPECT_EQ(s.exit_reason, "interval");
  EXPECT_NE(log.find("[exiting program at iteration 3] datetime: 20"), std::string::npos) << "print_datetime's form";
  EXPECT_EQ(log.find("on test set"), std::string::npos);
}

namespace {

std::string temp_dir(const std::string& name) {
  auto d = std::filesystem::temp_directory_path() / ("laoyao_trainer_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  return d.string();
}

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& extra) {
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

}  // namespace

// --tensorboard-dir: Megatron's scalars in an event file, every --tensorboard-log-interval
// iterations (the iteration's values, each also against the consumed samples), the MoE losses,
// the evaluations with their perplexity, and iteration-time / throughput at the log intervals.
TEST(Trainer, TensorBoardScalarsFollowMegatronsTags) {
  const std::string dir = temp_dir("tensorboard");
  auto a = with(tiny_args(8, 1), {"--num-experts", "4", "--moe-router-topk", "2", "--moe-aux-loss-coeff", "0.01",
                                  "--disable-bias-linear", "--tensorboard-dir", dir, "--tensorboard-log-interval", "2",
                                  "--log-validation-ppl-to-tensorboard", "--log-timers-to-tensorboard",
                                  "--log-throughput", "--eval-interval", "4"});
  auto s = run(config::resolve_mlm(a, 1));
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) files.push_back(e.path().string());
  ASSERT_EQ(files.size(), 1u);
  const auto events = test::read_events(files[0]);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  auto steps_of = [&](const std::string& tag) {
    std::vector<std::pair<int64_t, float>> out;
    for (const auto& e : events)
      if (e.tag == tag) out.push_back({e.step, e.value});
    return out;
  };
  const auto loss = steps_of("lm loss");
  ASSERT_EQ(loss.size(), 4u) << "every second iteration";
  for (size_t i = 0; i < loss.size(); ++i) {
    const int64_t it = 2 * static_cast<int64_t>(i + 1);
    EXPECT_EQ(loss[i].first, it);
    EXPECT_EQ(loss[i].second, static_cast<float>(s.lm_loss[static_cast<size_t>(it - 1)])) << "iteration " << it;
  }
  const auto by_samples = steps_of("lm loss vs samples");
  ASSERT_EQ(by_samples.size(), 4u);
  EXPECT_EQ(by_samples[1].first, 4 * 4) << "global batch 4, iteration 4";
  for (const char* tag : {"learning-rate", "batch-size", "loss-scale", "grad-norm", "load_balancing_loss"})
    EXPECT_EQ(steps_of(tag).size(), 4u) << tag;
  EXPECT_EQ(steps_of("batch-size")[0].second, 4.0f);
  EXPECT_TRUE(steps_of("world-size").empty()) << "only with --log-world-size-to-tensorboard";
  const auto valid = steps_of("lm loss validation");
  ASSERT_EQ(valid.size(), 4u) << "iterations 4 and 8, then the validation and test sets' at 8";
  EXPECT_EQ(valid[0].first, 4);
  EXPECT_EQ(valid[1].second, static_cast<float>(s.valid_loss[1]));
  EXPECT_EQ(valid[2].first, 8);
  EXPECT_EQ(valid[2].second, static_cast<float>(s.valid_loss[2])) << "the validation set's, at the end";
  EXPECT_EQ(valid[3].first, 8);
  EXPECT_EQ(valid[3].second, static_cast<float>(s.test_loss)) << "the test set's, under the validation tag";
  EXPECT_EQ(steps_of("lm loss validation vs samples")[0].first, 16);
  EXPECT_NEAR(steps_of("lm loss validation ppl")[0].second, std::exp(s.valid_loss[0]), 1e-3 * std::exp(s.valid_loss[0]));
  const auto times = steps_of("iteration-time");
  EXPECT_EQ(times.size(), 7u) << "every log interval but the first iteration";
  EXPECT_EQ(steps_of("throughput").size(), 8u) << "every log interval, the first iteration included";
  std::filesystem::remove_all(dir);
}

// --timing-log-level: Megatron's timer block after each log line (the names laoyao times, in
// Megatron-LM's order; batch-generator only at level 2), none at level 0; with
// --log-timers-to-tensorboard each as "<name>-time" at the log lines.
TEST(Trainer, TimingLogLevelPrintsMegatronsTimerBlock) {
  const std::string dir = temp_dir("timers");
  std::string log1, log2, log0;
  run(config::resolve_mlm(with(tiny_args(4, 2), {"--timing-log-level", "1", "--tensorboard-dir", dir,
                                                 "--log-timers-to-tensorboard"}),
                          1),
      &log1);
  const auto r2 = config::resolve_mlm(with(tiny_args(4, 2), {"--timing-log-level", "2", "--timing-log-option", "max"}), 1);
  run(r2, &log2);
  run(config::resolve_mlm(tiny_args(4, 2), 1), &log0);
  // Level 0: the setup block alone (Megatron logs its setup timers at any level), none at the steps.
  ASSERT_NE(log0.find("done with setup ...\n(min, max) time across ranks (ms):\n    model-and-optimizer-setup "),
            std::string::npos) << log0;
  EXPECT_EQ(log0.find("time across ranks", log0.find("training ...")), std::string::npos) << "level 0: no step block";
  auto block_after = [](const std::string& log, const std::string& line) {
    const size_t at = log.find(line);
    if (at == std::string::npos) return std::string();
    const size_t start = log.find('\n', at) + 1;
    size_t end = start;
    while (end < log.size() && (log.compare(end, 4, "    ") == 0 || log.compare(end, 5, "(min,") == 0 ||
                                log.compare(end, 4, "max ") == 0))
      end = log.find('\n', end) + 1;
    return log.substr(start, end - start);
  };
  for (const char* line : {"iteration        1/", "iteration        2/", "iteration        4/"}) {
    const std::string b = block_after(log1, line);
    ASSERT_EQ(b.rfind("(min, max) time across ranks (ms):\n", 0), 0u) << line << "\n" << log1;
    // The regions with work in them, in Megatron-LM's order; the empty ones (with one process and
    // one pipeline stage: all-grads-sync, embedding-grads-all-reduce, optimizer-copy-to-main-grad)
    // in that order when their time is above 0, as Megatron filters.
    size_t at = 0;
    for (const char* name : {"forward-backward ", "embedding-grads-all-reduce ", "all-grads-sync ",
                             "optimizer-copy-to-main-grad ", "optimizer-inner-step ", "optimizer "}) {
      const size_t next = b.find(std::string("\n    ") + name, at);
      const std::string n = name;
      if (n == "forward-backward " || n == "optimizer-inner-step " || n == "optimizer ") {
        EXPECT_NE(next, std::string::npos) << name << " in order after " << at << ":\n" << b;
      }
      if (next != std::string::npos) at = next + 1;
    }
    EXPECT_EQ(b.find("batch-generator"), std::string::npos) << "a level-2 timer";
    EXPECT_EQ(b.find("layernorm-grads-all-reduce"), std::string::npos) << "Megatron's log leaves it out";
  }
  const std::string b2 = block_after(log2, "iteration        2/");
  EXPECT_EQ(b2.rfind("max time across ranks (ms):\n", 0), 0u) << log2;
  EXPECT_NE(b2.find("\n    batch-generator ................................: "), std::string::npos) << b2;
  bool said = false;  // what is timed, said once when the run starts
  for (const auto& note : r2.validated.notes) said = said || note.rfind("laoyao: timers at level 2: ", 0) == 0;
  EXPECT_TRUE(said);
  std::vector<int64_t> steps;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0)
      for (const auto& ev : test::read_events(e.path().string()))
        if (ev.tag == "forward-backward-time") {
          steps.push_back(ev.step);
          EXPECT_GT(ev.value, 0.0f);
          EXPECT_LT(ev.value, 60.0f) << "seconds per iteration";
        }
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 4})) << "at each log line, the first included";
  std::filesystem::remove_all(dir);
}

// Bridge's timer scalars: "iteration-time" at every log line, iteration 1 included at
// logger.log_interval 1, and no "throughput" tag (Megatron-LM's).
TEST(Trainer, BridgeTensorBoardTimersFollowBridge) {
  const std::string dir = temp_dir("tensorboard_bridge");
  const auto bridge =
      bridge_twin(with(tiny_args(3, 1), {"--tensorboard-dir", dir, "--log-timers-to-tensorboard", "--log-throughput"}));
  ASSERT_EQ(bridge.front_end, config::FrontEnd::Bridge);
  run(bridge);
  std::vector<int64_t> times;
  bool throughput = false;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0)
      for (const auto& ev : test::read_events(e.path().string())) {
        if (ev.tag == "iteration-time") times.push_back(ev.step);
        throughput = throughput || ev.tag == "throughput";
      }
  EXPECT_EQ(times, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_FALSE(throughput);
  std::filesystem::remove_all(dir);
}

// Bridge's timers: written to TensorBoard at every TensorBoard step (here every iteration) and
// restarted there (Bridge's W&B write resets them, with or without W&B), so that the block of the
// log line, which comes after, has nothing to print; without the TensorBoard timers it prints at
// the log lines (no first-iteration line).
TEST(Trainer, BridgeTimersFollowBridgesSchedule) {
  const std::string dir = temp_dir("timers_bridge");
  auto blocks_in = [](bool tb_timers, const std::string& tb_dir) {
    auto args = with(tiny_args(4, 2), {"--tensorboard-dir", tb_dir, "--timing-log-level", "1"});
    if (tb_timers) args.push_back("--log-timers-to-tensorboard");
    const auto bridge = bridge_twin(args);
    EXPECT_EQ(bridge.front_end, config::FrontEnd::Bridge);
    EXPECT_EQ(bridge.cfg.logger.timing_log_level, 1);
    EXPECT_EQ(bridge.cfg.logger.log_timers_to_tensorboard, tb_timers);
    std::string log;
    run(bridge, &log);
    size_t blocks = 0;  // the steps' (after the setup's block, which every run prints)
    const size_t steps_from = log.find("train/valid/test-data-iterators-setup");
    EXPECT_NE(steps_from, std::string::npos) << log;
    EXPECT_EQ(log.find("training ...\n"), std::string::npos) << "Megatron-LM's line; Bridge's train prints none";
    for (size_t at = log.find("(min, max) time across ranks (ms):", steps_from); at != std::string::npos;
         at = log.find("(min, max) time across ranks (ms):", at + 1))
      ++blocks;
    return blocks;
  };
  EXPECT_EQ(blocks_in(true, dir), 0u);
  std::vector<int64_t> steps;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0)
      for (const auto& ev : test::read_events(e.path().string()))
        if (ev.tag == "optimizer-time") steps.push_back(ev.step);
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3, 4}));
  std::filesystem::remove_all(dir);
  EXPECT_EQ(blocks_in(false, dir), 2u) << "iterations 2 and 4";
  std::filesystem::remove_all(dir);
}

// logger.log_throughput_to_tensorboard (Bridge): the throughput/* scalars once the window of
// iterations is full (window 2: from iteration 2 on), with the configured batch sizes.
TEST(Trainer, BridgeThroughputScalarsOnceTheWindowIsFull) {
  const std::string dir = temp_dir("tensorboard_throughput");
  run(bridge_twin(with(tiny_args(4, 1), {"--tensorboard-dir", dir}),
                  {"logger.log_throughput_to_tensorboard=true", "logger.throughput_window_size=2"}));
  std::map<std::string, std::vector<std::pair<int64_t, float>>> tags;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0)
      for (const auto& ev : test::read_events(e.path().string()))
        if (ev.tag.rfind("throughput/", 0) == 0) tags[ev.tag].push_back({ev.step, ev.value});
  EXPECT_EQ(tags.size(), 8u);
  for (const auto& [tag, points] : tags) {
    ASSERT_EQ(points.size(), 3u) << tag;
    EXPECT_EQ(points[0].first, 2) << tag;
    EXPECT_GT(points[0].second, 0.0f) << tag;
  }
  EXPECT_EQ(tags["throughput/global_batch_size"][0].second, 4.0f);
  std::filesystem::remove_all(dir);
}

// compare-logs reads a --tensorboard-dir as a log: a run's text log (every iteration logged) and
// its event files agree, iteration by iteration and at the evaluations.
TEST(Trainer, TensorBoardEventsCompareWithTheTextLog) {
  const std::string dir = temp_dir("tensorboard_compare");
  std::string log;
  run(config::resolve_mlm(with(tiny_args(6, 1), {"--tensorboard-dir", dir, "--eval-interval", "3"}), 1), &log);
  const train::ParsedLog text = train::parse_training_log(log), events = train::parse_tensorboard_events(dir);
  ASSERT_EQ(events.iterations.size(), 6u);
  ASSERT_EQ(events.validations.size(), 4u) << "at 3 and 6, then the validation and test sets' at 6";
  const train::LogComparison cmp = train::compare_logs(text, events, train::CompareTolerances{});
  EXPECT_TRUE(cmp.within_tolerance());
  EXPECT_EQ(cmp.loss_rows_compared, 6u);
  EXPECT_LT(cmp.max_loss_rel, 1e-6) << "float32 scalars against 7 printed digits (iteration 2: the mean of 1 and 2)";
  int64_t both = 0;  // at 3 and 6 during training, then the validation and test sets' at 6
  for (const auto& v : cmp.validation) both += v.loss_a && v.loss_b;
  EXPECT_EQ(both, 4);
  EXPECT_EQ(cmp.validation.size(), 4u) << "each evaluation paired, none in one log only";
  std::filesystem::remove_all(dir);
}

// Stop at iteration 4 with a checkpoint, resume to 8: iterations 5..8 are bit-identical to an
// uninterrupted run (weights, Adam state, schedule position, data position, dropout streams).
TEST(Trainer, ResumeContinuesBitIdentically) {
  const std::string dir = temp_dir("resume");
  auto base = tiny_args(8, 1);
  for (size_t k = 0; k + 1 < base.size(); ++k)  // dropout on: its streams must resume too
    if (base[k] == "--hidden-dropout" || base[k] == "--attention-dropout") base[k + 1] = "0.1";
  auto full = run(config::resolve_mlm(base, 1));
  std::string log1, log2;
  auto first = run(config::resolve_mlm(with(base, {"--save", dir, "--save-interval", "4", "--exit-interval", "4"}), 1),
                   &log1);
  EXPECT_NE(log1.find("successfully saved checkpoint from iteration       4"), std::string::npos) << log1;
  auto second = run(config::resolve_mlm(with(base, {"--load", dir, "--save", dir, "--save-interval", "4"}), 1), &log2);
  EXPECT_NE(log2.find("successfully loaded checkpoint from"), std::string::npos) << log2;
  EXPECT_NE(log2.find("at iteration 4"), std::string::npos) << log2;
  ASSERT_EQ(first.lm_loss.size(), 4u);
  ASSERT_EQ(second.lm_loss.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(first.lm_loss[i], full.lm_loss[i]) << i;
    EXPECT_EQ(second.lm_loss[i], full.lm_loss[i + 4]) << i + 4;
    EXPECT_EQ(second.grad_norm[i], full.grad_norm[i + 4]) << i + 4;
  }
  EXPECT_EQ(second.valid_loss, full.valid_loss);
  EXPECT_EQ(second.test_loss, full.test_loss);
  // Megatron-LM (core 0.20) treats a resumed process's first iteration as a fresh run's first:
  // with --log-interval 1 its iteration-5 line does not reset the sums, so the iteration-6 line
  // shows the mean of iterations 5 and 6 (Megatron-LM issue #6237 reports exactly this).
  char want[64];
  std::snprintf(want, sizeof want, "lm loss: %.6E", second.lm_loss[0]);
  const std::string line5 = log2.substr(log2.find("iteration        5/"));
  EXPECT_NE(line5.substr(0, line5.find('\n')).find(want), std::string::npos) << line5.substr(0, 400);
  std::snprintf(want, sizeof want, "lm loss: %.6E", (second.lm_loss[0] + second.lm_loss[1]) / 2);
  const std::string line6 = log2.substr(log2.find("iteration        6/"));
  EXPECT_NE(line6.substr(0, line6.find('\n')).find(want), std::string::npos) << line6.substr(0, 400);
  // Megatron-Core's scheduler state on resume: each value the checkpoint's, said so.
  EXPECT_NE(log2.find(" > using checkpoint value 0.003 for learning rate\n"), std::string::npos) << log2;
  EXPECT_NE(log2.find(" > using checkpoint value linear for learning rate decay style\n"), std::string::npos);
  EXPECT_LT(log2.find(" > using checkpoint value"), log2.find("successfully loaded checkpoint from"));
  std::filesystem::remove_all(dir);
}

// Resuming with another schedule (here a longer run: another decay length) is Megatron-Core's
// assertion unless --override-opt_param-scheduler, when the config's values win, said so.
TEST(Trainer, ResumeWithAnotherScheduleNeedsTheOverride) {
  const std::string dir = temp_dir("resume_schedule");
  run(config::resolve_mlm(with(tiny_args(4, 1), {"--save", dir, "--save-interval", "4"}), 1));
  std::string log;
  try {
    run(config::resolve_mlm(with(tiny_args(8, 1), {"--load", dir}), 1), &log);
    ADD_FAILURE() << "resumed with another schedule\n" << log;
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("OptimizerParamScheduler: class input value 32 and checkpoint value 16 for "
                                         "total number of iterations do not match"),
              std::string::npos)
        << e.what();
  }
  log.clear();
  const auto resumed =
      run(config::resolve_mlm(with(tiny_args(8, 1), {"--load", dir, "--override-opt_param-scheduler"}), 1), &log);
  EXPECT_EQ(resumed.lm_loss.size(), 4u);
  EXPECT_NE(log.find(" > overriding total number of iterations value to 32\n"), std::string::npos) << log;
  std::filesystem::remove_all(dir);
}

// The "stale nemo_experiments" trap: loading a checkpoint of another model shape is refused, naming
// the differing fields; an empty --load directory starts from scratch with Megatron's warning.
// A run saved in the middle of a batch-size ramp resumes with the batch its consumed samples give
// (iteration 7 trains on 6 samples) and continues bit for bit. As Megatron-LM, a run with --save
// also saves before each iteration whose batch takes more micro-batches (after iterations 4, 6, 8).
TEST(Trainer, ResumeInsideABatchRampupContinuesBitIdentically) {
  const std::string dir = temp_dir("resume_ramp");
  auto base = tiny_args(10, 1);
  for (size_t k = 0; k + 1 < base.size(); ++k)
    if (base[k] == "--train-iters") base[k] = "--train-samples", base[k + 1] = "60";
  base = with(base, {"--global-batch-size", "8", "--rampup-batch-size", "2", "2", "24"});
  const auto full = run(config::resolve_mlm(base, 1));
  ASSERT_EQ(full.lm_loss.size(), 12u);
  std::string first_log;
  run(config::resolve_mlm(with(base, {"--save", dir, "--save-interval", "100", "--exit-interval", "6"}), 1),
      &first_log);
  for (const char* it : {"4", "6"})
    EXPECT_NE(first_log.find(std::string("successfully saved checkpoint from iteration       ") + it), std::string::npos)
        << it << "\n" << first_log;
  EXPECT_EQ(first_log.find("successfully saved checkpoint from iteration       5"), std::string::npos);
  std::string log;
  const auto second = run(config::resolve_mlm(with(base, {"--load", dir}), 1), &log);
  ASSERT_EQ(second.lm_loss.size(), 6u);
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(second.lm_loss[i], full.lm_loss[i + 6]) << "iteration " << i + 7;
  EXPECT_NE(iteration_line(log, 7).find("global batch size:     6"), std::string::npos) << iteration_line(log, 7);
  std::filesystem::remove_all(dir);
}

TEST(Trainer, StaleCheckpointIsRefusedAndEmptyLoadStartsFresh) {
  const std::string dir = temp_dir("stale");
  run(config::resolve_mlm(with(tiny_args(2, 1), {"--save", dir, "--save-interval", "2"}), 1));
  auto other = tiny_args(2, 1);
  for (size_t k = 0; k + 1 < other.size(); ++k)
    if (other[k] == "--hidden-size") other[k + 1] = "48";
  try {
    run(config::resolve_mlm(with(other, {"--load", dir}), 1));
    FAIL() << "expected a refusal";
  } catch (const laoyao::UsageError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("hidden_size"), std::string::npos) << m;
    EXPECT_NE(m.find("32"), std::string::npos) << m;
    EXPECT_NE(m.find("48"), std::string::npos) << m;
  }
  std::string log;
  const std::string empty = temp_dir("empty_load");
  std::filesystem::create_directories(empty);
  run(config::resolve_mlm(with(tiny_args(2, 1), {"--load", empty}), 1), &log);
  EXPECT_NE(log.find("will not load any checkpoints and will start from random"), std::string::npos) << log;
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(empty);
}

// --pretrained-checkpoint loads weights only and starts at iteration 0; --finetune likewise.
TEST(Trainer, PretrainedWeightsStartAtIterationZero) {
  const std::string dir = temp_dir("pretrained");
  auto a = run(config::resolve_mlm(with(tiny_args(3, 1), {"--save", dir, "--save-interval", "3"}), 1));
  std::string log;
  auto b = run(config::resolve_mlm(with(tiny_args(3, 1), {"--pretrained-checkpoint", dir}), 1), &log);
  EXPECT_NE(log.find("loaded pretrained weights from"), std::string::npos) << log;
  EXPECT_NE(log.find("iteration        1/       3"), std::string::npos);
  EXPECT_LT(b.lm_loss[0], a.lm_loss[0]) << "starts from the trained weights";
  auto f = run(config::resolve_mlm(with(tiny_args(3, 1), {"--load", dir, "--finetune"}), 1));
  EXPECT_EQ(f.lm_loss.size(), 3u) << "fine-tuning restarts the iteration count";
  EXPECT_EQ(f.lm_loss[0], b.lm_loss[0]) << "same weights, fresh optimizer";
  std::filesystem::remove_all(dir);
}

// --no-load-optim restarts Megatron's optimizer *and* LR scheduler; a zero --exit-interval is off.
TEST(Trainer, NoLoadOptimRestartsTheScheduleAndZeroExitIntervalIsOff) {
  const std::string dir = temp_dir("no_load_optim");
  auto base = tiny_args(4, 1);
  run(config::resolve_mlm(with(base, {"--save", dir, "--save-interval", "2", "--exit-interval", "2"}), 1));
  std::string log;
  auto s = run(config::resolve_mlm(with(base, {"--load", dir, "--no-load-optim", "--exit-interval", "0"}), 1), &log);
  EXPECT_EQ(s.lm_loss.size(), 2u) << "iterations 3 and 4 ran";
  // lr(n = 1 * 4 samples) of the linear decay from 3e-3 to 3e-4 over 16 samples: 2.325e-3.
  auto line3 = log.substr(log.find("iteration        3/"));
  EXPECT_NE(line3.substr(0, line3.find('\n')).find("learning rate: 2.325000E-03"), std::string::npos)
      << line3.substr(0, 400);
  std::filesystem::remove_all(dir);
}

TEST(Backend, LaoyaoDeviceChoosesOrRefusesByName) {
  laoyao::model::GptConfig m;
  m.num_layers = 1, m.hidden = 8, m.heads = 2, m.query_groups = 2, m.kv_channels = 4, m.ffn = 16, m.vocab = 8;
  m.max_positions = 8;
  using laoyao::RuntimeOptions;
  using Device = RuntimeOptions::Device;
  auto device = [](Device d) { return [d](RuntimeOptions& o) { o.device = d; }; };
  {
    const laoyao::ScopedRuntimeOptions cpu(device(Device::kCpu));
    EXPECT_FALSE(laoyao::train::choose_backend(m).cuda);
  }
  if (laoyao::cuda_device_count() == 0) {
    {
      const laoyao::ScopedRuntimeOptions cuda(device(Device::kCuda));
      try {
        laoyao::train::choose_backend(m);
        ADD_FAILURE() << "LAOYAO_DEVICE=cuda accepted without a GPU";
      } catch (const laoyao::UsageError& e) {
        EXPECT_NE(std::string(e.what()).find("LAOYAO_DEVICE=cuda"), std::string::npos) << e.what();
      }
    }
    const laoyao::ScopedRuntimeOptions automatic(device(Device::kAuto));
    EXPECT_FALSE(laoyao::train::choose_backend(m).cuda) << "no GPU: the CPU, silently";
  }
}
