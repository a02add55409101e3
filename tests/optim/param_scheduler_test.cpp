#include <gtest/gtest.h>

#include <cmath>

#include "optim/param_scheduler.hpp"

using namespace laoyao::optim;

// The learning rates a real Megatron-LM run printed (megatron-lm.md §13.2: linear, lr 3e-4,
// min 3e-5, 30 iterations, gbs 32, no warmup); iteration k prints lr(n = k*gbs).
TEST(ParamScheduler, MatchesTheLearningRatesMegatronPrinted) {
  ParamSchedule s;
  s.max_lr = 3e-4, s.min_lr = 3e-5, s.decay_steps = 30 * 32, s.decay_style = "linear";
  const std::pair<int, double> printed[] = {{1, 2.91e-4}, {2, 2.82e-4}, {3, 2.73e-4}, {5, 2.55e-4}, {10, 2.10e-4},
                                            {15, 1.65e-4}, {20, 1.20e-4}, {25, 7.5e-5}, {30, 3.0e-5}};
  for (auto [k, lr] : printed) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.6E", lr_at(s, k * 32));
    char want[32];
    std::snprintf(want, sizeof want, "%.6E", lr);
    EXPECT_STREQ(buf, want) << "iteration " << k;
  }
  EXPECT_DOUBLE_EQ(lr_at(s, 0), 3e-4) << "iteration 1 trains at the peak without warmup";
  EXPECT_DOUBLE_EQ(lr_at(s, 31 * 32), 3e-5) << "past the decay: min_lr";
}

TEST(ParamScheduler, WarmupStartsFromTheInitialLr) {
  ParamSchedule s;
  s.max_lr = 1.0, s.min_lr = 0.1, s.warmup_steps = 100, s.decay_steps = 1100, s.decay_style = "cosine";
  EXPECT_DOUBLE_EQ(lr_at(s, 0), 0.0) << "iteration 1 of a warmup trains at lr_warmup_init";
  EXPECT_DOUBLE_EQ(lr_at(s, 25), 0.25);
  EXPECT_DOUBLE_EQ(lr_at(s, 100), 1.0) << "n == warmup is still warmup";
  EXPECT_NEAR(lr_at(s, 600), 0.1 + 0.5 * (std::cos(M_PI * 0.5) + 1) * 0.9, 1e-15);
  EXPECT_NEAR(lr_at(s, 1100), 0.1, 1e-15);
  s.init_lr = 0.5;
  EXPECT_DOUBLE_EQ(lr_at(s, 50), 0.75);
}

TEST(ParamScheduler, FractionalWarmupIsNotRounded) {
  // --lr-warmup-fraction 0.07 over 30 iterations of 4 samples: a warmup of 8.4 samples.
  ParamSchedule s;
  s.max_lr = 3e-4, s.min_lr = 0, s.warmup_steps = 0.07 * 120, s.decay_steps = 120, s.decay_style = "linear";
  EXPECT_NEAR(lr_at(s, 4), 3e-4 * 4 / 8.4, 1e-18);
  EXPECT_NEAR(lr_at(s, 12), 3e-4 * (1 - (12 - 8.4) / (120 - 8.4)), 1e-18);
}

TEST(ParamScheduler, OtherStyles) {
  ParamSchedule s;
  s.max_lr = 2.0, s.min_lr = 0.5, s.warmup_steps = 4, s.decay_steps = 100;
  s.decay_style = "constant";
  EXPECT_DOUBLE_EQ(lr_at(s, 1000), 2.0);
  s.decay_style = "inverse-square-root";
  EXPECT_DOUBLE_EQ(lr_at(s, 16), 2.0 * 2.0 / 4.0);
  EXPECT_DOUBLE_EQ(lr_at(s, 64), 0.5) << "floored at min_lr";
  s.decay_style = "WSD", s.wsd_decay_steps = 20, s.wsd_decay_style = "linear";
  EXPECT_DOUBLE_EQ(lr_at(s, 80), 2.0) << "stable until decay - wsd";
  EXPECT_DOUBLE_EQ(lr_at(s, 90), 0.5 + 0.5 * 1.5);
  s.wsd_decay_style = "exponential";
  EXPECT_DOUBLE_EQ(lr_at(s, 90), 0.5 + (2 * std::pow(0.5, 0.5) - 1) * 1.5);
  s.wsd_decay_style = "minus_sqrt";
  EXPECT_DOUBLE_EQ(lr_at(s, 85), 0.5 + (1 - std::sqrt(0.25)) * 1.5);
  s.wsd_decay_style = "cosine";
  EXPECT_NEAR(lr_at(s, 100), 0.5, 1e-15);
}

TEST(ParamScheduler, WeightDecay) {
  ParamSchedule s;
  s.start_wd = 0.033, s.end_wd = 0.033, s.wd_incr_steps = 100;
  EXPECT_DOUBLE_EQ(wd_at(s, 50), 0.033);
  s.start_wd = 0.0, s.end_wd = 0.1, s.wd_incr_style = "linear";
  EXPECT_DOUBLE_EQ(wd_at(s, 25), 0.025);
  EXPECT_DOUBLE_EQ(wd_at(s, 101), 0.1);
  s.wd_incr_style = "cosine";
  EXPECT_NEAR(wd_at(s, 50), 0.05, 1e-15);
  EXPECT_NEAR(wd_at(s, 0), 0.0, 1e-15);
}
