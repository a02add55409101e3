// Expert parallelism's row groups (src/kernels/cuda/moe_ep.hpp) against a host version: random
// counts with empty chunks; the all-gather dispatcher's pieces (this rank's pairs, their
// permutation, the row ops that skip the other ranks' pairs, the device-bounded row counts)
// against host versions on random choices; whole experts under TP's share of the choices. GPU only
// (device 0).
#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/rng.hpp"
#include "kernels/cuda/device_buffer.hpp"
#include "kernels/cuda/moe.hpp"
#include "kernels/cuda/moe_ep.hpp"
#include "kernels/cuda/swiglu.hpp"
#include "cuda_test_util.hpp"

namespace laoyao::kernels::cuda_test {
namespace {

using CudaMoeEp = CudaStreamTest;

// counts [P][E]: about a quarter of them zero (empty chunks), the rest 1..9.
std::vector<int32_t> random_counts(int64_t P, int64_t E, uint64_t seed) {
  Rng rng(seed, "moe_ep.counts");
  std::vector<int32_t> c(static_cast<size_t>(P * E));
  for (auto& v : c) v = rng.next_u64() % 4 == 0 ? 0 : static_cast<int32_t>(1 + rng.next_u64() % 9);
  return c;
}

// Rank me's source-major groups, the order the all-to-all delivers them: group s * El + e holds
// source s's rows for local expert e. The groups of local expert e, taken in group order, are its
// rows in the CPU stage's expert-major order (model/moe_expert_parallel.cpp: source 0's, then 1's).
TEST_F(CudaMoeEp, SourceOffsetsFollowTheAllToAllsOrder) {
  for (const auto& [P, E] : std::vector<std::pair<int64_t, int64_t>>{{2, 8}, {4, 64}, {8, 512}, {1, 16}}) {
    const std::vector<int32_t> counts = random_counts(P, E, static_cast<uint64_t>(P * 1000 + E));
    auto dcounts = to_device(counts);
    const int64_t El = E / P;
    for (int64_t me : {int64_t{0}, P - 1}) {
      SCOPED_TRACE("P " + std::to_string(P) + ", E " + std::to_string(E) + ", rank " + std::to_string(me));
      DeviceBuffer doff((E + 1) * sizeof(int32_t));
      cuda::moe_ep_source_offsets(dcounts.as<int32_t>(), P, E, me, doff.as<int32_t>(), stream_);
      sync();
      const std::vector<int32_t> off = from_device<int32_t>(doff, static_cast<size_t>(E + 1));
      int32_t at = 0;
      for (int64_t s = 0; s < P; ++s)
        for (int64_t e = 0; e < El; ++e) {
          EXPECT_EQ(off[s * El + e], at) << "offset of source " << s << "'s rows for local expert " << e;
          at += counts[s * E + me * El + e];
        }
      EXPECT_EQ(off[E], at);
      for (int64_t g = 0; g < E; ++g) EXPECT_LE(off[g], off[g + 1]);
    }
  }
}

// P ranks' tokens x top-k choices over E experts (distinct within a token), rank me's share.
TEST_F(CudaMoeEp, GatheredPairsOfThisRanksExpertsSortExpertMajor) {
  const int64_t P = 4, E = 32, El = E / P, k = 6, Tg = 4 * 37, H = 24, n = Tg * k;
  Rng rng(11, "moe_ep.gathered");
  std::vector<int32_t> idx(static_cast<size_t>(n));
  for (int64_t t = 0; t < Tg; ++t) {
    std::vector<int32_t> experts(static_cast<size_t>(E));
    for (int32_t e = 0; e < E; ++e) experts[static_cast<size_t>(e)] = e;
    for (int64_t j = 0; j < k; ++j) {  // a partial Fisher-Yates shuffle: k distinct experts
      const size_t pick = static_cast<size_t>(j) + rng.next_u64() % static_cast<size_t>(E - j);
      std::swap(experts[static_cast<size_t>(j)], experts[pick]);
      idx[static_cast<size_t>(t * k + j)] = experts[static_cast<size_t>(j)];
    }
  }
  const std::vector<float> x = randn_bf16(static_cast<size_t>(Tg * H), 3, "moe_ep.x");
  const std::vector<float> probs = randn(static_cast<size_t>(n), 4, "moe_ep.probs");
  const std::vector<float> dy = randn_bf16(static_cast<size_t>(Tg * H), 5, "moe_ep.dy");
  for (const int64_t me : {int64_t{0}, int64_t{2}}) {
    SCOPED_TRACE("rank " + std::to_string(me));
    // Host: the local pairs expert-major, tokens ascending within an expert.
    std::vector<int32_t> counts(static_cast<size_t>(El), 0), offsets(static_cast<size_t>(El + 1), 0);
    for (int32_t e : idx)
      if (e / El == me) ++counts[static_cast<size_t>(e - me * El)];
    for (int64_t e = 0; e < El; ++e) offsets[e + 1] = offsets[e] + counts[e];
    const int32_t rows = offsets[El];
    std::vector<int32_t> want_row(static_cast<size_t>(n), -1), want_token(static_cast<size_t>(rows));
    std::vector<int32_t> cursor(offsets.begin(), offsets.end() - 1);
    for (int64_t i = 0; i < n; ++i) {
      const int32_t e = idx[i] - static_cast<int32_t>(me * El);
      if (e < 0 || e >= El) continue;
      want_row[i] = cursor[e]++;
      want_token[want_row[i]] = static_cast<int32_t>(i / k);
    }
    auto didx = to_device(idx);
    DeviceBuffer dl(n * sizeof(int32_t)), dcounts(El * sizeof(int32_t)), doff((El + 1) * sizeof(int32_t)),
        dsorted(n * sizeof(int32_t)), drows(n * sizeof(int32_t)),
        scratch(std::max<size_t>(cuda::moe_permutation_scratch_bytes(Tg, El), 1));
    cuda::moe_ep_local_choices(didx.as<int32_t>(), n, me * El, El, dl.as<int32_t>(), dcounts.as<int32_t>(), stream_);
    cuda::moe_permutation(dl.as<int32_t>(), dcounts.as<int32_t>(), Tg, El, k, doff.as<int32_t>(),
                          dsorted.as<int32_t>(), drows.as<int32_t>(), scratch.ptr, stream_);
    // The rows, bounded by n on the host and by offsets[El] on the device; a sentinel past them.
    auto dx = to_device_bf16(x);
    std::vector<float> sentinel(static_cast<size_t>(n * H), 7.0f);
    auto dperm = to_device_bf16(sentinel);
    cuda::moe_permute_forward(dx.as<cuda::bf16>(), dsorted.as<int32_t>(), dperm.as<cuda::bf16>(), n, H, stream_,
                              doff.as<int32_t>() + El);
    // SwiGLU over the same bound: rows past offsets[El] keep their sentinel.
    const int64_t F = H / 2;
    std::vector<float> act_sentinel(static_cast<size_t>(n * F), 5.0f);
    auto dact = to_device_bf16(act_sentinel);
    cuda::swiglu_forward(dperm.as<cuda::bf16>(), dact.as<cuda::bf16>(), n, F, stream_, doff.as<int32_t>() + El);
    // Combine and its backward over the gathered tokens: the other ranks' pairs skipped.
    auto dprobs = to_device(probs);
    DeviceBuffer dy_sum(Tg * H * sizeof(cuda::bf16)), dexp(n * H * sizeof(cuda::bf16)), dpr(n * sizeof(float)),
        dback(Tg * H * sizeof(cuda::bf16));
    cuda::moe_unpermute_forward(dperm.as<cuda::bf16>(), drows.as<int32_t>(), dprobs.as<float>(), nullptr,
                                dy_sum.as<cuda::bf16>(), Tg, k, H, stream_);
    auto ddy = to_device_bf16(dy);
    cuda::moe_unpermute_backward(dperm.as<cuda::bf16>(), drows.as<int32_t>(), dprobs.as<float>(), ddy.as<cuda::bf16>(),
                                 dexp.as<cuda::bf16>(), dpr.as<float>(), Tg, k, H, stream_);
    cuda::moe_permute_backward(dperm.as<cuda::bf16>(), drows.as<int32_t>(), dback.as<cuda::bf16>(), Tg, k, H, false,
                               stream_);
    sync();
    EXPECT_EQ(from_device<int32_t>(dcounts, static_cast<size_t>(El)), counts);
    EXPECT_EQ(from_device<int32_t>(doff, static_cast<size_t>(El + 1)), offsets);
    EXPECT_EQ(from_device<int32_t>(drows, static_cast<size_t>(n)), want_row);
    const std::vector<int32_t> sorted = from_device<int32_t>(dsorted, static_cast<size_t>(n));
    EXPECT_EQ(std::vector<int32_t>(sorted.begin(), sorted.begin() + rows), want_token);
    const std::vector<float> perm = from_device_bf16(dperm, static_cast<size_t>(n * H));
    const std::vector<float> act = from_device_bf16(dact, static_cast<size_t>(n * F));
    for (int64_t r = 0; r < n; ++r)
      for (int64_t h = 0; h < H; ++h) {
        const float want = r < rows ? x[static_cast<size_t>(want_token[r] * H + h)] : 7.0f;
        ASSERT_EQ(perm[r * H + h], want) << "row " << r << ", column " << h;
        if (r >= rows && h < F) {
          ASSERT_EQ(act[r * F + h], 5.0f) << "SwiGLU wrote row " << r << " past the rows";
        }
      }
    // Host sums in fp32 in choice order over this rank's pairs only.
    const std::vector<float> ysum = from_device_bf16(dy_sum, static_cast<size_t>(Tg * H));
    const std::vector<float> back = from_device_bf16(dback, static_cast<size_t>(Tg * H));
    const std::vector<float> dp = from_device<float>(dpr, static_cast<size_t>(n));
    for (int64_t t = 0; t < Tg; ++t) {
      for (int64_t h = 0; h < H; ++h) {
        float acc = 0.0f, acc_back = 0.0f;
        for (int64_t j = 0; j < k; ++j) {
          const int32_t r = want_row[t * k + j];
          if (r < 0) continue;
          acc += probs[t * k + j] * perm[r * H + h];
          acc_back += perm[r * H + h];
        }
        // Within a bf16 step (the device may fuse the multiply-adds).
        ASSERT_NEAR(ysum[t * H + h], acc, std::abs(acc) / 128 + 1e-6) << "token " << t;
        ASSERT_NEAR(back[t * H + h], acc_back, std::abs(acc_back) / 128 + 1e-6) << "token " << t;
      }
      for (int64_t j = 0; j < k; ++j) {
        const int32_t r = want_row[t * k + j];
        double dot = 0.0;
        for (int64_t h = 0; h < H && r >= 0; ++h) dot += double(dy[t * H + h]) * perm[r * H + h];
        EXPECT_NEAR(dp[t * k + j], dot, 1e-4 * (1.0 + std::abs(dot))) << "pair " << t * k + j;
      }
    }
  }
}

// Whole experts under TP: of b = 3 sequences of s = 40 tokens, share 1 of 4 (positions 10..19 of
// each) keeps its pairs and their counts; every other pair becomes -1. Random choices, a few
// already -1.
TEST_F(CudaMoeEp, ShareChoicesKeepOnlyTheSharesPositions) {
  const int64_t b = 3, s = 40, k = 5, E = 16, T = b * s, n = T * k, ranks = 4;
  Rng rng(13, "moe_ep.share");
  std::vector<int32_t> idx(static_cast<size_t>(n));
  for (auto& e : idx) e = rng.next_u64() % 10 == 0 ? -1 : static_cast<int32_t>(rng.next_u64() % E);
  auto didx = to_device(idx);
  DeviceBuffer dshare(n * sizeof(int32_t)), dcounts(E * sizeof(int32_t));
  for (const int64_t rank : {int64_t{0}, int64_t{1}, int64_t{3}}) {
    SCOPED_TRACE("share " + std::to_string(rank));
    std::vector<int32_t> want(static_cast<size_t>(n), -1), want_counts(static_cast<size_t>(E), 0);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t position = (i / k) % s;
      if (position / (s / ranks) != rank) continue;
      want[i] = idx[i];
      if (idx[i] >= 0) ++want_counts[static_cast<size_t>(idx[i])];
    }
    cuda::moe_share_choices(didx.as<int32_t>(), T, s, k, E, rank, ranks, dshare.as<int32_t>(), dcounts.as<int32_t>(),
                            stream_);
    sync();
    EXPECT_EQ(from_device<int32_t>(dshare, n), want);
    EXPECT_EQ(from_device<int32_t>(dcounts, E), want_counts);
  }
  DeviceBuffer counts(E * sizeof(int32_t));
  EXPECT_THROW(cuda::moe_share_choices(didx.as<int32_t>(), T, s, k, E, 0, 3, dshare.as<int32_t>(),
                                       counts.as<int32_t>(), stream_),
               Error);  // 3 shares do not divide 40 positions
  EXPECT_THROW(cuda::moe_share_choices(didx.as<int32_t>(), T, s, k, E, 4, 4, dshare.as<int32_t>(),
                                       counts.as<int32_t>(), stream_),
               Error);  // a share outside the group
}

TEST_F(CudaMoeEp, BadShapesThrow) {
  DeviceBuffer counts(8 * sizeof(int32_t)), off(9 * sizeof(int32_t));
  EXPECT_THROW(cuda::moe_ep_source_offsets(counts.as<int32_t>(), 3, 8, 0, off.as<int32_t>(), stream_),
               Error);  // 8 experts over 3 ranks
  EXPECT_THROW(cuda::moe_ep_source_offsets(counts.as<int32_t>(), 2, 8, 2, off.as<int32_t>(), stream_),
               Error);  // rank outside the group
  EXPECT_THROW(cuda::moe_ep_source_offsets(counts.as<int32_t>(), 2, 1024, 0, off.as<int32_t>(), stream_),
               Error);  // more experts than the router takes
  EXPECT_THROW(cuda::moe_ep_local_choices(counts.as<int32_t>(), 8, 0, 0, off.as<int32_t>(), counts.as<int32_t>(),
                                          stream_),
               Error);  // no local experts
}

}  // namespace
}  // namespace laoyao::kernels::cuda_test
