#include "core/fp8_scaling.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/error.hpp"

namespace laoyao {
namespace {

// Transformer Engine's delayed-scaling update, step by step, for a history of 3 under both
// algorithms: the history rolls (newest last, row 0 cleared), the scale follows the chosen amax,
// and a pass that did not cast the tensor (amax 0) leaves its history and scale alone.
TEST(Fp8DelayedScaling, HistoryAndScaleFollowTransformerEnginesUpdate) {
  DelayedScaling most_recent({Fp8Format::E4M3, Fp8Format::E5M2}, 3, AmaxComputeAlgo::MostRecent, 0);
  DelayedScaling max({Fp8Format::E4M3}, 3, AmaxComputeAlgo::Max, 1);
  EXPECT_EQ(most_recent.scale(0), 1.0f);  // the first pass casts with scale 1
  const float passes[] = {2.0f, 8.0f, 0.0f, 1.0f, 0.5f};
  // (newest completed last: rows 1, 2 after each pass)
  const float want_rows[][2] = {{0, 2}, {2, 8}, {2, 8}, {8, 1}, {1, 0.5f}};
  // max over the window before the roll (rows 1 .. len - 1, the oldest row 1 included) and the new amax
  const float want_max_amax[] = {2, 8, 8, 8, 8};
  for (int p = 0; p < 5; ++p) {
    SCOPED_TRACE("pass " + std::to_string(p));
    const float before0 = most_recent.scale(0), before_max = max.scale(0);
    most_recent.record_amax(0, passes[p] / 2);  // two casts in the pass: their max is kept
    most_recent.record_amax(0, passes[p]);
    most_recent.record_amax(1, 4.0f * passes[p]);
    max.record_amax(0, passes[p]);
    most_recent.update();
    max.update();
    EXPECT_EQ(most_recent.history(0, 0), 0.0f);
    EXPECT_EQ(most_recent.history(1, 0), want_rows[p][0]);
    EXPECT_EQ(most_recent.history(2, 0), want_rows[p][1]);
    EXPECT_EQ(most_recent.history(2, 1), passes[p] == 0 ? 32.0f : 4.0f * passes[p]);
    if (passes[p] == 0) {
      EXPECT_EQ(most_recent.scale(0), before0);
      EXPECT_EQ(max.scale(0), before_max);
    } else {
      EXPECT_EQ(most_recent.scale(0), 448.0f / passes[p]);
      EXPECT_EQ(most_recent.scale(1), 57344.0f / (4.0f * passes[p]));  // E5M2's maximum
      EXPECT_EQ(max.scale(0), 224.0f / want_max_amax[p]);             // margin 1: 448 / 2
    }
  }
}

TEST(Fp8DelayedScaling, NonFiniteOrTinyAmaxesKeepOrSaturateTheScale) {
  DelayedScaling s({Fp8Format::E4M3}, 1, AmaxComputeAlgo::MostRecent, 0);
  s.record_amax(0, 4.0f);
  s.update();
  EXPECT_EQ(s.scale(0), 112.0f);
  EXPECT_EQ(s.history(0, 0), 0.0f);  // a history of one starts over at 0
  s.record_amax(0, std::numeric_limits<float>::infinity());
  s.update();
  EXPECT_EQ(s.scale(0), 112.0f);  // an infinite amax: the old scale
  s.record_amax(0, std::numeric_limits<float>::quiet_NaN());
  s.update();
  EXPECT_EQ(s.scale(0), 112.0f);
  s.record_amax(0, 1e-38f);  // 448 / 1e-38 overflows fp32
  s.update();
  EXPECT_EQ(s.scale(0), FLT_MAX);
  // The amaxes of a pass are row 0: Megatron reduces them with MAX over its amax group in place.
  s.pass_amaxes()[0] = 7.0f;
  s.update();
  EXPECT_EQ(s.scale(0), 64.0f);
  EXPECT_THROW(DelayedScaling({Fp8Format::E4M3}, 0, AmaxComputeAlgo::Max, 0), Error);
}

TEST(Fp8CurrentScaling, ScaleFromTheTensorsOwnAmax) {
  EXPECT_EQ(current_scaling_scale(2.0f, Fp8Format::E4M3), 224.0f);
  EXPECT_EQ(current_scaling_scale(2.0f, Fp8Format::E5M2), 28672.0f);
  EXPECT_EQ(current_scaling_scale(0.0f, Fp8Format::E4M3), 1.0f);
  EXPECT_EQ(current_scaling_scale(std::numeric_limits<float>::infinity(), Fp8Format::E4M3), 1.0f);
  EXPECT_EQ(current_scaling_scale(std::numeric_limits<float>::quiet_NaN(), Fp8Format::E4M3), 1.0f);
  EXPECT_EQ(current_scaling_scale(1e-39f, Fp8Format::E4M3), FLT_MAX);
  EXPECT_EQ(current_scaling_scale(0.0f, Fp8Format::E4M3, 0.5f), 896.0f);  // eps stands in for a smaller amax
  EXPECT_EQ(current_scaling_scale(3.0f, Fp8Format::E4M3, 0.0f, true), 128.0f);  // 149.33 down to 2^7
  EXPECT_EQ(current_scaling_scale(2.0f, Fp8Format::E4M3, 0.0f, true), 128.0f);  // 224 down to 2^7
}

TEST(Fp8Quantize, AmaxSkipsNansAndTheCastSaturates) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const float x[] = {0.5f, -3.0f, nan, 1.0f};
  EXPECT_EQ(fp8_amax(x, 4), 3.0f);
  const float y[] = {1.0f, -inf};
  EXPECT_EQ(fp8_amax(y, 2), inf);
  const float z[] = {1.0f, -2.0f, 300.0f, 0.01f};
  uint8_t q[4];
  fp8_quantize(z, 4, 2.0f, Fp8Format::E4M3, q);  // 600 saturates to 448
  float back[4];
  fp8_dequantize(q, 4, 0.5f, Fp8Format::E4M3, back);
  EXPECT_EQ(back[0], 1.0f);
  EXPECT_EQ(back[1], -2.0f);
  EXPECT_EQ(back[2], 224.0f);
  EXPECT_EQ(back[3], fp8_to_float(fp8_from_float(0.02f, Fp8Format::E4M3), Fp8Format::E4M3) * 0.5f);
  float values[4];  // the same cast's values, unscaled
  fp8_quantize_values(z, 4, 2.0f, Fp8Format::E5M2, values);
  fp8_quantize(z, 4, 2.0f, Fp8Format::E5M2, q);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(values[i], fp8_to_float(q[i], Fp8Format::E5M2)) << i;
  EXPECT_EQ(values[2], 640.0f);  // E5M2 rounds 600 to 640 (steps of 128 there), E4M3 saturated it
}

// Block scaling's casts against a naive one: each block of 1 x 128, 128 x 1 or 128 x 128 values
// (edge blocks partial: 200 x 300 leaves 72 and 44) cast by the power of two at or below
// fp8_max / its own amax; a block of zeros scales by 1; the dequantized form is the FP8 values
// times their block's scale_inv, within FP8's rounding of x at its block's scale.
TEST(Fp8BlockScaling, EachBlockCastsWithItsOwnPowerOfTwoScale) {
  const int64_t rows = 200, cols = 300;
  std::mt19937 rng(77);
  std::normal_distribution<float> nd;
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)  // magnitudes from 2^-6 to 2^6 by row band and column band
      x[size_t(r * cols + c)] = nd(rng) * std::ldexp(1.0f, int((r / 64 + c / 50) % 13) - 6);
  for (int64_t c = 0; c < cols; ++c)
    for (int64_t r = 128; r < rows; ++r)
      if (c >= 256) x[size_t(r * cols + c)] = 0.0f;  // one whole 128 x 128 edge block of zeros
  for (const auto& [br, bc] : {std::pair<int64_t, int64_t>{1, 128}, {128, 1}, {128, 128}})
    for (const Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2}) {
      SCOPED_TRACE(std::to_string(br) + " x " + std::to_string(bc));
      const int64_t rb = (rows + br - 1) / br, cb = (cols + bc - 1) / bc;
      std::vector<uint8_t> q(x.size());
      std::vector<float> inv(static_cast<size_t>(rb * cb), -1.0f), deq(x.size());
      fp8_block_quantize(x.data(), rows, cols, br, bc, f, true, q.data(), inv.data());
      fp8_block_quantize_dequantized(x.data(), rows, cols, br, bc, f, true, deq.data());
      for (int64_t i = 0; i < rb; ++i)
        for (int64_t j = 0; j < cb; ++j) {
          double amax = 0;
          for (int64_t r = i * br; r < std::min(rows, (i + 1) * br); ++r)
            for (int64_t c = j * bc; c < std::min(cols, (j + 1) * bc); ++c)
              amax = std::max(amax, double(std::fabs(x[size_t(r * cols + c)])));
          const double scale = amax == 0 ? 1.0 : std::exp2(std::floor(std::log2(fp8_max(f) / amax)));
          ASSERT_EQ(inv[size_t(i * cb + j)], float(1.0 / scale)) << i << ", " << j;
          for (int64_t r = i * br; r < std::min(rows, (i + 1) * br); ++r)
            for (int64_t c = j * bc; c < std::min(cols, (j + 1) * bc); ++c) {
              const size_t k = size_t(r * cols + c);
              ASSERT_EQ(q[k], fp8_from_float(float(x[k] * scale), f)) << r << ", " << c;
              ASSERT_EQ(deq[k], float(fp8_to_float(q[k], f) / scale)) << r << ", " << c;
              // half a step of the format's mantissa, or of its smallest subnormal, at the scale
              const double rel = f == Fp8Format::E4M3 ? 0x1p-4 : 0x1p-3, sub = f == Fp8Format::E4M3 ? 0x1p-10 : 0x1p-17;
              ASSERT_LE(std::fabs(double(deq[k]) - x[k]), rel * std::fabs(x[k]) + sub / scale) << r << ", " << c;
            }
        }
      EXPECT_EQ(inv.back(), 1.0f);  // the last block, every shape's, holds zeros only: scale 1
      EXPECT_NE(*std::min_element(inv.begin(), inv.end()), *std::max_element(inv.begin(), inv.end()));
    }
  EXPECT_THROW(fp8_block_quantize_dequantized(x.data(), rows, cols, 0, 128, Fp8Format::E4M3, true, x.data()), Error);
}

// The simulated FP8 GEMM against an fp64 product of the same scaled, rounded inputs: random
// operands quantized with current scaling (E4M3 x E4M3 and E4M3 x E5M2, as the forward and the
// gradient GEMMs of the hybrid format), beta adding to what d held; two E5M2 operands refused.
TEST(Fp8Gemm, EqualsAnFp64ProductOfTheRoundedInputs) {
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 1.5f);
  const int64_t m = 7, n = 5, k = 96;
  for (const Fp8Format fb : {Fp8Format::E4M3, Fp8Format::E5M2}) {
    std::vector<float> a(m * k), b(n * k), d(m * n), d0(m * n);
    for (float& v : a) v = dist(rng);
    for (float& v : b) v = dist(rng) * 0.01f;
    for (float& v : d0) v = dist(rng);
    const float sa = current_scaling_scale(fp8_amax(a.data(), m * k), Fp8Format::E4M3);
    const float sb = current_scaling_scale(fp8_amax(b.data(), n * k), fb);
    std::vector<uint8_t> qa(m * k), qb(n * k);
    fp8_quantize(a.data(), m * k, sa, Fp8Format::E4M3, qa.data());
    fp8_quantize(b.data(), n * k, sb, fb, qb.data());
    d = d0;
    fp8_gemm_tn(qa.data(), Fp8Format::E4M3, 1.0f / sa, qb.data(), fb, 1.0f / sb, d.data(), m, n, k, 0.5f);
    double err = 0, norm = 0, quant_err = 0;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double want = 0, exact = 0;
        for (int64_t p = 0; p < k; ++p) {
          want += double(fp8_to_float(qa[i * k + p], Fp8Format::E4M3)) * fp8_to_float(qb[j * k + p], fb);
          exact += double(a[i * k + p]) * b[j * k + p];
        }
        want = want * (1.0 / sa) * (1.0 / sb) + 0.5 * d0[i * n + j];
        exact += 0.5 * d0[i * n + j];
        err = std::max(err, std::abs(d[i * n + j] - want));
        quant_err = std::max(quant_err, std::abs(want - exact));
        norm = std::max(norm, std::abs(want));
      }
    EXPECT_LT(err, 1e-5 * norm) << "fp32 accumulation of the rounded inputs";
    EXPECT_GT(quant_err, 1e-4 * norm) << "the inputs were rounded to FP8, not used as they were";
    EXPECT_LT(quant_err, 0.1 * norm) << "FP8's rounding, not garbage";
  }
  std::vector<uint8_t> q(4);
  float d[1];
  EXPECT_THROW(fp8_gemm_tn(q.data(), Fp8Format::E5M2, 1, q.data(), Fp8Format::E5M2, 1, d, 1, 1, 4), Error);
  EXPECT_EQ(fp8_format_of(Fp8Formats::Hybrid, true), Fp8Format::E5M2);
  EXPECT_EQ(fp8_format_of(Fp8Formats::Hybrid, false), Fp8Format::E4M3);
  EXPECT_EQ(fp8_format_of(Fp8Formats::E4M3, true), Fp8Format::E4M3);
}

}  // namespace
}  // namespace laoyao
