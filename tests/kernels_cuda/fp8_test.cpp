// The GPU's FP8 pieces against core/fp8_scaling (the CPU backend's simulation) on fresh random
// inputs: the casts bit for bit (values, transposes, amaxes, scale_inv), both recipes' scale updates
// bit for bit, and cuBLASLt's FP8 GEMMs against the fp32 product of the same FP8 values, within one
// bf16 rounding of the output. GPU only (device 0).
#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/error.hpp"
#include "core/fp8_scaling.hpp"
#include "cuda_test_util.hpp"
#include "kernels/cuda/fp8_cast.hpp"
#include "kernels/cuda/gemm_cublaslt.hpp"

namespace laoyao::kernels::cuda_test {
namespace {

using CudaFp8 = CudaStreamTest;

std::vector<float> codes_as_floats(const std::vector<uint8_t>& q) { return {q.begin(), q.end()}; }

std::vector<uint8_t> cpu_cast(const std::vector<float>& x, float scale, Fp8Format f) {
  std::vector<uint8_t> q(x.size());
  fp8_quantize(x.data(), static_cast<int64_t>(x.size()), scale, f, q.data());
  return q;
}

DeviceBuffer scalar(float v) { return to_device(std::vector<float>{v}); }
float read_scalar(const DeviceBuffer& d) { return from_device<float>(d, 1)[0]; }

}  // namespace

// Values that saturate, a NaN (passed over by the amax, kept by the cast) and an infinity (the amax;
// cast to the largest value) among random ones; a length the 8-wide path takes and one it does not.
TEST_F(CudaFp8, CastMatchesTheCpuBitForBit) {
  for (const int64_t n : {5003, 5000}) {
    for (const Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2}) {
      SCOPED_TRACE(std::string(f == Fp8Format::E4M3 ? "e4m3 " : "e5m2 ") + std::to_string(n));
      auto x = randn_bf16(n, 31, "fp8.cast", 3.0);
      // (values a bf16 holds exactly: the device reads bf16)
      x[7] = 3072.0f, x[8] = -1048576.0f, x[9] = std::numeric_limits<float>::quiet_NaN();
      const float scale = 37.25f;
      auto dx = to_device_bf16(x);
      auto dscale = scalar(scale), dinv = scalar(0.0f), damax = scalar(0.0f);
      DeviceBuffer dq(x.size());
      cuda::fp8_cast(dx.as<bf16>(), static_cast<int64_t>(x.size()), dscale.as<float>(), f, dq.as<uint8_t>(),
                     dinv.as<float>(), damax.as<float>(), stream_);
      sync();
      expect_equal(codes_as_floats(from_device<uint8_t>(dq, x.size())), codes_as_floats(cpu_cast(x, scale, f)),
                   "codes");
      EXPECT_EQ(read_scalar(dinv), 1.0f / scale);
      EXPECT_EQ(read_scalar(damax), fp8_amax(x.data(), static_cast<int64_t>(x.size())));
      x[10] = -std::numeric_limits<float>::infinity();  // an infinity is the amax
      dx = to_device_bf16(x);
      cuda::fp8_amax(dx.as<bf16>(), static_cast<int64_t>(x.size()), damax.as<float>(), stream_);
      sync();
      EXPECT_EQ(read_scalar(damax), std::numeric_limits<float>::infinity());
    }
  }
}

// Both copies of a [rows, cols] tensor with edges that are not whole tiles (the vector loads and
// stores where the shape allows them, byte by byte where it does not); the amax max-ed into what
// the slot held (a larger earlier amax stays).
TEST_F(CudaFp8, CastTransposeWritesBothLayouts) {
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{70, 48}, {128, 96}, {33, 13}, {80, 200}}) {
    SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(cols));
    const auto x = randn_bf16(rows * cols, 32, "fp8.transpose", 0.02);
    const float scale = current_scaling_scale(fp8_amax(x.data(), rows * cols), Fp8Format::E4M3);
    auto dx = to_device_bf16(x);
    auto dscale = scalar(scale), dinv = scalar(0.0f), damax = scalar(0.0f), dbig = scalar(5.0f);
    DeviceBuffer dq(rows * cols), dqt(rows * cols);
    cuda::fp8_cast_transpose(dx.as<bf16>(), rows, cols, dscale.as<float>(), Fp8Format::E4M3, dq.as<uint8_t>(),
                             dqt.as<uint8_t>(), dinv.as<float>(), damax.as<float>(), stream_);
    cuda::fp8_cast_transpose(dx.as<bf16>(), rows, cols, dscale.as<float>(), Fp8Format::E4M3, nullptr, nullptr, nullptr,
                             dbig.as<float>(), stream_);
    sync();
    const auto want = cpu_cast(x, scale, Fp8Format::E4M3);
    std::vector<uint8_t> want_t(want.size());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) want_t[c * rows + r] = want[r * cols + c];
    expect_equal(codes_as_floats(from_device<uint8_t>(dq, want.size())), codes_as_floats(want), "q");
    expect_equal(codes_as_floats(from_device<uint8_t>(dqt, want.size())), codes_as_floats(want_t), "q transposed");
    EXPECT_EQ(read_scalar(damax), fp8_amax(x.data(), rows * cols));
    EXPECT_EQ(read_scalar(dinv), 1.0f / scale);
    EXPECT_EQ(read_scalar(dbig), 5.0f);
  }
}

// Current scaling's scale from an amax, and delayed scaling's update over three passes (amaxes of
// 0 among them: such a tensor's history and scale stay), against core/fp8_scaling.
TEST_F(CudaFp8, ScaleUpdatesMatchTheCpuRecipes) {
  for (const float amax : {0.0f, 3.5f, 1e-30f, std::numeric_limits<float>::infinity(), 448.0f}) {
    auto da = scalar(amax), ds = scalar(-1.0f);
    cuda::fp8_current_scale(da.as<float>(), Fp8Format::E5M2, ds.as<float>(), stream_);
    sync();
    EXPECT_EQ(read_scalar(ds), current_scaling_scale(amax, Fp8Format::E5M2)) << amax;
  }
  const int64_t n = 5;
  for (const bool max_algo : {false, true})
    for (const int64_t len : {int64_t{1}, int64_t{4}}) {
      SCOPED_TRACE(std::string(max_algo ? "max" : "most_recent") + " len " + std::to_string(len));
      const std::vector<Fp8Format> formats = {Fp8Format::E4M3, Fp8Format::E5M2, Fp8Format::E4M3, Fp8Format::E4M3,
                                              Fp8Format::E5M2};
      DelayedScaling cpu(formats, len, max_algo ? AmaxComputeAlgo::Max : AmaxComputeAlgo::MostRecent, 1);
      std::vector<float> fmax;
      for (const Fp8Format f : formats) fmax.push_back(static_cast<float>(fp8_max(f)));
      auto dhist = to_device(std::vector<float>(static_cast<size_t>(len * n), 0.0f));
      auto dscale = to_device(std::vector<float>(n, 1.0f));
      auto dmax = to_device(fmax);
      for (int pass = 0; pass < 3; ++pass) {
        const auto amaxes = randn(n, 33 + static_cast<uint64_t>(pass), "fp8.amax", 4.0);
        std::vector<float> row0(n);
        for (int64_t i = 0; i < n; ++i) {
          row0[i] = i == pass ? 0.0f : std::fabs(amaxes[i]);
          cpu.record_amax(i, row0[i]);
        }
        // This pass's amaxes into the device's row 0.
        LAOYAO_CUDA_CHECK(cudaMemcpy(dhist.ptr, row0.data(), sizeof(float) * n, cudaMemcpyHostToDevice));
        cpu.update();
        cuda::fp8_delayed_update(dhist.as<float>(), dscale.as<float>(), dmax.as<float>(), n, len, max_algo, 1, stream_);
        sync();
        const auto hist = from_device<float>(dhist, static_cast<size_t>(len * n));
        const auto scale = from_device<float>(dscale, n);
        for (int64_t i = 0; i < n; ++i) {
          EXPECT_EQ(scale[i], cpu.scale(i)) << "pass " << pass << " tensor " << i;
          for (int64_t r = 0; r < len; ++r) EXPECT_EQ(hist[r * n + i], cpu.history(r, i)) << "row " << r;
        }
      }
    }
}

// The linear layer's three FP8 GEMMs as Hopper takes them (TN): the forward y = x w^T (E4M3 x
// E4M3, fast accumulation, bf16 output with the bias), the input gradient dx = dy w through w's
// transposed copy (E4M3 x E5M2, bf16), and the weight gradient dw += dy^T x through both
// transposed copies, accumulated into fp32 (beta 1). Each against the fp32 product of the same FP8
// values (core's fp8_gemm_tn); the fp32 output within 1e-3 of the product's largest entry: Hopper's
// FP8 tensor cores sum with fewer bits than fp32 between the promotions (an H100 erred by about 1e-4 of it).
TEST_F(CudaFp8, GemmsMatchTheFp32ProductOfTheSameFp8Values) {
  const int64_t T = 64, K = 128, N = 96;
  const auto x = randn_bf16(T * K, 34, "fp8.x", 2.0), w = randn_bf16(N * K, 34, "fp8.w", 0.05),
             dy = randn_bf16(T * N, 34, "fp8.dy", 1e-3), bias = randn_bf16(N, 34, "fp8.bias");
  auto cast = [&](const std::vector<float>& v, int64_t rows, int64_t cols, Fp8Format f, DeviceBuffer& q,
                  DeviceBuffer& qt, DeviceBuffer& inv, std::vector<uint8_t>& host, float& scale) {
    scale = current_scaling_scale(fp8_amax(v.data(), rows * cols), f);
    auto dv = to_device_bf16(v);
    auto ds = scalar(scale);
    q = DeviceBuffer(rows * cols), qt = DeviceBuffer(rows * cols), inv = scalar(0.0f);
    cuda::fp8_cast_transpose(dv.as<bf16>(), rows, cols, ds.as<float>(), f, q.as<uint8_t>(), qt.as<uint8_t>(),
                             inv.as<float>(), nullptr, stream_);
    sync();
    host = cpu_cast(v, scale, f);
  };
  DeviceBuffer qx, qxt, ix, qw, qwt, iw, qdy, qdyt, idy;
  std::vector<uint8_t> hx, hw, hdy;
  float sx, sw, sdy;
  cast(x, T, K, Fp8Format::E4M3, qx, qxt, ix, hx, sx);
  cast(w, N, K, Fp8Format::E4M3, qw, qwt, iw, hw, sw);
  cast(dy, T, N, Fp8Format::E5M2, qdy, qdyt, idy, hdy, sdy);
  auto transpose = [](const std::vector<uint8_t>& q, int64_t rows, int64_t cols) {
    std::vector<uint8_t> t(q.size());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) t[c * rows + r] = q[r * cols + c];
    return t;
  };
  cuda::CublasLtGemm gemm;
  cuda::GemmProblem p;
  // y^T [N, T] = w x^T (column-major): A = w ([K, N] column-major, transposed), B = x ([K, T]).
  p.m = N, p.n = T, p.k = K, p.trans_a = true, p.lda = K, p.ldb = K, p.ldd = N, p.bias = true;
  p.a_type = p.b_type = cuda::GemmOperand::E4M3, p.fast_accum = true;
  auto dbias = to_device_bf16(bias);
  DeviceBuffer y(T * N * sizeof(bf16));
  gemm.gemm_fp8(p, qw.as<uint8_t>(), iw.as<float>(), qx.as<uint8_t>(), ix.as<float>(), y.ptr, dbias.as<bf16>(), 1.0f,
                0.0f, stream_);
  // The same plus a residual stream as C (beta 1): linear_proj's and linear_fc2's bias-dropout-add
  // without dropout.
  const auto res = randn_bf16(T * N, 34, "fp8.residual", 4.0);
  auto dres = to_device_bf16(res);
  DeviceBuffer yr(T * N * sizeof(bf16));
  gemm.gemm_fp8(p, qw.as<uint8_t>(), iw.as<float>(), qx.as<uint8_t>(), ix.as<float>(), yr.ptr, dbias.as<bf16>(), 1.0f,
                1.0f, stream_, dres.as<bf16>());
  // dx^T [K, T] = w^T dy^T: A = w's transposed copy (row-major [K, N]: column-major [N, K], transposed).
  cuda::GemmProblem pd = p;
  pd.m = K, pd.n = T, pd.k = N, pd.lda = N, pd.ldb = N, pd.ldd = K, pd.bias = false;
  pd.b_type = cuda::GemmOperand::E5M2, pd.fast_accum = false;
  DeviceBuffer dx(T * K * sizeof(bf16));
  gemm.gemm_fp8(pd, qwt.as<uint8_t>(), iw.as<float>(), qdy.as<uint8_t>(), idy.as<float>(), dx.ptr, nullptr, 1.0f,
                0.0f, stream_);
  // dw^T [K, N] += x^T dy: A = x^T's copy, B = dy^T's copy, fp32 D.
  cuda::GemmProblem pw = pd;
  pw.m = K, pw.n = N, pw.k = T, pw.lda = T, pw.ldb = T, pw.ldd = K, pw.d_fp32 = true;
  pw.a_type = cuda::GemmOperand::E4M3, pw.b_type = cuda::GemmOperand::E5M2;
  const auto dw0 = randn(N * K, 34, "fp8.dw0", 0.01);
  auto dw = to_device(dw0);
  gemm.gemm_fp8(pw, qxt.as<uint8_t>(), ix.as<float>(), qdyt.as<uint8_t>(), idy.as<float>(), dw.ptr, nullptr, 1.0f,
                1.0f, stream_);
  sync();

  // The references, row-major: y[T, N], dx[T, K], dw[N, K].
  std::vector<float> want_y(T * N), want_dx(T * K), want_dw(dw0);
  fp8_gemm_tn(hx.data(), Fp8Format::E4M3, 1.0f / sx, hw.data(), Fp8Format::E4M3, 1.0f / sw, want_y.data(), T, N, K);
  const auto hwt = transpose(hw, N, K), hxt = transpose(hx, T, K), hdyt = transpose(hdy, T, N);
  fp8_gemm_tn(hdy.data(), Fp8Format::E5M2, 1.0f / sdy, hwt.data(), Fp8Format::E4M3, 1.0f / sw, want_dx.data(), T, K,
              N);
  fp8_gemm_tn(hdyt.data(), Fp8Format::E5M2, 1.0f / sdy, hxt.data(), Fp8Format::E4M3, 1.0f / sx, want_dw.data(), N, K,
              T, 1.0f);
  std::vector<double> wy(want_y.begin(), want_y.end());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) wy[t * N + n] += bias[n];
  expect_bf16_close(from_device_bf16(y, T * N), wy, 1e-3, "y = x w^T + b");
  for (size_t i = 0; i < wy.size(); ++i) wy[i] += res[i];
  expect_bf16_close(from_device_bf16(yr, T * N), wy, 1e-3, "y = x w^T + b + residual");
  expect_bf16_close(from_device_bf16(dx, T * K), to_double(want_dx), 1e-3, "dx = dy w");
  const auto got_dw = from_device<float>(dw, N * K);
  std::vector<double> product(want_dw.size());
  for (size_t i = 0; i < product.size(); ++i) product[i] = double(want_dw[i]) - dw0[i];
  std::vector<double> tol(want_dw.size(), 1e-3 * max_abs(product));
  expect_within(got_dw, to_double(want_dw), tol, "dw += dy^T x (fp32)");

  // What Hopper's FP8 GEMMs cannot take.
  cuda::GemmProblem nn = p;
  nn.trans_a = false;
  EXPECT_THROW(gemm.gemm_fp8(nn, qw.as<uint8_t>(), iw.as<float>(), qx.as<uint8_t>(), ix.as<float>(), y.ptr,
                             dbias.as<bf16>(), 1.0f, 0.0f, stream_),
               Error);
  cuda::GemmProblem both = pd;
  both.a_type = cuda::GemmOperand::E5M2;
  EXPECT_THROW(gemm.gemm_fp8(both, qwt.as<uint8_t>(), iw.as<float>(), qdy.as<uint8_t>(), idy.as<float>(), dx.ptr,
                             nullptr, 1.0f, 0.0f, stream_),
               Error);
  EXPECT_THROW(gemm.gemm(p, dbias.as<bf16>(), dbias.as<bf16>(), y.ptr, dbias.as<bf16>(), 1.0f, 0.0f, stream_), Error);
  EXPECT_THROW(gemm.gemm_fp8(p, qw.as<uint8_t>(), iw.as<float>(), qx.as<uint8_t>(), ix.as<float>(), y.ptr,
                             dbias.as<bf16>(), 1.0f, 1.0f, stream_),
               Error);  // (a bf16 D added to in place)
}

}  // namespace laoyao::kernels::cuda_test
