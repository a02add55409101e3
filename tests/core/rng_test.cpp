#include <gtest/gtest.h>

#include <cmath>

#include "core/rng.hpp"

using namespace laoyao;

TEST(Rng, StreamsDependOnSeedAndNameOnly) {
  Rng a(1234, "decoder.layers.0.mlp.linear_fc1.weight"), b(1234, "decoder.layers.0.mlp.linear_fc1.weight");
  Rng c(1234, "decoder.layers.1.mlp.linear_fc1.weight"), d(1235, "decoder.layers.0.mlp.linear_fc1.weight");
  uint64_t x = a.next_u64();
  EXPECT_EQ(x, b.next_u64());
  EXPECT_NE(x, c.next_u64());
  EXPECT_NE(x, d.next_u64());
}

TEST(Rng, NormalHasUnitMoments) {
  Rng r(7, "moments");
  const int n = 200000;
  double s = 0, s2 = 0, s4 = 0;
  for (int i = 0; i < n; ++i) {
    double v = r.normal();
    s += v, s2 += v * v, s4 += v * v * v * v;
  }
  EXPECT_NEAR(s / n, 0.0, 0.01);
  EXPECT_NEAR(s2 / n, 1.0, 0.01);
  EXPECT_NEAR(s4 / n, 3.0, 0.05);  // kurtosis of a normal
  Rng u(7, "uniform");
  double m = 0;
  for (int i = 0; i < n; ++i) m += u.uniform();
  EXPECT_NEAR(m / n, 0.5, 0.005);
}

TEST(Rng, Bf16RoundsToNearestEven) {
  EXPECT_EQ(round_to_bf16(1.0f), 1.0f);
  EXPECT_EQ(round_to_bf16(1.0f + 1.0f / 256), 1.0f) << "a tie rounds to even";
  EXPECT_EQ(round_to_bf16(1.0f + 3.0f / 256), 1.0f + 4.0f / 256) << "a tie rounds to even (up)";
  EXPECT_EQ(round_to_bf16(1.0f + 1.0f / 200), 1.0f + 1.0f / 128);
  EXPECT_EQ(round_to_bf16(-2.5f), -2.5f);
  EXPECT_TRUE(std::isinf(round_to_bf16(INFINITY)));
  EXPECT_TRUE(std::isnan(round_to_bf16(NAN)));
  EXPECT_TRUE(std::isinf(round_to_bf16(3.4e38f))) << "past bf16's largest finite value";
}
