// The routed experts' FP8 pieces (Transformer Engine's GroupedLinear under fp8_autocast, one scale
// per weight matrix): the grouped casts (fp8_cast.hpp) against core/fp8_scaling's cast bit for bit,
// and the FP8 grouped GEMMs (grouped_gemm.hpp) against fp64 sums of the same FP8 values times the
// scale_invs, on fresh random inputs. Groups cover empty ones (first, middle, last), single rows,
// counts that start a group at an odd row (the wgrad's first box for it then starts below it, at a
// 16-byte multiple, TMA's only innermost coordinates), counts around the 128-row tile, expert
// parallelism's source-major groups (G = 2 Gw) and a bound's slack rows past the last group (the
// all-gather dispatcher's).
//
// Tolerances: the FP8 values and scales are exact in fp64, so what differs is the tensor cores' sum,
// which for FP8 keeps fewer bits than fp32. An output element is checked against
// |got - want| <= 2^-7 |want| (bf16 outputs) + tol * sum |terms|: with the split accumulator, whose
// partial sums over a stage's 128 products the threads add in fp32, tol = 1e-4 for the input
// gradient (measured on an H100: up to 5.3e-5) and 4e-4 for the weight gradient (measured: up to
// 1.8e-4, the same tensor cores' sums over a stage); 1e-3 for the forward's fast accumulation over
// the whole reduction (measured: 3.7e-4 at K = 1024). Each check prints its worst error over its
// bound.
//
// GPU only (device 0, Hopper: these kernels are wgmma ones).
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/fp8.hpp"
#include "core/fp8_scaling.hpp"
#include "cuda_test_util.hpp"
#include "kernels/cuda/fp8_cast.hpp"
#include "kernels/cuda/grouped_gemm.hpp"

namespace laoyao::kernels::cuda_test {
namespace {

constexpr double kSplitSum = 1e-4, kWgradSum = 4e-4, kFastSum = 1e-3;  // times sum |terms| (the header)

struct Groups {
  std::vector<int32_t> offsets;  // G + 1, from 0
  int64_t G = 0, Gw = 0, rows = 0;
  DeviceBuffer device;
  // `slack` rows past the last group in the bound the device is told.
  cuda::RowGroups on_device(int64_t slack = 0) const { return {device.as<int32_t>(), G, Gw, rows + slack, 0}; }
  int64_t group_of(int64_t r) const {
    for (int64_t g = 0; g < G; ++g)
      if (r >= offsets[size_t(g)] && r < offsets[size_t(g) + 1]) return g;
    return -1;
  }
};

Groups groups_of(const std::vector<int>& counts, int64_t Gw = 0) {
  Groups g;
  g.G = int64_t(counts.size());
  g.Gw = Gw > 0 ? Gw : g.G;
  g.offsets.assign(counts.size() + 1, 0);
  for (size_t i = 0; i < counts.size(); ++i) g.offsets[i + 1] = g.offsets[i] + counts[i];
  g.rows = g.offsets.back();
  g.device = to_device(g.offsets);
  return g;
}

// n random FP8 codes of format f: N(0, 1) values cast with a scale that spreads them over the format.
std::vector<uint8_t> random_codes(size_t n, uint64_t seed, const char* name, Fp8Format f) {
  const auto x = randn(n, seed, name);
  std::vector<uint8_t> q(n);
  fp8_quantize(x.data(), int64_t(n), f == Fp8Format::E4M3 ? 64.0f : 4096.0f, f, q.data());
  return q;
}

// Per-matrix scale_invs (powers of two times random factors: any float works).
std::vector<float> random_scales(int64_t n, uint64_t seed, const char* name) {
  auto v = randn(size_t(n), seed, name);
  for (auto& s : v) s = std::ldexp(1.0f + 0.5f * std::abs(s), -6);
  return v;
}

std::string counts_text(const std::vector<int>& counts, int64_t Gw, int64_t N, int64_t K) {
  std::string s = "counts {";
  for (size_t i = 0; i < counts.size(); ++i) s += (i ? ", " : "") + std::to_string(counts[i]);
  return s + "} Gw=" + std::to_string(Gw) + " N=" + std::to_string(N) + " K=" + std::to_string(K);
}

// got against want within rel |want| + tol * mag, the worst ratio of error to bound reported.
void expect_close(const std::vector<float>& got, const std::vector<double>& want, const std::vector<double>& mag,
                  double rel, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  double worst = 0.0;
  size_t bad = 0, first_bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(double(got[i]) - want[i]), bound = rel * std::abs(want[i]) + tol * mag[i] + 1e-30;
    worst = std::max(worst, err / bound);
    if (!(err <= bound) && bad++ == 0) first_bad = i;
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " elements out of bounds, first at " << first_bad << " (got "
                     << got[first_bad] << ", want " << want[first_bad] << "); worst error / bound " << worst;
  std::printf("[ %s: worst error / bound %.3f ]\n", what.c_str(), worst);
}

class CudaGroupedFp8 : public CudaStreamTest {
 protected:
  // The grouped cast of x [first + rows + slack][cols] with per-matrix scales (the groups' rows
  // from first): q and qt bit for bit, q's rows outside the groups untouched, qt's columns of slack
  // rows and from first rounded down to 16 up to first zero and those before untouched, every
  // matrix's scale_inv, the amaxes max-ed into what they held.
  void check_cast(const std::vector<int>& counts, int64_t Gw, int64_t cols, int64_t slack, Fp8Format f,
                  int64_t first = 0) {
    Groups g = groups_of(counts, Gw);
    for (auto& o : g.offsets) o += int32_t(first);
    g.device = to_device(g.offsets);
    SCOPED_TRACE(counts_text(counts, g.Gw, 0, cols) + " slack " + std::to_string(slack) + " first " +
                 std::to_string(first));
    const int64_t extent = first + g.rows + slack, ld = (extent + 15) / 16 * 16, stride = 3;
    const auto x = randn_bf16(size_t(extent * cols), 7, "fp8.grouped.x", 2.0);
    std::vector<float> scale(size_t(g.Gw * stride), -1.0f), amax0(scale.size(), 0.0f);
    for (int64_t w = 0; w < g.Gw; ++w) scale[size_t(w * stride)] = std::ldexp(1.0f + 0.1f * float(w), int(w % 5));
    amax0[0] = 1e6f;  // a larger earlier amax stays
    auto dx = to_device_bf16(x);
    auto dscale = to_device(scale), dinv = to_device(std::vector<float>(scale.size(), 0.0f)), damax = to_device(amax0);
    DeviceBuffer dq(size_t(extent * cols)), dqt(size_t(cols * ld));
    LAOYAO_CUDA_CHECK(cudaMemset(dq.ptr, 0xEE, dq.bytes));
    LAOYAO_CUDA_CHECK(cudaMemset(dqt.ptr, 0xEE, dqt.bytes));
    const cuda::Fp8Slots slots{dscale.as<float>(), stride, dinv.as<float>(), stride, damax.as<float>(), stride};
    cuda::RowGroups rg = g.on_device(slack);
    rg.first = first;
    cuda::fp8_grouped_cast_transpose(dx.as<bf16>(), cols, rg, slots, f, dq.as<uint8_t>(), dqt.as<uint8_t>(), ld,
                                     stream_);
    sync();
    const auto q = from_device<uint8_t>(dq, size_t(extent * cols)), qt = from_device<uint8_t>(dqt, size_t(cols * ld));
    const auto inv = from_device<float>(dinv, scale.size()), amax = from_device<float>(damax, scale.size());
    std::vector<float> want_amax = amax0;
    size_t wrong_q = 0, wrong_qt = 0;
    for (int64_t r = 0; r < extent; ++r) {
      const int64_t grp = g.group_of(r);
      for (int64_t c = 0; c < cols; ++c) {
        const float v = x[size_t(r * cols + c)];
        uint8_t want = r < first / 16 * 16 ? 0xEE : 0;  // (columns before the first box: untouched)
        if (grp >= 0) {
          const int64_t w = grp % g.Gw;
          want = fp8_from_float(v * scale[size_t(w * stride)], f);
          want_amax[size_t(w * stride)] = std::max(want_amax[size_t(w * stride)], std::abs(v));
          wrong_q += q[size_t(r * cols + c)] != want;
        } else {
          wrong_q += q[size_t(r * cols + c)] != 0xEE;  // a row outside the groups: its q is left
        }
        wrong_qt += qt[size_t(c * ld + r)] != want;
      }
    }
    EXPECT_EQ(wrong_q, 0u) << "q";
    EXPECT_EQ(wrong_qt, 0u) << "qt";
    for (int64_t w = 0; w < g.Gw; ++w) {
      EXPECT_EQ(inv[size_t(w * stride)], 1.0f / scale[size_t(w * stride)]) << "scale_inv of matrix " << w;
      EXPECT_EQ(amax[size_t(w * stride)], want_amax[size_t(w * stride)]) << "amax of matrix " << w;
      EXPECT_EQ(inv[size_t(w * stride + 1)], 0.0f) << "between the strided slots";
    }
    // The amaxes alone, over a fresh slot array.
    auto damax2 = to_device(std::vector<float>(scale.size(), 0.0f));
    cuda::fp8_grouped_amax(dx.as<bf16>(), cols, rg, damax2.as<float>(), stride, stream_);
    sync();
    const auto amax2 = from_device<float>(damax2, scale.size());
    for (int64_t w = 1; w < g.Gw; ++w) EXPECT_EQ(amax2[size_t(w * stride)], want_amax[size_t(w * stride)]) << w;
  }

  // Y = sa sb X_q W_q^T per group against fp64.
  void check_nt(const std::vector<int>& counts, int64_t Gw, int64_t N, int64_t K, Fp8Format fx, bool split,
                int64_t slack = 0) {
    const Groups g = groups_of(counts, Gw);
    SCOPED_TRACE(counts_text(counts, g.Gw, N, K) + (split ? " split" : " fast") +
                 (fx == Fp8Format::E5M2 ? " e5m2" : " e4m3"));
    const int64_t extent = g.rows + slack;
    const auto xq = random_codes(size_t(extent * K), 11, "fp8.nt.x", fx);
    const auto wq = random_codes(size_t(g.Gw * N * K), 12, "fp8.nt.w", Fp8Format::E4M3);
    const auto sa = random_scales(g.Gw, 13, "fp8.nt.sa"), sb = random_scales(g.Gw, 14, "fp8.nt.sb");
    std::vector<double> want(size_t(g.rows * N)), mag(want.size());
    for (int64_t r = 0; r < g.rows; ++r) {
      const int64_t w = g.group_of(r) % g.Gw;
      const double f = double(sa[size_t(w)]) * sb[size_t(w)];
      for (int64_t n = 0; n < N; ++n) {
        double s = 0.0, a = 0.0;
        for (int64_t k = 0; k < K; ++k) {
          const double t = double(fp8_to_float(xq[size_t(r * K + k)], fx)) *
                           fp8_to_float(wq[size_t((w * N + n) * K + k)], Fp8Format::E4M3);
          s += t, a += std::abs(t);
        }
        want[size_t(r * N + n)] = f * s, mag[size_t(r * N + n)] = f * a;
      }
    }
    auto dx = to_device(xq), dw = to_device(wq), dsa = to_device(sa), dsb = to_device(sb);
    DeviceBuffer dy(size_t(extent * N) * sizeof(bf16));
    LAOYAO_CUDA_CHECK(cudaMemset(dy.ptr, 0xFF, dy.bytes));  // NaN bits: an unwritten row fails
    cuda::grouped_gemm_fp8_nt(dx.as<uint8_t>(), fx, dw.as<uint8_t>(), dy.as<bf16>(), g.on_device(slack), N, K,
                              {dsa.as<float>(), dsb.as<float>(), 1, 1}, split, stream_);
    sync();
    auto got = from_device_bf16(dy, size_t(extent * N));
    got.resize(size_t(g.rows * N));
    expect_close(got, want, mag, kBf16Rel, split ? kSplitSum : kFastSum, "nt");
  }

  // dW_w (+)= sa sb sum over w's groups of dY_q^T X_q, from the transposes, against fp64.
  void check_wgrad(const std::vector<int>& counts, int64_t Gw, int64_t N, int64_t K, Fp8Format fdy, bool accumulate,
                   int64_t slack = 0) {
    const Groups g = groups_of(counts, Gw);
    SCOPED_TRACE(counts_text(counts, g.Gw, N, K) + (accumulate ? " accumulate" : " write") +
                 (fdy == Fp8Format::E5M2 ? " e5m2" : " e4m3"));
    const int64_t extent = g.rows + slack, ld = (extent + 15) / 16 * 16 + 16;
    auto dyt = random_codes(size_t(N * ld), 21, "fp8.wgrad.dy", fdy);
    auto xt = random_codes(size_t(K * ld), 22, "fp8.wgrad.x", Fp8Format::E4M3);
    const auto sa = random_scales(g.Gw, 23, "fp8.wgrad.sa"), sb = random_scales(g.Gw, 24, "fp8.wgrad.sb");
    const auto before = randn(size_t(g.Gw * N * K), 25, "fp8.wgrad.before", 0.1);
    std::vector<double> want(before.size()), mag(before.size());
    for (int64_t w = 0; w < g.Gw; ++w)
      for (int64_t n = 0; n < N; ++n)
        for (int64_t k = 0; k < K; ++k) {
          double s = 0.0, a = 0.0;
          for (int64_t grp = w; grp < g.G; grp += g.Gw)
            for (int64_t r = g.offsets[size_t(grp)]; r < g.offsets[size_t(grp) + 1]; ++r) {
              const double t = double(fp8_to_float(dyt[size_t(n * ld + r)], fdy)) *
                               fp8_to_float(xt[size_t(k * ld + r)], Fp8Format::E4M3);
              s += t, a += std::abs(t);
            }
          const double f = double(sa[size_t(w)]) * sb[size_t(w)];
          const size_t i = size_t((w * N + n) * K + k);
          const double b = accumulate ? before[i] : 0.0;
          want[i] = b + f * s, mag[i] = std::abs(b) + f * a;
        }
    auto ddy = to_device(dyt), dxt = to_device(xt), dsa = to_device(sa), dsb = to_device(sb), ddw = to_device(before);
    cuda::grouped_gemm_fp8_wgrad(ddy.as<uint8_t>(), fdy, dxt.as<uint8_t>(), ld, ddw.as<float>(), g.on_device(slack), N,
                                 K, {dsa.as<float>(), dsb.as<float>(), 1, 1}, accumulate, stream_);
    sync();
    expect_close(from_device<float>(ddw, before.size()), want, mag, 0.0, kWgradSum, "wgrad");
  }
};

}  // namespace

TEST_F(CudaGroupedFp8, GroupedCastMatchesTheCpuBitForBit) {
  check_cast({0, 37, 130, 1, 0, 256, 77, 0}, 0, 48, 0, Fp8Format::E4M3);
  check_cast({0, 37, 130, 1, 0, 256, 77, 0}, 0, 1024, 21, Fp8Format::E5M2);
  check_cast({5, 0, 129, 64, 3, 40}, 3, 80, 7, Fp8Format::E4M3);  // source-major groups: G = 2 Gw
  // The groups from a first that is not a multiple of 16 (the all-gather dispatcher's), and a
  // width that is not a multiple of 8 (the casts' byte-by-byte path).
  check_cast({3, 200, 0, 61}, 0, 96, 5, Fp8Format::E4M3, 37);
  check_cast({3, 200, 0, 61}, 2, 20, 0, Fp8Format::E5M2, 64 + 9);
}

TEST_F(CudaGroupedFp8, BatchedCastGivesEachMatrixItsScale) {
  const int64_t batch = 5, rows = 48, cols = 80, stride = 2;
  const auto x = randn_bf16(size_t(batch * rows * cols), 8, "fp8.batched.x", 0.05);
  std::vector<float> scale(size_t(batch * stride), 0.0f);
  for (int64_t b = 0; b < batch; ++b) scale[size_t(b * stride)] = 100.0f * float(b + 1);
  auto dx = to_device_bf16(x), dscale = to_device(scale), dinv = to_device(std::vector<float>(size_t(3 * batch), 0.0f)),
       damax = to_device(std::vector<float>(size_t(batch), 0.0f));
  DeviceBuffer dq(size_t(batch * rows * cols)), dqt(size_t(batch * rows * cols));
  // scale_inv at stride 3 and amax at stride 1: each slot array its own stride.
  const cuda::Fp8Slots slots{dscale.as<float>(), stride, dinv.as<float>(), 3, damax.as<float>(), 1};
  cuda::fp8_batched_cast_transpose(dx.as<bf16>(), batch, rows, cols, slots, Fp8Format::E4M3, dq.as<uint8_t>(),
                                   dqt.as<uint8_t>(), stream_);
  sync();
  const auto q = from_device<uint8_t>(dq, x.size()), qt = from_device<uint8_t>(dqt, x.size());
  const auto inv = from_device<float>(dinv, size_t(3 * batch)), amax = from_device<float>(damax, size_t(batch));
  size_t wrong = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const float* xb = &x[size_t(b * rows * cols)];
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const uint8_t want = fp8_from_float(xb[r * cols + c] * scale[size_t(b * stride)], Fp8Format::E4M3);
        wrong += q[size_t(b * rows * cols + r * cols + c)] != want;
        wrong += qt[size_t(b * rows * cols + c * rows + r)] != want;
      }
    EXPECT_EQ(inv[size_t(b * 3)], 1.0f / scale[size_t(b * stride)]);
    EXPECT_EQ(amax[size_t(b)], fp8_amax(xb, rows * cols));
  }
  EXPECT_EQ(wrong, 0u);
}

TEST_F(CudaGroupedFp8, ForwardMatchesFp64) {
  check_nt({0, 37, 130, 1, 0, 256, 77, 0}, 0, 272, 208, Fp8Format::E4M3, false);
  check_nt({300, 5, 0, 129}, 0, 768, 1024, Fp8Format::E4M3, false);  // the flagship's fc1 (256-wide tiles)
  check_nt({5, 0, 129, 64, 3, 40}, 3, 144, 96, Fp8Format::E4M3, false, 19);
}

TEST_F(CudaGroupedFp8, InputGradientWithTheSplitAccumulatorMatchesFp64) {
  check_nt({0, 37, 130, 1, 0, 256, 77, 0}, 0, 272, 208, Fp8Format::E5M2, true);
  check_nt({300, 5, 0, 129}, 0, 384, 1024, Fp8Format::E5M2, true);  // the flagship's fc2 dgrad
  check_nt({5, 0, 129, 64, 3, 40}, 3, 144, 96, Fp8Format::E4M3, true, 19);
}

TEST_F(CudaGroupedFp8, WeightGradientMatchesFp64) {
  check_wgrad({0, 37, 130, 1, 0, 256, 77, 0}, 0, 272, 208, Fp8Format::E5M2, true);
  check_wgrad({0, 37, 130, 1, 0, 256, 77, 0}, 0, 144, 96, Fp8Format::E4M3, false);
  check_wgrad({5, 0, 129, 64, 3, 40}, 3, 144, 96, Fp8Format::E5M2, true, 19);
  check_wgrad({300, 5, 0, 129}, 0, 1024, 384, Fp8Format::E5M2, true);  // the flagship's fc2
}

TEST_F(CudaGroupedFp8, RejectsShapesThatAreNotMultiplesOf16) {
  const Groups g = groups_of({16, 16});
  DeviceBuffer a(4096), b(4096), c(4096 * 4), s(64);
  EXPECT_THROW(cuda::grouped_gemm_fp8_nt(a.as<uint8_t>(), Fp8Format::E4M3, b.as<uint8_t>(), c.as<bf16>(),
                                         g.on_device(), 24, 32, {s.as<float>(), s.as<float>(), 1, 1}, false, stream_),
               Error);
  EXPECT_THROW(cuda::grouped_gemm_fp8_wgrad(a.as<uint8_t>(), Fp8Format::E4M3, b.as<uint8_t>(), 40, c.as<float>(),
                                            g.on_device(), 32, 32, {s.as<float>(), s.as<float>(), 1, 1}, true, stream_),
               Error);  // ld not a multiple of 16
}

}  // namespace laoyao::kernels::cuda_test
