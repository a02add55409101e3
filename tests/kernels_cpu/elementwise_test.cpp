// Elementwise helpers against fp64 twins; bias_grad_accumulate as the backward of add_bias_inplace
// by finite differences.
#include <gtest/gtest.h>

#include "kernels/cpu/ops.hpp"
#include "test_util.hpp"

namespace laoyao::kernels::cpu::test {
namespace {

TEST(Elementwise, AddInplace) {
  std::mt19937 rng(701);
  const int64_t n = 1031;
  auto y = randn(n, rng);
  const auto x = randn(n, rng), y0 = y;
  add_inplace(y.data(), x.data(), n);
  std::vector<double> want(n);
  for (int64_t i = 0; i < n; ++i) want[i] = static_cast<double>(y0[i]) + x[i];
  expect_close(y, want, 1e-7, "y + x");  // one rounding
}

std::vector<double> add_bias_twin(const std::vector<double>& y, const std::vector<double>& b, int64_t T, int64_t C) {
  std::vector<double> out(y);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c) out[t * C + c] += b[c];
  return out;
}

TEST(Elementwise, AddBiasInplace) {
  std::mt19937 rng(702);
  const int64_t T = 7, C = 13;
  auto y = randn(T * C, rng);
  const auto b = randn(C, rng), y0 = y;
  add_bias_inplace(y.data(), b.data(), T, C);
  expect_close(y, add_bias_twin(to_double(y0), to_double(b), T, C), 1e-7, "y + bias");
}

TEST(Elementwise, BiasGradIsAddBiasBackwardAndAccumulates) {
  std::mt19937 rng(703);
  const int64_t T = 7, C = 13;
  const auto y = randn(T * C, rng), r = randn(T * C, rng);
  auto bd = to_double(randn(C, rng));
  const auto yd = to_double(y), rd = to_double(r);
  const auto fd = numeric_grad([&] { return project(rd, add_bias_twin(yd, bd, T, C)); }, bd);
  const auto start = randn(C, rng);  // a non-zero starting gradient: += keeps it
  auto db = start;
  bias_grad_accumulate(r.data(), db.data(), T, C);
  std::vector<double> want(C);
  for (int64_t c = 0; c < C; ++c) want[c] = start[c] + fd[c];
  expect_close(db, want, kGradTol, "start + dbias");
  for (int64_t c = 0; c < C; ++c) want[c] += fd[c];
  bias_grad_accumulate(r.data(), db.data(), T, C);
  expect_close(db, want, kGradTol, "start + 2 dbias");
}

}  // namespace
}  // namespace laoyao::kernels::cpu::test
