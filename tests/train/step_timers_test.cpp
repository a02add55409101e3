// Megatron's timers: the names training_log logs at each level, the printed block (Megatron's
// timers.py strings for max / minmax / all, which the expected strings below spell out), the
// TensorBoard values, and the timers' device waits and resets.
#include "train/step_timers.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.hpp"

namespace laoyao {
namespace {

using train::TimingLogOption;

TEST(StepTimers, NamesFollowMegatronLmsTimersToLogByLevel) {
  EXPECT_TRUE(train::megatron_timers_to_log(0).empty()) << "level 0: only the iteration time";
  EXPECT_TRUE(train::megatron_timers_to_log(-1).empty()) << "Bridge's -1";
  const auto one = train::megatron_timers_to_log(1);
  ASSERT_EQ(one.size(), 12u);
  EXPECT_EQ(one.front(), "forward-backward");
  EXPECT_EQ(one[3], "all-grads-sync");
  EXPECT_EQ(one.back(), "optimizer");
  const auto two = train::megatron_timers_to_log(2);
  ASSERT_EQ(two.size(), 15u);
  EXPECT_EQ(std::vector<std::string>(two.begin(), two.begin() + 12), one) << "level 1's names first";
  EXPECT_EQ(two[12], "batch-generator");
  EXPECT_EQ(two[14], "backward-compute");
}

// Two ranks; all-grads-sync has no time anywhere (left out), batch-generator only on rank 1.
const std::vector<std::string> kNames = {"forward-backward", "all-grads-sync", "batch-generator"};
const std::vector<std::vector<double>> kSeconds = {{0.2, 0.0, 0.0}, {0.3, 0.0, 0.05}};

TEST(StepTimers, BlockIsMegatronsMinMaxString) {
  const auto block = train::format_timers_block(kNames, kSeconds, 10.0, TimingLogOption::kMinMax);
  ASSERT_TRUE(block);
  EXPECT_EQ(*block,
            "(min, max) time across ranks (ms):"
            "\n    forward-backward ...............................: (20.00, 30.00)"
            "\n    batch-generator ................................: (5.00, 5.00)");
}

TEST(StepTimers, BlockIsMegatronsMaxAndAllStrings) {
  EXPECT_EQ(*train::format_timers_block(kNames, kSeconds, 10.0, TimingLogOption::kMax),
            "max time across ranks (ms):"
            "\n    forward-backward ...............................: 30.00"
            "\n    batch-generator ................................: 5.00");
  EXPECT_EQ(*train::format_timers_block(kNames, kSeconds, 10.0, TimingLogOption::kAll),
            "times across ranks (ms):"
            "\n  forward-backward:"
            "\n     rank  0: 20.00"
            "\n     rank  1: 30.00"
            "\n  batch-generator:"
            "\n     rank  1: 5.00");
}

TEST(StepTimers, NothingTimedPrintsNothing) {
  EXPECT_FALSE(train::format_timers_block(kNames, {{0.0, 0.0, 0.0}}, 1.0, TimingLogOption::kMinMax));
  EXPECT_FALSE(train::format_timers_block({}, {{}}, 1.0, TimingLogOption::kAll));
}

TEST(StepTimers, TensorBoardScalarsAreTheMaximumInSeconds) {
  const auto scalars = train::timer_scalars(kNames, kSeconds, 10.0);
  ASSERT_EQ(scalars.size(), 2u);
  EXPECT_EQ(scalars[0].first, "forward-backward-time");
  EXPECT_DOUBLE_EQ(scalars[0].second, 0.03);
  EXPECT_EQ(scalars[1].first, "batch-generator-time");
  EXPECT_DOUBLE_EQ(scalars[1].second, 0.005);
}

TEST(StepTimers, TimersAboveTheLevelNeverRunAndOthersWaitForTheDevice) {
  int waits = 0;
  train::StepTimers t(1, [&] { ++waits; });
  EXPECT_TRUE(t.enabled("optimizer"));
  EXPECT_FALSE(t.enabled("batch-generator"));
  t.start("batch-generator");
  t.stop("batch-generator");
  EXPECT_EQ(waits, 0) << "a level-2 timer at level 1 is Megatron's DummyTimer";
  for (int i = 0; i < 2; ++i) {
    t.start("optimizer");
    t.stop("optimizer");
  }
  EXPECT_EQ(waits, 4) << "one wait at each start and stop";
  const std::vector<std::string> names = {"optimizer", "batch-generator", "all-grads-sync"};
  const auto first = t.elapsed(names, false);
  EXPECT_GT(first[0], 0.0);
  EXPECT_EQ(first[1], 0.0);
  EXPECT_EQ(first[2], 0.0) << "never started";
  EXPECT_EQ(t.elapsed(names, true)[0], first[0]) << "kept until a reset";
  EXPECT_EQ(t.elapsed(names, false)[0], 0.0) << "zeroed by the reset";
}

// Megatron's level-1 timers wait for every rank at their start (barrier_with_L1_time); level-2
// ones and stops do not.
TEST(StepTimers, LevelOneStartsWaitForEveryRank) {
  int barriers = 0;
  train::StepTimers t(2, nullptr, [&] { ++barriers; });
  t.start("forward-backward");
  t.start("batch-generator");
  t.stop("batch-generator");
  t.stop("forward-backward");
  EXPECT_EQ(barriers, 1);
  t.start("optimizer");
  t.stop("optimizer");
  EXPECT_EQ(barriers, 2);
}

TEST(StepTimers, MisuseIsAnError) {
  train::StepTimers t(2, nullptr);
  EXPECT_THROW(t.stop("optimizer"), Error);
  t.start("optimizer");
  EXPECT_THROW(t.start("optimizer"), Error);
  EXPECT_THROW(t.start("no-such-timer"), Error);
  EXPECT_THROW(train::parse_timing_log_option("median"), UsageError);
  EXPECT_EQ(train::parse_timing_log_option("all"), TimingLogOption::kAll);
}

TEST(StepTimers, OneRankGathersItsOwnSeconds) {
  const auto all = train::gather_timer_seconds({0.5, 0.25}, nullptr);
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0], (std::vector<double>{0.5, 0.25}));
}

}  // namespace
}  // namespace laoyao
