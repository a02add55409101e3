// FP8 casts (core/fp8.hpp) against a naive reference: every code decoded from its fields' meaning,
// and random floats cast to the nearest finite value found by scanning all codes (ties to the even
// code, beyond the largest finite value saturated), as CUDA's __NV_SATFINITE cast does.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "core/fp8.hpp"

#ifdef LAOYAO_HAVE_CUDA
#include <cuda_fp8.h>
#endif

using laoyao::Fp8Format;
using laoyao::fp8_from_float;
using laoyao::fp8_max;
using laoyao::fp8_to_float;

namespace {

// The cast by brute force: the finite code of this sign nearest to x, the even one on a tie.
uint8_t nearest_by_scan(float x, Fp8Format f) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const double a = std::fabs(static_cast<double>(x));
  int best = -1;
  double best_d = 0;
  for (int c = 0; c < 0x80; ++c) {
    const float v = fp8_to_float(static_cast<uint8_t>(c), f);
    if (!std::isfinite(v)) continue;
    const double d = std::fabs(static_cast<double>(v) - a);
    if (best < 0 || d < best_d || (d == best_d && c % 2 == 0)) best = c, best_d = d;
  }
  return static_cast<uint8_t>(sign | best);
}

}  // namespace

TEST(Fp8, CodesDecodeToTheirFieldsValues) {
  // E4M3: bias 7, 3 mantissa bits, no infinity, 0x7F NaN.
  EXPECT_EQ(fp8_to_float(0x7E, Fp8Format::E4M3), 448.0f);
  EXPECT_EQ(fp8_to_float(0x01, Fp8Format::E4M3), std::ldexp(1.0f, -9));  // the smallest subnormal
  EXPECT_EQ(fp8_to_float(0x08, Fp8Format::E4M3), std::ldexp(1.0f, -6));  // the smallest normal
  EXPECT_EQ(fp8_to_float(0x38, Fp8Format::E4M3), 1.0f);
  EXPECT_EQ(fp8_to_float(0xBC, Fp8Format::E4M3), -1.5f);
  EXPECT_TRUE(std::isnan(fp8_to_float(0x7F, Fp8Format::E4M3)));
  EXPECT_TRUE(std::isnan(fp8_to_float(0xFF, Fp8Format::E4M3)));
  // E5M2: bias 15, 2 mantissa bits, 0x7C infinity, 0x7D-0x7F NaN.
  EXPECT_EQ(fp8_to_float(0x7B, Fp8Format::E5M2), 57344.0f);
  EXPECT_EQ(fp8_to_float(0x01, Fp8Format::E5M2), std::ldexp(1.0f, -16));
  EXPECT_EQ(fp8_to_float(0x3C, Fp8Format::E5M2), 1.0f);
  EXPECT_EQ(fp8_to_float(0x7C, Fp8Format::E5M2), std::numeric_limits<float>::infinity());
  EXPECT_EQ(fp8_to_float(0xFC, Fp8Format::E5M2), -std::numeric_limits<float>::infinity());
  for (uint8_t c : {0x7D, 0x7E, 0x7F}) EXPECT_TRUE(std::isnan(fp8_to_float(c, Fp8Format::E5M2)));
  EXPECT_EQ(fp8_max(Fp8Format::E4M3), 448.0);
  EXPECT_EQ(fp8_max(Fp8Format::E5M2), 57344.0);
  // Every code's value, from its fields written out in fp64: sign, then 2^(e - bias) (1 + m / 2^M),
  // or 2^(1 - bias) m / 2^M for e = 0.
  for (Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2}) {
    const int M = f == Fp8Format::E4M3 ? 3 : 2, bias = f == Fp8Format::E4M3 ? 7 : 15;
    for (int c = 0; c < 256; ++c) {
      const float v = fp8_to_float(static_cast<uint8_t>(c), f);
      if (!std::isfinite(v)) continue;
      const int e = (c & 0x7F) >> M, m = c & ((1 << M) - 1);
      double want = e == 0 ? std::pow(2.0, 1 - bias) * m / (1 << M) : std::pow(2.0, e - bias) * (1.0 + double(m) / (1 << M));
      if (c & 0x80) want = -want;
      EXPECT_EQ(static_cast<double>(v), want) << "code " << c;
    }
  }
}

TEST(Fp8, EveryFiniteCodeCastsBackToItself) {
  for (Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2})
    for (int c = 0; c < 256; ++c) {
      const float v = fp8_to_float(static_cast<uint8_t>(c), f);
      if (std::isfinite(v)) {
        EXPECT_EQ(fp8_from_float(v, f), c) << "code " << c;
      }
    }
}

TEST(Fp8, CastsRoundToTheNearestEvenAndSaturate) {
  std::mt19937 rng(5);
  for (Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2}) {
    SCOPED_TRACE(f == Fp8Format::E4M3 ? "E4M3" : "E5M2");
    // Random magnitudes across the whole range and beyond (log-uniform), either sign.
    std::uniform_real_distribution<double> log2_mag(-20.0, 20.0);
    for (int i = 0; i < 200000; ++i) {
      const float x = static_cast<float>((i % 2 ? -1 : 1) * std::exp2(log2_mag(rng)));
      ASSERT_EQ(fp8_from_float(x, f), nearest_by_scan(x, f)) << x;
    }
    // The midpoints between neighbouring codes (ties), and a hair either side of them.
    for (int c = 0; c + 1 < 0x80; ++c) {
      const float lo = fp8_to_float(static_cast<uint8_t>(c), f), hi = fp8_to_float(static_cast<uint8_t>(c + 1), f);
      if (!std::isfinite(hi)) continue;
      const float mid = 0.5f * (lo + hi);
      for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e30f), -mid})
        ASSERT_EQ(fp8_from_float(x, f), nearest_by_scan(x, f)) << x;
    }
    // Beyond the largest finite value, infinities included: the largest finite value.
    const uint8_t max_code = f == Fp8Format::E4M3 ? 0x7E : 0x7B;
    for (float x : {464.0f, 465.0f, 61440.0f, 1e30f, std::numeric_limits<float>::infinity()}) {
      EXPECT_EQ(fp8_from_float(x, f), x >= fp8_max(f) ? max_code : nearest_by_scan(x, f)) << x;
      EXPECT_EQ(fp8_from_float(-x, f), (x >= fp8_max(f) ? max_code : nearest_by_scan(x, f)) | 0x80) << -x;
    }
    // NaN stays NaN (0x7F); zeros keep their sign; half the smallest subnormal rounds to zero (even).
    EXPECT_TRUE(std::isnan(fp8_to_float(fp8_from_float(std::numeric_limits<float>::quiet_NaN(), f), f)));
    EXPECT_EQ(fp8_from_float(-0.0f, f), 0x80);
    EXPECT_EQ(fp8_from_float(0.5f * fp8_to_float(0x01, f), f), 0x00);
  }
  EXPECT_EQ(fp8_from_float(std::numeric_limits<float>::quiet_NaN(), Fp8Format::E4M3), 0x7F);
  EXPECT_EQ(fp8_from_float(-std::numeric_limits<float>::quiet_NaN(), Fp8Format::E5M2), 0x7F);
}

#ifdef LAOYAO_HAVE_CUDA
// CUDA's own cast (cuda_fp8.h's host path of __nv_cvt_float_to_fp8 with __NV_SATFINITE, what the
// device casts do) on the same inputs, NaNs included.
TEST(Fp8, CastsEqualCudasSaturatingCast) {
  std::mt19937 rng(9);
  std::uniform_real_distribution<double> log2_mag(-24.0, 24.0);
  std::vector<float> xs = {0.0f, -0.0f, std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(), 464.0f,
                           61440.0f, 448.0f, 57344.0f};
  for (int i = 0; i < 200000; ++i) xs.push_back(static_cast<float>((i % 2 ? -1 : 1) * std::exp2(log2_mag(rng))));
  for (Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2}) {
    const __nv_fp8_interpretation_t kind = f == Fp8Format::E4M3 ? __NV_E4M3 : __NV_E5M2;
    for (int c = 0; c + 1 < 0x80; ++c) {  // the ties between neighbouring codes
      const float lo = fp8_to_float(static_cast<uint8_t>(c), f), hi = fp8_to_float(static_cast<uint8_t>(c + 1), f);
      if (std::isfinite(hi)) xs.push_back(0.5f * (lo + hi)), xs.push_back(-0.5f * (lo + hi));
    }
    for (float x : xs)
      ASSERT_EQ(fp8_from_float(x, f), static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, kind))) << x;
  }
}
#endif
