// FP8 block scaling on the GPU against core/fp8_scaling's fp8_block_quantize (the CPU backend's
// simulation) on fresh random inputs: the casts bit for bit (values, transposes, each block's
// scale_inv in cuBLASLt's layouts), and cuBLASLt's block-scaled GEMMs (1 x 128 by 128 x 128 for the
// forward and the input gradient, 1 x 128 by 1 x 128 along the tokens for the weight gradient)
// against the fp64 product of the same dequantized operands. GPU only (device 0).
#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "core/error.hpp"
#include "core/fp8_scaling.hpp"
#include "cuda_test_util.hpp"
#include "kernels/cuda/fp8_block_cast.hpp"
#include "kernels/cuda/gemm_cublaslt.hpp"

namespace laoyao::kernels::cuda_test {
namespace {

using CudaFp8Block = CudaStreamTest;

// x [rows][cols] of bf16 values whose rows differ in magnitude by up to 2^12, so that blocks along
// a row and along a column take different scales; one 128-row band of zeros where there are more
// than 256 rows (its blocks scale by 1).
std::vector<float> banded(int64_t rows, int64_t cols, uint64_t seed, double stddev) {
  auto x = randn_bf16(static_cast<size_t>(rows * cols), seed, "fp8.block", stddev);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      float& v = x[size_t(r * cols + c)];
      v = r >= 256 && r < 384 ? 0.0f : std::ldexp(v, int(r % 13) - 6);  // (exact: a power of two)
    }
  return x;
}

std::vector<uint8_t> transpose(const std::vector<uint8_t>& q, int64_t rows, int64_t cols) {
  std::vector<uint8_t> t(q.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[size_t(c * rows + r)] = q[size_t(r * cols + c)];
  return t;
}

std::vector<float> as_floats(const std::vector<uint8_t>& q) { return {q.begin(), q.end()}; }

struct CpuBlocks {
  std::vector<uint8_t> q;
  std::vector<float> inv;  // [row blocks][col blocks]
};
CpuBlocks cpu_blocks(const std::vector<float>& x, int64_t rows, int64_t cols, int64_t br, int64_t bc, Fp8Format f) {
  CpuBlocks b;
  b.q.resize(x.size());
  b.inv.resize(size_t(((rows + br - 1) / br) * ((cols + bc - 1) / bc)));
  fp8_block_quantize(x.data(), rows, cols, br, bc, f, true, b.q.data(), b.inv.data());
  return b;
}

}  // namespace

// Shapes with whole and partial 128-blocks, widths the 16-byte loads take and ones they do not,
// lengths the 4-byte stores take and ones they do not; both formats.
TEST_F(CudaFp8Block, CastsMatchTheCpuBlockCastBitForBit) {
  for (const auto& [rows, cols] :
       {std::pair<int64_t, int64_t>{400, 256}, {200, 300}, {130, 72}, {64, 200}, {257, 131}}) {
    for (const Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2}) {
      SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(cols) + (f == Fp8Format::E4M3 ? " e4m3" : " e5m2"));
      const auto x = banded(rows, cols, 41, 3.0);
      auto dx = to_device_bf16(x);
      const int64_t rt = (rows + 127) / 128, ct = (cols + 127) / 128;
      // 1 x 128 blocks: q along the rows, qt along the columns.
      const int64_t ld = cuda::fp8_block_scale_ld(rows), ldt = cuda::fp8_block_scale_ld(cols);
      DeviceBuffer q(rows * cols), qt(rows * cols), inv(ct * ld * 4), invt(rt * ldt * 4);
      cuda::fp8_block_cast_1d(dx.as<bf16>(), rows, cols, f,
                              {q.as<uint8_t>(), inv.as<float>(), qt.as<uint8_t>(), invt.as<float>()}, stream_);
      sync();
      const CpuBlocks row = cpu_blocks(x, rows, cols, 1, 128, f), col = cpu_blocks(x, rows, cols, 128, 1, f);
      expect_equal(as_floats(from_device<uint8_t>(q, size_t(rows * cols))), as_floats(row.q), "1x128 q");
      expect_equal(as_floats(from_device<uint8_t>(qt, size_t(rows * cols))), as_floats(transpose(col.q, rows, cols)),
                   "128x1 qt");
      const auto got_inv = from_device<float>(inv, size_t(ct * ld)), got_invt = from_device<float>(invt, size_t(rt * ldt));
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < ct; ++j)
          ASSERT_EQ(got_inv[size_t(j * ld + r)], row.inv[size_t(r * ct + j)]) << "row " << r << " block " << j;
      for (int64_t i = 0; i < rt; ++i)
        for (int64_t c = 0; c < cols; ++c)
          ASSERT_EQ(got_invt[size_t(i * ldt + c)], col.inv[size_t(i * cols + c)]) << "block " << i << " column " << c;
      // 128 x 128 blocks: one scale a tile, q and its exact transpose.
      const int64_t ld2 = cuda::fp8_block_scale_ld(ct), ldt2 = cuda::fp8_block_scale_ld(rt);
      DeviceBuffer q2(rows * cols), qt2(rows * cols), inv2(rt * ld2 * 4), invt2(ct * ldt2 * 4);
      cuda::fp8_block_cast_2d(dx.as<bf16>(), rows, cols, f,
                              {q2.as<uint8_t>(), inv2.as<float>(), qt2.as<uint8_t>(), invt2.as<float>()}, stream_);
      sync();
      const CpuBlocks tile = cpu_blocks(x, rows, cols, 128, 128, f);
      expect_equal(as_floats(from_device<uint8_t>(q2, size_t(rows * cols))), as_floats(tile.q), "128x128 q");
      expect_equal(as_floats(from_device<uint8_t>(qt2, size_t(rows * cols))), as_floats(transpose(tile.q, rows, cols)),
                   "128x128 qt");
      const auto got_inv2 = from_device<float>(inv2, size_t(rt * ld2)), got_invt2 = from_device<float>(invt2, size_t(ct * ldt2));
      for (int64_t i = 0; i < rt; ++i)
        for (int64_t j = 0; j < ct; ++j) {
          ASSERT_EQ(got_inv2[size_t(i * ld2 + j)], tile.inv[size_t(i * ct + j)]) << i << ", " << j;
          ASSERT_EQ(got_invt2[size_t(j * ldt2 + i)], tile.inv[size_t(i * ct + j)]) << i << ", " << j;
        }
    }
  }
}

// The linear layer's three GEMMs under block scaling, TN as Hopper takes them: y = x w^T (x's 1 x 128
// blocks by w's 128 x 128, bf16 out), dx = dy w (dy's 1 x 128 by w's transposed tiles, E5M2 x E4M3),
// dw += dy^T x (both along the tokens, 1 x 128 by 1 x 128, fp32 accumulated). K not a multiple of
// 128 (a partial block along the reduction). Each against the fp64 product of the same dequantized
// operands: within a bf16 rounding and 1e-3 of the largest entry (the tensor cores' partial sums).
TEST_F(CudaFp8Block, GemmsMatchTheProductOfTheDequantizedOperands) {
  const int64_t T = 256, K = 320, N = 192;
  const auto x = banded(T, K, 42, 2.0), w = randn_bf16(size_t(N * K), 42, "fp8.block.w", 0.05),
             dy = banded(T, N, 43, 1e-3);
  auto deq = [](const std::vector<float>& v, int64_t rows, int64_t cols, int64_t br, int64_t bc, Fp8Format f) {
    std::vector<float> out(v.size());
    fp8_block_quantize_dequantized(v.data(), rows, cols, br, bc, f, true, out.data());
    return out;
  };
  auto dx_in = to_device_bf16(x), dw_in = to_device_bf16(w), ddy_in = to_device_bf16(dy);
  const int64_t tb = (T + 127) / 128, kb = (K + 127) / 128, nb = (N + 127) / 128;
  using cuda::fp8_block_scale_ld;
  // x: rowwise [T][K] (scales [kb][ld(T)]), columnwise x^T [K][T] (scales [tb][ld(K)]).
  DeviceBuffer qx(T * K), qxt(T * K), ix(kb * fp8_block_scale_ld(T) * 4), ixt(tb * fp8_block_scale_ld(K) * 4);
  cuda::fp8_block_cast_1d(dx_in.as<bf16>(), T, K, Fp8Format::E4M3,
                          {qx.as<uint8_t>(), ix.as<float>(), qxt.as<uint8_t>(), ixt.as<float>()}, stream_);
  // w: tiles [N][K] (scales [nb][ld(kb)]) and w^T [K][N] (scales [kb][ld(nb)]).
  DeviceBuffer qw(N * K), qwt(N * K), iw(nb * fp8_block_scale_ld(kb) * 4), iwt(kb * fp8_block_scale_ld(nb) * 4);
  cuda::fp8_block_cast_2d(dw_in.as<bf16>(), N, K, Fp8Format::E4M3,
                          {qw.as<uint8_t>(), iw.as<float>(), qwt.as<uint8_t>(), iwt.as<float>()}, stream_);
  // dy: rowwise [T][N] (scales [nb][ld(T)]), columnwise dy^T [N][T] (scales [tb][ld(N)]), E5M2.
  DeviceBuffer qdy(T * N), qdyt(T * N), idy(nb * fp8_block_scale_ld(T) * 4), idyt(tb * fp8_block_scale_ld(N) * 4);
  cuda::fp8_block_cast_1d(ddy_in.as<bf16>(), T, N, Fp8Format::E5M2,
                          {qdy.as<uint8_t>(), idy.as<float>(), qdyt.as<uint8_t>(), idyt.as<float>()}, stream_);

  cuda::CublasLtGemm gemm;
  // y^T [N, T] = w x^T: A = w ([K, N] column-major, transposed; 128 x 128), B = x (1 x 128).
  cuda::GemmProblem p;
  p.m = N, p.n = T, p.k = K, p.trans_a = true, p.lda = K, p.ldb = K, p.ldd = N;
  p.a_type = p.b_type = cuda::GemmOperand::E4M3;
  p.a_scale = cuda::GemmScale::Blk128, p.b_scale = cuda::GemmScale::Vec128;
  DeviceBuffer y(T * N * sizeof(bf16));
  gemm.gemm_fp8(p, qw.as<uint8_t>(), iw.as<float>(), qx.as<uint8_t>(), ix.as<float>(), y.ptr, nullptr, 1.0f, 0.0f,
                stream_);
  // dx^T [K, T] = w^T dy^T: A = w^T's tiles, B = dy (1 x 128 along N).
  cuda::GemmProblem pd = p;
  pd.m = K, pd.n = T, pd.k = N, pd.lda = N, pd.ldb = N, pd.ldd = K, pd.b_type = cuda::GemmOperand::E5M2;
  DeviceBuffer dx(T * K * sizeof(bf16));
  gemm.gemm_fp8(pd, qwt.as<uint8_t>(), iwt.as<float>(), qdy.as<uint8_t>(), idy.as<float>(), dx.ptr, nullptr, 1.0f,
                0.0f, stream_);
  // dw^T [K, N] += x^T dy: A = x^T (1 x 128 along T), B = dy^T (1 x 128 along T), fp32 D.
  cuda::GemmProblem pw = pd;
  pw.m = K, pw.n = N, pw.k = T, pw.lda = T, pw.ldb = T, pw.ldd = K, pw.d_fp32 = true;
  pw.a_type = cuda::GemmOperand::E4M3, pw.a_scale = cuda::GemmScale::Vec128;
  const auto dw0 = randn(size_t(N * K), 44, "fp8.block.dw0", 0.01);
  auto dw = to_device(dw0);
  gemm.gemm_fp8(pw, qxt.as<uint8_t>(), ixt.as<float>(), qdyt.as<uint8_t>(), idyt.as<float>(), dw.ptr, nullptr, 1.0f,
                1.0f, stream_);
  sync();

  const auto xr = deq(x, T, K, 1, 128, Fp8Format::E4M3), xc = deq(x, T, K, 128, 1, Fp8Format::E4M3),
             wq = deq(w, N, K, 128, 128, Fp8Format::E4M3), dyr = deq(dy, T, N, 1, 128, Fp8Format::E5M2),
             dyc = deq(dy, T, N, 128, 1, Fp8Format::E5M2);
  std::vector<double> want_y(size_t(T * N)), want_dx(size_t(T * K)), want_dw(size_t(N * K)), product(size_t(N * K));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += double(xr[size_t(t * K + k)]) * wq[size_t(n * K + k)];
      want_y[size_t(t * N + n)] = s;
    }
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < K; ++k) {
      double s = 0;
      for (int64_t n = 0; n < N; ++n) s += double(dyr[size_t(t * N + n)]) * wq[size_t(n * K + k)];
      want_dx[size_t(t * K + k)] = s;
    }
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      double s = 0;
      for (int64_t t = 0; t < T; ++t) s += double(dyc[size_t(t * N + n)]) * xc[size_t(t * K + k)];
      product[size_t(n * K + k)] = s;
      want_dw[size_t(n * K + k)] = dw0[size_t(n * K + k)] + s;
    }
  expect_bf16_close(from_device_bf16(y, size_t(T * N)), want_y, 1e-3, "y = x w^T");
  expect_bf16_close(from_device_bf16(dx, size_t(T * K)), want_dx, 1e-3, "dx = dy w");
  // (dw [N][K] row-major is dw^T [K][N] column-major: the same memory)
  std::vector<double> tol(want_dw.size(), 1e-3 * max_abs(product));
  expect_within(from_device<float>(dw, size_t(N * K)), want_dw, tol, "dw += dy^T x (fp32)");

  // What cuBLASLt's block scaling does not take: 128 x 128 on both operands, fast accumulation.
  cuda::GemmProblem both = p;
  both.b_scale = cuda::GemmScale::Blk128;
  EXPECT_THROW(gemm.gemm_fp8(both, qw.as<uint8_t>(), iw.as<float>(), qx.as<uint8_t>(), ix.as<float>(), y.ptr, nullptr,
                             1.0f, 0.0f, stream_),
               Error);
  cuda::GemmProblem fast = p;
  fast.fast_accum = true;
  EXPECT_THROW(gemm.gemm_fp8(fast, qw.as<uint8_t>(), iw.as<float>(), qx.as<uint8_t>(), ix.as<float>(), y.ptr, nullptr,
                             1.0f, 0.0f, stream_),
               Error);
}

}  // namespace laoyao::kernels::cuda_test
