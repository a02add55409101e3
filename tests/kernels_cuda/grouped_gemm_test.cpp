// The grouped expert GEMMs (kernels/cuda/grouped_gemm.hpp) against naive fp64 loops per group, on
// fresh random inputs (laoyao::Rng, never zeros) rounded to bf16 on the host.
//
// Tolerances (kernels_test.cpp's header explains them): a bf16 output (nt, nn) is checked element
// by element against |got - want| <= 2^-7 |want| + 2e-5 * sum |terms|, the fp32 main_grad of wgrad
// against 2e-5 * (|dW before| + sum |terms|) alone. Every output sits between guard regions: the
// bf16 outputs and their guards are poisoned with NaN bits before the call (an element the kernel
// does not write fails as NaN; a guard it overwrites fails bit for bit); wgrad accumulates onto a
// random non-zero dW, leaves its guards and the matrices of empty groups bit-identical, and gives
// bit-identical results when run twice (each element is summed by one block, in a fixed order).
// Writing instead (accumulate = false, a step's first micro-batch), the random dW before must not
// show through and a matrix without rows must become zeros.
//
// Expert parallelism's groups (one per source rank and local expert, source-major, group g using
// weight matrix g % Gw) run the same checks with fewer weight matrices than groups: wgrad then sums
// several groups' rows into one matrix.
//
// Group sizes cover empty groups (first, middle and last), single rows, counts just above and
// below the 128-row tile and odd counts; N and K cover multiples of 8 that are not multiples of the
// 128 x 128 x 64 tile (72, 136, 200, 264, 520) and the flagship MoE's shapes (hidden 1024, expert FFN
// 384 with SwiGLU: fc1 [768, 1024], fc2 [1024, 384]).
//
// GPU only: these tests need device 0 (tests/*_cuda are labelled `gpu`).
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.hpp"
#include "core/rng.hpp"
#include "core/runtime_options.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/device_buffer.hpp"
#include "kernels/cuda/grouped_gemm.hpp"
#include "cuda_test_util.hpp"

namespace laoyao::kernels::cuda_test {
namespace {

constexpr int64_t kGuard = 64;            // elements of guard before and after every output
constexpr uint16_t kPoison = 0xFFFF;      // bf16 NaN bits

struct Groups {
  std::vector<int32_t> offsets;  // G + 1
  int64_t G = 0, Gw = 0, rows = 0;
  DeviceBuffer device;
  cuda::RowGroups on_device() const { return {device.as<int32_t>(), G, Gw, rows}; }
};

// Groups of the given sizes over Gw weight matrices (0: one each).
Groups groups_of(const std::vector<int>& counts, int64_t Gw = 0) {
  Groups g;
  g.G = static_cast<int64_t>(counts.size());
  g.Gw = Gw > 0 ? Gw : g.G;
  g.offsets.assign(counts.size() + 1, 0);
  for (size_t i = 0; i < counts.size(); ++i) g.offsets[i + 1] = g.offsets[i] + counts[i];
  g.rows = g.offsets.back();
  g.device = DeviceBuffer(g.offsets.size() * sizeof(int32_t));
  g.device.upload(g.offsets.data(), g.device.bytes);
  return g;
}

std::string describe(const std::vector<int>& counts, int64_t Gw, int64_t N, int64_t K) {
  std::string s = "counts {";
  for (size_t i = 0; i < counts.size(); ++i) s += (i ? ", " : "") + std::to_string(counts[i]);
  return s + "} Gw=" + std::to_string(Gw) + " N=" + std::to_string(N) + " K=" + std::to_string(K);
}

// A bf16 output of n elements between two guards, all NaN bits.
struct PoisonedBf16 {
  DeviceBuffer buf;
  int64_t n;
  explicit PoisonedBf16(int64_t n_) : buf((n_ + 2 * kGuard) * sizeof(bf16)), n(n_) {
    LAOYAO_CUDA_CHECK(cudaMemset(buf.ptr, 0xFF, buf.bytes));
  }
  bf16* out() const { return buf.as<bf16>() + kGuard; }
  // The output as floats; fails the test if a guard element changed.
  std::vector<float> read(const std::string& what) const {
    std::vector<uint16_t> h(static_cast<size_t>(n + 2 * kGuard));
    buf.download(h.data(), buf.bytes);
    size_t touched = 0;
    for (int64_t i = 0; i < kGuard; ++i) touched += (h[size_t(i)] != kPoison) + (h[size_t(kGuard + n + i)] != kPoison);
    EXPECT_EQ(touched, 0u) << what << ": elements of the guards around the output were written";
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t bits = uint32_t(h[size_t(kGuard + i)]) << 16;
      std::memcpy(&v[size_t(i)], &bits, sizeof(float));
    }
    return v;
  }
};

class CudaGroupedGemm : public CudaStreamTest {
 protected:
  // Y[r] = X[r] @ W_g^T.
  void check_nt(const std::vector<int>& counts, int64_t N, int64_t K, uint64_t seed, int64_t Gw = 0) {
    const Groups g = groups_of(counts, Gw);
    SCOPED_TRACE("grouped_gemm_nt " + describe(counts, g.Gw, N, K));
    const auto x = randn_bf16(size_t(g.rows * K), seed, "grouped.nt.x");
    const auto w = randn_bf16(size_t(g.Gw * N * K), seed, "grouped.nt.w", 0.05);
    std::vector<double> want(size_t(g.rows * N)), tol(want.size());
    for (int64_t e = 0; e < g.G; ++e)
      for (int64_t r = g.offsets[size_t(e)]; r < g.offsets[size_t(e) + 1]; ++r)
        for (int64_t n = 0; n < N; ++n) {
          const float* xr = &x[size_t(r * K)];
          const float* wr = &w[size_t(((e % g.Gw) * N + n) * K)];
          double s = 0.0, a = 0.0;
          for (int64_t k = 0; k < K; ++k) {
            const double t = double(xr[k]) * wr[k];
            s += t;
            a += std::abs(t);
          }
          want[size_t(r * N + n)] = s;
          tol[size_t(r * N + n)] = kBf16Rel * std::abs(s) + kFp32Sum * a;
        }
    const DeviceBuffer dx = to_device_bf16(x), dw = to_device_bf16(w);
    const PoisonedBf16 y(g.rows * N);
    cuda::grouped_gemm_nt(dx.as<bf16>(), dw.as<bf16>(), y.out(), g.on_device(), N, K, stream_);
    sync();
    expect_within(y.read("Y"), want, tol, "Y");
  }

  // dX[r] = dY[r] @ W_g.
  void check_nn(const std::vector<int>& counts, int64_t N, int64_t K, uint64_t seed, int64_t Gw = 0) {
    const Groups g = groups_of(counts, Gw);
    SCOPED_TRACE("grouped_gemm_nn " + describe(counts, g.Gw, N, K));
    const auto dy = randn_bf16(size_t(g.rows * N), seed, "grouped.nn.dy");
    const auto w = randn_bf16(size_t(g.Gw * N * K), seed, "grouped.nn.w", 0.05);
    std::vector<double> want(size_t(g.rows * K)), tol(want.size());
    std::vector<double> s(static_cast<size_t>(K)), a(static_cast<size_t>(K));
    for (int64_t e = 0; e < g.G; ++e)
      for (int64_t r = g.offsets[size_t(e)]; r < g.offsets[size_t(e) + 1]; ++r) {
        std::fill(s.begin(), s.end(), 0.0);
        std::fill(a.begin(), a.end(), 0.0);
        for (int64_t n = 0; n < N; ++n) {
          const double d = dy[size_t(r * N + n)];
          const float* wr = &w[size_t(((e % g.Gw) * N + n) * K)];
          for (int64_t k = 0; k < K; ++k) {
            const double t = d * wr[k];
            s[size_t(k)] += t;
            a[size_t(k)] += std::abs(t);
          }
        }
        for (int64_t k = 0; k < K; ++k) {
          want[size_t(r * K + k)] = s[size_t(k)];
          tol[size_t(r * K + k)] = kBf16Rel * std::abs(s[size_t(k)]) + kFp32Sum * a[size_t(k)];
        }
      }
    const DeviceBuffer ddy = to_device_bf16(dy), dw = to_device_bf16(w);
    const PoisonedBf16 dx(g.rows * K);
    cuda::grouped_gemm_nn(ddy.as<bf16>(), dw.as<bf16>(), dx.out(), g.on_device(), N, K, stream_);
    sync();
    expect_within(dx.read("dX"), want, tol, "dX");
  }

  // dW_w += sum of dY_g^T @ X_g over the groups g of matrix w onto a random non-zero dW; or, with
  // accumulate false, written over it. dW starts `lead` elements into its buffer (the guard before
  // it): kGuard is 16-byte aligned, kGuard + 2 only 8-byte (main_grad's offsets may be).
  void check_wgrad(const std::vector<int>& counts, int64_t N, int64_t K, uint64_t seed, int64_t Gw = 0,
                   bool accumulate = true, int64_t lead = kGuard) {
    const Groups g = groups_of(counts, Gw);
    SCOPED_TRACE("grouped_gemm_wgrad " + describe(counts, g.Gw, N, K) + (accumulate ? "" : ", writing") +
                 (lead % 4 ? ", dW 8-byte aligned" : ""));
    const auto dy = randn_bf16(size_t(g.rows * N), seed, "grouped.wgrad.dy");
    const auto x = randn_bf16(size_t(g.rows * K), seed, "grouped.wgrad.x");
    const int64_t nw = g.Gw * N * K;
    // dW with its guards: random fp32 values (not bf16-rounded: main_grad holds any fp32).
    std::vector<float> dw0(size_t(lead + nw + kGuard));
    {
      Rng rng(seed, "grouped.wgrad.dw0");
      for (auto& v : dw0) v = static_cast<float>(rng.normal());
    }
    std::vector<double> want(static_cast<size_t>(nw)), abssum(static_cast<size_t>(nw));
    for (int64_t i = 0; i < nw; ++i) {
      want[size_t(i)] = accumulate ? dw0[size_t(lead + i)] : 0.0;
      abssum[size_t(i)] = std::abs(want[size_t(i)]);
    }
    for (int64_t e = 0; e < g.G; ++e)
      for (int64_t r = g.offsets[size_t(e)]; r < g.offsets[size_t(e) + 1]; ++r)
        for (int64_t n = 0; n < N; ++n) {
          const double d = dy[size_t(r * N + n)];
          const float* xr = &x[size_t(r * K)];
          double* wr = &want[size_t(((e % g.Gw) * N + n) * K)];
          double* ar = &abssum[size_t(((e % g.Gw) * N + n) * K)];
          for (int64_t k = 0; k < K; ++k) {
            const double t = d * xr[k];
            wr[k] += t;
            ar[k] += std::abs(t);
          }
        }
    std::vector<double> tol(static_cast<size_t>(nw));
    for (int64_t i = 0; i < nw; ++i) tol[size_t(i)] = kFp32Sum * abssum[size_t(i)];

    const DeviceBuffer ddy = to_device_bf16(dy), dx = to_device_bf16(x);
    DeviceBuffer ddw(dw0.size() * sizeof(float));
    std::vector<std::vector<float>> runs;
    for (int run = 0; run < 2; ++run) {  // twice from the same dW: bit-identical
      ddw.upload(dw0.data(), ddw.bytes);
      cuda::grouped_gemm_wgrad(ddy.as<bf16>(), dx.as<bf16>(), ddw.as<float>() + lead, g.on_device(), N, K,
                               accumulate, stream_);
      sync();
      std::vector<float> h(dw0.size());
      ddw.download(h.data(), ddw.bytes);
      runs.push_back(std::move(h));
    }
    const std::vector<float>& got = runs[0];
    EXPECT_EQ(std::memcmp(runs[0].data(), runs[1].data(), runs[0].size() * sizeof(float)), 0)
        << "two runs from the same dW differ";
    EXPECT_EQ(std::memcmp(got.data(), dw0.data(), size_t(lead) * sizeof(float)), 0) << "the guard before dW was written";
    EXPECT_EQ(std::memcmp(got.data() + lead + nw, dw0.data() + lead + nw, kGuard * sizeof(float)), 0)
        << "the guard after dW was written";
    for (int64_t w = 0; w < g.Gw; ++w) {
      bool empty = true;
      for (int64_t e = w; e < g.G; e += g.Gw) empty = empty && counts[size_t(e)] == 0;
      if (!empty) continue;
      const size_t at = size_t(lead + w * N * K);
      if (accumulate) {
        EXPECT_EQ(std::memcmp(got.data() + at, dw0.data() + at, size_t(N * K) * sizeof(float)), 0)
            << "the dW of matrix " << w << ", whose groups are empty, changed";
      } else {
        EXPECT_EQ(std::count(got.begin() + std::ptrdiff_t(at), got.begin() + std::ptrdiff_t(at + size_t(N * K)), 0.0f),
                  N * K)
            << "the dW of matrix " << w << ", whose groups are empty, is not all zeros";
      }
    }
    expect_within(std::vector<float>(got.begin() + lead, got.begin() + lead + nw), want, tol, "dW");
  }

  // nt and nn on groups g0 .. g0 + gn - 1 of `counts` alone (offsets from g0 on: a later part of a
  // longer grouping, as expert parallelism runs one source rank's groups), over Gw weight matrices:
  // their rows right, every other row of the output untouched (still NaN).
  void check_later_groups(const std::vector<int>& counts, int64_t g0, int64_t gn, int64_t Gw, int64_t N, int64_t K,
                          uint64_t seed) {
    SCOPED_TRACE("groups " + std::to_string(g0) + ".." + std::to_string(g0 + gn - 1) + " of " +
                 describe(counts, Gw, N, K));
    const Groups g = groups_of(counts);  // all groups' offsets; the call takes a part
    const int64_t r0 = g.offsets[size_t(g0)], r1 = g.offsets[size_t(g0 + gn)];
    const cuda::RowGroups part{g.device.as<int32_t>() + g0, gn, Gw, r1 - r0, r0};
    for (const bool nt : {true, false}) {
      SCOPED_TRACE(nt ? "nt" : "nn");
      const int64_t in = nt ? K : N, out = nt ? N : K;  // row widths of the input and the output
      const auto x = randn_bf16(size_t(g.rows * in), seed, "grouped.part.x");
      const auto w = randn_bf16(size_t(Gw * N * K), seed, "grouped.part.w", 0.05);
      std::vector<double> want, tol;
      for (int64_t e = g0; e < g0 + gn; ++e)
        for (int64_t r = g.offsets[size_t(e)]; r < g.offsets[size_t(e) + 1]; ++r)
          for (int64_t o = 0; o < out; ++o) {
            double sum = 0.0, a = 0.0;
            for (int64_t i = 0; i < in; ++i) {  // W_m is [N][K]: nt reads row o, nn column o
              const int64_t m = (e - g0) % Gw;
              const double t = double(x[size_t(r * in + i)]) * w[size_t(nt ? (m * N + o) * K + i : (m * N + i) * K + o)];
              sum += t;
              a += std::abs(t);
            }
            want.push_back(sum);
            tol.push_back(kBf16Rel * std::abs(sum) + kFp32Sum * a);
          }
      const DeviceBuffer dx = to_device_bf16(x), dw = to_device_bf16(w);
      const PoisonedBf16 y(g.rows * out);
      if (nt)
        cuda::grouped_gemm_nt(dx.as<bf16>(), dw.as<bf16>(), y.out(), part, N, K, stream_);
      else
        cuda::grouped_gemm_nn(dx.as<bf16>(), dw.as<bf16>(), y.out(), part, N, K, stream_);
      sync();
      const std::vector<float> got = y.read("out");
      expect_within(std::vector<float>(got.begin() + r0 * out, got.begin() + r1 * out), want, tol, "the part's rows");
      int64_t written = 0;
      for (int64_t i = 0; i < g.rows * out; ++i) written += (i < r0 * out || i >= r1 * out) && !std::isnan(got[i]);
      EXPECT_EQ(written, 0) << "elements of rows outside the groups were written";
    }
  }

  void check_all(const std::vector<int>& counts, int64_t N, int64_t K, uint64_t seed, int64_t Gw = 0) {
    check_nt(counts, N, K, seed, Gw);
    check_nn(counts, N, K, seed, Gw);
    check_wgrad(counts, N, K, seed, Gw);
    check_wgrad(counts, N, K, seed + 100, Gw, false);
  }

};

TEST_F(CudaGroupedGemm, MixedGroupSizes) {
  const std::vector<int> counts = {0, 1, 37, 128, 130, 0, 255, 64};
  check_all(counts, 72, 200, 1);
  check_all(counts, 200, 72, 2);
}

TEST_F(CudaGroupedGemm, RandomGroupSizes) {
  Rng rng(3, "grouped.counts");
  std::vector<int> counts(16);
  for (auto& c : counts) c = rng.uniform() < 0.25 ? 0 : static_cast<int>(rng.next_u64() % 300);
  counts.back() = 0;  // an empty last group
  check_all(counts, 136, 264, 3);
}

// The cp.async-fed kernels (LAOYAO_GROUPED_GEMM=cp_async), which the whole set also runs under in
// scripts/gpu_check.sh's grouped part: mixed and wide groups through both of them.
TEST_F(CudaGroupedGemm, CpAsyncKernelsMixedGroupSizes) {
  const ScopedRuntimeOptions cp_async([](RuntimeOptions& o) { o.grouped_gemm = RuntimeOptions::GroupedGemm::kCpAsync; });
  const std::vector<int> counts = {0, 1, 37, 128, 130, 0, 255, 64};
  check_all(counts, 72, 200, 11);
  check_all(counts, 512, 72, 12);
}

// The portable kernels (LAOYAO_GROUPED_GEMM=portable; auto's choice off Hopper): the same checks,
// tile edges, shared weights, later groups of a longer grouping and empty groups included.
TEST_F(CudaGroupedGemm, PortableKernelsMixedGroupSizes) {
  const ScopedRuntimeOptions portable([](RuntimeOptions& o) { o.grouped_gemm = RuntimeOptions::GroupedGemm::kPortable; });
  EXPECT_EQ(kernels::cuda::grouped_gemm_kernels(), kernels::cuda::GroupedGemmKernels::kPortable);
  const std::vector<int> counts = {0, 1, 37, 128, 130, 0, 255, 64};
  check_all(counts, 72, 200, 21);
  check_all(counts, 512, 72, 22);
  check_all({333}, 128, 96, 23);
  check_all({0, 70, 0, 65}, 24, 8, 24);
}

TEST_F(CudaGroupedGemm, SingleGroup) {
  check_all({333}, 128, 96, 4);
  check_all({5}, 8, 8, 5);
  check_all({129}, 256, 40, 6);
}

// The flagship MoE's expert GEMMs on three experts (one empty): fc1 (N=768, K=1024: the forward,
// its dgrad and wgrad) and fc2 (N=1024, K=384).
TEST_F(CudaGroupedGemm, FlagshipShapes) {
  const std::vector<int> counts = {512, 0, 389};
  check_all(counts, 768, 1024, 7);
  check_all(counts, 1024, 384, 8);
}

// Counts around the 64-row reduction step of wgrad (63, 65, 192) and widths that end in a partial
// 64-column swizzle block of a partial 128-wide tile (136, 520), in both roles; then outputs that
// take the 256-wide tiles of the TMA kernels (nn's K = 512, nt's N = 256) beside partial tiles.
TEST_F(CudaGroupedGemm, TileEdges) {
  const std::vector<int> counts = {63, 65, 0, 192, 1, 300};
  check_all(counts, 136, 520, 14);
  check_all(counts, 520, 136, 15);
  check_all(counts, 136, 512, 26);
  check_all(counts, 256, 72, 27);  // nt's output 256 wide
}

// dW only 8-byte aligned (an fp32 main_grad offset may be): the TMA kernels' wgrad cannot map it
// for bulk reductions and stores from its threads instead; both ways, writing and adding.
TEST_F(CudaGroupedGemm, WgradOfAnEightByteAlignedDw) {
  const std::vector<int> counts = {63, 0, 200, 129};
  check_wgrad(counts, 136, 72, 28, 0, true, kGuard + 2);
  check_wgrad(counts, 136, 72, 29, 0, false, kGuard + 2);
  check_wgrad(counts, 768, 1024, 30, 0, true, kGuard + 2);
}

// More 128 x 256 tiles than an H200 has SMs, so that the persistent blocks walk several tiles each
// (the ring's phases carried from tile to tile, the staging buffer reused after the previous
// tile's bulk stores): 64 groups of 250-349 rows (192 row tiles, most groups ending in a partial
// one) at N = K = 256 (4 reduction steps to a 3-stage ring); then more groups than the kernel's
// threads (400: several groups a thread in its tile table) and more than its table holds (1100:
// the grid kernels instead).
TEST_F(CudaGroupedGemm, ManyTilesAndManyGroups) {
  Rng rng(31, "grouped.many");
  std::vector<int> counts(64);
  for (auto& c : counts) c = 250 + static_cast<int>(rng.next_u64() % 100);
  check_all(counts, 256, 256, 31);
  std::vector<int> many(400);
  for (auto& c : many) c = static_cast<int>(rng.next_u64() % 40);
  check_all(many, 256, 256, 32);
  std::vector<int> beyond(1100);
  for (auto& c : beyond) c = static_cast<int>(rng.next_u64() % 9);
  check_all(beyond, 256, 64, 33);
}

// The weight gradient's blocks start with the matrices of the most rows (the order of equal ones
// by index): uneven loads with a hot matrix, ties and empty matrices, over 32 matrices (each lane of
// the ordering warp holding two and more); at 256 matrices (the most it orders), and with groups
// sharing matrices. Each element's sum is still one block's, in group order: the checks above
// (bit-identical twice, within the fp32 bound) hold whatever order the blocks run in.
TEST_F(CudaGroupedGemm, WgradLongestMatricesFirst) {
  Rng rng(34, "grouped.longest");
  std::vector<int> uneven(70);
  for (auto& c : uneven) c = static_cast<int>(rng.next_u64() % 4) * 64 + static_cast<int>(rng.next_u64() % 3);
  uneven[5] = 0, uneven[40] = 1500, uneven[69] = 0;
  check_wgrad(uneven, 136, 200, 34);
  check_wgrad(uneven, 136, 200, 35, 0, false);
  std::vector<int> most(256);
  for (auto& c : most) c = static_cast<int>(rng.next_u64() % 70);
  most[255] = 900;
  check_wgrad(most, 64, 72, 36);
  std::vector<int> shared(120);  // 3 sources x 40 matrices, matrix 7 hot on every source
  for (size_t g = 0; g < shared.size(); ++g) shared[g] = g % 40 == 7 ? 400 : static_cast<int>(rng.next_u64() % 90);
  check_wgrad(shared, 72, 136, 37, 40);
  check_wgrad(shared, 72, 136, 38, 40, false);
}

// Expert parallelism's source-major groups: 3 source ranks x 4 local experts (group g uses matrix
// g % 4), with empty groups, a matrix whose groups are all empty (1) and groups that straddle the
// 64-row reduction steps; then the flagship's fc1 at EP=2 (2 sources x 3 experts).
TEST_F(CudaGroupedGemm, SourceMajorGroupsShareWeights) {
  const std::vector<int> counts = {70, 0, 5, 128, 0, 0, 64, 1, 33, 0, 200, 63};
  check_all(counts, 136, 72, 16, 4);
  check_all(counts, 72, 136, 17, 4);
  check_all({300, 0, 129, 64, 1, 0}, 768, 1024, 18, 3);
  check_all({7, 9}, 24, 40, 19, 1);  // one matrix, two groups
}

// One source rank's groups of the source-major grouping alone: the first, a middle and the last
// source of 3 (4 local experts each), and an empty part.
TEST_F(CudaGroupedGemm, LaterGroupsOfALongerGrouping) {
  const std::vector<int> counts = {70, 0, 5, 128, 0, 0, 64, 1, 33, 0, 200, 63};
  check_later_groups(counts, 0, 4, 4, 136, 72, 21);
  check_later_groups(counts, 4, 4, 4, 72, 136, 22);
  check_later_groups(counts, 8, 4, 4, 136, 72, 23);
  check_later_groups(counts, 4, 8, 4, 40, 24, 24);
  check_later_groups({9, 0, 0, 5}, 1, 2, 2, 16, 24, 25);  // no rows
}

// No rows at all (every group empty) is a no-op (writing: zeros); a zero-length reduction writes
// zeros.
TEST_F(CudaGroupedGemm, EmptyProblems) {
  check_all({0, 0, 0, 0}, 72, 40, 9);
  check_all({0}, 16, 16, 10);
  check_all({0, 0, 0, 0}, 72, 40, 20, 2);
  check_nt({3, 0, 17}, 24, 0, 11);   // Y = 0
  check_nn({3, 0, 17}, 0, 24, 12);   // dX = 0
  check_wgrad({3, 0, 17}, 24, 0, 13);  // nothing to add
}

TEST_F(CudaGroupedGemm, RejectsBadArguments) {
  DeviceBuffer buf(1 << 16);
  const Groups g = groups_of({4, 4});
  const bf16* a = buf.as<bf16>();
  bf16* y = buf.as<bf16>();
  float* dw = buf.as<float>();
  const int32_t* off = g.device.as<int32_t>();
  struct Case {
    int64_t G, Gw, rows, N, K;
    const bf16* a;
    std::string_view expect;
  };
  const Case cases[] = {{2, 2, 8, 12, 16, a, "multiples of 8"}, {2, 2, 8, 16, 20, a, "multiples of 8"},
                        {2, 2, 8, -8, 16, a, "N=-8"},           {2, 2, 8, 16, -8, a, "K=-8"},
                        {0, 1, 8, 16, 16, a, "at least 1"},     {-1, 1, 8, 16, 16, a, "at least 1"},
                        {2, 0, 8, 16, 16, a, "Gw=0"},           {3, 2, 8, 16, 16, a, "multiple of the weight"},
                        {2, 2, -1, 16, 16, a, "rows"},          {2, 2, 8, 16, 16, a + 1, "aligned"}};
  for (const Case& c : cases) {
    SCOPED_TRACE("G=" + std::to_string(c.G) + " Gw=" + std::to_string(c.Gw) + " rows=" + std::to_string(c.rows) +
                 " N=" + std::to_string(c.N) + " K=" + std::to_string(c.K) + " expecting \"" +
                 std::string(c.expect) + "\"");
    const cuda::RowGroups rg{off, c.G, c.Gw, c.rows};
    const auto expect_error = [&](auto&& call, const char* fn) {
      try {
        call();
        ADD_FAILURE() << fn << " did not throw";
      } catch (const laoyao::Error& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find(fn), std::string::npos) << what;
        EXPECT_NE(what.find(c.expect), std::string::npos) << what;
      }
    };
    expect_error([&] { cuda::grouped_gemm_nt(c.a, a, y, rg, c.N, c.K, stream_); }, "grouped_gemm_nt");
    expect_error([&] { cuda::grouped_gemm_nn(c.a, a, y, rg, c.N, c.K, stream_); }, "grouped_gemm_nn");
    expect_error([&] { cuda::grouped_gemm_wgrad(c.a, a, dw, rg, c.N, c.K, true, stream_); }, "grouped_gemm_wgrad");
  }
  EXPECT_THROW(cuda::grouped_gemm_nt(a, a, y, cuda::RowGroups{nullptr, 2, 2, 8}, 16, 16, stream_), laoyao::Error);
  EXPECT_THROW(cuda::grouped_gemm_nn(a, a, y, cuda::RowGroups{off, 2, 2, 8, -1}, 16, 16, stream_), laoyao::Error);
  EXPECT_THROW(cuda::grouped_gemm_wgrad(a, a, dw, cuda::RowGroups{off, 2, 2, 8, INT32_MAX}, 16, 16, true, stream_),
               laoyao::Error);
  sync();  // nothing was enqueued
}

}  // namespace
}  // namespace laoyao::kernels::cuda_test
