// Batch-size ramp-up (data/batch_rampup.hpp) against values worked out by hand from Megatron-Core's
// RampupBatchsizeNumMicroBatchesCalculator and Megatron-LM's update_train_iters.
#include "data/batch_rampup.hpp"

#include <gtest/gtest.h>

using laoyao::data::BatchRampup;
using laoyao::data::rampup_indivisible_batch;
using laoyao::data::rampup_train_iters;

namespace {

BatchRampup ramp(int64_t start, int64_t increment, int64_t samples, int64_t gbs, int64_t micro_times_dp = 1) {
  BatchRampup r;
  r.start = start, r.increment = increment, r.samples = samples, r.global_batch_size = gbs;
  r.micro_times_dp = micro_times_dp;
  return r;
}

}  // namespace

// 4 -> 16 by 4 over 100 samples: 3 increments, one every 100 / 3 samples, reached at
// int(consumed / 33.33...): 34 samples is the first past one, 100 itself counts 3 (Python's
// 100 / (100 / 3) is exactly 3.0), and past 100 the batch is the global one.
TEST(BatchRampup, BatchGrowsEveryRampSamplesOverIncrements) {
  const BatchRampup r = ramp(4, 4, 100, 16);
  EXPECT_EQ(r.problem(), "");
  EXPECT_EQ(r.current(0), 4);
  EXPECT_EQ(r.current(33), 4);
  EXPECT_EQ(r.current(34), 8);
  EXPECT_EQ(r.current(66), 8);
  EXPECT_EQ(r.current(67), 12);
  EXPECT_EQ(r.current(99), 12);
  EXPECT_EQ(r.current(100), 16);
  EXPECT_EQ(r.current(101), 16);
  EXPECT_EQ(r.current(1000000), 16);
}

// 2 -> 8 by 2 over 24 samples (one increment every 8): the iterations consume 2, 2, 2, 2 (to 8),
// 4, 4 (to 16), 6, 6 (to 28 > 24), so the ramp takes 8 iterations and 28 samples; 60 samples leave
// 32 = 4 batches of 8: 12 iterations. Inside the ramp Python's floor division takes some off again.
TEST(BatchRampup, TrainItersCountTheRampThenWholeBatches) {
  const BatchRampup r = ramp(2, 2, 24, 8);
  EXPECT_EQ(rampup_train_iters(r, 60), 12);
  EXPECT_EQ(rampup_train_iters(r, 67), 12);
  EXPECT_EQ(rampup_train_iters(r, 68), 13);
  EXPECT_EQ(rampup_train_iters(r, 28), 8);
  EXPECT_EQ(rampup_train_iters(r, 27), 7) << "8 + floor(-1 / 8)";
}

// Running batches: with --decrease-batch-size-if-needed a batch that is not whole micro-batches
// over the data-parallel ranks is rounded down; without it, the first such batch is reported.
TEST(BatchRampup, IndivisibleBatchesAreFoundOrRoundedDown) {
  BatchRampup r = ramp(2, 2, 24, 8, 4);  // 2 and 6 are not multiples of 4
  EXPECT_EQ(rampup_indivisible_batch(r), 2);
  r.start = 4, r.increment = 4, r.global_batch_size = 12;
  EXPECT_EQ(rampup_indivisible_batch(r), 0);
  r = ramp(6, 2, 24, 12, 4);  // 6, 8, 10, 12: 6 first
  EXPECT_EQ(rampup_indivisible_batch(r), 6);
  r.decrease_if_needed = true;
  EXPECT_EQ(rampup_indivisible_batch(r), 0);
  EXPECT_EQ(r.running(0), 4);
  EXPECT_EQ(r.current(0), 6);
  EXPECT_EQ(r.running(1000), 12);
}

TEST(BatchRampup, ProblemsAreNamed) {
  EXPECT_NE(ramp(0, 2, 24, 8).problem().find("start batch size must be positive"), std::string::npos);
  EXPECT_NE(ramp(2, 0, 24, 8).problem().find("increment must be positive"), std::string::npos);
  EXPECT_NE(ramp(2, 2, 0, 8).problem().find("ramp-up samples must be positive"), std::string::npos);
  EXPECT_NE(ramp(16, 2, 24, 8).problem().find("must not exceed the global batch size (8)"), std::string::npos);
  EXPECT_NE(ramp(2, 4, 24, 8).problem().find("(6) must be a multiple of the increment (4)"), std::string::npos);
  EXPECT_NE(ramp(8, 2, 24, 8).problem().find("nothing to ramp"), std::string::npos);
  BatchRampup r = ramp(2, 2, 24, 8, 4);
  r.decrease_if_needed = true;
  EXPECT_NE(r.problem().find("less than one micro-batch on every data-parallel rank (4)"), std::string::npos);
}
