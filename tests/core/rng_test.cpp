#include <gtest/gtest.h>

#include <cmath>

#include "core/counter_normal.hpp"
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

// The counter-based draws (GPU kernels draw element i on its own): uniform j is the stream's j-th
// Rng::uniform, and the normals have unit moments.
TEST(CounterNormal, UniformsAreTheStreamsAndNormalsHaveUnitMoments) {
  const uint64_t key = rng_stream_key(7, "router.layer3.random_logits.42");
  Rng r(7, "router.layer3.random_logits.42");
  for (uint64_t j = 0; j < 1000; ++j) ASSERT_EQ(counter_uniform(key, j), r.uniform()) << j;
  const int n = 200000;
  double s = 0, s2 = 0, s4 = 0;
  for (int i = 0; i < n; ++i) {
    const double v = counter_normal(key, static_cast<uint64_t>(i));
    s += v, s2 += v * v, s4 += v * v * v * v;
  }
  EXPECT_NEAR(s / n, 0.0, 0.01);
  EXPECT_NEAR(s2 / n, 1.0, 0.01);
  EXPECT_NEAR(s4 / n, 3.0, 0.05);
  EXPECT_NE(counter_normal(key, 5), counter_normal(key + 1, 5));
  EXPECT_EQ(counter_normal(key, 5), counter_normal(key, 5));
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
