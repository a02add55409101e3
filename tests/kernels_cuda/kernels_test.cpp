// Every CUDA op of src/kernels/cuda against the CPU reference ops (src/kernels/cpu, optim/adamw) or
// a naive fp64 loop, on fresh random inputs (laoyao::Rng, never zeros) rounded to bf16 on the host,
// so the CPU and the GPU read identical values.
//
// Tolerances. bf16 keeps 8 significant bits: one round-to-nearest has relative error at most
// u = 2^-8 (~3.9e-3). fp32 has u = 2^-24 (~6e-8).
//  - An op that computes in fp32 and rounds its bf16 output once is checked element by element
//    against |got - want| <= 2^-7 |want| + (an fp32 term): 2^-7 is twice bf16's u, room for the
//    rounding plus fp32 noise, and a tenth of what a wrong formula usually shows. The fp32 term is
//    kFp32Sum (2e-5) times the sum of the absolute values of the terms of the reduction (a sum of k
//    fp32-rounded terms errs by at most ~k u of that, ~1e-6 for our sizes; tensor cores truncate
//    instead of rounding in their fp32 accumulation, so 2e-5 leaves a margin), or a small fraction
//    of the tensor's largest entry where the op has no long reduction (cancellation can make an
//    element tiny next to its inputs).
//  - fp32 outputs (main_grad accumulation, statistics, losses) get the kFp32Sum term alone.
//  - Where the GPU and the CPU execute the same fp32 operations in the same order (casts, adds,
//    dropout masks, the embedding gradient), results must be bit-identical.
//  - Attention keeps bf16 probabilities and bf16 intermediate gradients (dS, per-head dk/dv), a few
//    2^-8 roundings deep: it is compared by relative norm ||gpu - cpu|| / ||cpu|| < 2e-2 plus a
//    per-element bound of 2e-2 of the tensor's largest entry, which catches a wrong row or head that
//    a norm over the whole tensor could dilute. A host emulation of the unfused path's roundings
//    (bf16 P, dS, ctx, per-head dk/dv) on these shapes gave relative norms of 2-3e-3 and worst
//    elements of 3-4e-3 of the largest: the tolerances leave a 5x margin.
//
// GPU only: these tests need device 0 (tests/*_cuda are labelled `gpu`).
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/rng.hpp"
#include "core/runtime_options.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/qkv_layout.hpp"
#include "kernels/cuda/attention_reference.hpp"
#include "kernels/cuda/attention_cudnn.hpp"
#include "kernels/cuda/attention_flash.hpp"
#include "kernels/cuda/attention_unfused.hpp"
#include "kernels/cuda/bias_gelu.hpp"
#include "kernels/cuda/cross_entropy.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/device_buffer.hpp"
#include "kernels/cuda/dropout_rng.cuh"
#include "kernels/cuda/elementwise.hpp"
#include "kernels/cuda/embedding.hpp"
#include "kernels/cuda/gemm_cublaslt.hpp"
#include "kernels/cuda/layernorm.hpp"
#include "kernels/cuda/mla.hpp"
#include "kernels/cuda/optimizer.hpp"
#include "kernels/cuda/qk_norm.hpp"
#include "kernels/cuda/rope.hpp"
#include "kernels/cuda/swiglu.hpp"
#include "optim/adamw.hpp"
#include "cuda_test_util.hpp"

namespace laoyao::kernels::cuda_test {
namespace {

constexpr double kAttnNormTol = 2e-2;     // attention: relative norm of the error
constexpr double kAttnElemTol = 2e-2;     // attention: per element, times the largest |want|

// ---- host data

// Integers in [0, bound), uniform.
std::vector<int64_t> rand_ids(size_t n, uint64_t seed, std::string_view name, int64_t bound) {
  Rng rng(seed, name);
  std::vector<int64_t> v(n);
  for (auto& x : v) x = static_cast<int64_t>(rng.next_u64() % static_cast<uint64_t>(bound));
  return v;
}

// The CPU model's dropout mask (model/gpt_model.cpp): 0 with probability p, else float(1/(1-p)).
std::vector<float> cpu_dropout_mask(size_t n, double p, uint64_t seed, std::string_view stream) {
  Rng rng(seed, stream);
  const float keep = static_cast<float>(1.0 / (1.0 - p));
  std::vector<float> mask(n);
  for (auto& m : mask) m = rng.uniform() < p ? 0.0f : keep;
  return mask;
}

cuda::DropoutSpec dropout_spec(double p, uint64_t seed, std::string_view stream) {
  cuda::DropoutSpec d;
  d.key = rng_stream_key(seed, stream);
  d.p = p;
  d.keep_scale = static_cast<float>(1.0 / (1.0 - p));
  return d;
}

// ---- checks

// ||got - want|| / ||want|| < rel_tol, and every |got - want| <= elem_frac * max|want|.
void expect_rel_norm(const std::vector<float>& got, const std::vector<double>& want, double rel_tol,
                     double elem_frac, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double err2 = 0.0, ref2 = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double e = static_cast<double>(got[i]) - want[i];
    err2 += e * e;
    ref2 += want[i] * want[i];
  }
  ASSERT_GT(ref2, 0.0) << what << ": the reference is all zeros";
  const double rel = std::sqrt(err2 / ref2);
  EXPECT_LT(rel, rel_tol) << what << ": relative norm of the error";  // NaN fails too
  expect_within(got, want, std::vector<double>(want.size(), elem_frac * max_abs(want)), what + " (per element)");
}

// Every test runs its ops on stream_, a created (blocking) stream of device 0.
class CudaKernels : public CudaStreamTest {};

// ---------------------------------------------------------------- cuBLASLt GEMMs

TEST_F(CudaKernels, LinearForwardMatchesCpu) {
  const int64_t T = 37, K = 301, N = 203;
  const auto x = randn_bf16(T * K, 11, "linear.x");
  const auto w = randn_bf16(N * K, 11, "linear.w", 0.05);
  const auto bias = randn_bf16(N, 11, "linear.bias", 0.5);
  // The sum of |terms| of each output (the fp32 accumulation's error scale).
  std::vector<double> abssum(T * N, 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k) abssum[t * N + n] += std::abs(double(x[t * K + k]) * w[n * K + k]);

  auto dx = to_device_bf16(x), dw = to_device_bf16(w), db = to_device_bf16(bias);
  DeviceBuffer dy(T * N * sizeof(bf16));
  cuda::CublasLtGemm gemm;
  for (const bool with_bias : {false, true}) {
    SCOPED_TRACE(with_bias ? "with bias" : "without bias");
    std::vector<float> want(T * N);
    cpu::linear_forward(x.data(), w.data(), with_bias ? bias.data() : nullptr, want.data(), T, K, N);
    const bf16* b = with_bias ? db.as<bf16>() : nullptr;
    gemm.linear_forward(dx.as<bf16>(), dw.as<bf16>(), b, dy.as<bf16>(), T, K, N, stream_);
    sync();
    std::vector<double> tol(T * N);
    for (int64_t i = 0; i < T * N; ++i)
      // cuBLASLt's bias epilogue may round the product to bf16 before adding the bias, so where the
      // two nearly cancel the error is a bf16 rounding of |bias| (~|product|), not of the result.
      tol[i] = kBf16Rel * (std::abs(want[i]) + (with_bias ? std::abs(bias[i % N]) : 0.0)) +
               kFp32Sum * (abssum[i] + (with_bias ? std::abs(bias[i % N]) : 0.0));
    expect_within(from_device_bf16(dy, T * N), to_double(want), tol, "y");

    // The same problem again reuses its plan.
    const size_t plans = gemm.plans_built();
    gemm.linear_forward(dx.as<bf16>(), dw.as<bf16>(), b, dy.as<bf16>(), T, K, N, stream_);
    sync();
    EXPECT_EQ(gemm.plans_built(), plans);
  }
  EXPECT_EQ(gemm.plans_built(), 2u);  // one plan with the bias epilogue, one without
}

TEST_F(CudaKernels, LinearBackwardInputMatchesNaive) {
  const int64_t T = 37, K = 301, N = 203;
  const auto dyv = randn_bf16(T * N, 12, "linear.dy");
  const auto w = randn_bf16(N * K, 12, "linear.w", 0.05);
  std::vector<double> want(T * K, 0.0), tol(T * K, 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < K; ++k) {
      double s = 0.0, a = 0.0;
      for (int64_t n = 0; n < N; ++n) {
        const double term = double(dyv[t * N + n]) * w[n * K + k];
        s += term;
        a += std::abs(term);
      }
      want[t * K + k] = s;
      tol[t * K + k] = kBf16Rel * std::abs(s) + kFp32Sum * a;
    }
  auto ddy = to_device_bf16(dyv), dw = to_device_bf16(w);
  auto ddx = to_device_bf16(randn_bf16(T * K, 12, "linear.stale_dx"));  // overwritten
  cuda::CublasLtGemm gemm;
  gemm.linear_backward_input(ddy.as<bf16>(), dw.as<bf16>(), ddx.as<bf16>(), T, K, N, stream_);
  sync();
  expect_within(from_device_bf16(ddx, T * K), want, tol, "dx = dy w");
}

TEST_F(CudaKernels, LinearBackwardWeightAccumulatesIntoFp32) {
  const int64_t T = 37, K = 301, N = 203;
  const auto dyv = randn_bf16(T * N, 13, "linear.dy");
  const auto x = randn_bf16(T * K, 13, "linear.x");
  const auto dw0 = randn(N * K, 13, "linear.main_grad");  // an earlier micro-batch's gradient
  std::vector<double> want(N * K), tol(N * K);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      double s = dw0[n * K + k], a = std::abs(s);
      for (int64_t t = 0; t < T; ++t) {
        const double term = double(dyv[t * N + n]) * x[t * K + k];
        s += term;
        a += std::abs(term);
      }
      want[n * K + k] = s;
      tol[n * K + k] = kFp32Sum * a;
    }
  auto ddy = to_device_bf16(dyv), dx = to_device_bf16(x), ddw = to_device(dw0);
  cuda::CublasLtGemm gemm;
  gemm.linear_backward_weight(ddy.as<bf16>(), dx.as<bf16>(), ddw.as<float>(), T, K, N, stream_);
  sync();
  // The first call timed its candidates into a scratch output: dw holds one product, not several.
  expect_within(from_device<float>(ddw, N * K), want, tol, "dw0 + dy^T x");
  const auto tunings = gemm.tunings();
  ASSERT_EQ(tunings.size(), 1u);
  EXPECT_GE(tunings[0].candidates, 1);
  if (tunings[0].candidates > 1) {
    EXPECT_GT(tunings[0].best_ms, 0.0f);
    EXPECT_LE(tunings[0].best_ms, tunings[0].first_ms);
  }
}

TEST_F(CudaKernels, GemmAutotuneOffKeepsTheHeuristicsFirstChoice) {
  const ScopedRuntimeOptions no_autotune([](RuntimeOptions& o) { o.gemm_autotune = false; });
  cuda::CublasLtGemm gemm;
  const int64_t T = 64, K = 128, N = 96;
  auto dx = to_device_bf16(randn_bf16(T * K, 14, "linear.x"));
  auto dw = to_device_bf16(randn_bf16(N * K, 14, "linear.w", 0.05));
  DeviceBuffer dy(T * N * sizeof(bf16));
  gemm.linear_forward(dx.as<bf16>(), dw.as<bf16>(), nullptr, dy.as<bf16>(), T, K, N, stream_);
  sync();
  const auto tunings = gemm.tunings();
  ASSERT_EQ(tunings.size(), 1u);
  EXPECT_EQ(tunings[0].chosen, 0);
  EXPECT_EQ(tunings[0].best_ms, 0.0f);
}

// fc1 with cuBLASLt's GELU_AUX_BIAS epilogue against the CPU's linear and tanh GeLU, and fc2's
// input gradient with the DGELU epilogue against (dy @ w) * gelu'(u) on the GPU's own u.
TEST_F(CudaKernels, LinearGeluEpiloguesMatchCpuTanhGelu) {
  const int64_t T = 37, K = 96, N = 200;
  const auto x = randn_bf16(T * K, 15, "gelu_gemm.x");
  const auto w = randn_bf16(N * K, 15, "gelu_gemm.w", 0.15);
  const auto bias = randn_bf16(N, 15, "gelu_gemm.bias", 0.5);
  std::vector<double> u_want(T * N), abssum(T * N);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) {
      double s = bias[n], a = std::abs(s);
      for (int64_t k = 0; k < K; ++k) s += double(x[t * K + k]) * w[n * K + k], a += std::abs(double(x[t * K + k]) * w[n * K + k]);
      u_want[t * N + n] = s;
      abssum[t * N + n] = a;
    }
  std::vector<float> u_f(u_want.begin(), u_want.end()), y_f(T * N);
  cpu::gelu_forward(u_f.data(), y_f.data(), T * N, cpu::Gelu::Tanh);
  std::vector<double> u_tol(T * N), y_tol(T * N);
  for (int64_t i = 0; i < T * N; ++i) {
    u_tol[i] = kBf16Rel * std::abs(u_want[i]) + kFp32Sum * abssum[i];
    // |gelu'| <= 1.13; 1e-4 absolute: a GeLU other than the tanh form (erf differs by up to 5e-4) fails.
    y_tol[i] = kBf16Rel * std::abs(y_f[i]) + 1.13 * kFp32Sum * abssum[i] + 1e-4;
  }
  auto dx = to_device_bf16(x), dw = to_device_bf16(w), db = to_device_bf16(bias);
  DeviceBuffer dy_out(T * N * sizeof(bf16)), du(T * N * sizeof(bf16));
  cuda::CublasLtGemm gemm;
  gemm.linear_forward_gelu(dx.as<bf16>(), dw.as<bf16>(), db.as<bf16>(), dy_out.as<bf16>(), du.as<bf16>(), T, K, N,
                           stream_);
  sync();
  const auto u_got = from_device_bf16(du, T * N);
  expect_within(u_got, u_want, u_tol, "u = x w^T + bias");
  expect_within(from_device_bf16(dy_out, T * N), to_double(y_f), y_tol, "gelu_tanh(u)");

  // Backward through fc2 [M=64, N] and the GeLU: du2[T, N] = (g @ w2) * gelu'(u).
  const int64_t M = 64;
  const auto g = randn_bf16(T * M, 16, "gelu_gemm.g");
  const auto w2 = randn_bf16(M * N, 16, "gelu_gemm.w2", 0.15);
  std::vector<float> gw(T * N), dwant(T * N);
  std::vector<double> gabs(T * N);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) {
      double s = 0, a = 0;
      for (int64_t m = 0; m < M; ++m) s += double(g[t * M + m]) * w2[m * N + n], a += std::abs(double(g[t * M + m]) * w2[m * N + n]);
      gw[t * N + n] = static_cast<float>(s);
      gabs[t * N + n] = a;
    }
  cpu::gelu_backward(u_got.data(), gw.data(), dwant.data(), T * N, cpu::Gelu::Tanh);
  std::vector<double> dtol(T * N);
  for (int64_t i = 0; i < T * N; ++i) dtol[i] = kBf16Rel * std::abs(dwant[i]) + 1.13 * kFp32Sum * gabs[i] + 1e-4;
  auto dg = to_device_bf16(g), dw2 = to_device_bf16(w2);
  DeviceBuffer ddu(T * N * sizeof(bf16));
  gemm.linear_backward_input_dgelu(dg.as<bf16>(), dw2.as<bf16>(), du.as<bf16>(), ddu.as<bf16>(), T, N, M, stream_);
  sync();
  expect_within(from_device_bf16(ddu, T * N), to_double(dwant), dtol, "(g w2) * gelu_tanh'(u)");
}

TEST_F(CudaKernels, MatmulRowMajorAllTransposesBatched) {
  const int64_t M = 37, N = 29, K = 45, batch = 3;
  const float alpha = 0.75f;
  cuda::CublasLtGemm gemm;
  size_t expected_plans = 0;
  for (const bool c_fp32 : {false, true})
    for (const bool tx : {false, true})
      for (const bool ty : {false, true}) {
        const std::string what = std::string("tx=") + (tx ? "1" : "0") + " ty=" + (ty ? "1" : "0") +
                                 (c_fp32 ? " C fp32, beta 1" : " C bf16, beta 0");
        SCOPED_TRACE(what);
        const uint64_t seed = 100 + (c_fp32 ? 4 : 0) + (tx ? 2 : 0) + (ty ? 1 : 0);
        const auto X = randn_bf16(batch * M * K, seed, "matmul.X");  // [M, K], or [K, M] when tx
        const auto Y = randn_bf16(batch * K * N, seed, "matmul.Y");  // [K, N], or [N, K] when ty
        const float beta = c_fp32 ? 1.0f : 0.0f;  // fp32: accumulate into C; bf16: overwrite it
        const auto C0 = c_fp32 ? randn(batch * M * N, seed, "matmul.C") : randn_bf16(batch * M * N, seed, "matmul.C");
        std::vector<double> want(batch * M * N), tol(batch * M * N);
        for (int64_t bi = 0; bi < batch; ++bi) {
          const float* Xb = X.data() + bi * M * K;
          const float* Yb = Y.data() + bi * K * N;
          for (int64_t m = 0; m < M; ++m)
            for (int64_t n = 0; n < N; ++n) {
              double s = 0.0, a = 0.0;
              for (int64_t k = 0; k < K; ++k) {
                const double xv = tx ? Xb[k * M + m] : Xb[m * K + k];
                const double yv = ty ? Yb[n * K + k] : Yb[k * N + n];
                s += xv * yv;
                a += std::abs(xv * yv);
              }
              const int64_t i = bi * M * N + m * N + n;
              const double c0 = double(beta) * C0[i];
              want[i] = alpha * s + c0;
              tol[i] = (c_fp32 ? 0.0 : kBf16Rel * std::abs(want[i])) + kFp32Sum * (alpha * a + std::abs(c0));
            }
        }
        auto dX = to_device_bf16(X), dY = to_device_bf16(Y);
        DeviceBuffer dC = c_fp32 ? to_device(C0) : to_device_bf16(C0);
        gemm.matmul_rm(dX.as<bf16>(), tx, dY.as<bf16>(), ty, dC.ptr, c_fp32, M, N, K, alpha, beta, batch, stream_);
        sync();
        ++expected_plans;
        EXPECT_EQ(gemm.plans_built(), expected_plans);
        const auto got = c_fp32 ? from_device<float>(dC, batch * M * N) : from_device_bf16(dC, batch * M * N);
        expect_within(got, want, tol, "C = alpha op(X) op(Y) + beta C");

        // An identical call builds no new plan.
        gemm.matmul_rm(dX.as<bf16>(), tx, dY.as<bf16>(), ty, dC.ptr, c_fp32, M, N, K, alpha, beta, batch, stream_);
        sync();
        EXPECT_EQ(gemm.plans_built(), expected_plans);
      }
}

// ---------------------------------------------------------------- elementwise

TEST_F(CudaKernels, ResidualDropoutAddMatchesCpuMask) {
  const int64_t n = 10007;
  const uint64_t seed = 1234;
  const double p = 0.1;
  // Branch values of magnitude >= 1 and a smaller residual: a kept element always changes the
  // residual, so `out == residual` exactly marks the dropped ones.
  auto branch = randn(n, seed, "rda.branch");
  for (auto& v : branch) v = round_to_bf16(v < 0 ? v - 1.0f : v + 1.0f);
  const auto residual = randn_bf16(n, seed, "rda.residual", 0.25);
  const auto mask = cpu_dropout_mask(n, p, seed, "some.stream");

  auto db = to_device_bf16(branch), dr = to_device_bf16(residual);
  DeviceBuffer dout(n * sizeof(bf16));
  cuda::residual_dropout_add(db.as<bf16>(), dr.as<bf16>(), dout.as<bf16>(), n, dropout_spec(p, seed, "some.stream"),
                             stream_);
  sync();
  const auto out = from_device_bf16(dout, n);
  size_t pattern_bad = 0, first_bad = 0, dropped = 0;
  std::vector<double> want(n), tol(n);
  for (int64_t i = 0; i < n; ++i) {
    dropped += mask[i] == 0.0f;
    if ((out[i] == residual[i]) != (mask[i] == 0.0f) && pattern_bad++ == 0) first_bad = i;
    want[i] = double(residual[i]) + double(branch[i]) * mask[i];
    tol[i] = kBf16Rel * std::abs(want[i]) + 1e-30;
  }
  EXPECT_EQ(pattern_bad, 0u) << "dropout pattern differs from the CPU mask, first at " << first_bad;
  EXPECT_GT(dropped, size_t(n * 0.08));  // p = 0.1 of 10007: ~1000 dropped
  EXPECT_LT(dropped, size_t(n * 0.12));
  expect_within(out, want, tol, "residual + branch * mask");

  // p = 0: out = bf16(residual + branch), the fp32 add the CPU does too, bit for bit. In place
  // (out aliasing branch) as the model calls it.
  cuda::residual_dropout_add(db.as<bf16>(), dr.as<bf16>(), db.as<bf16>(), n, cuda::DropoutSpec{}, stream_);
  sync();
  std::vector<float> exact(n);
  for (int64_t i = 0; i < n; ++i) exact[i] = round_to_bf16(residual[i] + branch[i]);
  expect_equal(from_device_bf16(db, n), exact, "p = 0: residual + branch");
}

// With a bias of rows of N (the bias of a row-parallel linear, added after the tensor-parallel
// reduction): residual + dropout(branch + bias), against the CPU's fp64 sum of the same values.
TEST_F(CudaKernels, ResidualDropoutAddWithABiasMatchesCpu) {
  const int64_t rows = 37, N = 96, n = rows * N;
  const uint64_t seed = 99;
  const auto branch = randn_bf16(n, seed, "rdab.branch", 1.0);
  const auto residual = randn_bf16(n, seed, "rdab.residual", 0.5);
  const auto bias = randn_bf16(N, seed, "rdab.bias", 0.5);
  auto db = to_device_bf16(branch), dr = to_device_bf16(residual), dbias = to_device_bf16(bias);
  DeviceBuffer dout(n * sizeof(bf16));
  for (const double p : {0.0, 0.2}) {
    SCOPED_TRACE(p);
    const auto mask = p > 0 ? cpu_dropout_mask(n, p, seed, "bias.stream") : std::vector<float>(n, 1.0f);
    cuda::residual_dropout_add(db.as<bf16>(), dr.as<bf16>(), dout.as<bf16>(), n, dropout_spec(p, seed, "bias.stream"),
                               stream_, dbias.as<bf16>(), N);
    sync();
    std::vector<double> want(n), tol(n);
    for (int64_t i = 0; i < n; ++i) {
      want[i] = double(residual[i]) + (double(branch[i]) + double(bias[i % N])) * mask[i];
      tol[i] = kBf16Rel * (std::abs(double(residual[i])) + std::abs(double(branch[i]) + double(bias[i % N])) * mask[i]) +
               1e-30;
    }
    expect_within(from_device_bf16(dout, n), want, tol, "residual + (branch + bias) * mask");
  }
}

TEST_F(CudaKernels, DropoutApplyMatchesCpuMaskExactly) {
  const int64_t n = 10007;
  const uint64_t seed = 4321;
  const double p = 0.1;
  const auto x = randn_bf16(n, seed, "dropout.x");
  for (float v : x) ASSERT_NE(v, 0.0f);  // a zero output must mean a dropped element
  const auto mask = cpu_dropout_mask(n, p, seed, "some.stream");
  std::vector<float> want(n);
  for (int64_t i = 0; i < n; ++i) want[i] = round_to_bf16(x[i] * mask[i]);  // one fp32 multiply, as the GPU

  auto dx = to_device_bf16(x);
  DeviceBuffer dy(n * sizeof(bf16));
  cuda::dropout_apply(dx.as<bf16>(), dy.as<bf16>(), n, dropout_spec(p, seed, "some.stream"), stream_);
  sync();
  const auto y = from_device_bf16(dy, n);
  size_t pattern_bad = 0;
  for (int64_t i = 0; i < n; ++i) pattern_bad += (y[i] == 0.0f) != (mask[i] == 0.0f);
  EXPECT_EQ(pattern_bad, 0u) << "zero pattern differs from the CPU mask";
  expect_equal(y, want, "x * mask");

  // In place gives the same.
  cuda::dropout_apply(dx.as<bf16>(), dx.as<bf16>(), n, dropout_spec(p, seed, "some.stream"), stream_);
  sync();
  expect_equal(from_device_bf16(dx, n), want, "x * mask in place");

  // p = 0: a copy.
  auto dx2 = to_device_bf16(x);
  cuda::dropout_apply(dx2.as<bf16>(), dy.as<bf16>(), n, cuda::DropoutSpec{}, stream_);
  sync();
  expect_equal(from_device_bf16(dy, n), x, "p = 0 copies");
}

TEST_F(CudaKernels, AddInplaceIsOneBf16Rounding) {
  const int64_t n = 10007;
  const auto acc = randn_bf16(n, 21, "add.acc"), x = randn_bf16(n, 21, "add.x", 0.1);
  std::vector<float> want(n);
  for (int64_t i = 0; i < n; ++i) want[i] = round_to_bf16(acc[i] + x[i]);
  auto dacc = to_device_bf16(acc), dx = to_device_bf16(x);
  cuda::add_inplace(dacc.as<bf16>(), dx.as<bf16>(), n, stream_);
  sync();
  expect_equal(from_device_bf16(dacc, n), want, "acc + x");
}

TEST_F(CudaKernels, ScaleInplaceMultipliesEveryElement) {
  const int64_t n = 10007;
  const auto x = randn(n, 23, "scale.x");
  const float s = 0.37f;
  std::vector<float> want(n);
  for (int64_t i = 0; i < n; ++i) want[i] = x[i] * s;
  auto dx = to_device(x);
  cuda::scale_inplace(dx.as<float>(), s, n, stream_);
  sync();
  expect_equal(from_device<float>(dx, n), want, "x * s");
}

TEST_F(CudaKernels, BiasGradAccumulatesColumnSums) {
  // N = 77: the scalar kernel, three row chunks of its 256; N = 776: 16-byte loads, ten chunks of
  // 64 rows (the last partial); both chunks' partials added by add_chunk_partials.
  for (const int64_t N : {int64_t{77}, int64_t{776}}) {
    SCOPED_TRACE("N = " + std::to_string(N));
    const int64_t T = 600;
    const auto dyv = randn_bf16(T * N, 22, "bias_grad.dy");
    const auto db0 = randn(N, 22, "bias_grad.main_grad");
    std::vector<double> want(N), tol(N);
    for (int64_t c = 0; c < N; ++c) {
      double s = db0[c], a = std::abs(s);
      for (int64_t t = 0; t < T; ++t) s += dyv[t * N + c], a += std::abs(dyv[t * N + c]);
      want[c] = s;
      tol[c] = kFp32Sum * a;
    }
    auto ddy = to_device_bf16(dyv), ddb = to_device(db0);
    DeviceBuffer scratch(cuda::bias_grad_scratch_floats(T, N) * sizeof(float));
    cuda::bias_grad(ddy.as<bf16>(), ddb.as<float>(), scratch.as<float>(), T, N, stream_);
    sync();
    expect_within(from_device<float>(ddb, N), want, tol, "db0 + column sums");
  }
}

TEST_F(CudaKernels, CastToBf16RoundsToNearestEven) {
  auto x = randn(4099, 23, "cast.x", 3.0);
  // Other scales, and exact ties between two bf16 values (round half to even).
  for (size_t i = 0; i < 1000; ++i) x[i] *= i % 2 ? 1e-3f : 1e4f;
  for (const float tie : {1.00390625f, 1.01171875f, -1.00390625f, 3.0078125f, 255.5f, -65.25f}) x.push_back(tie);
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<float> want(n);
  for (int64_t i = 0; i < n; ++i) want[i] = round_to_bf16(x[i]);
  auto dx = to_device(x);
  DeviceBuffer dy(n * sizeof(bf16));
  cuda::cast_to_bf16(dx.as<float>(), dy.as<bf16>(), n, stream_);
  sync();
  expect_equal(from_device_bf16(dy, n), want, "bf16(x)");
  // In place, staying fp32: the same values.
  cuda::round_to_bf16_inplace(dx.as<float>(), n, stream_);
  sync();
  expect_equal(from_device<float>(dx, n), want, "float(bf16(x)) in place");
}

// ---------------------------------------------------------------- attention

struct AttnCase {
  int64_t b, s, H, G, D;
  double p;              // attention dropout
  int64_t doc_len = 0;   // > 0: documents of random lengths 1 .. 2*doc_len (--reset-attention-mask)
};

cuda::AttentionShape shape_of(const AttnCase& c) {
  cuda::AttentionShape a;
  a.b = c.b, a.s = c.s, a.H = c.H, a.G = c.G, a.D = c.D;
  a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.D)));
  return a;
}

// Each query's first key for the case's documents (empty without): every sequence cut into
// documents of random lengths 1 .. 2*doc_len (the last one cut short by the sequence's end).
std::vector<int32_t> key_start_of(const AttnCase& c, uint64_t seed) {
  if (c.doc_len <= 0) return {};
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> len(1, 2 * c.doc_len);
  std::vector<int32_t> ks(c.b * c.s);
  for (int64_t bi = 0; bi < c.b; ++bi) {
    int64_t start = 0, next = len(rng);
    for (int64_t i = 0; i < c.s; ++i) {
      if (i == next) start = i, next = i + len(rng);
      ks[bi * c.s + i] = static_cast<int32_t>(start);
    }
  }
  return ks;
}

// The CPU's forward and backward on the same bf16-valued inputs.
struct CpuAttention {
  std::vector<float> ctx, probs, dqkv;
};

CpuAttention cpu_attention(const AttnCase& c, const std::vector<float>& qkv, const std::vector<float>& dctx,
                           const float* mask, const std::vector<int32_t>& key_start = {}) {
  const int32_t* ks = key_start.empty() ? nullptr : key_start.data();
  const cpu::QkvLayout L("test", c.H, c.G, c.D);
  const float scale = shape_of(c).scale;
  CpuAttention r;
  r.ctx.resize(c.b * c.s * c.H * c.D);
  r.probs.resize(c.b * c.H * c.s * c.s);
  r.dqkv.resize(c.b * c.s * L.row);
  cpu::attention_forward(qkv.data(), r.ctx.data(), r.probs.data(), c.b, c.s, c.H, c.G, c.D, scale, mask, ks);
  cpu::attention_backward(qkv.data(), r.probs.data(), dctx.data(), r.dqkv.data(), c.b, c.s, c.H, c.G, c.D, scale,
                          mask, ks);
  return r;
}

void check_attention_unfused(const AttnCase& c, cudaStream_t stream) {
  const cpu::QkvLayout L("test", c.H, c.G, c.D);
  const uint64_t seed = 7000 + static_cast<uint64_t>(c.s * 100 + c.H * 10 + c.G);
  const int64_t T = c.b * c.s;
  const auto qkv = randn_bf16(T * L.row, seed, "attn.qkv");
  const auto dctx = randn_bf16(T * c.H * c.D, seed, "attn.dctx");
  const char* stream_name = "decoder.layers.0.self_attention.core_attention.dropout";
  auto shape = shape_of(c);
  const auto key_start = key_start_of(c, seed);
  DeviceBuffer dkey_start = key_start.empty() ? DeviceBuffer() : to_device(key_start);
  shape.key_start = dkey_start.as<int32_t>();
  const int64_t n_probs = cuda::attention_probs_elems(shape), n_heads = cuda::attention_heads_elems(shape);
  ASSERT_EQ(n_probs, c.b * c.H * c.s * c.s);
  ASSERT_EQ(n_heads, c.b * c.H * c.s * c.D);
  std::vector<float> mask;
  if (c.p > 0) mask = cpu_dropout_mask(n_probs, c.p, seed, stream_name);
  const auto want = cpu_attention(c, qkv, dctx, c.p > 0 ? mask.data() : nullptr, key_start);
  const cuda::DropoutSpec drop = c.p > 0 ? dropout_spec(c.p, seed, stream_name) : cuda::DropoutSpec{};

  auto dqkv_in = to_device_bf16(qkv), ddctx = to_device_bf16(dctx);
  DeviceBuffer dctx_out(T * c.H * c.D * sizeof(bf16)), ddqkv(T * L.row * sizeof(bf16));
  DeviceBuffer q(n_heads * sizeof(bf16)), k(n_heads * sizeof(bf16)), v(n_heads * sizeof(bf16));
  DeviceBuffer probs(n_probs * sizeof(bf16)), probs_dropped;
  if (c.p > 0) probs_dropped = DeviceBuffer(n_probs * sizeof(bf16));
  DeviceBuffer scores(n_probs * sizeof(float)), heads(n_heads * sizeof(bf16)), dq(n_heads * sizeof(bf16)),
      dk(n_heads * sizeof(bf16)), dv(n_heads * sizeof(bf16));
  cuda::UnfusedAttentionBuffers saved;
  saved.q = q.as<bf16>(), saved.k = k.as<bf16>(), saved.v = v.as<bf16>(), saved.probs = probs.as<bf16>();
  saved.probs_dropped = probs_dropped.as<bf16>();  // nullptr without dropout
  cuda::UnfusedAttentionScratch scratch;
  scratch.scores = scores.as<float>(), scratch.heads = heads.as<bf16>();
  scratch.dq = dq.as<bf16>(), scratch.dk = dk.as<bf16>(), scratch.dv = dv.as<bf16>();

  cuda::CublasLtGemm gemm;
  cuda::attention_unfused_forward(gemm, dqkv_in.as<bf16>(), dctx_out.as<bf16>(), saved, scratch, shape, drop, stream);
  LAOYAO_CUDA_CHECK(cudaStreamSynchronize(stream));
  expect_rel_norm(from_device_bf16(dctx_out, T * c.H * c.D), to_double(want.ctx), kAttnNormTol, kAttnElemTol, "ctx");
  // Saved probabilities: fp32 softmax rounded once; exact zeros above the diagonal.
  {
    std::vector<double> tol(n_probs);
    for (int64_t i = 0; i < n_probs; ++i) tol[i] = kBf16Rel * std::abs(want.probs[i]) + 1e-7;
    expect_within(from_device_bf16(probs, n_probs), to_double(want.probs), tol, "probs");
  }
  if (c.p > 0) {
    // probs * mask: zero exactly where the CPU's mask drops or the key is in the future.
    const auto got = from_device_bf16(probs_dropped, n_probs);
    std::vector<double> w(n_probs), tol(n_probs);
    size_t pattern_bad = 0, first_bad = 0;
    for (int64_t e = 0; e < n_probs; ++e) {
      const int64_t i = (e / c.s) % c.s, j = e % c.s, bi = e / (c.H * c.s * c.s);
      const bool zero = mask[e] == 0.0f || j > i || (!key_start.empty() && j < key_start[bi * c.s + i]);
      if ((got[e] == 0.0f) != zero && pattern_bad++ == 0) first_bad = e;
      w[e] = double(want.probs[e]) * mask[e];
      tol[e] = kBf16Rel * std::abs(w[e]) + 1e-7;
    }
    EXPECT_EQ(pattern_bad, 0u) << "attention dropout pattern differs from the CPU mask, first at " << first_bad;
    expect_within(got, w, tol, "probs * mask");
  }

  cuda::attention_unfused_backward(gemm, ddctx.as<bf16>(), ddqkv.as<bf16>(), saved, scratch, shape, drop, stream);
  LAOYAO_CUDA_CHECK(cudaStreamSynchronize(stream));
  expect_rel_norm(from_device_bf16(ddqkv, T * L.row), to_double(want.dqkv), kAttnNormTol, kAttnElemTol, "dqkv");
}

TEST_F(CudaKernels, AttentionUnfusedMhaMatchesCpu) { check_attention_unfused({2, 37, 4, 4, 64, 0.0}, stream_); }

TEST_F(CudaKernels, AttentionUnfusedGqaMatchesCpu) { check_attention_unfused({1, 64, 8, 2, 128, 0.0}, stream_); }

TEST_F(CudaKernels, AttentionUnfusedDropoutMatchesCpuMask) {
  check_attention_unfused({2, 29, 4, 2, 64, 0.1}, stream_);
}

TEST_F(CudaKernels, AttentionUnfusedDocumentsMatchCpu) {
  check_attention_unfused({2, 77, 4, 2, 64, 0.0, 12}, stream_);
  check_attention_unfused({2, 45, 4, 2, 64, 0.1, 6}, stream_);
}

void check_attention_reference(const AttnCase& c, cudaStream_t stream) {
  const cpu::QkvLayout L("test", c.H, c.G, c.D);
  const uint64_t seed = 8000 + static_cast<uint64_t>(c.s * 100 + c.H * 10 + c.G);
  const int64_t T = c.b * c.s;
  const auto qkv = randn_bf16(T * L.row, seed, "attn.qkv");
  const auto dctx = randn_bf16(T * c.H * c.D, seed, "attn.dctx");
  const auto key_start = key_start_of(c, seed);
  const auto want = cpu_attention(c, qkv, dctx, nullptr, key_start);
  auto shape = shape_of(c);
  DeviceBuffer dkey_start = key_start.empty() ? DeviceBuffer() : to_device(key_start);
  shape.key_start = dkey_start.as<int32_t>();

  // lse[b, H, s] by a naive fp64 loop over the same inputs (keys j0..i of query i).
  std::vector<double> want_lse(c.b * c.H * c.s), lse_tol(c.b * c.H * c.s);
  for (int64_t bi = 0; bi < c.b; ++bi)
    for (int64_t h = 0; h < c.H; ++h)
      for (int64_t i = 0; i < c.s; ++i) {
        const int64_t j0 = key_start.empty() ? 0 : key_start[bi * c.s + i];
        std::vector<double> sc;
        for (int64_t j = j0; j <= i; ++j) {
          double dot = 0.0;
          for (int64_t d = 0; d < c.D; ++d)
            dot += double(qkv[(bi * c.s + i) * L.row + L.q(h) + d]) *
                   qkv[(bi * c.s + j) * L.row + L.k(L.group_of(h)) + d];
          sc.push_back(double(shape.scale) * dot);
        }
        const double m = *std::max_element(sc.begin(), sc.end());
        double sum = 0.0;
        for (double x : sc) sum += std::exp(x - m);
        const int64_t r = (bi * c.H + h) * c.s + i;
        want_lse[r] = m + std::log(sum);
        lse_tol[r] = 1e-5 * (1.0 + std::abs(want_lse[r]));
      }

  auto dqkv_in = to_device_bf16(qkv), ddctx = to_device_bf16(dctx);
  DeviceBuffer dctx_out(T * c.H * c.D * sizeof(bf16)), ddqkv(T * L.row * sizeof(bf16));
  DeviceBuffer lse(c.b * c.H * c.s * sizeof(float)), delta(c.b * c.H * c.s * sizeof(float));
  cuda::attention_reference_forward(dqkv_in.as<bf16>(), dctx_out.as<bf16>(), lse.as<float>(), shape, stream);
  LAOYAO_CUDA_CHECK(cudaStreamSynchronize(stream));
  const auto ctx = from_device_bf16(dctx_out, T * c.H * c.D);
  expect_rel_norm(ctx, to_double(want.ctx), kAttnNormTol, kAttnElemTol, "ctx");
  expect_bf16_close(ctx, to_double(want.ctx), 1e-4, "ctx (fp32 softmax, rounded once)");
  expect_within(from_device<float>(lse, c.b * c.H * c.s), want_lse, lse_tol, "lse");

  cuda::attention_reference_backward(dqkv_in.as<bf16>(), dctx_out.as<bf16>(), ddctx.as<bf16>(), lse.as<float>(),
                                     delta.as<float>(), ddqkv.as<bf16>(), shape, stream);
  LAOYAO_CUDA_CHECK(cudaStreamSynchronize(stream));
  expect_rel_norm(from_device_bf16(ddqkv, T * L.row), to_double(want.dqkv), kAttnNormTol, kAttnElemTol, "dqkv");
}

TEST_F(CudaKernels, AttentionReferenceMhaMatchesCpu) { check_attention_reference({2, 37, 4, 4, 64, 0.0}, stream_); }

TEST_F(CudaKernels, AttentionReferenceGqaMatchesCpu) {
  check_attention_reference({1, 64, 8, 2, 128, 0.0}, stream_);
}

TEST_F(CudaKernels, AttentionReferenceDocumentsMatchCpu) {
  check_attention_reference({2, 90, 4, 2, 64, 0.0, 10}, stream_);
}

// A kernel's lse [b, H, s] against the CPU's probabilities (every 7th query): p_ii = exp(s_ii -
// lse_i), so lse_i = s_ii - log(p_ii).
void expect_lse_matches_cpu_probs(const std::vector<float>& got_lse, const std::vector<float>& qkv,
                                  const std::vector<float>& probs, const AttnCase& c, int64_t b) {
  const cpu::QkvLayout L("test", c.H, c.G, c.D);
  const float scale = shape_of(c).scale;
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t h = 0; h < c.H; ++h)
      for (int64_t i = 0; i < c.s; i += 7) {
        double dot = 0;
        for (int64_t d = 0; d < c.D; ++d)
          dot += double(qkv[(bi * c.s + i) * L.row + L.q(h) + d]) * qkv[(bi * c.s + i) * L.row + L.k(L.group_of(h)) + d];
        const double want_lse = scale * dot - std::log(double(probs[((bi * c.H + h) * c.s + i) * c.s + i]));
        EXPECT_NEAR(got_lse[(bi * c.H + h) * c.s + i], want_lse, 2e-3 * (1 + std::abs(want_lse)))
            << "lse b=" << bi << " h=" << h << " i=" << i;
      }
}

// The flash kernels against the CPU attention on the same inputs and dropout mask; partial tiles
// (s not a multiple of 64), GQA, both head dims, and a sequence long enough for many tiles.
void check_attention_flash(const AttnCase& c, cudaStream_t stream) {
  const cpu::QkvLayout L("test", c.H, c.G, c.D);
  const uint64_t seed = 9000 + static_cast<uint64_t>(c.s * 100 + c.H * 10 + c.G);
  const int64_t T = c.b * c.s;
  const auto qkv = randn_bf16(T * L.row, seed, "attn.qkv");
  const auto dctx = randn_bf16(T * c.H * c.D, seed, "attn.dctx");
  const char* stream_name = "decoder.layers.0.self_attention.core_attention.dropout";
  auto shape = shape_of(c);
  ASSERT_TRUE(cuda::attention_flash_supports(shape));
  const auto key_start = key_start_of(c, seed);
  DeviceBuffer dkey_start = key_start.empty() ? DeviceBuffer() : to_device(key_start);
  shape.key_start = dkey_start.as<int32_t>();
  std::vector<float> mask;
  if (c.p > 0) mask = cpu_dropout_mask(c.b * c.H * c.s * c.s, c.p, seed, stream_name);
  const auto want = cpu_attention(c, qkv, dctx, c.p > 0 ? mask.data() : nullptr, key_start);
  const cuda::DropoutSpec drop = c.p > 0 ? dropout_spec(c.p, seed, stream_name) : cuda::DropoutSpec{};

  auto dqkv_in = to_device_bf16(qkv), ddctx = to_device_bf16(dctx);
  DeviceBuffer dctx_out(T * c.H * c.D * sizeof(bf16)), ddqkv(T * L.row * sizeof(bf16));
  DeviceBuffer lse(c.b * c.H * c.s * sizeof(float)), delta(c.b * c.H * c.s * sizeof(float));
  cuda::attention_flash_forward(dqkv_in.as<bf16>(), dctx_out.as<bf16>(), lse.as<float>(), shape, drop, stream);
  LAOYAO_CUDA_CHECK(cudaStreamSynchronize(stream));
  expect_rel_norm(from_device_bf16(dctx_out, T * c.H * c.D), to_double(want.ctx), kAttnNormTol, kAttnElemTol, "ctx");
  expect_lse_matches_cpu_probs(from_device<float>(lse, c.b * c.H * c.s), qkv, want.probs, c, c.b);
  cuda::attention_flash_backward(dqkv_in.as<bf16>(), dctx_out.as<bf16>(), ddctx.as<bf16>(), lse.as<float>(),
                                 delta.as<float>(), ddqkv.as<bf16>(), shape, drop, stream);
  LAOYAO_CUDA_CHECK(cudaStreamSynchronize(stream));
  expect_rel_norm(from_device_bf16(ddqkv, T * L.row), to_double(want.dqkv), kAttnNormTol, kAttnElemTol, "dqkv");
  // Deterministic: a second backward gives the same bits.
  DeviceBuffer again(T * L.row * sizeof(bf16));
  cuda::attention_flash_backward(dqkv_in.as<bf16>(), dctx_out.as<bf16>(), ddctx.as<bf16>(), lse.as<float>(),
                                 delta.as<float>(), again.as<bf16>(), shape, drop, stream);
  LAOYAO_CUDA_CHECK(cudaStreamSynchronize(stream));
  EXPECT_EQ(from_device_bf16(again, T * L.row), from_device_bf16(ddqkv, T * L.row));
}

TEST_F(CudaKernels, AttentionFlashMhaHeadDim64MatchesCpu) { check_attention_flash({2, 100, 4, 4, 64, 0.0}, stream_); }
TEST_F(CudaKernels, AttentionFlashGqaHeadDim128MatchesCpu) { check_attention_flash({1, 130, 8, 2, 128, 0.0}, stream_); }
TEST_F(CudaKernels, AttentionFlashDropoutMatchesCpuMask) { check_attention_flash({2, 77, 4, 2, 64, 0.1}, stream_); }
TEST_F(CudaKernels, AttentionFlashLongSequence) { check_attention_flash({1, 512, 2, 1, 128, 0.0}, stream_); }
// Documents: boundaries inside tiles (short ones, single tokens too) and documents spanning several
// tiles, so whole tiles are skipped in each kernel; with and without dropout.
TEST_F(CudaKernels, AttentionFlashDocumentsMatchCpu) {
  check_attention_flash({2, 300, 4, 4, 64, 0.0, 20}, stream_);
  check_attention_flash({2, 520, 8, 2, 128, 0.0, 150}, stream_);
  check_attention_flash({1, 700, 4, 2, 64, 0.0, 300}, stream_);
  check_attention_flash({2, 200, 4, 2, 64, 0.1, 40}, stream_);
}
TEST_F(CudaKernels, AttentionFlashRefusesOtherHeadDims) {
  EXPECT_FALSE(cuda::attention_flash_supports(shape_of({1, 16, 2, 2, 96, 0.0})));
  EXPECT_THROW(cuda::attention_flash_forward(nullptr, nullptr, nullptr, shape_of({1, 16, 2, 2, 96, 0.0}), {}, stream_),
               laoyao::Error);
}

// The fused rows [T, row] rearranged into the split rows (qkv_rows.hpp), or back (to_split false).
std::vector<float> split_rows(const std::vector<float>& x, const cpu::QkvLayout& L, int64_t T, int64_t H, int64_t G,
                              int64_t D, bool to_split) {
  std::vector<float> y(x.size());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t g = 0; g < G; ++g)
      for (int64_t j = 0; j < L.Q + 2; ++j) {
        const int64_t fused = t * L.row + (g * (L.Q + 2) + j) * D;
        const int64_t split = j < L.Q ? (t * H + g * L.Q + j) * D : (T * H + 2 * (t * G + g) + (j - L.Q)) * D;
        for (int64_t d = 0; d < D; ++d) (to_split ? y[split + d] : y[fused + d]) = x[to_split ? fused + d : split + d];
      }
  return y;
}

// cuDNN's fused attention (our graphs of its SDPA pattern) against the CPU attention: MHA read in
// place, GQA through the gathered query heads, head dims 64, 96 and 128, partial tiles, and a
// smaller batch than the one the plans were built for; with split rows, q, k, v read and their
// gradients written in the split layout.
void check_attention_cudnn(const AttnCase& c, cudaStream_t stream, int64_t run_b = 0,
                           cuda::QkvRows rows = cuda::QkvRows::Fused) {
  const cpu::QkvLayout L("test", c.H, c.G, c.D);
  const uint64_t seed = 9100 + static_cast<uint64_t>(c.s * 100 + c.H * 10 + c.G);
  AttnCase r = c;
  r.b = run_b > 0 ? run_b : c.b;
  const int64_t T = r.b * c.s;
  const auto qkv = randn_bf16(T * L.row, seed, "attn.qkv");
  const auto dctx = randn_bf16(T * c.H * c.D, seed, "attn.dctx");
  const auto want = cpu_attention(r, qkv, dctx, nullptr);
  ASSERT_TRUE(cuda::CudnnAttention::supports(shape_of(c)));
  cuda::CudnnAttention attn(shape_of(c), stream, rows);
  const bool split = rows == cuda::QkvRows::Split;

  auto dqkv_in = to_device_bf16(split ? split_rows(qkv, L, T, c.H, c.G, c.D, true) : qkv), ddctx = to_device_bf16(dctx);
  DeviceBuffer dctx_out(T * c.H * c.D * sizeof(bf16)), ddqkv(T * L.row * sizeof(bf16));
  DeviceBuffer lse(r.b * c.H * c.s * sizeof(float));
  attn.forward(dqkv_in.as<bf16>(), dctx_out.as<bf16>(), lse.as<float>(), r.b);
  LAOYAO_CUDA_CHECK(cudaStreamSynchronize(stream));
  expect_rel_norm(from_device_bf16(dctx_out, T * c.H * c.D), to_double(want.ctx), kAttnNormTol, kAttnElemTol, "ctx");
  expect_lse_matches_cpu_probs(from_device<float>(lse, r.b * c.H * c.s), qkv, want.probs, c, r.b);
  // Every element of dqkv is written: fill it with garbage first.
  LAOYAO_CUDA_CHECK(cudaMemset(ddqkv.ptr, 0x7f, ddqkv.bytes));
  attn.backward(dqkv_in.as<bf16>(), dctx_out.as<bf16>(), ddctx.as<bf16>(), lse.as<float>(), ddqkv.as<bf16>(), r.b);
  LAOYAO_CUDA_CHECK(cudaStreamSynchronize(stream));
  const auto dqkv_gpu = from_device_bf16(ddqkv, T * L.row);
  expect_rel_norm(split ? split_rows(dqkv_gpu, L, T, c.H, c.G, c.D, false) : dqkv_gpu, to_double(want.dqkv),
                  kAttnNormTol, kAttnElemTol, "dqkv");
  EXPECT_NE(attn.engines().find("engine"), std::string::npos) << attn.engines();
}

TEST_F(CudaKernels, AttentionCudnnMhaHeadDim64MatchesCpu) { check_attention_cudnn({2, 100, 4, 4, 64, 0.0}, stream_); }
TEST_F(CudaKernels, AttentionCudnnGqaHeadDim128MatchesCpu) { check_attention_cudnn({1, 130, 8, 2, 128, 0.0}, stream_); }
TEST_F(CudaKernels, AttentionCudnnMultiQueryLongSequence) { check_attention_cudnn({2, 512, 4, 1, 128, 0.0}, stream_); }
TEST_F(CudaKernels, AttentionCudnnHeadDim96MatchesCpu) { check_attention_cudnn({1, 64, 2, 2, 96, 0.0}, stream_); }
TEST_F(CudaKernels, AttentionCudnnSmallerBatchThanPlanned) {
  check_attention_cudnn({3, 96, 4, 2, 64, 0.0}, stream_, 2);
}
TEST_F(CudaKernels, AttentionCudnnSplitRowsMatchCpu) {
  check_attention_cudnn({1, 130, 8, 2, 128, 0.0}, stream_, 0, cuda::QkvRows::Split);
  check_attention_cudnn({3, 96, 4, 2, 64, 0.0}, stream_, 2, cuda::QkvRows::Split);  // smaller batch: k_off moves
  check_attention_cudnn({2, 100, 4, 4, 64, 0.0}, stream_, 0, cuda::QkvRows::Split);  // MHA
}
// cuDNN's attention over documents (its ragged offsets and padding mask, the documents as its
// batch) against the CPU's attention within documents: fused rows (MHA in place, GQA gathered) and
// split rows; one object run on two micro-batches whose document counts fall in different buckets
// (32 and 256), single-token documents among them; every gradient element written.
void check_attention_cudnn_documents(const AttnCase& c, cudaStream_t stream, cuda::QkvRows rows,
                                     const std::vector<int64_t>& doc_lens) {
  SCOPED_TRACE("b " + std::to_string(c.b) + " s " + std::to_string(c.s) + " H " + std::to_string(c.H) + " G " +
               std::to_string(c.G) + (rows == cuda::QkvRows::Split ? " split rows" : " fused rows"));
  const cpu::QkvLayout L("test", c.H, c.G, c.D);
  const int64_t T = c.b * c.s;
  const bool split = rows == cuda::QkvRows::Split;
  cuda::CudnnAttention attn(shape_of(c), stream, rows, true);
  EXPECT_NE(attn.engines().find("over documents"), std::string::npos) << attn.engines();
  for (const int64_t doc_len : doc_lens) {
    AttnCase r = c;
    r.doc_len = doc_len;
    const uint64_t seed = 9200 + static_cast<uint64_t>(c.s * 100 + c.H * 10 + c.G + doc_len);
    const auto qkv = randn_bf16(T * L.row, seed, "attn.qkv");
    const auto dctx = randn_bf16(T * c.H * c.D, seed, "attn.dctx");
    const auto key_start = key_start_of(r, seed);
    const auto want = cpu_attention(r, qkv, dctx, nullptr, key_start);
    std::vector<int64_t> start;
    std::vector<int32_t> length;
    const int64_t count = cuda::fill_cudnn_documents(key_start.data(), c.b, c.s, start, length);
    int64_t docs = 0;
    for (int64_t t = 0; t < T; ++t) docs += key_start[t] == t % c.s;
    ASSERT_EQ(count, cuda::documents_bucket(docs));
    ASSERT_EQ(start[size_t(docs)], T);
    auto dstart = to_device(start), dlength = to_device(length);
    const cuda::CudnnDocuments documents{count, dstart.as<int64_t>(), dlength.as<int32_t>()};

    auto dqkv_in = to_device_bf16(split ? split_rows(qkv, L, T, c.H, c.G, c.D, true) : qkv),
         ddctx = to_device_bf16(dctx);
    DeviceBuffer dctx_out(T * c.H * c.D * sizeof(bf16)), ddqkv(T * L.row * sizeof(bf16));
    DeviceBuffer lse(T * c.H * sizeof(float));
    attn.forward(dqkv_in.as<bf16>(), dctx_out.as<bf16>(), lse.as<float>(), c.b, &documents);
    LAOYAO_CUDA_CHECK(cudaStreamSynchronize(stream));
    expect_rel_norm(from_device_bf16(dctx_out, T * c.H * c.D), to_double(want.ctx), kAttnNormTol, kAttnElemTol,
                    "ctx over " + std::to_string(docs) + " documents");
    // lse is token-major over documents: [b*s, H] -> [b, H, s] for the CPU comparison.
    const auto token_major = from_device<float>(lse, T * c.H);
    std::vector<float> head_major(T * c.H);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < c.H; ++h) head_major[((t / c.s) * c.H + h) * c.s + t % c.s] = token_major[t * c.H + h];
    expect_lse_matches_cpu_probs(head_major, qkv, want.probs, c, c.b);
    LAOYAO_CUDA_CHECK(cudaMemset(ddqkv.ptr, 0x7f, ddqkv.bytes));
    attn.backward(dqkv_in.as<bf16>(), dctx_out.as<bf16>(), ddctx.as<bf16>(), lse.as<float>(), ddqkv.as<bf16>(), c.b,
                  &documents);
    LAOYAO_CUDA_CHECK(cudaStreamSynchronize(stream));
    const auto dqkv_gpu = from_device_bf16(ddqkv, T * L.row);
    expect_rel_norm(split ? split_rows(dqkv_gpu, L, T, c.H, c.G, c.D, false) : dqkv_gpu, to_double(want.dqkv),
                    kAttnNormTol, kAttnElemTol, "dqkv over " + std::to_string(docs) + " documents");
  }
}

TEST_F(CudaKernels, AttentionCudnnDocumentsMatchCpu) {
  check_attention_cudnn_documents({2, 300, 4, 4, 64, 0.0}, stream_, cuda::QkvRows::Fused, {40, 2});
  check_attention_cudnn_documents({2, 257, 8, 2, 128, 0.0}, stream_, cuda::QkvRows::Fused, {90, 3});
  check_attention_cudnn_documents({1, 520, 8, 2, 128, 0.0}, stream_, cuda::QkvRows::Split, {150, 4});
}

TEST_F(CudaKernels, CudnnDocumentsAreKeyStartsDocuments) {
  // Two sequences of 6: documents [0,2) [2,6) and [0,1) [1,4) [4,6).
  const std::vector<int32_t> key_start{0, 0, 2, 2, 2, 2, 0, 1, 1, 1, 4, 4};
  std::vector<int64_t> start;
  std::vector<int32_t> length;
  ASSERT_EQ(cuda::fill_cudnn_documents(key_start.data(), 2, 6, start, length), 32);
  ASSERT_EQ(start.size(), 33u);
  EXPECT_EQ(std::vector<int64_t>(start.begin(), start.begin() + 6), (std::vector<int64_t>{0, 2, 6, 7, 10, 12}));
  EXPECT_EQ(std::vector<int32_t>(length.begin(), length.begin() + 6), (std::vector<int32_t>{2, 4, 1, 3, 2, 0}));
  EXPECT_EQ(start.back(), 12);
  EXPECT_EQ(cuda::documents_bucket(33), 64);
  EXPECT_EQ(cuda::documents_bucket(512), 512);
  EXPECT_EQ(cuda::documents_bucket(513), 1024);
  // A query that sees part of its document only is not a document.
  const std::vector<int32_t> window{0, 0, 1, 2, 0, 0};
  EXPECT_THROW(cuda::fill_cudnn_documents(window.data(), 1, 6, start, length), laoyao::Error);
}

TEST_F(CudaKernels, AttentionCudnnRefusesHeadDimNotMultipleOf8) {
  EXPECT_FALSE(cuda::CudnnAttention::supports(shape_of({1, 16, 2, 2, 36, 0.0})));
  EXPECT_THROW(cuda::CudnnAttention(shape_of({1, 16, 2, 2, 36, 0.0}), stream_), laoyao::Error);
}

// ---------------------------------------------------------------- multi-latent attention

// cuDNN's attention over separate q, k and v whose value head dim differs from the query's (MLA),
// against the CPU's separate_attention (fp32 from the same bf16 inputs): ctx, dq, dk, dv; every
// gradient element written (poisoned first); a smaller batch than the plans were built for.
void check_attention_cudnn_separate(int64_t b, int64_t s, int64_t H, int64_t Dqk, int64_t Dv, cudaStream_t stream,
                                    int64_t run_b = 0) {
  SCOPED_TRACE("b " + std::to_string(b) + " s " + std::to_string(s) + " H " + std::to_string(H) + " Dqk " +
               std::to_string(Dqk) + " Dv " + std::to_string(Dv));
  const int64_t rb = run_b > 0 ? run_b : b, T = rb * s;
  const uint64_t seed = 9300 + static_cast<uint64_t>(s + Dqk + Dv);
  const float scale = 0.8f / std::sqrt(static_cast<float>(Dqk));  // (MLA's: YaRN's mscale^2 / sqrt(Dqk))
  const auto q = randn_bf16(T * H * Dqk, seed, "mla_attn.q"), k = randn_bf16(T * H * Dqk, seed, "mla_attn.k");
  const auto v = randn_bf16(T * H * Dv, seed, "mla_attn.v"), dctx = randn_bf16(T * H * Dv, seed, "mla_attn.dctx");
  std::vector<float> ctx(T * H * Dv), probs(rb * H * s * s), dq(q.size()), dk(k.size()), dv(v.size());
  cpu::separate_attention_forward(q.data(), k.data(), v.data(), ctx.data(), probs.data(), rb, s, H, Dqk, Dv, scale);
  cpu::separate_attention_backward(q.data(), k.data(), v.data(), probs.data(), dctx.data(), dq.data(), dk.data(),
                                   dv.data(), rb, s, H, Dqk, Dv, scale);

  cuda::AttentionShape shape{b, s, H, H, Dqk, scale};
  shape.Dv = Dv;
  ASSERT_TRUE(cuda::CudnnAttention::supports(shape));
  cuda::CudnnAttention attn(shape, stream, cuda::QkvRows::Separate);
  auto dq_in = to_device_bf16(q), dk_in = to_device_bf16(k), dv_in = to_device_bf16(v), ddctx = to_device_bf16(dctx);
  DeviceBuffer ctx_out(T * H * Dv * sizeof(bf16)), lse(rb * H * s * sizeof(float));
  DeviceBuffer gq(q.size() * sizeof(bf16)), gk(k.size() * sizeof(bf16)), gv(v.size() * sizeof(bf16));
  attn.forward(dq_in.as<bf16>(), dk_in.as<bf16>(), dv_in.as<bf16>(), ctx_out.as<bf16>(), lse.as<float>(), rb);
  LAOYAO_CUDA_CHECK(cudaStreamSynchronize(stream));
  expect_rel_norm(from_device_bf16(ctx_out, ctx.size()), to_double(ctx), kAttnNormTol, kAttnElemTol, "ctx");
  for (DeviceBuffer* g : {&gq, &gk, &gv}) LAOYAO_CUDA_CHECK(cudaMemset(g->ptr, 0x7f, g->bytes));
  attn.backward(dq_in.as<bf16>(), dk_in.as<bf16>(), dv_in.as<bf16>(), ctx_out.as<bf16>(), ddctx.as<bf16>(),
                lse.as<float>(), gq.as<bf16>(), gk.as<bf16>(), gv.as<bf16>(), rb);
  LAOYAO_CUDA_CHECK(cudaStreamSynchronize(stream));
  expect_rel_norm(from_device_bf16(gq, q.size()), to_double(dq), kAttnNormTol, kAttnElemTol, "dq");
  expect_rel_norm(from_device_bf16(gk, k.size()), to_double(dk), kAttnNormTol, kAttnElemTol, "dk");
  expect_rel_norm(from_device_bf16(gv, v.size()), to_double(dv), kAttnNormTol, kAttnElemTol, "dv");
  // The fused-rows entry points refuse a separate-rows object.
  EXPECT_THROW(attn.forward(dq_in.as<bf16>(), ctx_out.as<bf16>(), lse.as<float>(), rb), laoyao::Error);
}

TEST_F(CudaKernels, AttentionCudnnSeparateRowsMatchCpu) {
  check_attention_cudnn_separate(2, 100, 4, 48, 32, stream_);
  check_attention_cudnn_separate(3, 64, 2, 48, 32, stream_, 2);  // smaller batch than planned
}
// DeepSeek-V2-Lite's head dims: qk_head_dim 128 + qk_pos_emb_head_dim 64, v_head_dim 128.
TEST_F(CudaKernels, AttentionCudnnDeepseekHeadDimsMatchCpu) { check_attention_cudnn_separate(1, 256, 2, 192, 128, stream_); }
TEST_F(CudaKernels, AttentionCudnnRefusesUnequalHeadDimsOverQkvRows) {
  cuda::AttentionShape shape{1, 16, 2, 2, 64, 0.125f};
  shape.Dv = 32;
  EXPECT_THROW(cuda::CudnnAttention(shape, stream_, cuda::QkvRows::Fused), laoyao::Error);
}

// mla_prepare_forward/backward against the CPU's mla_qkv_forward/backward: the no-pe parts copied
// exactly, MLA's interleaved RoPE (whole or partial, plain or YaRN-scaled table) within one bf16
// rounding, the shared key's gradient summed over the heads; k_pe's other columns left alone.
void check_mla_prepare(const cpu::RopeParams& rp, int64_t b, int64_t s, int64_t H, int64_t dqk, int64_t dr,
                       int64_t dv, cudaStream_t stream) {
  const int64_t T = b * s, dq = dqk + dr, kv_lora = 24, ld = kv_lora + dr;
  const cpu::RopeTable table = cpu::rope_table(dr, s + 3, rp);
  SCOPED_TRACE("H " + std::to_string(H) + " dqk " + std::to_string(dqk) + " dr " + std::to_string(dr) + " rot_dim " +
               std::to_string(table.rot_dim));
  std::vector<float> cos_sin = table.cos;
  cos_sin.insert(cos_sin.end(), table.sin.begin(), table.sin.end());
  auto dtable = to_device(cos_sin);
  const cuda::RopeDeviceTable dt{dtable.as<float>(), dtable.as<float>() + table.cos.size(), table.rot_dim,
                                 table.max_positions};
  std::vector<int64_t> pos(T);
  for (int64_t t = 0; t < T; ++t) pos[t] = t % s;
  const uint64_t seed = 9400 + static_cast<uint64_t>(table.rot_dim);
  const auto q = randn_bf16(T * H * dq, seed, "mla.q"), kv = randn_bf16(T * H * (dqk + dv), seed, "mla.kv");
  const auto down = randn_bf16(T * ld, seed, "mla.kv_down");
  std::vector<float> query(T * H * dq), key(T * H * dq), value(T * H * dv);
  cpu::mla_qkv_forward(q.data(), kv.data(), down.data() + kv_lora, ld, pos.data(), table, query.data(), key.data(),
                       value.data(), T, H, dqk, dr, dv);
  auto gq = to_device_bf16(q), gkv = to_device_bf16(kv), gdown = to_device_bf16(down);
  DeviceBuffer gquery(query.size() * sizeof(bf16)), gkey(key.size() * sizeof(bf16)), gvalue(value.size() * sizeof(bf16));
  const cuda::MlaDims d{b, s, H, dqk, dr, dv};
  cuda::mla_prepare_forward(gq.as<bf16>(), gkv.as<bf16>(), gdown.as<bf16>() + kv_lora, ld, dt, gquery.as<bf16>(),
                            gkey.as<bf16>(), gvalue.as<bf16>(), d, stream);
  LAOYAO_CUDA_CHECK(cudaStreamSynchronize(stream));
  expect_bf16_close(from_device_bf16(gquery, query.size()), to_double(query), 0.0, "query");
  expect_bf16_close(from_device_bf16(gkey, key.size()), to_double(key), 0.0, "key");
  expect_equal(from_device_bf16(gvalue, value.size()), value, "value");

  const auto dquery = randn_bf16(query.size(), seed, "mla.dquery"), dkey = randn_bf16(key.size(), seed, "mla.dkey");
  const auto dvalue = randn_bf16(value.size(), seed, "mla.dvalue");
  std::vector<float> dqv(q.size()), dkvv(kv.size()), ddown = down;  // (dk_pe's latent columns: down's values)
  cpu::mla_qkv_backward(dquery.data(), dkey.data(), dvalue.data(), pos.data(), table, dqv.data(), dkvv.data(),
                        ddown.data() + kv_lora, ld, T, H, dqk, dr, dv);
  auto gdquery = to_device_bf16(dquery), gdkey = to_device_bf16(dkey), gdvalue = to_device_bf16(dvalue);
  DeviceBuffer gdq(q.size() * sizeof(bf16)), gdkv(kv.size() * sizeof(bf16));
  LAOYAO_CUDA_CHECK(cudaMemset(gdq.ptr, 0x7f, gdq.bytes));
  LAOYAO_CUDA_CHECK(cudaMemset(gdkv.ptr, 0x7f, gdkv.bytes));
  cuda::mla_prepare_backward(gdquery.as<bf16>(), gdkey.as<bf16>(), gdvalue.as<bf16>(), dt, gdq.as<bf16>(),
                             gdkv.as<bf16>(), gdown.as<bf16>() + kv_lora, ld, d, stream);
  LAOYAO_CUDA_CHECK(cudaStreamSynchronize(stream));
  expect_bf16_close(from_device_bf16(gdq, q.size()), to_double(dqv), 0.0, "dq");
  expect_equal(from_device_bf16(gdkv, kv.size()), dkvv, "dkv");
  // The heads' sum in fp32 on the GPU, in double on the CPU: one bf16 rounding plus the sum's.
  const auto got = from_device_bf16(gdown, down.size());
  std::vector<float> latent_got, latent_want;
  std::vector<float> pe_got;
  std::vector<double> pe_want;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < ld; ++c)
      if (c < kv_lora) {
        latent_got.push_back(got[t * ld + c]), latent_want.push_back(down[t * ld + c]);
      } else {
        pe_got.push_back(got[t * ld + c]), pe_want.push_back(ddown[t * ld + c]);
      }
  expect_equal(latent_got, latent_want, "k_pe's row, its latent columns (not written)");
  expect_bf16_close(pe_got, pe_want, 1e-5, "dk_pe");
}

TEST_F(CudaKernels, MlaPrepareMatchesCpu) {
  cpu::RopeParams plain;
  plain.rotary_base = 10000;
  check_mla_prepare(plain, 2, 37, 4, 32, 16, 24, stream_);
  cpu::RopeParams partial = plain;  // a rotary_percent that leaves dims unrotated
  partial.rotary_percent = 0.5;
  check_mla_prepare(partial, 1, 20, 3, 16, 16, 16, stream_);
  cpu::RopeParams yarn = plain;  // DeepSeek's: YaRN with its mscale in cos and sin
  cpu::YarnParams y;
  y.scaling_factor = 40, y.original_max_position_embeddings = 16, y.mscale = 0.707, y.mscale_all_dim = 0.707;
  yarn.yarn = y;
  check_mla_prepare(yarn, 2, 64, 16, 128, 64, 128, stream_);
}

TEST_F(CudaKernels, MlaPrepareRefusesATableLongerThanTheRotatedDims) {
  cpu::RopeParams rp;
  const cpu::RopeTable table = cpu::rope_table(32, 8, rp);  // rot_dim 32 > dr 16
  auto dtable = to_device(table.cos);
  const cuda::RopeDeviceTable dt{dtable.as<float>(), dtable.as<float>(), table.rot_dim, table.max_positions};
  DeviceBuffer x(4096);
  EXPECT_THROW(cuda::mla_prepare_forward(x.as<bf16>(), x.as<bf16>(), x.as<bf16>(), 16, dt, x.as<bf16>(), x.as<bf16>(),
                                         x.as<bf16>(), {1, 4, 1, 8, 16, 8}, stream_),
               laoyao::Error);
}

// ---------------------------------------------------------------- optimizer

// Fewer and more elements than blocks, and more than four packs a thread (the 16-byte kernel's
// loads in flight, n % 4 left over); from an aligned start (16-byte loads) or one element on (the
// scalar kernel); every element, or those a random flag counts. Twice the same call: the same bits.
TEST_F(CudaKernels, SumSquaresMatchesDoubleSum) {
  DeviceBuffer scratch(cuda::kReduceBlocks * sizeof(double)), out(sizeof(double));
  for (const int64_t n : {int64_t{777}, int64_t{100003}, int64_t{5000001}})
    for (const int64_t start : {int64_t{0}, int64_t{1}})
      for (const bool flagged : {false, true}) {
        SCOPED_TRACE("n = " + std::to_string(n) + ", start " + std::to_string(start) + (flagged ? ", flagged" : ""));
        const auto x = randn(n + start, 31, "sumsq.x", 0.5);
        std::vector<uint8_t> flags(static_cast<size_t>(n + start), 1);
        Rng pick(31, "sumsq.flags");
        if (flagged)
          for (auto& f : flags) f = pick.uniform() < 0.6 ? 1 : 0;
        double want = 0.0;
        for (int64_t i = start; i < n + start; ++i) want += flags[i] ? double(x[i]) * x[i] : 0.0;
        auto dx = to_device(x), dflags = to_device(flags);
        const uint8_t* counted = flagged ? dflags.as<uint8_t>() + start : nullptr;
        cuda::sum_squares(dx.as<float>() + start, n, scratch.as<double>(), out.as<double>(), stream_, counted);
        sync();
        const double got = from_device<double>(out, 1)[0];
        EXPECT_NEAR(got, want, 1e-11 * want);  // double sums (any order) of exact double squares
        cuda::sum_squares(dx.as<float>() + start, n, scratch.as<double>(), out.as<double>(), stream_, counted);
        sync();
        EXPECT_EQ(from_device<double>(out, 1)[0], got);
      }
}

TEST_F(CudaKernels, CountZerosIsExact) {
  const int64_t n = 100003;
  auto x = randn(n, 32, "zeros.x");
  Rng pick(32, "zeros.where");
  int64_t want = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (pick.uniform() < 0.01) x[i] = (i % 2) ? 0.0f : -0.0f;  // -0 == 0 too
    want += x[i] == 0.0f;
  }
  ASSERT_GT(want, 500);
  DeviceBuffer scratch(cuda::kReduceBlocks * sizeof(double)), out(sizeof(double));
  auto dx = to_device(x);
  cuda::count_zeros(dx.as<float>(), n, scratch.as<double>(), out.as<double>(), stream_);
  sync();
  EXPECT_EQ(from_device<double>(out, 1)[0], static_cast<double>(want));
  // One element on (the scalar kernel), every other element counted.
  std::vector<uint8_t> flags(static_cast<size_t>(n));
  int64_t want_flagged = 0;
  for (int64_t i = 1; i < n; ++i) {
    flags[i] = i % 2;
    want_flagged += flags[i] && x[i] == 0.0f;
  }
  auto dflags = to_device(flags);
  cuda::count_zeros(dx.as<float>() + 1, n - 1, scratch.as<double>(), out.as<double>(), stream_,
                    dflags.as<uint8_t>() + 1);
  sync();
  EXPECT_EQ(from_device<double>(out, 1)[0], static_cast<double>(want_flagged));
}

TEST_F(CudaKernels, MaskedLossSumAccumulates) {
  const int64_t T = 1500;  // more tokens than the kernel's 1024 threads
  auto loss = randn(T, 33, "mls.loss", 2.0, 5.0);
  std::vector<float> mask(T);
  Rng rng(33, "mls.mask");
  for (auto& m : mask) m = rng.uniform() < 0.7 ? 1.0f : 0.0f;
  double s = 0.0, c = 0.0;
  for (int64_t t = 0; t < T; ++t) s += double(loss[t]) * mask[t], c += mask[t];
  const std::vector<double> acc0 = {3.25, 7.0};
  auto dl = to_device(loss), dm = to_device(mask), dacc = to_device(acc0);
  cuda::masked_loss_sum(dl.as<float>(), dm.as<float>(), T, dacc.as<double>(), stream_);
  cuda::masked_loss_sum(dl.as<float>(), dm.as<float>(), T, dacc.as<double>(), stream_);
  sync();
  const auto acc = from_device<double>(dacc, 2);
  EXPECT_NEAR(acc[0], acc0[0] + 2 * s, 1e-12 * (acc0[0] + 2 * s)) << "loss sum";
  EXPECT_EQ(acc[1], acc0[1] + 2 * c) << "token count";
}

TEST_F(CudaKernels, AdamWStepMatchesCpuAdamW) {
  const int64_t n = 5003;
  const std::vector<optim::ParamRange> ranges = {{0, 3000, 1.0}, {3000, 500, 0.0}, {3500, 1503, 1.0}};
  std::vector<uint8_t> decay(n);
  for (const auto& r : ranges)
    for (int64_t i = r.offset; i < r.offset + r.numel; ++i) decay[i] = r.wd_mult != 0.0 ? 1 : 0;
  const optim::AdamWSettings settings;  // 0.9, 0.999, 1e-8
  optim::AdamW cpu_opt(n, ranges, settings);
  // A random starting state (as if steps had been taken), the same on both sides.
  auto params = randn(n, 41, "adamw.params");
  cpu_opt.exp_avg() = randn(n, 41, "adamw.exp_avg", 0.01);
  cpu_opt.exp_avg_sq() = randn(n, 41, "adamw.exp_avg_sq", 0.01);
  for (auto& v : cpu_opt.exp_avg_sq()) v *= v;

  auto dp = to_device(params), dm = to_device(cpu_opt.exp_avg()), dv = to_device(cpu_opt.exp_avg_sq());
  auto ddecay = to_device(decay);
  DeviceBuffer dg(n * sizeof(float)), dpb(n * sizeof(bf16));
  const double lr = 1e-2, wd = 0.1;
  for (int step = 1; step <= 4; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const auto grads = randn(n, 41, "adamw.grads." + std::to_string(step), 0.1);
    dg.upload(grads.data(), n * sizeof(float));
    auto cpu_grads = grads;
    float grad_scale = 1.0f;
    if (step == 4) {  // clipping: Megatron's coefficient, folded into the GPU step
      const double norm = optim::grad_norm(cpu_grads.data(), n);
      const double coeff = optim::clip_grads(cpu_grads.data(), n, norm, 0.5 * norm);
      ASSERT_LT(coeff, 1.0);
      grad_scale = static_cast<float>(coeff);
    }
    cuda::AdamWStep s;
    s.beta1 = static_cast<float>(settings.beta1);
    s.beta2 = static_cast<float>(settings.beta2);
    s.eps = settings.eps;
    s.lr = lr;
    s.wd = wd;
    s.step_size = lr / (1.0 - std::pow(settings.beta1, static_cast<double>(step)));
    s.bc2_sqrt = std::sqrt(1.0 - std::pow(settings.beta2, static_cast<double>(step)));
    s.grad_scale = grad_scale;
    const std::vector<float> m_prev = cpu_opt.exp_avg();
    cuda::adamw_step(dp.as<float>(), dg.as<float>(), dm.as<float>(), dv.as<float>(), dpb.as<bf16>(),
                     ddecay.as<uint8_t>(), n, s, stream_);
    cpu_opt.step(params.data(), cpu_grads.data(), lr, wd);
    sync();

    // The same fp32/fp64 formulas on both sides, but nvcc may fuse a multiply-add (one rounding
    // less), so agreement is to a few fp32 ulps of the terms: exp_avg to 1e-6 of |b1 m| + |(1-b1) g|
    // (the terms can cancel), exp_avg_sq (positive terms) to 1e-6 relative, params to 1e-6
    // relative plus 1e-5 * lr for parameters near zero. A wrong decay flag errs by lr*wd*|p|.
    const auto p_gpu = from_device<float>(dp, n);
    std::vector<double> tol(n);
    for (int64_t i = 0; i < n; ++i) tol[i] = 1e-6 * std::abs(params[i]) + 1e-5 * lr;
    expect_within(p_gpu, to_double(params), tol, "param");
    const auto m_want = to_double(cpu_opt.exp_avg()), v_want = to_double(cpu_opt.exp_avg_sq());
    for (int64_t i = 0; i < n; ++i)
      // A few ulps of the two terms: nvcc contracts b1*m + (1-b1)*g into an FMA, g++ does not.
      tol[i] = 1e-5 * (settings.beta1 * std::abs(m_prev[i]) + (1.0 - settings.beta1) * std::abs(cpu_grads[i]));
    expect_within(from_device<float>(dm, n), m_want, tol, "exp_avg");
    for (int64_t i = 0; i < n; ++i) tol[i] = 1e-6 * std::abs(v_want[i]) + 1e-30;
    expect_within(from_device<float>(dv, n), v_want, tol, "exp_avg_sq");
    // The bf16 copy is exactly bf16(param); the gradient is left unscaled.
    std::vector<float> pb_want(n);
    for (int64_t i = 0; i < n; ++i) pb_want[i] = round_to_bf16(p_gpu[i]);
    expect_equal(from_device_bf16(dpb, n), pb_want, "param_bf16");
    expect_equal(from_device<float>(dg, n), grads, "grad untouched");
  }
}

// A distributed-optimizer shard can start at any element: the step then runs its first elements
// one at a time up to 16-byte alignment, the middle four at a time, the tail one at a time. Every
// element must get the same bits as in a step over the whole (aligned) buffers; the elements before
// the shard stay untouched.
TEST_F(CudaKernels, AdamWStepOnAShardStartingAnywhereMatchesTheWholeStep) {
  const int64_t n = 1031;
  std::vector<uint8_t> decay(n);
  for (int64_t i = 0; i < n; ++i) decay[i] = i % 7 != 0;
  const auto p0 = randn(n, 43, "adamw.shard.params"), g = randn(n, 43, "adamw.shard.grads", 0.1);
  const auto m0 = randn(n, 43, "adamw.shard.m", 0.01);
  auto v0 = randn(n, 43, "adamw.shard.v", 0.01);
  for (auto& x : v0) x *= x;
  cuda::AdamWStep s;
  s.lr = 1e-2, s.wd = 0.1, s.step_size = 1e-2 / (1 - 0.9), s.bc2_sqrt = std::sqrt(1 - 0.999), s.grad_scale = 0.75f;
  auto run = [&](int64_t begin) {
    auto dp = to_device(p0), dm = to_device(m0), dv = to_device(v0), dg = to_device(g), dd = to_device(decay);
    DeviceBuffer dpb(n * sizeof(bf16));
    LAOYAO_CUDA_CHECK(cudaMemsetAsync(dpb.ptr, 0, dpb.bytes, stream_));
    cuda::adamw_step(dp.as<float>() + begin, dg.as<float>() + begin, dm.as<float>() + begin, dv.as<float>() + begin,
                     dpb.as<bf16>() + begin, dd.as<uint8_t>() + begin, n - begin, s, stream_);
    sync();
    return std::vector<std::vector<float>>{from_device<float>(dp, n), from_device<float>(dm, n),
                                           from_device<float>(dv, n), from_device_bf16(dpb, n)};
  };
  const auto whole = run(0);
  for (const int64_t begin : {int64_t{1}, int64_t{3}, int64_t{6}}) {
    SCOPED_TRACE("shard from " + std::to_string(begin));
    const auto shard = run(begin);
    for (int64_t i = 0; i < n; ++i) {
      const bool in = i >= begin;
      ASSERT_EQ(shard[0][i], in ? whole[0][i] : p0[i]) << "param " << i;
      ASSERT_EQ(shard[1][i], in ? whole[1][i] : m0[i]) << "exp_avg " << i;
      ASSERT_EQ(shard[2][i], in ? whole[2][i] : v0[i]) << "exp_avg_sq " << i;
      ASSERT_EQ(shard[3][i], in ? whole[3][i] : 0.0f) << "param_bf16 " << i;
    }
  }
}

// ---------------------------------------------------------------- layernorm

// A norm backward's dx_colsum: got[c] == base[c] + sum over t of dx[t, c] (the bf16 values the
// kernel wrote, summed in fp64 here), within fp32 summation's error.
void expect_column_sums(const std::vector<float>& got, const std::vector<float>& base, const std::vector<float>& dx,
                        int64_t T, int64_t C, const char* what) {
  std::vector<double> want(C), tol(C);
  for (int64_t c = 0; c < C; ++c) {
    double sum = base[c], mag = std::abs(base[c]);
    for (int64_t t = 0; t < T; ++t) sum += dx[t * C + c], mag += std::abs(dx[t * C + c]);
    want[c] = sum;
    tol[c] = kFp32Sum * mag;
  }
  expect_within(got, want, tol, what);
}

TEST_F(CudaKernels, LayerNormForwardBackwardMatchCpu) {
  const float eps = 1e-5f;
  // C = 1003: the block-per-row kernels; C = 768: the warp-per-row, 16-byte-vector kernels, whose
  // backward also writes the parameter partials; C = 2048: warp-per-row dx, partials apart.
  // T = 300: three row chunks of the dgamma reduction's 128, nineteen of the fused kernel's 16 (two
  // rows a warp); T = 8229: five rows a warp in the fused kernel (its grid held to 256 blocks), the
  // last chunk partial.
  for (const int64_t T : {int64_t{300}, int64_t{8229}})
  for (const int64_t C : {int64_t{1003}, int64_t{768}, int64_t{2048}})
  for (const bool zc : {false, true}) {
    SCOPED_TRACE((zc ? "zero-centered gamma, C = " : "plain gamma, C = ") + std::to_string(C) +
                 ", T = " + std::to_string(T));
    const uint64_t seed = zc ? 52 : 51;
    const auto x = randn_bf16(T * C, seed, "ln.x", 2.0, 0.5);
    const auto gamma = randn_bf16(C, seed, "ln.gamma", 0.1, zc ? 0.0 : 1.0);
    const auto beta = randn_bf16(C, seed, "ln.beta", 0.1);
    const auto dyv = randn_bf16(T * C, seed, "ln.dy");
    const auto dgamma0 = randn(C, seed, "ln.dgamma0"), dbeta0 = randn(C, seed, "ln.dbeta0");

    std::vector<float> y(T * C), mean(T), rstd(T);
    cpu::layernorm_forward(x.data(), gamma.data(), beta.data(), y.data(), mean.data(), rstd.data(), T, C, eps, zc);

    auto dx_in = to_device_bf16(x), dgam = to_device_bf16(gamma), dbet = to_device_bf16(beta);
    auto ddy = to_device_bf16(dyv), ddg = to_device(dgamma0), ddb = to_device(dbeta0);
    DeviceBuffer dy_out(T * C * sizeof(bf16)), dmean(T * sizeof(float)), drstd(T * sizeof(float));
    DeviceBuffer ddx(T * C * sizeof(bf16)), scratch(cuda::layernorm_backward_scratch_floats(T, C) * sizeof(float));
    cuda::layernorm_forward(dx_in.as<bf16>(), dgam.as<bf16>(), dbet.as<bf16>(), dy_out.as<bf16>(), dmean.as<float>(),
                            drstd.as<float>(), T, C, eps, zc, stream_);
    sync();
    const auto mean_gpu = from_device<float>(dmean, T), rstd_gpu = from_device<float>(drstd, T);
    std::vector<double> tol(T);
    for (int64_t t = 0; t < T; ++t) {
      double a = 0.0;
      for (int64_t c = 0; c < C; ++c) a += std::abs(x[t * C + c]);
      tol[t] = kFp32Sum * a / C;
    }
    expect_within(mean_gpu, to_double(mean), tol, "mean");
    for (int64_t t = 0; t < T; ++t) tol[t] = kFp32Sum * rstd[t];
    expect_within(rstd_gpu, to_double(rstd), tol, "rstd");
    expect_bf16_close(from_device_bf16(dy_out, T * C), to_double(y), 1e-4, "y");

    // Backward from the GPU's saved statistics on both sides (they agree to fp32 rounding anyway).
    std::vector<float> dx(T * C), dgamma = dgamma0, dbeta = dbeta0;
    cpu::layernorm_backward(dyv.data(), x.data(), gamma.data(), mean_gpu.data(), rstd_gpu.data(), dx.data(),
                            dgamma.data(), dbeta.data(), T, C, zc);
    const auto colsum0 = randn(C, seed, "ln.colsum0");
    auto dcs = to_device(colsum0);
    cuda::layernorm_backward(ddy.as<bf16>(), dx_in.as<bf16>(), dgam.as<bf16>(), dmean.as<float>(), drstd.as<float>(),
                             ddx.as<bf16>(), ddg.as<float>(), ddb.as<float>(), scratch.as<float>(), T, C, zc,
                             stream_, false, dcs.as<float>());
    sync();
    const auto dx_gpu = from_device_bf16(ddx, T * C);
    expect_bf16_close(dx_gpu, to_double(dx), 1e-4, "dx");
    expect_column_sums(from_device<float>(dcs, C), colsum0, dx_gpu, T, C, "colsum0 + column sums of dx");
    std::vector<double> tg(C), tb(C);
    for (int64_t c = 0; c < C; ++c) {
      double ag = std::abs(dgamma0[c]), ab = std::abs(dbeta0[c]);
      for (int64_t t = 0; t < T; ++t) {
        const double xhat = (double(x[t * C + c]) - mean_gpu[t]) * rstd_gpu[t];
        ag += std::abs(dyv[t * C + c] * xhat);
        ab += std::abs(dyv[t * C + c]);
      }
      tg[c] = kFp32Sum * ag;
      tb[c] = kFp32Sum * ab;
    }
    expect_within(from_device<float>(ddg, C), to_double(dgamma), tg, "dgamma0 + dgamma");
    expect_within(from_device<float>(ddb, C), to_double(dbeta), tb, "dbeta0 + dbeta");
    {  // Without dx_colsum (its own kernel instantiations): the same dx, dgamma and dbeta bits.
      auto ddx2 = to_device_bf16(std::vector<float>(T * C, 0.0f));
      auto ddg2 = to_device(dgamma0), ddb2 = to_device(dbeta0);
      cuda::layernorm_backward(ddy.as<bf16>(), dx_in.as<bf16>(), dgam.as<bf16>(), dmean.as<float>(),
                               drstd.as<float>(), ddx2.as<bf16>(), ddg2.as<float>(), ddb2.as<float>(),
                               scratch.as<float>(), T, C, zc, stream_);
      sync();
      expect_equal(from_device_bf16(ddx2, T * C), dx_gpu, "dx without dx_colsum");
      expect_equal(from_device<float>(ddg2, C), from_device<float>(ddg, C), "dgamma without dx_colsum");
      expect_equal(from_device<float>(ddb2, C), from_device<float>(ddb, C), "dbeta without dx_colsum");
    }
    if (C % 8 == 0) {  // accumulate_dx: dx = residual gradient + the norm's, rounded once
      const auto r = randn_bf16(T * C, seed, "ln.residual_grad");
      auto dacc = to_device_bf16(r);
      auto dcs_acc = to_device(colsum0);
      cuda::layernorm_backward(ddy.as<bf16>(), dx_in.as<bf16>(), dgam.as<bf16>(), dmean.as<float>(),
                               drstd.as<float>(), dacc.as<bf16>(), ddg.as<float>(), ddb.as<float>(),
                               scratch.as<float>(), T, C, zc, stream_, true, dcs_acc.as<float>());
      sync();
      std::vector<double> want_acc(T * C);
      for (int64_t i = 0; i < T * C; ++i) want_acc[i] = double(r[i]) + dx[i];
      const auto acc_gpu = from_device_bf16(dacc, T * C);
      expect_bf16_close(acc_gpu, want_acc, 1e-4, "residual grad + dx");
      expect_column_sums(from_device<float>(dcs_acc, C), colsum0, acc_gpu, T, C, "column sums of the summed dx");
    }
  }
}

// ---------------------------------------------------------------- Llama's pieces

TEST_F(CudaKernels, RmsNormForwardBackwardMatchCpu) {
  // C = 768 and 2048: dx and the weight-gradient partials in one kernel (4 and 8 packs a lane);
  // C = 4096: the partials in a kernel of their own. T = 8229: the fused kernel's warps take five
  // rows each, as in LayerNormForwardBackwardMatchCpu.
  for (const int64_t T : {int64_t{300}, int64_t{8229}})
  for (const int64_t C : {int64_t{768}, int64_t{2048}, int64_t{4096}}) {
    SCOPED_TRACE("C = " + std::to_string(C) + ", T = " + std::to_string(T));
    const float eps = 1e-5f;
    const auto x = randn_bf16(T * C, 80, "rms.x", 2.0, 0.5);
    const auto gamma = randn_bf16(C, 80, "rms.gamma", 0.1, 1.0);
    const auto dyv = randn_bf16(T * C, 80, "rms.dy");
    const auto dgamma0 = randn(C, 80, "rms.dgamma0");
    std::vector<float> y(T * C), rstd(T);
    cpu::rmsnorm_forward(x.data(), gamma.data(), y.data(), rstd.data(), T, C, eps, false);
    auto dx_in = to_device_bf16(x), dgam = to_device_bf16(gamma), ddy = to_device_bf16(dyv), ddg = to_device(dgamma0);
    DeviceBuffer dy_out(T * C * sizeof(bf16)), drstd(T * sizeof(float)), ddx(T * C * sizeof(bf16));
    DeviceBuffer scratch(cuda::layernorm_backward_scratch_floats(T, C) * sizeof(float));
    cuda::rmsnorm_forward(dx_in.as<bf16>(), dgam.as<bf16>(), dy_out.as<bf16>(), drstd.as<float>(), T, C, eps, false,
                          stream_);
    sync();
    const auto rstd_gpu = from_device<float>(drstd, T);
    std::vector<double> tol(T);
    for (int64_t t = 0; t < T; ++t) tol[t] = kFp32Sum * rstd[t];
    expect_within(rstd_gpu, to_double(rstd), tol, "rstd");
    expect_bf16_close(from_device_bf16(dy_out, T * C), to_double(y), 1e-4, "y");

    std::vector<float> dx(T * C), dgamma = dgamma0;
    cpu::rmsnorm_backward(dyv.data(), x.data(), gamma.data(), rstd_gpu.data(), dx.data(), dgamma.data(), T, C, false);
    const auto colsum0 = randn(C, 80, "rms.colsum0");
    auto dcs = to_device(colsum0);
    cuda::rmsnorm_backward(ddy.as<bf16>(), dx_in.as<bf16>(), dgam.as<bf16>(), drstd.as<float>(), ddx.as<bf16>(),
                           ddg.as<float>(), scratch.as<float>(), T, C, false, stream_, false, dcs.as<float>());
    sync();
    const auto dx_gpu = from_device_bf16(ddx, T * C);
    expect_bf16_close(dx_gpu, to_double(dx), 1e-4, "dx");
    expect_column_sums(from_device<float>(dcs, C), colsum0, dx_gpu, T, C, "colsum0 + column sums of dx");
    std::vector<double> tg(C);
    for (int64_t c = 0; c < C; ++c) {
      double a = std::abs(dgamma0[c]);
      for (int64_t t = 0; t < T; ++t) a += std::abs(dyv[t * C + c] * x[t * C + c] * rstd_gpu[t]);
      tg[c] = kFp32Sum * a;
    }
    expect_within(from_device<float>(ddg, C), to_double(dgamma), tg, "dgamma0 + dgamma");
    {  // Without dx_colsum (its own kernel instantiations): the same dx and dgamma bits.
      auto ddx2 = to_device_bf16(std::vector<float>(T * C, 0.0f));
      auto ddg2 = to_device(dgamma0);
      cuda::rmsnorm_backward(ddy.as<bf16>(), dx_in.as<bf16>(), dgam.as<bf16>(), drstd.as<float>(), ddx2.as<bf16>(),
                             ddg2.as<float>(), scratch.as<float>(), T, C, false, stream_);
      sync();
      expect_equal(from_device_bf16(ddx2, T * C), dx_gpu, "dx without dx_colsum");
      expect_equal(from_device<float>(ddg2, C), from_device<float>(ddg, C), "dgamma without dx_colsum");
    }
    // accumulate_dx: the residual stream's gradient plus the norm's.
    const auto r = randn_bf16(T * C, 80, "rms.residual_grad");
    auto dacc = to_device_bf16(r);
    auto dcs_acc = to_device(colsum0);
    cuda::rmsnorm_backward(ddy.as<bf16>(), dx_in.as<bf16>(), dgam.as<bf16>(), drstd.as<float>(), dacc.as<bf16>(),
                           ddg.as<float>(), scratch.as<float>(), T, C, false, stream_, true, dcs_acc.as<float>());
    sync();
    std::vector<double> want(T * C);
    for (int64_t i = 0; i < T * C; ++i) want[i] = double(r[i]) + dx[i];
    const auto acc_gpu = from_device_bf16(dacc, T * C);
    expect_bf16_close(acc_gpu, want, 1e-4, "residual grad + dx");
    expect_column_sums(from_device<float>(dcs_acc, C), colsum0, acc_gpu, T, C, "column sums of the summed dx");
    // The weight gradient is the same bits on every call (fixed-order reductions, no atomics).
    std::vector<std::vector<float>> bits;
    for (int rep = 0; rep < 2; ++rep) {
      auto z = to_device(std::vector<float>(C, 0.0f));
      cuda::rmsnorm_backward(ddy.as<bf16>(), dx_in.as<bf16>(), dgam.as<bf16>(), drstd.as<float>(), ddx.as<bf16>(),
                             z.as<float>(), scratch.as<float>(), T, C, false, stream_);
      sync();
      bits.push_back(from_device<float>(z, C));
    }
    expect_equal(bits[1], bits[0], "dgamma, second call");
  }
  const int64_t T = 300, C = 768;
  auto dx_in = to_device_bf16(randn_bf16(T * C, 80, "rms.x", 2.0, 0.5));
  auto dgam = to_device_bf16(randn_bf16(C, 80, "rms.gamma", 0.1, 1.0));
  DeviceBuffer dy_out(T * C * sizeof(bf16)), drstd(T * sizeof(float));
  const float eps = 1e-5f;
  // A width the warp kernels cannot take is refused, not computed wrongly.
  EXPECT_THROW(cuda::rmsnorm_forward(dx_in.as<bf16>(), dgam.as<bf16>(), dy_out.as<bf16>(), drstd.as<float>(), T, 1001,
                                     eps, false, stream_),
               laoyao::Error);
}

TEST_F(CudaKernels, SwigluMatchesCpu) {
  // F = 1003: one element a thread; F = 384 (the flagship's experts): the 16-byte pack path.
  for (const int64_t F : {int64_t(1003), int64_t(384)}) {
    SCOPED_TRACE("F " + std::to_string(F));
    const int64_t T = 37;
    const auto x = randn_bf16(T * 2 * F, 81 + F, "swiglu.x", 1.5);
    const auto dyv = randn_bf16(T * F, 81 + F, "swiglu.dy");
    std::vector<float> y(T * F), dx(T * 2 * F);
    cpu::swiglu_forward(x.data(), y.data(), T, F);
    cpu::swiglu_backward(x.data(), dyv.data(), dx.data(), T, F);
    auto dxin = to_device_bf16(x), ddy = to_device_bf16(dyv);
    DeviceBuffer dyout(T * F * sizeof(bf16)), ddx(T * 2 * F * sizeof(bf16));
    cuda::swiglu_forward(dxin.as<bf16>(), dyout.as<bf16>(), T, F, stream_);
    cuda::swiglu_backward(dxin.as<bf16>(), ddy.as<bf16>(), ddx.as<bf16>(), T, F, stream_);
    sync();
    expect_bf16_close(from_device_bf16(dyout, T * F), to_double(y), 1e-5, "y");
    expect_bf16_close(from_device_bf16(ddx, T * 2 * F), to_double(dx), 1e-5, "dx");
  }
}

TEST_F(CudaKernels, RopeMatchesCpuWithLlama3Scaling) {
  // The 16-byte pack kernels (rotated half a multiple of 8: 64 x 1.0, 64 x 0.5, 48 x 1.0 whose half
  // is 3 packs) and the one-pair-a-thread kernel (36 x 1.0: half 18).
  for (const auto& [D, percent] : {std::pair<int64_t, double>{64, 1.0}, {64, 0.5}, {48, 1.0}, {36, 1.0}}) {
    SCOPED_TRACE("D " + std::to_string(D) + " rotary_percent " + std::to_string(percent));
    const int64_t b = 2, s = 50, H = 8, G = 2;
    const cpu::QkvLayout L("test", H, G, D);
    cpu::RopeParams rp;
    rp.rotary_base = 500000;
    rp.rotary_percent = percent;
    rp.rope_scaling = true;
    rp.rope_scaling_factor = 32;
    const cpu::RopeTable table = cpu::rope_table(D, 64, rp);
    const auto qkv = randn_bf16(b * s * L.row, 82 + D, "rope.qkv");
    std::vector<int64_t> pos(b * s);
    for (int64_t t = 0; t < b * s; ++t) pos[t] = t % s;
    std::vector<float> fwd = qkv, bwd = qkv;
    cpu::rope_forward_qkv(fwd.data(), pos.data(), table, b * s, H, G, D);
    cpu::rope_backward_qkv(bwd.data(), pos.data(), table, b * s, H, G, D);
    auto dcos = to_device(table.cos), dsin = to_device(table.sin);
    const cuda::RopeDeviceTable tb{dcos.as<float>(), dsin.as<float>(), table.rot_dim, table.max_positions};
    auto d1 = to_device_bf16(qkv), d2 = to_device_bf16(qkv);
    cuda::rope_forward_qkv(d1.as<bf16>(), tb, b, s, H, G, D, stream_);
    cuda::rope_backward_qkv(d2.as<bf16>(), tb, b, s, H, G, D, stream_);
    sync();
    expect_bf16_close(from_device_bf16(d1, b * s * L.row), to_double(fwd), 1e-5, "rotated");
    expect_bf16_close(from_device_bf16(d2, b * s * L.row), to_double(bwd), 1e-5, "gradient rotation");
    // v slots (and the pass-through dims) are untouched, bit for bit.
    const auto got = from_device_bf16(d1, b * s * L.row);
    for (int64_t t = 0; t < b * s; ++t)
      for (int64_t g = 0; g < G; ++g)
        for (int64_t d = 0; d < D; ++d) ASSERT_EQ(got[t * L.row + L.v(g) + d], qkv[t * L.row + L.v(g) + d]);
    EXPECT_THROW(cuda::rope_forward_qkv(d1.as<bf16>(), tb, 1, 65, H, G, D, stream_), laoyao::Error);
  }
}

// ---------------------------------------------------------------- QK layernorm (Qwen3)

struct QkCase {
  int64_t T, H, G, D;
  bool zero_centered;
};

// Forward and backward against the CPU ops: q/k normalised (one bf16 rounding of fp32 math), v
// copied bit for bit, rstd to fp32 rounding; backward out of place and then in place (dqkv ==
// dout), both accumulating into the same fp32 weight gradients (so they hold dgamma0 + 2 dgamma),
// and the weight gradients bitwise reproducible.
void check_qk_rmsnorm(const QkCase& c, cudaStream_t stream) {
  SCOPED_TRACE("T=" + std::to_string(c.T) + " H=" + std::to_string(c.H) + " G=" + std::to_string(c.G) +
               " D=" + std::to_string(c.D) + (c.zero_centered ? " zero-centred gamma" : ""));
  const cpu::QkvLayout L("test", c.H, c.G, c.D);
  const int64_t T = c.T, D = c.D, n = T * L.row, S = T * (c.H + c.G);
  const float eps = 1e-6f;
  const uint64_t seed = 7000 + static_cast<uint64_t>(c.T * 1000 + c.H * 100 + c.G * 10 + c.D) * 2 + c.zero_centered;
  const auto qkv = randn_bf16(n, seed, "qk.qkv", 2.0, 0.3);
  const auto qg = randn_bf16(D, seed, "qk.q_gamma", 0.2, c.zero_centered ? 0.0 : 1.0);
  const auto kg = randn_bf16(D, seed, "qk.k_gamma", 0.2, c.zero_centered ? 0.0 : 1.0);
  const auto dout = randn_bf16(n, seed, "qk.dout");
  const auto dq0 = randn(D, seed, "qk.dq_gamma0"), dk0 = randn(D, seed, "qk.dk_gamma0");

  std::vector<float> y(n), rstd(S);
  cpu::qk_rmsnorm_forward(qkv.data(), qg.data(), kg.data(), y.data(), rstd.data(), T, c.H, c.G, D, eps,
                          c.zero_centered);
  auto dx_in = to_device_bf16(qkv), dqg = to_device_bf16(qg), dkg = to_device_bf16(kg);
  DeviceBuffer dy_out(n * sizeof(bf16)), drstd(S * sizeof(float));
  cuda::qk_rmsnorm_forward(dx_in.as<bf16>(), dqg.as<bf16>(), dkg.as<bf16>(), dy_out.as<bf16>(), drstd.as<float>(), T,
                           c.H, c.G, D, eps, c.zero_centered, stream);
  LAOYAO_CUDA_CHECK(cudaStreamSynchronize(stream));
  const auto rstd_gpu = from_device<float>(drstd, S);
  std::vector<double> tol(S);
  for (int64_t i = 0; i < S; ++i) tol[i] = kFp32Sum * rstd[i];
  expect_within(rstd_gpu, to_double(rstd), tol, "rstd");
  const auto y_gpu = from_device_bf16(dy_out, n);
  expect_bf16_close(y_gpu, to_double(y), 1e-4, "normalised q, k");
  for (int64_t t = 0; t < T; ++t)
    for (int64_t g = 0; g < c.G; ++g)
      for (int64_t d = 0; d < D; ++d)
        ASSERT_EQ(y_gpu[t * L.row + L.v(g) + d], qkv[t * L.row + L.v(g) + d]) << "v copied, token " << t;

  // Backward from the GPU's statistics on both sides; the CPU accumulates twice as the GPU does.
  std::vector<float> dx(n), dq = dq0, dk = dk0;
  for (int rep = 0; rep < 2; ++rep)
    cpu::qk_rmsnorm_backward(dout.data(), qkv.data(), qg.data(), kg.data(), rstd_gpu.data(), dx.data(), dq.data(),
                             dk.data(), T, c.H, c.G, D, c.zero_centered);
  auto ddout = to_device_bf16(dout), dinplace = to_device_bf16(dout), ddq = to_device(dq0), ddk = to_device(dk0);
  DeviceBuffer ddx(n * sizeof(bf16));
  DeviceBuffer scratch(cuda::qk_rmsnorm_backward_scratch_floats(T, c.H, c.G, D) * sizeof(float));
  cuda::qk_rmsnorm_backward(ddout.as<bf16>(), dx_in.as<bf16>(), dqg.as<bf16>(), dkg.as<bf16>(), drstd.as<float>(),
                            ddx.as<bf16>(), ddq.as<float>(), ddk.as<float>(), scratch.as<float>(), T, c.H, c.G, D,
                            c.zero_centered, stream);
  cuda::qk_rmsnorm_backward(dinplace.as<bf16>(), dx_in.as<bf16>(), dqg.as<bf16>(), dkg.as<bf16>(), drstd.as<float>(),
                            dinplace.as<bf16>(), ddq.as<float>(), ddk.as<float>(), scratch.as<float>(), T, c.H, c.G,
                            D, c.zero_centered, stream);
  LAOYAO_CUDA_CHECK(cudaStreamSynchronize(stream));
  const auto dx_gpu = from_device_bf16(ddx, n);
  expect_bf16_close(dx_gpu, to_double(dx), 1e-4, "dqkv");
  expect_equal(from_device_bf16(dinplace, n), dx_gpu, "in-place dqkv");
  for (int64_t t = 0; t < T; ++t)
    for (int64_t g = 0; g < c.G; ++g)
      for (int64_t d = 0; d < D; ++d)
        ASSERT_EQ(dx_gpu[t * L.row + L.v(g) + d], dout[t * L.row + L.v(g) + d]) << "v's gradient, token " << t;
  std::vector<double> tq(D), tk(D);
  for (int64_t d = 0; d < D; ++d) {
    double aq = 0.0, ak = 0.0;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t g = 0; g < c.G; ++g) {
        for (int64_t j = 0; j <= L.Q; ++j) {
          const int64_t col = t * L.row + L.col(g, j) + d;
          const int64_t st = t * (c.H + c.G) + (j < L.Q ? g * L.Q + j : c.H + g);
          (j < L.Q ? aq : ak) += std::abs(double(dout[col]) * qkv[col] * rstd_gpu[st]);
        }
      }
    tq[d] = kFp32Sum * (std::abs(dq0[d]) + 2 * aq);
    tk[d] = kFp32Sum * (std::abs(dk0[d]) + 2 * ak);
  }
  expect_within(from_device<float>(ddq, D), to_double(dq), tq, "dq_gamma0 + 2 dq_gamma");
  expect_within(from_device<float>(ddk, D), to_double(dk), tk, "dk_gamma0 + 2 dk_gamma");

  // No atomics: the weight gradients are the same bits on every call.
  std::vector<std::vector<float>> bits;
  for (int rep = 0; rep < 2; ++rep) {
    auto zq = to_device(std::vector<float>(D, 0.0f)), zk = to_device(std::vector<float>(D, 0.0f));
    cuda::qk_rmsnorm_backward(ddout.as<bf16>(), dx_in.as<bf16>(), dqg.as<bf16>(), dkg.as<bf16>(), drstd.as<float>(),
                              ddx.as<bf16>(), zq.as<float>(), zk.as<float>(), scratch.as<float>(), T, c.H, c.G, D,
                              c.zero_centered, stream);
    LAOYAO_CUDA_CHECK(cudaStreamSynchronize(stream));
    auto q = from_device<float>(zq, D), k = from_device<float>(zk, D);
    q.insert(q.end(), k.begin(), k.end());
    bits.push_back(std::move(q));
  }
  expect_equal(bits[1], bits[0], "weight gradients, second call");
}

// The split rows (qkv_rows.hpp): the forward writes the fused forward's rows rearranged, and the
// backward from the rearranged gradient gives the fused backward's dqkv and weight gradients, bit
// for bit (the same arithmetic, only the addresses differ); with RoPE in the pass and without, GQA
// and MHA. Split rows cannot be written or read in place.
TEST_F(CudaKernels, QkRmsNormSplitRowsAreTheFusedRowsRearranged) {
  struct Case {
    int64_t b, s, H, G, D;
    bool rope;
  };
  for (const Case& c : {Case{2, 37, 8, 2, 64, true}, Case{1, 50, 4, 1, 128, false}, Case{2, 20, 4, 4, 64, true}}) {
    SCOPED_TRACE("H " + std::to_string(c.H) + " G " + std::to_string(c.G) + " D " + std::to_string(c.D));
    const cpu::QkvLayout L("test", c.H, c.G, c.D);
    const int64_t T = c.b * c.s, D = c.D, n = T * L.row, S = T * (c.H + c.G);
    cpu::RopeParams rp;
    rp.rotary_base = 10000;
    const cpu::RopeTable table = cpu::rope_table(D, 64, rp);
    auto dcos = to_device(table.cos), dsin = to_device(table.sin);
    const cuda::RopeDeviceTable tb{dcos.as<float>(), dsin.as<float>(), table.rot_dim, table.max_positions};
    const cuda::RopeDeviceTable* rope = c.rope ? &tb : nullptr;
    const uint64_t seed = 9300 + static_cast<uint64_t>(D + c.H + c.G);
    const auto qkv = randn_bf16(n, seed, "qksplit.qkv", 2.0, 0.3);
    const auto qg = randn_bf16(D, seed, "qksplit.q_gamma", 0.2, 1.0);
    const auto kg = randn_bf16(D, seed, "qksplit.k_gamma", 0.2, 1.0);
    const auto dout = randn_bf16(n, seed, "qksplit.dout");
    auto dqkv = to_device_bf16(qkv), dqg = to_device_bf16(qg), dkg = to_device_bf16(kg);
    DeviceBuffer y_fused(n * sizeof(bf16)), y_split(n * sizeof(bf16)), rstd_fused(S * sizeof(float)),
        rstd_split(S * sizeof(float));
    LAOYAO_CUDA_CHECK(cudaMemset(y_split.ptr, 0x7f, y_split.bytes));  // every element written: garbage first
    cuda::qk_rmsnorm_forward(dqkv.as<bf16>(), dqg.as<bf16>(), dkg.as<bf16>(), y_fused.as<bf16>(),
                             rstd_fused.as<float>(), T, c.H, c.G, D, 1e-6f, false, stream_, rope, c.s);
    cuda::qk_rmsnorm_forward(dqkv.as<bf16>(), dqg.as<bf16>(), dkg.as<bf16>(), y_split.as<bf16>(),
                             rstd_split.as<float>(), T, c.H, c.G, D, 1e-6f, false, stream_, rope, c.s,
                             cuda::QkvRows::Split);
    sync();
    expect_equal(from_device_bf16(y_split, n), split_rows(from_device_bf16(y_fused, n), L, T, c.H, c.G, D, true),
                 "split forward");
    expect_equal(from_device<float>(rstd_split, S), from_device<float>(rstd_fused, S), "rstd");

    auto dout_fused = to_device_bf16(dout), dout_split = to_device_bf16(split_rows(dout, L, T, c.H, c.G, D, true));
    auto zeros = std::vector<float>(D, 0.0f);
    auto gq_fused = to_device(zeros), gk_fused = to_device(zeros), gq_split = to_device(zeros),
         gk_split = to_device(zeros);
    DeviceBuffer dx_fused(n * sizeof(bf16)), dx_split(n * sizeof(bf16));
    LAOYAO_CUDA_CHECK(cudaMemset(dx_split.ptr, 0x7f, dx_split.bytes));
    DeviceBuffer scratch(cuda::qk_rmsnorm_backward_scratch_floats(T, c.H, c.G, D) * sizeof(float));
    cuda::qk_rmsnorm_backward(dout_fused.as<bf16>(), dqkv.as<bf16>(), dqg.as<bf16>(), dkg.as<bf16>(),
                              rstd_fused.as<float>(), dx_fused.as<bf16>(), gq_fused.as<float>(), gk_fused.as<float>(),
                              scratch.as<float>(), T, c.H, c.G, D, false, stream_, rope, c.s);
    cuda::qk_rmsnorm_backward(dout_split.as<bf16>(), dqkv.as<bf16>(), dqg.as<bf16>(), dkg.as<bf16>(),
                              rstd_fused.as<float>(), dx_split.as<bf16>(), gq_split.as<float>(), gk_split.as<float>(),
                              scratch.as<float>(), T, c.H, c.G, D, false, stream_, rope, c.s, cuda::QkvRows::Split);
    sync();
    expect_equal(from_device_bf16(dx_split, n), from_device_bf16(dx_fused, n), "dqkv from split rows");
    expect_equal(from_device<float>(gq_split, D), from_device<float>(gq_fused, D), "dq_gamma");
    expect_equal(from_device<float>(gk_split, D), from_device<float>(gk_fused, D), "dk_gamma");
    EXPECT_THROW(cuda::qk_rmsnorm_forward(y_split.as<bf16>(), dqg.as<bf16>(), dkg.as<bf16>(), y_split.as<bf16>(),
                                          rstd_split.as<float>(), T, c.H, c.G, D, 1e-6f, false, stream_, rope, c.s,
                                          cuda::QkvRows::Split),
                 laoyao::Error);
    EXPECT_THROW(cuda::qk_rmsnorm_backward(dout_split.as<bf16>(), dqkv.as<bf16>(), dqg.as<bf16>(), dkg.as<bf16>(),
                                           rstd_fused.as<float>(), dout_split.as<bf16>(), gq_split.as<float>(),
                                           gk_split.as<float>(), scratch.as<float>(), T, c.H, c.G, D, false, stream_,
                                           rope, c.s, cuda::QkvRows::Split),
                 laoyao::Error);
  }
}

// The QK norm with RoPE in the same pass against the CPU's norm then rotation (forward) and
// rotation back then norm backward (backward): MHA and GQA, head dims 64, 128 (half the dims
// rotated) and 96 (12 packs in a 16-lane group, half 48 = 6 packs), zero-centred weights.
TEST_F(CudaKernels, QkRmsNormWithRopeMatchesCpuNormThenRope) {
  struct Case {
    int64_t b, s, H, G, D;
    double percent;
    bool zero_centered;
  };
  for (const Case& c : {Case{2, 37, 4, 4, 64, 1.0, false}, Case{3, 20, 8, 2, 128, 0.5, true},
                        Case{2, 25, 4, 2, 96, 1.0, false}}) {
    SCOPED_TRACE("H " + std::to_string(c.H) + " G " + std::to_string(c.G) + " D " + std::to_string(c.D));
    const cpu::QkvLayout L("test", c.H, c.G, c.D);
    const int64_t T = c.b * c.s, D = c.D, n = T * L.row, S = T * (c.H + c.G);
    const float eps = 1e-6f;
    cpu::RopeParams rp;
    rp.rotary_base = 10000;
    rp.rotary_percent = c.percent;
    const cpu::RopeTable table = cpu::rope_table(D, 64, rp);
    std::vector<int64_t> pos(T);
    for (int64_t t = 0; t < T; ++t) pos[t] = t % c.s;
    const uint64_t seed = 9100 + static_cast<uint64_t>(D + c.H);
    const auto qkv = randn_bf16(n, seed, "qkrope.qkv", 2.0, 0.3);
    const auto qg = randn_bf16(D, seed, "qkrope.q_gamma", 0.2, c.zero_centered ? 0.0 : 1.0);
    const auto kg = randn_bf16(D, seed, "qkrope.k_gamma", 0.2, c.zero_centered ? 0.0 : 1.0);
    const auto dout = randn_bf16(n, seed, "qkrope.dout");

    std::vector<float> y(n), rstd(S);
    cpu::qk_rmsnorm_forward(qkv.data(), qg.data(), kg.data(), y.data(), rstd.data(), T, c.H, c.G, D, eps,
                            c.zero_centered);
    cpu::rope_forward_qkv(y.data(), pos.data(), table, T, c.H, c.G, D);
    auto dcos = to_device(table.cos), dsin = to_device(table.sin);
    const cuda::RopeDeviceTable tb{dcos.as<float>(), dsin.as<float>(), table.rot_dim, table.max_positions};
    ASSERT_TRUE(cuda::rope_packable(tb));
    auto dqkv = to_device_bf16(qkv), dqg = to_device_bf16(qg), dkg = to_device_bf16(kg);
    DeviceBuffer dy(n * sizeof(bf16)), drstd(S * sizeof(float));
    cuda::qk_rmsnorm_forward(dqkv.as<bf16>(), dqg.as<bf16>(), dkg.as<bf16>(), dy.as<bf16>(), drstd.as<float>(), T, c.H,
                             c.G, D, eps, c.zero_centered, stream_, &tb, c.s);
    sync();
    const auto rstd_gpu = from_device<float>(drstd, S);
    const auto y_gpu = from_device_bf16(dy, n);
    expect_bf16_close(y_gpu, to_double(y), 1e-4, "normalised and rotated q, k");
    for (int64_t t = 0; t < T; ++t)
      for (int64_t g = 0; g < c.G; ++g)
        for (int64_t d = 0; d < D; ++d) ASSERT_EQ(y_gpu[t * L.row + L.v(g) + d], qkv[t * L.row + L.v(g) + d]);

    std::vector<float> drot = dout, dx(n), dq(D, 0.0f), dk(D, 0.0f);
    cpu::rope_backward_qkv(drot.data(), pos.data(), table, T, c.H, c.G, D);
    cpu::qk_rmsnorm_backward(drot.data(), qkv.data(), qg.data(), kg.data(), rstd_gpu.data(), dx.data(), dq.data(),
                             dk.data(), T, c.H, c.G, D, c.zero_centered);
    auto ddout = to_device_bf16(dout), ddq = to_device(std::vector<float>(D, 0.0f)),
         ddk = to_device(std::vector<float>(D, 0.0f));
    DeviceBuffer scratch(cuda::qk_rmsnorm_backward_scratch_floats(T, c.H, c.G, D) * sizeof(float));
    cuda::qk_rmsnorm_backward(ddout.as<bf16>(), dqkv.as<bf16>(), dqg.as<bf16>(), dkg.as<bf16>(), drstd.as<float>(),
                              ddout.as<bf16>(), ddq.as<float>(), ddk.as<float>(), scratch.as<float>(), T, c.H, c.G, D,
                              c.zero_centered, stream_, &tb, c.s);
    sync();
    expect_bf16_close(from_device_bf16(ddout, n), to_double(dx), 1e-4, "dqkv (in place)");
    std::vector<double> tq(D), tk(D);
    for (int64_t d = 0; d < D; ++d) {
      double aq = 0.0, ak = 0.0;
      for (int64_t t = 0; t < T; ++t)
        for (int64_t g = 0; g < c.G; ++g)
          for (int64_t j = 0; j <= L.Q; ++j) {
            const int64_t col = t * L.row + L.col(g, j) + d;
            const int64_t st = t * (c.H + c.G) + (j < L.Q ? g * L.Q + j : c.H + g);
            (j < L.Q ? aq : ak) += std::abs(double(drot[col]) * qkv[col] * rstd_gpu[st]);
          }
      tq[d] = kFp32Sum * aq + 1e-6;
      tk[d] = kFp32Sum * ak + 1e-6;
    }
    expect_within(from_device<float>(ddq, D), to_double(dq), tq, "dq_gamma");
    expect_within(from_device<float>(ddk, D), to_double(dk), tk, "dk_gamma");
  }
  // A table whose rotated half is not a multiple of 8, or wider than the head, cannot join the
  // norm: refused by name.
  DeviceBuffer buf(1 << 16), stats(4096), tbl(4096);
  const cuda::RopeDeviceTable odd{tbl.as<float>(), tbl.as<float>(), 36, 8};
  const cuda::RopeDeviceTable wide{tbl.as<float>(), tbl.as<float>(), 128, 8};
  for (const auto* t : {&odd, &wide})
    EXPECT_THROW(cuda::qk_rmsnorm_forward(buf.as<bf16>(), buf.as<bf16>(), buf.as<bf16>(), buf.as<bf16>(),
                                          stats.as<float>(), 2, 2, 1, 64, 1e-6f, false, stream_, t, 2),
                 laoyao::Error);
  EXPECT_FALSE(cuda::rope_packable({tbl.as<float>() + 1, tbl.as<float>(), 32, 8})) << "a misaligned cos table";
}

TEST_F(CudaKernels, QkRmsNormMhaMatchesCpu) {
  check_qk_rmsnorm({37, 4, 4, 64, false}, stream_);
  check_qk_rmsnorm({37, 4, 4, 128, true}, stream_);
}
TEST_F(CudaKernels, QkRmsNormGqaMatchesCpu) {
  check_qk_rmsnorm({37, 8, 2, 128, false}, stream_);
  check_qk_rmsnorm({37, 8, 2, 64, true}, stream_);
  check_qk_rmsnorm({300, 8, 1, 128, false}, stream_);  // many token chunks in the weight-gradient reduction
}
// Head dims whose rows do not fill a power-of-two lane group (96: 12 of 16 lanes), a whole warp
// (256) and one lane (8).
TEST_F(CudaKernels, QkRmsNormOtherHeadDimsMatchCpu) {
  check_qk_rmsnorm({37, 4, 2, 96, false}, stream_);
  check_qk_rmsnorm({19, 2, 1, 256, true}, stream_);
  check_qk_rmsnorm({21, 4, 4, 8, false}, stream_);
}
TEST_F(CudaKernels, QkRmsNormRefusesHeadDimsItCannotTake) {
  DeviceBuffer buf(4096), stats(4096), scratch(4096);
  for (const int64_t D : {int64_t{100}, int64_t{264}}) {
    try {
      cuda::qk_rmsnorm_forward(buf.as<bf16>(), buf.as<bf16>(), buf.as<bf16>(), buf.as<bf16>(), stats.as<float>(), 1, 2,
                               1, D, 1e-6f, false, stream_);
      ADD_FAILURE() << "no error for D = " << D;
    } catch (const laoyao::Error& e) {
      EXPECT_NE(std::string(e.what()).find("D = " + std::to_string(D)), std::string::npos) << e.what();
    }
    EXPECT_THROW(cuda::qk_rmsnorm_backward(buf.as<bf16>(), buf.as<bf16>(), buf.as<bf16>(), buf.as<bf16>(),
                                           stats.as<float>(), buf.as<bf16>(), stats.as<float>(), stats.as<float>(),
                                           scratch.as<float>(), 1, 2, 1, D, false, stream_),
                 laoyao::Error);
  }
}

// ---------------------------------------------------------------- bias + GeLU

// Both forms: Megatron's fused tanh bias-GeLU and F.gelu's exact erf.
TEST_F(CudaKernels, BiasGeluMatchesCpuTanhAndErfGelu) {
  const int64_t T = 37;
  for (const bool erf : {false, true})
    for (const int64_t F : {int64_t{1003}, int64_t{1024}}) {  // scalar path, 16-byte vector path
      SCOPED_TRACE(std::string(erf ? "erf" : "tanh") + ", F = " + std::to_string(F));
      const cpu::Gelu kind = erf ? cpu::Gelu::Erf : cpu::Gelu::Tanh;
      const uint64_t seed = 60 + F + (erf ? 1 : 0);
      const auto x = randn_bf16(T * F, seed, "gelu.x", 1.5);
      const auto bias = randn_bf16(F, seed, "gelu.bias", 0.5);
      const auto dyv = randn_bf16(T * F, seed, "gelu.dy");
      std::vector<float> u(T * F), y(T * F), dx(T * F);
      for (int64_t i = 0; i < T * F; ++i) u[i] = x[i] + bias[i % F];  // fp32 add, as the kernel
      cpu::gelu_forward(u.data(), y.data(), T * F, kind);
      cpu::gelu_backward(u.data(), dyv.data(), dx.data(), T * F, kind);

      auto dx_in = to_device_bf16(x), db = to_device_bf16(bias), ddy = to_device_bf16(dyv);
      DeviceBuffer dy_out(T * F * sizeof(bf16)), ddx(T * F * sizeof(bf16));
      cuda::bias_gelu_forward(dx_in.as<bf16>(), db.as<bf16>(), dy_out.as<bf16>(), T, F, stream_, erf);
      cuda::bias_gelu_backward(ddy.as<bf16>(), dx_in.as<bf16>(), db.as<bf16>(), ddx.as<bf16>(), T, F, stream_, erf);
      sync();
      // fp32 math (tanhf/erff vs the C library's: a few ulps) rounded once.
      expect_bf16_close(from_device_bf16(dy_out, T * F), to_double(y), 1e-5, "gelu(x + bias)");
      expect_bf16_close(from_device_bf16(ddx, T * F), to_double(dx), 1e-5, "dy * gelu'(x + bias)");
    }
}

// ---------------------------------------------------------------- cross entropy

TEST_F(CudaKernels, CrossEntropyMatchesCpu) {
  const int64_t T = 37, V = 5003;
  const auto logits = randn_bf16(T * V, 70, "ce.logits", 2.0);
  const auto targets = rand_ids(T, 70, "ce.targets", V);
  std::vector<float> dloss(T);
  for (auto& g : dloss) g = 1.0f / T;
  {
    const auto r = randn(T, 70, "ce.dloss", 0.5, 1.0);
    for (int64_t t = 0; t < T; ++t) dloss[t] *= r[t];
  }
  std::vector<float> loss(T), lse(T), grad = logits;
  cpu::cross_entropy_forward(logits.data(), targets.data(), loss.data(), lse.data(), T, V);
  cpu::cross_entropy_backward(grad.data(), targets.data(), lse.data(), dloss.data(), T, V);

  auto dz = to_device_bf16(logits), dt = to_device(targets), ddl = to_device(dloss);
  DeviceBuffer dloss_out(T * sizeof(float)), dlse(T * sizeof(float));
  cuda::cross_entropy_forward(dz.as<bf16>(), dt.as<int64_t>(), dloss_out.as<float>(), dlse.as<float>(), T, V, stream_);
  sync();
  // fp32 log-sum-exp over V terms: ~1e-6 absolute; 1e-5 (1 + |x|).
  std::vector<double> tol(T);
  for (int64_t t = 0; t < T; ++t) tol[t] = 1e-5 * (1.0 + std::abs(loss[t]));
  expect_within(from_device<float>(dloss_out, T), to_double(loss), tol, "loss");
  for (int64_t t = 0; t < T; ++t) tol[t] = 1e-5 * (1.0 + std::abs(lse[t]));
  expect_within(from_device<float>(dlse, T), to_double(lse), tol, "lse");

  cuda::cross_entropy_backward(dz.as<bf16>(), dt.as<int64_t>(), dlse.as<float>(), ddl.as<float>(), T, V, stream_);
  sync();
  expect_bf16_close(from_device_bf16(dz, T * V), to_double(grad), 1e-5, "(softmax - onehot) * dloss");
}

// The fused training kernel: the same loss, lse and gradient as the two-kernel form: rows held in
// a cluster of 1 (5008), 2 (100008, the last slice one pack shorter), 3 (Qwen's 151936) and 8
// blocks (409600, the most a cluster holds); one block a row reading it twice (409608, and 5008
// with LAOYAO_CE_CLUSTER=0); the scalar path (5003).
TEST_F(CudaKernels, CrossEntropyForwardBackwardFusedMatchesCpu) {
  struct Case {
    int64_t V;
    bool cluster;
  };
  for (const Case c : {Case{5008, true}, Case{100008, true}, Case{151936, true}, Case{409600, true},
                       Case{409608, true}, Case{5008, false}, Case{5003, true}}) {
    const int64_t V = c.V;
    SCOPED_TRACE("V=" + std::to_string(V) + (c.cluster ? "" : ", LAOYAO_CE_CLUSTER=0"));
    const ScopedRuntimeOptions cluster_choice([&](RuntimeOptions& o) { o.ce_cluster = c.cluster; });
    // 100 KB (51200 logits) a block, at most 8 blocks; 0: one block a row.
    const int want_blocks =
        !c.cluster || V % 8 != 0 || V > 409600 ? 0 : V <= 51200 ? 1 : V <= 102400 ? 2 : V <= 153600 ? 3 : 8;
    EXPECT_EQ(cuda::cross_entropy_cluster_blocks(V), want_blocks) << "the path this case runs";
    const int64_t T = V > 10000 ? 7 : 29;
    const auto logits = randn_bf16(T * V, 72, "ce.logits", 2.0);
    const auto targets = rand_ids(T, 72, "ce.targets", V);
    const auto dloss = randn(T, 72, "ce.dloss", 0.01, 0.03);
    std::vector<float> loss(T), lse(T), grad = logits;
    cpu::cross_entropy_forward(logits.data(), targets.data(), loss.data(), lse.data(), T, V);
    cpu::cross_entropy_backward(grad.data(), targets.data(), lse.data(), dloss.data(), T, V);
    auto dz = to_device_bf16(logits), dt = to_device(targets), ddl = to_device(dloss);
    DeviceBuffer dloss_out(T * sizeof(float)), dlse(T * sizeof(float));
    cuda::cross_entropy_forward_backward(dz.as<bf16>(), dt.as<int64_t>(), ddl.as<float>(), dloss_out.as<float>(),
                                         dlse.as<float>(), T, V, stream_);
    sync();
    std::vector<double> tol(T);
    for (int64_t t = 0; t < T; ++t) tol[t] = 1e-5 * (1.0 + std::abs(loss[t]));
    expect_within(from_device<float>(dloss_out, T), to_double(loss), tol, "loss");
    for (int64_t t = 0; t < T; ++t) tol[t] = 1e-5 * (1.0 + std::abs(lse[t]));
    expect_within(from_device<float>(dlse, T), to_double(lse), tol, "lse");
    expect_bf16_close(from_device_bf16(dz, T * V), to_double(grad), 1e-5, "(softmax - onehot) * dloss");
  }
}

// The training form with targets outside the vocabulary: NaN losses, and gradients without the
// one-hot term (softmax * dloss), on the cluster path and the one-block one.
TEST_F(CudaKernels, CrossEntropyForwardBackwardOutOfRangeTargetGivesNan) {
  for (const int64_t V : {int64_t(151936), int64_t(5003)}) {
    SCOPED_TRACE("V=" + std::to_string(V));
    const int64_t T = 3;
    const auto logits = randn_bf16(T * V, 73, "ce.logits");
    const std::vector<int64_t> targets = {5, V, -1};
    const std::vector<float> dloss = {0.5f, 0.25f, 2.0f};
    std::vector<float> loss(1), lse(T), grad = logits;
    cpu::cross_entropy_forward(logits.data(), targets.data(), loss.data(), lse.data(), 1, V);  // row 0 only
    for (int64_t t = 0; t < T; ++t) {
      double m = -1e30, sum = 0.0;
      for (int64_t j = 0; j < V; ++j) m = std::max(m, double(logits[t * V + j]));
      for (int64_t j = 0; j < V; ++j) sum += std::exp(double(logits[t * V + j]) - m);
      for (int64_t j = 0; j < V; ++j)
        grad[t * V + j] = float((std::exp(double(logits[t * V + j]) - m) / sum - (j == targets[t] ? 1.0 : 0.0)) *
                                dloss[t]);
    }
    auto dz = to_device_bf16(logits), dt = to_device(targets), ddl = to_device(dloss);
    DeviceBuffer dloss_out(T * sizeof(float)), dlse(T * sizeof(float));
    cuda::cross_entropy_forward_backward(dz.as<bf16>(), dt.as<int64_t>(), ddl.as<float>(), dloss_out.as<float>(),
                                         dlse.as<float>(), T, V, stream_);
    sync();
    const auto got = from_device<float>(dloss_out, T);
    EXPECT_NEAR(got[0], loss[0], 1e-5 * (1.0 + std::abs(loss[0])));
    EXPECT_TRUE(std::isnan(got[1]));
    EXPECT_TRUE(std::isnan(got[2]));
    expect_bf16_close(from_device_bf16(dz, T * V), to_double(grad), 1e-5, "softmax * dloss");
  }
}

TEST_F(CudaKernels, CrossEntropyOutOfRangeTargetGivesNan) {
  const int64_t T = 3, V = 101;
  const auto logits = randn_bf16(T * V, 71, "ce.logits");
  const std::vector<int64_t> targets = {5, V, -1};
  auto dz = to_device_bf16(logits), dt = to_device(targets);
  DeviceBuffer dloss(T * sizeof(float)), dlse(T * sizeof(float));
  cuda::cross_entropy_forward(dz.as<bf16>(), dt.as<int64_t>(), dloss.as<float>(), dlse.as<float>(), T, V, stream_);
  sync();
  const auto loss = from_device<float>(dloss, T);
  EXPECT_TRUE(std::isfinite(loss[0]));
  EXPECT_TRUE(std::isnan(loss[1]));
  EXPECT_TRUE(std::isnan(loss[2]));
}

// ---------------------------------------------------------------- embedding

TEST_F(CudaKernels, EmbeddingForwardMatchesCpu) {
  const int64_t b = 3, s = 17, T = b * s, C = 77, rows = 31, pos_rows = 64;
  const auto ids = rand_ids(T, 80, "emb.ids", rows);
  std::vector<int64_t> pos(T);
  for (int64_t t = 0; t < T; ++t) pos[t] = t % s;
  const auto wte = randn_bf16(rows * C, 80, "emb.wte"), wpe = randn_bf16(pos_rows * C, 80, "emb.wpe", 0.1);
  std::vector<float> y(T * C), y_word(T * C);
  cpu::embedding_forward(ids.data(), wte.data(), y_word.data(), T, C, rows, false);
  y = y_word;
  cpu::embedding_forward(pos.data(), wpe.data(), y.data(), T, C, pos_rows, true);
  for (auto& v : y) v = round_to_bf16(v);  // the fp32 sum, rounded once

  auto dids = to_device(ids), dpos = to_device(pos), dwte = to_device_bf16(wte), dwpe = to_device_bf16(wpe);
  DeviceBuffer dy(T * C * sizeof(bf16));
  cuda::embedding_forward(dids.as<int64_t>(), dwte.as<bf16>(), dpos.as<int64_t>(), dwpe.as<bf16>(), dy.as<bf16>(), T,
                          C, rows, pos_rows, stream_);
  sync();
  expect_equal(from_device_bf16(dy, T * C), y, "wte[ids] + wpe[pos]");

  cuda::embedding_forward(dids.as<int64_t>(), dwte.as<bf16>(), nullptr, nullptr, dy.as<bf16>(), T, C, rows, 0,
                          stream_);
  sync();
  expect_equal(from_device_bf16(dy, T * C), y_word, "wte[ids] (no positions)");
}

TEST_F(CudaKernels, EmbeddingBackwardMatchesCpuBitForBit) {
  const int64_t b = 3, s = 17, T = b * s, C = 77, rows = 31, pos_rows = 64;
  const auto ids = rand_ids(T, 81, "emb.ids", 11);  // ids < 11 of 31 rows: many repeats, untouched rows
  std::vector<int64_t> pos(T);
  for (int64_t t = 0; t < T; ++t) pos[t] = t % s;  // each position repeated b times
  const auto dyv = randn_bf16(T * C, 81, "emb.dy");
  const auto dwte0 = randn(rows * C, 81, "emb.dwte0"), dwpe0 = randn(pos_rows * C, 81, "emb.dwpe0");
  // The CPU adds the tokens of a row in token order onto its current value; so does the GPU.
  auto dwte = dwte0, dwpe = dwpe0;
  cpu::embedding_backward(ids.data(), dyv.data(), dwte.data(), T, C);
  cpu::embedding_backward(pos.data(), dyv.data(), dwpe.data(), T, C);

  auto dids = to_device(ids), dpos = to_device(pos), ddy = to_device_bf16(dyv);
  auto ddwte = to_device(dwte0), ddwpe = to_device(dwpe0);
  const size_t bytes = std::max(cuda::embedding_backward_scratch_bytes(T, rows),
                                cuda::embedding_backward_scratch_bytes(T, pos_rows));
  DeviceBuffer scratch(bytes);
  cuda::embedding_backward(dids.as<int64_t>(), ddy.as<bf16>(), ddwte.as<float>(), T, C, rows, scratch.ptr, bytes,
                           stream_);
  cuda::embedding_backward(dpos.as<int64_t>(), ddy.as<bf16>(), ddwpe.as<float>(), T, C, pos_rows, scratch.ptr, bytes,
                           stream_);
  sync();
  expect_equal(from_device<float>(ddwte, rows * C), dwte, "dwte0 + scatter(dy)");
  expect_equal(from_device<float>(ddwpe, pos_rows * C), dwpe, "dwpe0 + scatter(dy)");
}


// ---------------------------------------------------------------- tensor-parallel pieces

// A rank's slice of a mask (its heads, or its positions of every sequence) is the whole mask's
// elements at their places: dropout over the slice equals the slice of dropout over the whole.
TEST_F(CudaKernels, SlicedDropoutIsTheWholeMasksSlice) {
  const int64_t runs = 3, whole_run = 4 * 50, parts = 4, n_whole = runs * whole_run, n_local = n_whole / parts;
  const auto x = randn_bf16(n_whole, 90, "sliced.x");
  for (float v : x) ASSERT_NE(v, 0.0f);
  const auto spec = dropout_spec(0.3, 90, "sliced.stream");
  auto dx = to_device_bf16(x);
  DeviceBuffer dy(n_whole * sizeof(bf16));
  cuda::dropout_apply(dx.as<bf16>(), dy.as<bf16>(), n_whole, spec, stream_);
  sync();
  const auto whole = from_device_bf16(dy, n_whole);
  for (int64_t part = 0; part < parts; ++part) {
    std::vector<float> xl, want;  // the part's pieces of every run
    for (int64_t r = 0; r < runs; ++r)
      for (int64_t i = 0; i < whole_run / parts; ++i) {
        const int64_t g = r * whole_run + part * (whole_run / parts) + i;
        xl.push_back(x[g]);
        want.push_back(whole[g]);
      }
    auto dxl = to_device_bf16(xl);
    cuda::dropout_apply(dxl.as<bf16>(), dxl.as<bf16>(), n_local, cuda::sliced(spec, whole_run, part, parts), stream_);
    sync();
    expect_equal(from_device_bf16(dxl, n_local), want, "part " + std::to_string(part));
  }
}

// Vocabulary-parallel cross entropy: the shards' statistics, combined, give the whole vocabulary's
// loss and lse, and each shard's gradient is its columns of the whole gradient.
TEST_F(CudaKernels, VocabParallelCrossEntropyMatchesCpu) {
  const int64_t T = 23, V = 3 * 1024, ranks = 3, Vl = V / ranks;
  const auto logits = randn_bf16(T * V, 91, "vpce.logits", 2.0);
  auto targets = rand_ids(T, 91, "vpce.targets", V);
  targets[0] = V - 1, targets[1] = 0, targets[2] = Vl;  // shard edges
  const auto dloss = randn(T, 91, "vpce.dloss", 0.01, 0.03);
  std::vector<float> loss(T), lse(T), grad = logits;
  cpu::cross_entropy_forward(logits.data(), targets.data(), loss.data(), lse.data(), T, V);
  cpu::cross_entropy_backward(grad.data(), targets.data(), lse.data(), dloss.data(), T, V);

  auto dt = to_device(targets), ddl = to_device(dloss);
  DeviceBuffer gathered(ranks * 2 * T * sizeof(float)), dloss_out(T * sizeof(float)), dlse(T * sizeof(float));
  std::vector<DeviceBuffer> shards;
  for (int64_t r = 0; r < ranks; ++r) {
    std::vector<float> shard(T * Vl);
    for (int64_t t = 0; t < T; ++t)
      std::copy(logits.begin() + t * V + r * Vl, logits.begin() + t * V + (r + 1) * Vl, shard.begin() + t * Vl);
    shards.push_back(to_device_bf16(shard));
    cuda::cross_entropy_shard_stats(shards.back().as<bf16>(), dt.as<int64_t>(), gathered.as<float>() + r * 2 * T, T,
                                    Vl, r * Vl, stream_);
  }
  cuda::cross_entropy_combine_shards(gathered.as<float>(), dt.as<int64_t>(), dloss_out.as<float>(), dlse.as<float>(),
                                     T, V, static_cast<int>(ranks), stream_);
  sync();
  std::vector<double> tol(T);
  for (int64_t t = 0; t < T; ++t) tol[t] = 1e-5 * (1.0 + std::abs(loss[t]));
  expect_within(from_device<float>(dloss_out, T), to_double(loss), tol, "loss");
  for (int64_t t = 0; t < T; ++t) tol[t] = 1e-5 * (1.0 + std::abs(lse[t]));
  expect_within(from_device<float>(dlse, T), to_double(lse), tol, "lse");
  for (int64_t r = 0; r < ranks; ++r) {
    cuda::cross_entropy_backward(shards[r].as<bf16>(), dt.as<int64_t>(), dlse.as<float>(), ddl.as<float>(), T, Vl,
                                 stream_, r * Vl);
    sync();
    std::vector<double> want(T * Vl);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < Vl; ++j) want[t * Vl + j] = grad[t * V + r * Vl + j];
    expect_bf16_close(from_device_bf16(shards[r], T * Vl), want, 1e-5, "shard " + std::to_string(r) + " gradient");
  }
}

// A vocabulary shard's embedding: zeros for the other shards' ids, so the shards' outputs sum to the
// whole lookup; its backward scatters only its own ids, at their rows of the shard.
TEST_F(CudaKernels, VocabShardEmbeddingMatchesTheWholeTable) {
  const int64_t T = 41, C = 24, rows = 30, ranks = 2, rl = rows / ranks;
  const auto ids = rand_ids(T, 92, "vemb.ids", rows);
  const auto wte = randn_bf16(rows * C, 92, "vemb.wte");
  std::vector<float> whole(T * C);
  cpu::embedding_forward(ids.data(), wte.data(), whole.data(), T, C, rows, false);
  const auto dyv = randn_bf16(T * C, 92, "vemb.dy");
  std::vector<float> dwhole(rows * C, 0.0f);
  cpu::embedding_backward(ids.data(), dyv.data(), dwhole.data(), T, C);

  auto dids = to_device(ids), ddy = to_device_bf16(dyv);
  std::vector<float> sum(T * C, 0.0f);
  DeviceBuffer scratch(cuda::embedding_backward_scratch_bytes(T, rl));
  for (int64_t r = 0; r < ranks; ++r) {
    auto shard = to_device_bf16(std::vector<float>(wte.begin() + r * rl * C, wte.begin() + (r + 1) * rl * C));
    DeviceBuffer dy(T * C * sizeof(bf16));
    cuda::embedding_forward(dids.as<int64_t>(), shard.as<bf16>(), nullptr, nullptr, dy.as<bf16>(), T, C, rl, 0, stream_,
                            r * rl);
    DeviceBuffer dw(rl * C * sizeof(float));
    LAOYAO_CUDA_CHECK(cudaMemsetAsync(dw.ptr, 0, dw.bytes, stream_));
    cuda::embedding_backward(dids.as<int64_t>(), ddy.as<bf16>(), dw.as<float>(), T, C, rl, scratch.ptr, scratch.bytes,
                             stream_, r * rl);
    sync();
    const auto y = from_device_bf16(dy, T * C);
    for (int64_t t = 0; t < T; ++t) {
      const bool mine = ids[t] >= r * rl && ids[t] < (r + 1) * rl;
      for (int64_t c = 0; c < C; ++c) {
        EXPECT_EQ(y[t * C + c], mine ? whole[t * C + c] : 0.0f) << "rank " << r << " token " << t;
        sum[t * C + c] += y[t * C + c];
      }
    }
    expect_equal(from_device<float>(dw, rl * C),
                 std::vector<float>(dwhole.begin() + r * rl * C, dwhole.begin() + (r + 1) * rl * C),
                 "rank " + std::to_string(r) + " scatter(dy)");
  }
  expect_equal(sum, whole, "the shards' sum");
}

}  // namespace
}  // namespace laoyao::kernels::cuda_test
