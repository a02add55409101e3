// linear_forward / linear_backward against a naive fp64 twin and finite differences.
#include <gtest/gtest.h>

#include "core/fp8_scaling.hpp"
#include "kernels/cpu/ops.hpp"
#include "test_util.hpp"

namespace laoyao::kernels::cpu::test {
namespace {

// fp64 twin: y[t,n] = sum_k x[t,k] w[n,k] (+ b[n]).
std::vector<double> linear_twin(const std::vector<double>& x, const std::vector<double>& w,
                                const std::vector<double>* b, int64_t T, int64_t K, int64_t N) {
  std::vector<double> y(T * N);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) {
      double s = b ? (*b)[n] : 0.0;
      for (int64_t k = 0; k < K; ++k) s += x[t * K + k] * w[n * K + k];
      y[t * N + n] = s;
    }
  return y;
}

TEST(Linear, ForwardMatchesFp64Twin) {
  std::mt19937 rng(101);
  for (bool with_bias : {true, false}) {
    const int64_t T = 7, K = 13, N = 11;
    auto x = randn(T * K, rng), w = randn(N * K, rng), b = randn(N, rng);
    auto y = nans(T * N);
    linear_forward(x.data(), w.data(), with_bias ? b.data() : nullptr, y.data(), T, K, N);
    const auto bd = to_double(b);
    expect_close(y, linear_twin(to_double(x), to_double(w), with_bias ? &bd : nullptr, T, K, N), kForwardTol,
                 with_bias ? "y (bias)" : "y (no bias)");
  }
}

TEST(Linear, BackwardMatchesFiniteDifferences) {
  std::mt19937 rng(102);
  const int64_t T = 7, K = 13, N = 11;
  auto x = randn(T * K, rng), w = randn(N * K, rng), b = randn(N, rng), r = randn(T * N, rng);
  auto xd = to_double(x), wd = to_double(w), bd = to_double(b);
  const auto rd = to_double(r);
  auto loss = [&] { return project(rd, linear_twin(xd, wd, &bd, T, K, N)); };

  auto dx = nans(T * K);  // overwritten: stale NaNs must not survive
  std::vector<float> dw(N * K, 0.0f), db(N, 0.0f);
  linear_backward(x.data(), w.data(), r.data(), dx.data(), dw.data(), db.data(), T, K, N);
  expect_close(dx, numeric_grad(loss, xd), kGradTol, "dx");
  expect_close(dw, numeric_grad(loss, wd), kGradTol, "dw");
  expect_close(db, numeric_grad(loss, bd), kGradTol, "dbias");
}

TEST(Linear, BackwardAccumulatesParamGradsAndOverwritesInputGrad) {
  std::mt19937 rng(103);
  const int64_t T = 5, K = 9, N = 6;
  auto x = randn(T * K, rng), w = randn(N * K, rng), dy = randn(T * N, rng);
  std::vector<float> dx(T * K), dw(N * K, 0.0f), db(N, 0.0f);
  linear_backward(x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data(), T, K, N);
  const auto dx1 = dx, dw1 = dw, db1 = db;
  linear_backward(x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data(), T, K, N);
  EXPECT_EQ(dx, dx1);  // overwritten with the same value, not doubled
  std::vector<double> dw2(dw1.begin(), dw1.end()), db2(db1.begin(), db1.end());
  for (auto& v : dw2) v *= 2;
  for (auto& v : db2) v *= 2;
  expect_close(dw, dw2, 1e-6, "dw after two calls = 2 x dw");
  expect_close(db, db2, 1e-6, "dbias after two calls = 2 x dbias");
}

TEST(Linear, NullGradPointersAreSkipped) {
  std::mt19937 rng(104);
  const int64_t T = 4, K = 3, N = 5;
  auto x = randn(T * K, rng), w = randn(N * K, rng), dy = randn(T * N, rng);
  std::vector<float> dw(N * K, 0.0f);
  linear_backward(x.data(), w.data(), dy.data(), nullptr, dw.data(), nullptr, T, K, N);
  std::vector<double> want(N * K, 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k)
      for (int64_t t = 0; t < T; ++t) want[n * K + k] += static_cast<double>(dy[t * N + n]) * x[t * K + k];
  expect_close(dw, want, kForwardTol, "dw alone");
}

// Sizes past OpenBLAS's small-matrix path (blocked, multi-threaded GEMM): checked against the
// analytic fp64 gradients (finite differences would need too many evaluations here).
TEST(Linear, LargerShapesMatchFp64Twin) {
  std::mt19937 rng(105);
  const int64_t T = 67, K = 301, N = 45;
  auto x = randn(T * K, rng), w = randn(N * K, rng, 0.05f), b = randn(N, rng), dy = randn(T * N, rng);
  const auto xd = to_double(x), wd = to_double(w), bd = to_double(b), dyd = to_double(dy);
  std::vector<float> y(T * N);
  linear_forward(x.data(), w.data(), b.data(), y.data(), T, K, N);
  expect_close(y, linear_twin(xd, wd, &bd, T, K, N), kForwardTol, "y");

  auto dx = nans(T * K);
  std::vector<float> dw(N * K, 0.0f), db(N, 0.0f);
  linear_backward(x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data(), T, K, N);
  std::vector<double> dxw(T * K, 0.0), dww(N * K, 0.0), dbw(N, 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) {
      dbw[n] += dyd[t * N + n];
      for (int64_t k = 0; k < K; ++k) {
        dxw[t * K + k] += dyd[t * N + n] * wd[n * K + k];
        dww[n * K + k] += dyd[t * N + n] * xd[t * K + k];
      }
    }
  expect_close(dx, dxw, kForwardTol, "dx");
  expect_close(dw, dww, kForwardTol, "dw");
  expect_close(db, dbw, kForwardTol, "dbias");
}

// A LoRA adapter's GEMMs: y += alpha * x w^T, and its scaled backward (dw accumulated, dx
// overwritten or accumulated, dx aliasing x).
TEST(Linear, AccumulateAddsTheScaledProduct) {
  std::mt19937 rng(106);
  const int64_t T = 6, K = 5, N = 9;
  const float alpha = 0.625f;
  auto x = randn(T * K, rng), w = randn(N * K, rng), y = randn(T * N, rng);
  std::vector<double> want = linear_twin(to_double(x), to_double(w), nullptr, T, K, N);
  for (size_t i = 0; i < want.size(); ++i) want[i] = y[i] + alpha * want[i];
  linear_accumulate(x.data(), w.data(), y.data(), T, K, N, alpha);
  expect_close(y, want, kForwardTol, "y + alpha x w^T");
}

TEST(Linear, ScaledBackwardMatchesFiniteDifferences) {
  std::mt19937 rng(107);
  const int64_t T = 6, K = 5, N = 9;
  const float alpha = 1.75f;
  auto x = randn(T * K, rng), w = randn(N * K, rng), r = randn(T * N, rng);
  auto xd = to_double(x), wd = to_double(w);
  const auto rd = to_double(r);
  auto loss = [&] {
    std::vector<double> y = linear_twin(xd, wd, nullptr, T, K, N);
    for (auto& v : y) v *= alpha;
    return project(rd, y);
  };
  const std::vector<double> want_dx = numeric_grad(loss, xd), want_dw = numeric_grad(loss, wd);
  for (bool accumulate : {false, true}) {
    SCOPED_TRACE(accumulate);
    auto dx = accumulate ? randn(T * K, rng) : nans(T * K);
    std::vector<double> want = want_dx;
    if (accumulate)
      for (size_t i = 0; i < want.size(); ++i) want[i] += dx[i];
    auto dw = randn(N * K, rng);
    std::vector<double> want_w = want_dw;
    for (size_t i = 0; i < want_w.size(); ++i) want_w[i] += dw[i];
    linear_backward_scaled(x.data(), w.data(), r.data(), dx.data(), dw.data(), T, K, N, alpha, accumulate);
    expect_close(dx, want, kGradTol, "dx");
    expect_close(dw, want_w, kGradTol, "dw");
  }
  // dx in x's place: dw is taken from x first.
  auto inplace = x;
  std::vector<float> dw(N * K, 0.0f);
  linear_backward_scaled(inplace.data(), w.data(), r.data(), inplace.data(), dw.data(), T, K, N, alpha, false);
  expect_close(inplace, want_dx, kGradTol, "dx over x");
  expect_close(dw, want_dw, kGradTol, "dw with dx over x");
}

// The FP8 linear layer's three GEMMs against fp64 over the same FP8 values: random operands cast
// with their own scales (the forward's E4M3 x E4M3, the gradients' E5M2 output gradient), the
// dequantization factors applied after the sums; dw accumulates, dx is overwritten. The weight
// gradient reads its own cast of the output gradient (block scaling's along the tokens; here E4M3).
TEST(Fp8Linear, GemmsEqualFp64OverTheSameFp8Values) {
  std::mt19937 rng(104);
  const int64_t T = 16, K = 48, N = 32;
  auto x = randn(T * K, rng, 2.0f), w = randn(N * K, rng, 0.05f), dy = randn(T * N, rng, 1e-3f), b = randn(N, rng);
  auto cast = [](const std::vector<float>& v, Fp8Format f, std::vector<float>& q) {
    const float scale = current_scaling_scale(fp8_amax(v.data(), static_cast<int64_t>(v.size())), f);
    q.resize(v.size());
    fp8_quantize_values(v.data(), static_cast<int64_t>(v.size()), scale, f, q.data());
    return Fp8Operand{q.data(), 1.0f / scale};
  };
  std::vector<float> qx, qw, qdy, qdy_t;
  const Fp8Operand ox = cast(x, Fp8Format::E4M3, qx), ow = cast(w, Fp8Format::E4M3, qw),
                   ody = cast(dy, Fp8Format::E5M2, qdy), ody_t = cast(dy, Fp8Format::E4M3, qdy_t);
  ASSERT_NE(qdy, qdy_t);
  auto y = nans(T * N);
  fp8_linear_forward(ox, ow, b.data(), y.data(), T, K, N);
  auto dx = nans(T * K);
  auto dw = randn(N * K, rng);
  const auto dw0 = dw;
  fp8_linear_backward(ox, ow, {ody, ody_t}, dx.data(), dw.data(), T, K, N);

  const double sx = ox.scale_inv, sw = ow.scale_inv, sdy = ody.scale_inv, sdy_t = ody_t.scale_inv;
  std::vector<double> want_y(T * N), want_dx(T * K), want_dw(N * K), exact_y(T * N);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0, exact = 0;
      for (int64_t k = 0; k < K; ++k) acc += double(qx[t * K + k]) * qw[n * K + k], exact += double(x[t * K + k]) * w[n * K + k];
      want_y[t * N + n] = sx * sw * acc + b[n];
      exact_y[t * N + n] = exact + b[n];
    }
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < K; ++k) {
      double acc = 0;
      for (int64_t n = 0; n < N; ++n) acc += double(qdy[t * N + n]) * qw[n * K + k];
      want_dx[t * K + k] = sdy * sw * acc;
    }
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      double acc = 0;
      for (int64_t t = 0; t < T; ++t) acc += double(qdy_t[t * N + n]) * qx[t * K + k];
      want_dw[n * K + k] = dw0[n * K + k] + sdy_t * sx * acc;
    }
  expect_close(y, want_y, kForwardTol, "y");
  expect_close(dx, want_dx, kForwardTol, "dx");
  expect_close(dw, want_dw, kForwardTol, "dw (accumulated)");
  // The operands were FP8's, not the inputs as they were: the result differs from the exact one
  // by FP8's rounding, not more.
  double diff = 0;
  for (int64_t i = 0; i < T * N; ++i) diff = std::max(diff, std::abs(exact_y[i] - want_y[i]));
  EXPECT_GT(diff, 1e-4 * max_abs(exact_y));
  EXPECT_LT(diff, 0.1 * max_abs(exact_y));
}

}  // namespace
}  // namespace laoyao::kernels::cpu::test
