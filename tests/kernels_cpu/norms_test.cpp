// LayerNorm and RMSNorm against naive fp64 twins and finite differences, both gamma conventions.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/cpu/ops.hpp"
#include "test_util.hpp"

namespace laoyao::kernels::cpu::test {
namespace {

constexpr float kEps = 1e-5f;  // Megatron's layernorm_epsilon default

// fp64 twin of torch.nn.LayerNorm (biased variance) with Megatron's optional (1 + gamma).
std::vector<double> layernorm_twin(const std::vector<double>& x, const std::vector<double>& gamma,
                                   const std::vector<double>& beta, int64_t T, int64_t C, bool zc) {
  std::vector<double> y(T * C);
  for (int64_t t = 0; t < T; ++t) {
    double mean = 0.0, var = 0.0;
    for (int64_t c = 0; c < C; ++c) mean += x[t * C + c];
    mean /= C;
    for (int64_t c = 0; c < C; ++c) var += (x[t * C + c] - mean) * (x[t * C + c] - mean);
    var /= C;
    for (int64_t c = 0; c < C; ++c)
      y[t * C + c] = (x[t * C + c] - mean) / std::sqrt(var + kEps) * (zc ? 1.0 + gamma[c] : gamma[c]) + beta[c];
  }
  return y;
}

// fp64 twin of torch.nn.RMSNorm.
std::vector<double> rmsnorm_twin(const std::vector<double>& x, const std::vector<double>& gamma, int64_t T,
                                 int64_t C, bool zc) {
  std::vector<double> y(T * C);
  for (int64_t t = 0; t < T; ++t) {
    double ms = 0.0;
    for (int64_t c = 0; c < C; ++c) ms += x[t * C + c] * x[t * C + c];
    ms /= C;
    for (int64_t c = 0; c < C; ++c) y[t * C + c] = x[t * C + c] / std::sqrt(ms + kEps) * (zc ? 1.0 + gamma[c] : gamma[c]);
  }
  return y;
}

// Inputs with per-row offsets and spreads (one row far from zero mean, one with a small spread) so
// the statistics matter; gamma near its convention's identity but not equal to it.
std::vector<float> norm_input(int64_t T, int64_t C, std::mt19937& rng) {
  auto x = randn(T * C, rng);
  for (int64_t c = 0; c < C; ++c) {
    x[1 * C + c] = x[1 * C + c] * 0.5f + 6.0f;
    x[2 * C + c] *= 0.05f;
  }
  return x;
}

std::vector<float> gamma_for(bool zc, int64_t C, std::mt19937& rng) {
  return zc ? randn(C, rng, 0.3f) : randn(C, rng, 0.3f, 1.0f);
}

class NormTest : public ::testing::TestWithParam<bool> {};  // param: zero_centered_gamma
INSTANTIATE_TEST_SUITE_P(Gamma, NormTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "ZeroCentered" : "Plain"; });

TEST_P(NormTest, LayerNormForwardMatchesFp64Twin) {
  const bool zc = GetParam();
  std::mt19937 rng(201);
  const int64_t T = 7, C = 13;
  auto x = norm_input(T, C, rng), g = gamma_for(zc, C, rng), b = randn(C, rng, 0.5f);
  auto y = nans(T * C), mean = nans(T), rstd = nans(T);
  layernorm_forward(x.data(), g.data(), b.data(), y.data(), mean.data(), rstd.data(), T, C, kEps, zc);
  expect_close(y, layernorm_twin(to_double(x), to_double(g), to_double(b), T, C, zc), kForwardTol, "y");
  std::vector<double> want_mean(T), want_rstd(T);
  for (int64_t t = 0; t < T; ++t) {
    double m = 0.0, v = 0.0;
    for (int64_t c = 0; c < C; ++c) m += x[t * C + c];
    m /= C;
    for (int64_t c = 0; c < C; ++c) v += (x[t * C + c] - m) * (x[t * C + c] - m);
    want_mean[t] = m;
    want_rstd[t] = 1.0 / std::sqrt(v / C + kEps);
  }
  // mean and rstd are double sums rounded once to fp32: one rounding (relative to the row's own value).
  for (int64_t t = 0; t < T; ++t) {
    EXPECT_NEAR(mean[t], want_mean[t], 1e-7 * std::abs(want_mean[t]) + 1e-7) << "mean " << t;
    EXPECT_NEAR(rstd[t], want_rstd[t], 1e-7 * want_rstd[t]) << "rstd " << t;
  }
}

TEST_P(NormTest, LayerNormBackwardMatchesFiniteDifferences) {
  const bool zc = GetParam();
  std::mt19937 rng(202);
  const int64_t T = 7, C = 13;
  auto x = norm_input(T, C, rng), g = gamma_for(zc, C, rng), b = randn(C, rng, 0.5f), r = randn(T * C, rng);
  std::vector<float> y(T * C), mean(T), rstd(T);
  layernorm_forward(x.data(), g.data(), b.data(), y.data(), mean.data(), rstd.data(), T, C, kEps, zc);
  auto dx = nans(T * C);
  std::vector<float> dg(C, 0.0f), db(C, 0.0f);
  layernorm_backward(r.data(), x.data(), g.data(), mean.data(), rstd.data(), dx.data(), dg.data(), db.data(), T, C,
                     zc);

  auto xd = to_double(x), gd = to_double(g), bd = to_double(b);
  const auto rd = to_double(r);
  auto loss = [&] { return project(rd, layernorm_twin(xd, gd, bd, T, C, zc)); };
  expect_close(dx, numeric_grad(loss, xd), kGradTol, "dx");
  expect_close(dg, numeric_grad(loss, gd), kGradTol, "dgamma");
  expect_close(db, numeric_grad(loss, bd), kGradTol, "dbeta");

  // Second call: parameter grads accumulate (double), dx is overwritten (same value).
  const auto dx1 = dx;
  auto dg2 = to_double(dg), db2 = to_double(db);
  for (auto& v : dg2) v *= 2;
  for (auto& v : db2) v *= 2;
  layernorm_backward(r.data(), x.data(), g.data(), mean.data(), rstd.data(), dx.data(), dg.data(), db.data(), T, C,
                     zc);
  EXPECT_EQ(dx, dx1);
  expect_close(dg, dg2, 1e-6, "dgamma after two calls");
  expect_close(db, db2, 1e-6, "dbeta after two calls");
}

TEST_P(NormTest, RmsNormForwardMatchesFp64Twin) {
  const bool zc = GetParam();
  std::mt19937 rng(203);
  const int64_t T = 7, C = 13;
  auto x = norm_input(T, C, rng), g = gamma_for(zc, C, rng);
  auto y = nans(T * C), rstd = nans(T);
  rmsnorm_forward(x.data(), g.data(), y.data(), rstd.data(), T, C, kEps, zc);
  expect_close(y, rmsnorm_twin(to_double(x), to_double(g), T, C, zc), kForwardTol, "y");
  for (int64_t t = 0; t < T; ++t) {
    double ms = 0.0;
    for (int64_t c = 0; c < C; ++c) ms += static_cast<double>(x[t * C + c]) * x[t * C + c];
    const double want = 1.0 / std::sqrt(ms / C + kEps);
    EXPECT_NEAR(rstd[t], want, 1e-7 * want) << "rstd " << t;
  }
}

TEST_P(NormTest, RmsNormBackwardMatchesFiniteDifferences) {
  const bool zc = GetParam();
  std::mt19937 rng(204);
  const int64_t T = 7, C = 13;
  auto x = norm_input(T, C, rng), g = gamma_for(zc, C, rng), r = randn(T * C, rng);
  std::vector<float> y(T * C), rstd(T);
  rmsnorm_forward(x.data(), g.data(), y.data(), rstd.data(), T, C, kEps, zc);
  auto dx = nans(T * C);
  std::vector<float> dg(C, 0.0f);
  rmsnorm_backward(r.data(), x.data(), g.data(), rstd.data(), dx.data(), dg.data(), T, C, zc);

  auto xd = to_double(x), gd = to_double(g);
  const auto rd = to_double(r);
  auto loss = [&] { return project(rd, rmsnorm_twin(xd, gd, T, C, zc)); };
  expect_close(dx, numeric_grad(loss, xd), kGradTol, "dx");
  expect_close(dg, numeric_grad(loss, gd), kGradTol, "dgamma");

  const auto dx1 = dx;
  auto dg2 = to_double(dg);
  for (auto& v : dg2) v *= 2;
  rmsnorm_backward(r.data(), x.data(), g.data(), rstd.data(), dx.data(), dg.data(), T, C, zc);
  EXPECT_EQ(dx, dx1);
  expect_close(dg, dg2, 1e-6, "dgamma after two calls");
}

// (1 + gamma) really is applied: a zero stored gamma with zero_centered_gamma normalises to unit
// scale, while the plain convention multiplies by zero.
TEST(Norms, ZeroCenteredGammaUsesOnePlusGamma) {
  std::mt19937 rng(205);
  const int64_t T = 3, C = 5;
  auto x = randn(T * C, rng);
  std::vector<float> zero(C, 0.0f), y1(T * C), y0(T * C), mean(T), rstd(T);
  layernorm_forward(x.data(), zero.data(), zero.data(), y1.data(), mean.data(), rstd.data(), T, C, kEps, true);
  layernorm_forward(x.data(), zero.data(), zero.data(), y0.data(), mean.data(), rstd.data(), T, C, kEps, false);
  for (int64_t i = 0; i < T * C; ++i) {
    EXPECT_EQ(y0[i], 0.0f);
    EXPECT_FLOAT_EQ(y1[i], (x[i] - mean[i / C]) * rstd[i / C]);
  }
}

}  // namespace
}  // namespace laoyao::kernels::cpu::test
