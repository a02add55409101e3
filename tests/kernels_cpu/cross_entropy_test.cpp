// Cross entropy over all V logits (Megatron's vocab-parallel CE at TP = 1) against an fp64 twin,
// finite differences, and its invariants.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.hpp"
#include "kernels/cpu/ops.hpp"
#include "test_util.hpp"

namespace laoyao::kernels::cpu::test {
namespace {

// fp64 twin: loss[t] = log(sum_j exp(z_j - max)) - (z_target - max).
std::vector<double> ce_twin(const std::vector<double>& z, const std::vector<int64_t>& targets, int64_t T, int64_t V,
                            std::vector<double>* lse = nullptr) {
  std::vector<double> loss(T);
  if (lse) lse->assign(T, 0.0);
  for (int64_t t = 0; t < T; ++t) {
    double m = z[t * V];
    for (int64_t j = 1; j < V; ++j) m = std::max(m, z[t * V + j]);
    double s = 0.0;
    for (int64_t j = 0; j < V; ++j) s += std::exp(z[t * V + j] - m);
    loss[t] = std::log(s) - (z[t * V + targets[t]] - m);
    if (lse) (*lse)[t] = m + std::log(s);
  }
  return loss;
}

std::vector<int64_t> random_targets(int64_t T, int64_t V, std::mt19937& rng) {
  std::uniform_int_distribution<int64_t> d(0, V - 1);
  std::vector<int64_t> t(T);
  for (auto& x : t) x = d(rng);
  t[0] = V - 1;  // the last (padding-like) column is an ordinary class
  return t;
}

// Logits with rows far from zero: without max subtraction exp would overflow fp32 (row 1) or
// underflow to a zero sum (row 2).
std::vector<float> ce_logits(int64_t T, int64_t V, std::mt19937& rng) {
  auto z = randn(T * V, rng, 2.0f);
  for (int64_t j = 0; j < V; ++j) {
    z[1 * V + j] += 120.0f;
    z[2 * V + j] -= 150.0f;
  }
  return z;
}

TEST(CrossEntropy, ForwardMatchesFp64Twin) {
  std::mt19937 rng(501);
  const int64_t T = 7, V = 37;
  const auto z = ce_logits(T, V, rng);
  const auto targets = random_targets(T, V, rng);
  auto loss = nans(T), lse = nans(T);
  cross_entropy_forward(z.data(), targets.data(), loss.data(), lse.data(), T, V);
  std::vector<double> want_lse;
  const auto want = ce_twin(to_double(z), targets, T, V, &want_lse);
  // The loss is formed from max-subtracted logits: error relative to the loss scale, not to |z|.
  expect_close(loss, want, kForwardTol, "loss");
  // lse is max + log(sum) rounded to fp32 once: one rounding of its own value.
  for (int64_t t = 0; t < T; ++t) EXPECT_NEAR(lse[t], want_lse[t], 1e-7 * std::abs(want_lse[t]) + 1e-7) << t;
}

TEST(CrossEntropy, BackwardMatchesFiniteDifferences) {
  std::mt19937 rng(502);
  const int64_t T = 7, V = 37;
  const auto z = ce_logits(T, V, rng);
  const auto targets = random_targets(T, V, rng);
  const auto dloss = randn(T, rng);
  std::vector<float> loss(T), lse(T);
  cross_entropy_forward(z.data(), targets.data(), loss.data(), lse.data(), T, V);
  auto grad = z;  // backward writes the gradient in place of the logits
  cross_entropy_backward(grad.data(), targets.data(), lse.data(), dloss.data(), T, V);
  auto zd = to_double(z);
  const auto dd = to_double(dloss);
  // Rows with |logits| ~ 150 carry the fp32 rounding of the saved lse (up to 150 * 6e-8 = 9e-6
  // absolute) into exp(z - lse): up to ~1e-5 relative in each probability, so 2x the usual tolerance.
  expect_close(grad, numeric_grad([&] { return project(dd, ce_twin(zd, targets, T, V)); }, zd), 2 * kGradTol,
               "dlogits");
}

TEST(CrossEntropy, EqualLogitsGiveLogV) {
  for (const float value : {0.0f, 3.25f, -77.0f, 1000.0f}) {
    const int64_t T = 3, V = 50257;  // GPT-2's vocabulary: log(V) = 10.8249...
    std::vector<float> z(T * V, value), loss(T), lse(T);
    const std::vector<int64_t> targets{0, 17, V - 1};
    cross_entropy_forward(z.data(), targets.data(), loss.data(), lse.data(), T, V);
    for (int64_t t = 0; t < T; ++t) {
      EXPECT_NEAR(loss[t], std::log(static_cast<double>(V)), 1e-6) << "logit value " << value;
      EXPECT_NEAR(lse[t], value + std::log(static_cast<double>(V)), 1e-6 * (std::abs(value) + 11)) << value;
    }
  }
}

TEST(CrossEntropy, GradientRowsSumToZero) {
  std::mt19937 rng(503);
  const int64_t T = 5, V = 1001;
  const auto z = ce_logits(T, V, rng);
  const auto targets = random_targets(T, V, rng);
  const auto dloss = uniform(T, rng, 0.5f, 2.0f);
  std::vector<float> loss(T), lse(T);
  cross_entropy_forward(z.data(), targets.data(), loss.data(), lse.data(), T, V);
  auto grad = z;
  cross_entropy_backward(grad.data(), targets.data(), lse.data(), dloss.data(), T, V);
  for (int64_t t = 0; t < T; ++t) {
    double sum = 0.0, abs_sum = 0.0;
    for (int64_t j = 0; j < V; ++j) {
      sum += grad[t * V + j];
      abs_sum += std::abs(grad[t * V + j]);
    }
    // sum(softmax) - 1 = 0: what remains is the fp32 rounding of the probabilities (relative 1e-6
    // as above, incl. lse's rounding for the offset rows) times their total mass dloss.
    EXPECT_NEAR(sum, 0.0, 2e-5 * dloss[t]) << "row " << t;
    EXPECT_LT(grad[t * V + targets[t]], 0.0f);  // the target's logit is pushed up
    EXPECT_NEAR(abs_sum, 2.0 * dloss[t] * (1.0 - std::exp(-loss[t])), 1e-4 * dloss[t]);  // |p-1| + sum others
  }
}

TEST(CrossEntropy, OutOfRangeTargetThrows) {
  const int64_t T = 2, V = 4;
  std::vector<float> z(T * V, 0.5f), loss(T), lse(T);
  const std::vector<int64_t> bad{1, 4};
  EXPECT_THROW(cross_entropy_forward(z.data(), bad.data(), loss.data(), lse.data(), T, V), laoyao::Error);
  const std::vector<int64_t> neg{-1, 0};
  EXPECT_THROW(cross_entropy_forward(z.data(), neg.data(), loss.data(), lse.data(), T, V), laoyao::Error);
}

}  // namespace
}  // namespace laoyao::kernels::cpu::test
