// Helpers shared by the CPU reference op tests: seeded random inputs, fp32-vs-fp64 comparison and
// central finite differences on the fp64 twins.
//
// Tolerances: fp32 unit roundoff is u = 2^-24 ~ 6e-8. An fp32 result built from n rounded terms has
// error up to ~n*u times the magnitude of the terms (typically sqrt(n)*u), and the terms are about
// as large as the tensor's largest entries. So errors are measured against the tensor's scale
// (max |want|), not the element's own magnitude, which can be small by cancellation.
// Finite differences in fp64 (eps = 1e-6, central) have truncation error ~eps^2 * f''' ~ 1e-12 and
// roundoff ~1e-16 * |loss| / eps ~ 1e-9, far below fp32 backward errors (~1e-7); so the FD
// tolerances below are set by fp32 alone.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace laoyao::kernels::cpu::test {

// Every test draws from its own seeded generator (fresh, reproducible, never all zeros).
inline std::vector<float> randn(size_t n, std::mt19937& rng, float stddev = 1.0f, float mean = 0.0f) {
  std::normal_distribution<float> d(mean, stddev);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

inline std::vector<float> uniform(size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

inline std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

inline std::vector<float> nans(size_t n) { return std::vector<float>(n, std::numeric_limits<float>::quiet_NaN()); }

inline double max_abs(const std::vector<double>& v) {
  double m = 0.0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

// |got[i] - want[i]| <= rtol * max|want| for every i (see the note on tolerances above).
inline void expect_close(const float* got, const std::vector<double>& want, double rtol, const std::string& what) {
  const double scale = std::max(max_abs(want), 1e-30);
  double worst = -1.0;
  size_t worst_i = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    double err = std::abs(static_cast<double>(got[i]) - want[i]);
    if (std::isnan(err)) err = std::numeric_limits<double>::infinity();  // NaN is the worst error
    if (err > worst) {
      worst = err;
      worst_i = i;
    }
  }
  EXPECT_LE(worst, rtol * scale) << what << ": worst element " << worst_i << " got " << got[worst_i] << " want "
                                 << want[worst_i] << " (scale " << scale << ", relative error " << worst / scale
                                 << ", tolerance " << rtol << ")";
}

inline void expect_close(const std::vector<float>& got, const std::vector<double>& want, double rtol,
                         const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  expect_close(got.data(), want, rtol, what);
}

// d loss / d p[i] for every i by central differences: p[i] is perturbed in place and restored.
inline std::vector<double> numeric_grad(const std::function<double()>& loss, std::vector<double>& p,
                                        double eps = 1e-6) {
  std::vector<double> g(p.size());
  for (size_t i = 0; i < p.size(); ++i) {
    const double keep = p[i];
    p[i] = keep + eps;
    const double up = loss();
    p[i] = keep - eps;
    const double down = loss();
    p[i] = keep;
    g[i] = (up - down) / (2.0 * eps);
  }
  return g;
}

// The random projection of an output that finite-difference checks differentiate: sum(r * y).
inline double project(const std::vector<double>& r, const std::vector<double>& y) {
  double s = 0.0;
  for (size_t i = 0; i < y.size(); ++i) s += r[i] * y[i];
  return s;
}

// Forward comparisons: dot products of up to a few hundred fp32 terms; observed worst 3.2e-7
// (K = 301 GEMM), ~5 u. 5e-6 leaves a margin for other BLAS kernels' summation orders.
constexpr double kForwardTol = 5e-6;
// Backward vs finite differences: the fp32 backward's reductions (tens of terms); observed worst
// 2e-7. 1e-5 is 100x tighter than the 1e-3 a wrong-but-close formula could hide behind.
constexpr double kGradTol = 1e-5;

}  // namespace laoyao::kernels::cpu::test
