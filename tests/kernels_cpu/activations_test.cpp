// GeLU (Megatron's bias_gelu tanh form and exact erf GeLU) and SwiGLU against fp64 twins and
// finite differences.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/cpu/ops.hpp"
#include "test_util.hpp"

namespace laoyao::kernels::cpu::test {
namespace {

// fp64 twins. The tanh form keeps Megatron's constants (0.79788456, 0.044715), not the exact
// sqrt(2/pi), so that the twin is Megatron's function evaluated without rounding.
double gelu_twin(double x, Gelu kind) {
  if (kind == Gelu::Tanh) return x * 0.5 * (1.0 + std::tanh(0.79788456 * x * (1.0 + 0.044715 * x * x)));
  return x * 0.5 * (1.0 + std::erf(x / std::sqrt(2.0)));
}
double silu(double v) { return v / (1.0 + std::exp(-v)); }

std::vector<float> gelu_inputs(std::mt19937& rng) {
  auto x = randn(41, rng, 2.5f);
  // the tails and the neighbourhood of zero, where the forms and their slopes change character
  for (float v : {-9.5f, -4.0f, -1e-3f, 3e-4f, 4.5f, 11.0f}) x.push_back(v);
  return x;
}

class GeluTest : public ::testing::TestWithParam<Gelu> {};
INSTANTIATE_TEST_SUITE_P(Kind, GeluTest, ::testing::Values(Gelu::Tanh, Gelu::Erf),
                         [](const auto& info) { return info.param == Gelu::Tanh ? "Tanh" : "Erf"; });

TEST_P(GeluTest, ForwardMatchesFp64Twin) {
  std::mt19937 rng(301);
  const auto x = gelu_inputs(rng);
  const int64_t n = static_cast<int64_t>(x.size());
  auto y = nans(n);
  gelu_forward(x.data(), y.data(), n, GetParam());
  // Elementwise: a few fp32 roundings of the element's own value (plus 1 ulp of O(1) for the
  // 1 + tanh/erf cancellation in the negative tail).
  for (int64_t i = 0; i < n; ++i) {
    const double want = gelu_twin(x[i], GetParam());
    EXPECT_NEAR(y[i], want, 4e-7 * (std::abs(want) + std::abs(x[i]) * 0.5)) << "x = " << x[i];
  }
}

TEST_P(GeluTest, BackwardMatchesFiniteDifferences) {
  std::mt19937 rng(302);
  const auto x = gelu_inputs(rng);
  const int64_t n = static_cast<int64_t>(x.size());
  const auto r = randn(n, rng);
  auto dx = nans(n);
  gelu_backward(x.data(), r.data(), dx.data(), n, GetParam());
  auto xd = to_double(x);
  const auto rd = to_double(r);
  auto loss = [&] {
    std::vector<double> y(n);
    for (int64_t i = 0; i < n; ++i) y[i] = gelu_twin(xd[i], GetParam());
    return project(rd, y);
  };
  // Megatron's tanh backward uses 0.1070322243 for 3*0.044715*0.79788456 (equal to 1e-10): it is
  // the derivative of the forward, so finite differences apply to both forms.
  expect_close(dx, numeric_grad(loss, xd), kGradTol, "dx");

  // dx is overwritten, not accumulated.
  const auto dx1 = dx;
  gelu_backward(x.data(), r.data(), dx.data(), n, GetParam());
  EXPECT_EQ(dx, dx1);
}

// The two forms are not swapped: known values at x = 1 (tanh form with Megatron's constants
// 0.8411919906; exact 1 * Phi(1) = 0.8413447461) differ by 1.5e-4, far above fp32 rounding.
TEST(Gelu, TanhAndErfFormsAtOne) {
  const float one = 1.0f;
  float yt = 0, ye = 0;
  gelu_forward(&one, &yt, 1, Gelu::Tanh);
  gelu_forward(&one, &ye, 1, Gelu::Erf);
  EXPECT_NEAR(yt, 0.8411919906, 2e-7);
  EXPECT_NEAR(ye, 0.8413447461, 2e-7);
}

// Megatron's bias_gelu_back formula literally, at fp64, against the op's fp32 backward.
TEST(Gelu, TanhBackwardIsMegatronsFormula) {
  std::mt19937 rng(303);
  const auto x = gelu_inputs(rng);
  const int64_t n = static_cast<int64_t>(x.size());
  const auto g = randn(n, rng);
  std::vector<float> dx(n);
  gelu_backward(x.data(), g.data(), dx.data(), n, Gelu::Tanh);
  for (int64_t i = 0; i < n; ++i) {
    const double v = x[i];
    const double t = std::tanh(0.79788456 * v * (1 + 0.044715 * v * v));
    const double ff = 0.5 * v * ((1 - t * t) * (0.79788456 + 0.1070322243 * v * v)) + 0.5 * (1 + t);
    EXPECT_NEAR(dx[i], ff * g[i], 1e-6 * (std::abs(ff * g[i]) + std::abs(g[i]))) << "x = " << v;
  }
}

// fp64 twin of Megatron's swiglu: chunk(x, 2, -1) = (gate, linear); silu(gate) * linear.
std::vector<double> swiglu_twin(const std::vector<double>& x, int64_t T, int64_t F) {
  std::vector<double> y(T * F);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t f = 0; f < F; ++f) y[t * F + f] = silu(x[t * 2 * F + f]) * x[t * 2 * F + F + f];
  return y;
}

TEST(SwiGlu, ForwardMatchesFp64Twin) {
  std::mt19937 rng(304);
  const int64_t T = 7, F = 5;
  auto x = randn(T * 2 * F, rng, 2.0f);
  auto y = nans(T * F);
  swiglu_forward(x.data(), y.data(), T, F);
  expect_close(y, swiglu_twin(to_double(x), T, F), kForwardTol, "y");
}

TEST(SwiGlu, BackwardMatchesFiniteDifferences) {
  std::mt19937 rng(305);
  const int64_t T = 7, F = 5;
  auto x = randn(T * 2 * F, rng, 2.0f);
  const auto r = randn(T * F, rng);
  auto dx = nans(T * 2 * F);
  swiglu_backward(x.data(), r.data(), dx.data(), T, F);
  auto xd = to_double(x);
  const auto rd = to_double(r);
  expect_close(dx, numeric_grad([&] { return project(rd, swiglu_twin(xd, T, F)); }, xd), kGradTol, "dx");
  const auto dx1 = dx;
  swiglu_backward(x.data(), r.data(), dx.data(), T, F);
  EXPECT_EQ(dx, dx1);  // overwritten
}

// Megatron's layout: the FIRST half of each token's fc1 output is the gate (through silu), the
// second half the linear part. With the linear half all ones, y = silu(first half).
TEST(SwiGlu, FirstHalfIsTheGate) {
  std::mt19937 rng(306);
  const int64_t T = 3, F = 4;
  auto x = randn(T * 2 * F, rng);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t f = 0; f < F; ++f) x[t * 2 * F + F + f] = 1.0f;
  std::vector<float> y(T * F);
  swiglu_forward(x.data(), y.data(), T, F);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t f = 0; f < F; ++f) EXPECT_NEAR(y[t * F + f], silu(x[t * 2 * F + f]), 1e-6) << t << "," << f;
}

}  // namespace
}  // namespace laoyao::kernels::cpu::test
