// Parsing real Megatron-LM / Megatron-Bridge log text (lines quoted in /work/shared/reference)
// and our own formatted lines back into numbers.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

#include "core/error.hpp"
#include "train/log_parse.hpp"
#include "train/training_log.hpp"
#include "reference_log_lines.hpp"

using namespace laoyao::train;
using laoyao::train::test::kBridgeLine;
using laoyao::train::test::kMlmLine;

namespace {

const std::string kValidationLine =
    " validation loss at iteration 10 | lm loss value: 9.285186E+00 | lm loss PPL: 1.077718E+04 | ";

}  // namespace

TEST(LogParse, RealMegatronLmLine) {
  auto r = parse_training_line(kMlmLine);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->timestamp, "2026-11-30 05:34:22.661240");
  EXPECT_EQ(r->iteration, 1);
  EXPECT_EQ(r->train_iters, 30);
  EXPECT_EQ(r->consumed_samples, 32);
  EXPECT_FALSE(r->skipped_samples);
  EXPECT_DOUBLE_EQ(*r->elapsed_ms, 3054.0);
  EXPECT_DOUBLE_EQ(*r->throughput_tflops_per_gpu, 0.3);
  EXPECT_DOUBLE_EQ(*r->learning_rate, 2.91e-4);
  EXPECT_EQ(r->global_batch_size, 32);
  ASSERT_EQ(r->losses.size(), 1u);
  EXPECT_EQ(r->losses[0].name, "lm loss");
  EXPECT_DOUBLE_EQ(r->losses[0].value, 10.42071);
  EXPECT_DOUBLE_EQ(*r->loss("lm loss"), 10.42071);
  EXPECT_DOUBLE_EQ(*r->loss_scale, 1.0);
  EXPECT_DOUBLE_EQ(*r->grad_norm, 0.651);
  EXPECT_EQ(r->skipped_iterations, 0);
  EXPECT_EQ(r->nan_iterations, 0);
  EXPECT_FALSE(r->params_norm);
  EXPECT_TRUE(r->other_fields.empty());
}

TEST(LogParse, RealBridgeLineWithLauncherPrefixes) {
  for (std::string prefix : {"", "[default0]:", "0: ", "ain_fp8_mx/0 "}) {
    auto r = parse_training_line(prefix + kBridgeLine);
    ASSERT_TRUE(r) << prefix;
    EXPECT_EQ(r->timestamp, "2026-05-28 22:32:59");
    EXPECT_EQ(r->iteration, 43);
    EXPECT_EQ(r->train_iters, 6069);
    EXPECT_EQ(r->consumed_samples, 22016);
    EXPECT_DOUBLE_EQ(*r->elapsed_ms, 26714.9);
    EXPECT_FALSE(r->throughput_tflops_per_gpu);
    EXPECT_DOUBLE_EQ(*r->learning_rate, 8.6e-5);
    EXPECT_EQ(r->global_batch_size, 512);
    ASSERT_EQ(r->losses.size(), 4u);
    EXPECT_EQ(r->losses[0].name, "lm loss");
    EXPECT_DOUBLE_EQ(r->losses[0].value, 0.7866524);
    EXPECT_EQ(r->losses[1].name, "seq_load_balancing_loss");
    EXPECT_DOUBLE_EQ(r->losses[1].value, 1.228777);
    EXPECT_EQ(r->losses[2].name, "mtp_1 loss");
    EXPECT_EQ(r->losses[3].name, "mtp_2 loss");
    EXPECT_DOUBLE_EQ(r->losses[3].value, 1.170827);
    EXPECT_DOUBLE_EQ(*r->grad_norm, 1.517);
  }
}

TEST(LogParse, ValidationLines) {
  auto v = parse_validation_line(kValidationLine);
  ASSERT_TRUE(v);
  EXPECT_EQ(v->iteration, 10);
  EXPECT_EQ(v->set, EvalSet::kDuringTraining);
  EXPECT_FALSE(v->validation_set_index);
  ASSERT_EQ(v->losses.size(), 1u);
  EXPECT_EQ(v->losses[0].name, "lm loss");
  EXPECT_DOUBLE_EQ(*v->losses[0].value, 9.285186);
  EXPECT_DOUBLE_EQ(*v->losses[0].ppl, 10777.18);
  EXPECT_FALSE(parse_training_line(kValidationLine));

  auto end = parse_validation_line(
      "[default7]: validation loss at iteration 30 on validation set | lm loss value: 8.427104E+00 |"
      " lm loss PPL: 4.569248E+03 | ");
  ASSERT_TRUE(end);
  EXPECT_EQ(end->iteration, 30);
  EXPECT_EQ(end->set, EvalSet::kValidationSet);
  EXPECT_DOUBLE_EQ(*end->loss("lm loss"), 8.427104);
  auto test = parse_validation_line(
      " validation-2 loss at iteration 30 on test set | lm loss value: 8.407009E+00 |"
      " lm loss PPL: 4.478346E+03 | mtp_1 loss value: NAN | mtp_1 loss PPL: 4.851652E+08 | ");
  ASSERT_TRUE(test);
  EXPECT_EQ(test->set, EvalSet::kTestSet);
  EXPECT_EQ(test->validation_set_index, 2);
  ASSERT_EQ(test->losses.size(), 2u);
  EXPECT_TRUE(std::isnan(*test->losses[1].value));
  EXPECT_FALSE(parse_validation_line("Running validation at iteration 10..."));
  EXPECT_FALSE(parse_validation_line(" validation loss at iteration 10 on the moon | x value: 1 |"));
}

TEST(LogParse, BridgeRegexFloorIsAccepted) {
  // Shapes that Bridge's evaluate.py regexes accept (and cloudai's tests feed them).
  auto a = parse_training_line("iteration 10/10 | elapsed time per iteration (ms): 9125.0 |");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->iteration, 10);
  EXPECT_DOUBLE_EQ(*a->elapsed_ms, 9125.0);
  auto b = parse_training_line("iteration 1/2");
  ASSERT_TRUE(b);
  EXPECT_EQ(b->iteration, 1);
  EXPECT_EQ(b->train_iters, 2);
  auto c = parse_training_line(" iteration        7/     100 | lm loss: 1.0E+01 | grad norm: nan |");
  ASSERT_TRUE(c);
  EXPECT_TRUE(std::isnan(*c->grad_norm));
  EXPECT_DOUBLE_EQ(*c->loss("lm loss"), 10.0);
  auto d = parse_training_line(" iteration        8/     100 | lm loss: 9.5 | grad norm: inf |");
  ASSERT_TRUE(d);
  EXPECT_TRUE(std::isinf(*d->grad_norm));
  auto e = parse_training_line(
      "ain_fp8_mx/0  [2025-12-22 15:18:33] iteration       50/      50 | consumed samples:        25600 | "
      "elapsed time per iteration (ms): 9089.0 | learning rate: 3.000000E-05 | global batch size:   512 | "
      "lm loss: 8.114214E+00 | load_balancing_loss: 1.000000E+00 | loss scale: 1.0 | grad norm: 0.042 | "
      "number of skipped iterations:   0 | number of nan iterations:   0 |");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->timestamp, "2025-12-22 15:18:33");
  ASSERT_EQ(e->losses.size(), 2u);
  EXPECT_DOUBLE_EQ(*e->loss("load_balancing_loss"), 1.0);
  EXPECT_DOUBLE_EQ(*e->grad_norm, 0.042);
}

TEST(LogParse, OtherLinesAreNotTrainingLines) {
  EXPECT_FALSE(parse_training_line("[Rank 0] (after 10 iterations) memory (GB) | allocated: 1.2 |"));
  EXPECT_FALSE(parse_training_line(" saving checkpoint at iteration      10 to /tmp/ckpt in torch_dist format"));
  EXPECT_FALSE(parse_training_line(" number of skipped iterations:   0 |"));
  EXPECT_FALSE(parse_training_line("Evaluating iter 1/2"));
  EXPECT_FALSE(parse_training_line("subiteration 3/4"));
  EXPECT_FALSE(parse_training_line(""));
  // An iteration number past int64 is no iteration.
  EXPECT_FALSE(parse_training_line(" iteration 34444444444444444444/ 10 | consumed samples: 1 | lm loss: 1.0 |"));
  // A counter printed as a float past int64 (some forks print floats) is no count.
  const auto huge = parse_training_line(" iteration 3/ 10 | consumed samples: 1e300 | lm loss: 1.0 |");
  ASSERT_TRUE(huge);
  EXPECT_FALSE(huge->consumed_samples);
  EXPECT_EQ(parse_training_line(" iteration 3/ 10 | consumed samples: 96.0 | lm loss: 1.0 |")->consumed_samples, 96);
}

TEST(LogParse, FieldsOfNewerMegatronAndUnknownFieldsAreKept) {
  auto r = parse_training_line(
      " [2026-01-01 00:00:00.000001] iteration        5/      10 | consumed samples:          160 |"
      " skipped samples:           12 | elapsed time per iteration (ms): 104.0 |"
      " memory(GiB): 12.5 | elapsed time: 0:01:02 | remaining time: 0:00:50 |"
      " learning rate: 1.000000E-04 | decoupled learning rate: 2.000000E-05 |"
      " global batch size:    32 | lm loss: 9.000000E+00 | z_loss: 1.000000E-03 | loss scale: 4096.0 |"
      " grad norm: 1.234 | num zeros: 1234.0 | params norm: 271.828 | max attention logit: 31.416 |"
      " number of skipped iterations:   2 | number of nan iterations:   1 |");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->skipped_samples, 12);
  EXPECT_DOUBLE_EQ(*r->decoupled_learning_rate, 2e-5);
  ASSERT_EQ(r->losses.size(), 2u);
  EXPECT_DOUBLE_EQ(*r->loss("z_loss"), 1e-3);
  EXPECT_DOUBLE_EQ(*r->loss_scale, 4096.0);
  EXPECT_DOUBLE_EQ(*r->num_zeros, 1234.0);
  EXPECT_DOUBLE_EQ(*r->params_norm, 271.828);
  EXPECT_DOUBLE_EQ(*r->max_attention_logit, 31.416);
  EXPECT_EQ(r->skipped_iterations, 2);
  EXPECT_EQ(r->nan_iterations, 1);
  ASSERT_EQ(r->other_fields.size(), 3u);
  EXPECT_EQ(r->other_fields[0].first, "memory(GiB)");
  EXPECT_EQ(r->other_fields[1].first, "elapsed time");
  EXPECT_EQ(r->other_fields[1].second, "0:01:02");
}

TEST(LogParse, WholeLogWithInterleavedOutputStepTimeAndCarriageReturns) {
  std::string dashes(kValidationLine.size() + 1, '-');
  std::string text =
      "using world size: 1, data-parallel size: 1\r\n"
      "[default0]:Step Time : 3.05s GPU utilization: 0.3MODEL_TFLOP/s/GPU\r\n"
      "[default0]:" + kMlmLine + "\r\n"
      "[default0]:[Rank 0] (after 1 iterations) memory (GB) | allocated: 0.5\n"
      "progress 10%\rprogress 20%\r" + kBridgeLine + "\n" +
      dashes + "\n" + kValidationLine + "\n" + dashes + "\n"
      "Step Time : 0.10s GPU utilization: 9.5MODEL_TFLOP/s/GPU\n"
      " [2026-11-30 05:34:22.765432] iteration        2/      30 | lm loss: 1.035622E+01 | grad norm: 0.711 |";
  ParsedLog log = parse_training_log(text);
  ASSERT_EQ(log.iterations.size(), 3u);
  ASSERT_EQ(log.validations.size(), 1u);
  EXPECT_EQ(log.iterations[0].iteration, 1);
  EXPECT_EQ(log.iterations[0].line, 3u);
  EXPECT_DOUBLE_EQ(*log.iterations[0].step_time_s, 3.05);
  EXPECT_DOUBLE_EQ(*log.iterations[0].model_tflops_per_gpu, 0.3);
  EXPECT_EQ(log.iterations[1].iteration, 43);
  EXPECT_EQ(log.iterations[1].line, 7u);  // after two '\r'-separated progress lines
  EXPECT_FALSE(log.iterations[1].step_time_s);
  EXPECT_EQ(log.validations[0].iteration, 10);
  EXPECT_EQ(log.iterations[2].iteration, 2);
  EXPECT_DOUBLE_EQ(*log.iterations[2].step_time_s, 0.10);
  EXPECT_DOUBLE_EQ(*log.iterations[2].model_tflops_per_gpu, 9.5);
  EXPECT_EQ(log.lines, 12u);
}

TEST(LogParse, FormatThenParseRoundTrips) {
  Timestamp t;
  t.year = 2026, t.month = 3, t.day = 4, t.hour = 5, t.minute = 6, t.second = 7, t.microsecond = 890123;
  for (LogFlavor flavor : {LogFlavor::kMegatronLM, LogFlavor::kBridge}) {
    for (int i = 1; i <= 50; ++i) {
      TrainingLogValues v;
      v.iteration = i * 7;
      v.train_iters = 400;
      v.consumed_samples = i * 7 * 256;
      v.skipped_samples = i % 5 == 0 ? i : 0;
      v.elapsed_ms_per_iteration = 100.0 + i * 1.25;
      if (i % 2) v.throughput_tflops_per_gpu = 400.0 + i * 0.5;
      v.learning_rate = 3e-4 * (1.0 - i / 60.0) + 1.234567e-9 * i;
      v.global_batch_size = 256;
      v.losses = {{"lm loss", 10.5 / (1 + i * 0.0371)}, {"load_balancing_loss", 1.0 + i * 1e-3}};
      v.loss_scale = 1.0;
      if (i % 7 != 0) v.grad_norm = 0.5 + i * 0.01337;
      else v.grad_norm = std::numeric_limits<double>::quiet_NaN();
      if (i % 3 == 0) v.params_norm = 200.0 + i;
      if (i % 4 == 0) v.num_zeros = 1000.0 * i;
      v.skipped_iterations = i % 7 == 0 ? 1 : 0;
      v.nan_iterations = i % 7 == 0 ? 1 : 0;
      std::string line = format_training_line(v, t, flavor);
      auto r = parse_training_line(line);
      ASSERT_TRUE(r) << line;
      EXPECT_EQ(r->timestamp, flavor == LogFlavor::kMegatronLM ? "2026-03-04 05:06:07.890123"
                                                               : "2026-03-04 05:06:07");
      EXPECT_EQ(r->iteration, v.iteration);
      EXPECT_EQ(r->train_iters, v.train_iters);
      EXPECT_EQ(r->consumed_samples, v.consumed_samples);
      EXPECT_EQ(r->skipped_samples.value_or(0), v.skipped_samples);
      EXPECT_NEAR(*r->elapsed_ms, v.elapsed_ms_per_iteration, 0.05 + 1e-9);
      EXPECT_EQ(r->throughput_tflops_per_gpu.has_value(), v.throughput_tflops_per_gpu.has_value());
      if (v.throughput_tflops_per_gpu) {
        EXPECT_NEAR(*r->throughput_tflops_per_gpu, *v.throughput_tflops_per_gpu, 0.05 + 1e-9);
      }
      EXPECT_NEAR(*r->learning_rate, *v.learning_rate, *v.learning_rate * 5e-7);
      EXPECT_EQ(r->global_batch_size, v.global_batch_size);
      ASSERT_EQ(r->losses.size(), 2u);
      for (size_t k = 0; k < 2; ++k) {
        EXPECT_EQ(r->losses[k].name, v.losses[k].name);
        EXPECT_NEAR(r->losses[k].value, v.losses[k].value, v.losses[k].value * 5e-7);
      }
      if (std::isnan(*v.grad_norm)) {
        EXPECT_TRUE(std::isnan(*r->grad_norm));
      } else {
        EXPECT_NEAR(*r->grad_norm, *v.grad_norm, 5e-4 + 1e-12);
      }
      EXPECT_EQ(r->params_norm.has_value(), v.params_norm.has_value());
      EXPECT_EQ(r->num_zeros, v.num_zeros);
      EXPECT_EQ(r->skipped_iterations, v.skipped_iterations);
      EXPECT_EQ(r->nan_iterations, v.nan_iterations);
      // Re-formatting the parsed values gives the same text: the printed precision is a fixed
      // point of format -> parse -> format.
      TrainingLogValues again = v;
      again.elapsed_ms_per_iteration = *r->elapsed_ms;
      again.learning_rate = r->learning_rate;
      again.losses = r->losses;
      again.grad_norm = r->grad_norm;
      again.throughput_tflops_per_gpu = r->throughput_tflops_per_gpu;
      again.params_norm = r->params_norm;
      EXPECT_EQ(format_training_line(again, t, flavor), line);
    }
  }
  for (EvalSet set : {EvalSet::kDuringTraining, EvalSet::kValidationSet, EvalSet::kTestSet}) {
    ValidationLogValues v;
    v.iteration = 1234;
    v.set = set;
    v.losses = {{"lm loss", 3.14159265}};
    std::string block = format_validation_block(v);
    ParsedLog log = parse_training_log(block);
    ASSERT_EQ(log.validations.size(), 1u);
    EXPECT_TRUE(log.iterations.empty());
    EXPECT_EQ(log.validations[0].iteration, 1234);
    EXPECT_EQ(log.validations[0].set, set);
    EXPECT_NEAR(*log.validations[0].loss("lm loss"), 3.14159265, 3.2e-6);
    EXPECT_NEAR(*log.validations[0].losses[0].ppl, std::exp(3.14159265), std::exp(3.14159265) * 1e-6);
  }
}

TEST(LogParse, MissingFileIsAUsageErrorNamingIt) {
  try {
    parse_training_log_file("/nonexistent/dir/run.log");
    FAIL();
  } catch (const laoyao::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir/run.log"), std::string::npos);
  }
  auto dir = std::filesystem::temp_directory_path() / ("laoyao_log_parse_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  EXPECT_THROW(parse_training_log_file(dir.string()), laoyao::UsageError);
  std::ofstream(dir / "x.log") << kMlmLine << "\n";
  EXPECT_EQ(parse_training_log_file((dir / "x.log").string()).iterations.size(), 1u);
  std::filesystem::remove_all(dir);
}
