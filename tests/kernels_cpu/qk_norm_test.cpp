// QK layernorm (RMSNorm per head over head_dim, q and k weights shared by their heads) on the fused
// QKV rows, against an fp64 twin written as Megatron runs it (split each group into q heads, k, v;
// torch.nn.RMSNorm over the last dim of query [.., heads, D] and key [.., groups, D]), finite
// differences of the backward, in-place backward, and per-head (not per-row) statistics.
#include <gtest/gtest.h>

#include <cmath>
#include <tuple>

#include "core/error.hpp"
#include "kernels/cpu/ops.hpp"
#include "test_util.hpp"

namespace laoyao::kernels::cpu::test {
namespace {

constexpr float kEps = 1e-6f;  // Qwen3's layernorm_epsilon

struct Shape {
  int64_t T, H, G, D;
  int64_t row() const { return G * (H / G + 2) * D; }
};

struct TwinOut {
  std::vector<double> out, rstd;
};

// torch.nn.RMSNorm(D, eps) applied to query [T, H, D] (weight q_gamma) and key [T, G, D] (weight
// k_gamma) after the split of each group's [H/G * D | D | D]; value passes through.
TwinOut qk_norm_twin(const std::vector<double>& qkv, const std::vector<double>& qg, const std::vector<double>& kg,
                     const Shape& sh, bool zc) {
  const int64_t Q = sh.H / sh.G, D = sh.D, W = sh.row();
  TwinOut r{qkv, std::vector<double>(sh.T * (sh.H + sh.G))};
  auto rms = [&](int64_t base, const std::vector<double>& gamma, double& rstd) {
    double ms = 0.0;
    for (int64_t d = 0; d < D; ++d) ms += qkv[base + d] * qkv[base + d];
    ms /= static_cast<double>(D);
    rstd = 1.0 / std::sqrt(ms + kEps);
    for (int64_t d = 0; d < D; ++d) r.out[base + d] = qkv[base + d] * rstd * (zc ? 1.0 + gamma[d] : gamma[d]);
  };
  for (int64_t t = 0; t < sh.T; ++t)
    for (int64_t g = 0; g < sh.G; ++g) {
      for (int64_t i = 0; i < Q; ++i) rms(t * W + (g * (Q + 2) + i) * D, qg, r.rstd[t * (sh.H + sh.G) + g * Q + i]);
      rms(t * W + (g * (Q + 2) + Q) * D, kg, r.rstd[t * (sh.H + sh.G) + sh.H + g]);
    }
  return r;
}

// Heads at different scales (one tiny, where eps matters; one large), so per-head statistics and
// eps placement are both visible.
std::vector<float> qkv_input(const Shape& sh, std::mt19937& rng) {
  auto x = randn(sh.T * sh.row(), rng);
  for (int64_t t = 0; t < sh.T; ++t)
    for (int64_t d = 0; d < sh.D; ++d) {
      x[t * sh.row() + d] *= 1e-3f;        // q head 0: mean square ~1e-6, the size of eps
      x[t * sh.row() + sh.D + d] *= 20.0f;  // the next slot (q head 1, or k when H/G = 1)
    }
  return x;
}

// expect_close per D-wide slot (each q head, k, v of each token) against the slot's own scale: the
// slots sit at very different scales on purpose, and one scale for all would hide the small ones.
void expect_close_per_slot(const std::vector<float>& got, const std::vector<double>& want, int64_t D, double rtol,
                           const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t b = 0; b < want.size(); b += D)
    expect_close(got.data() + b, std::vector<double>(want.begin() + b, want.begin() + b + D), rtol,
                 what + " slot " + std::to_string(b / D));
}

std::vector<float> gamma_for(bool zc, int64_t D, std::mt19937& rng) {
  return zc ? randn(D, rng, 0.3f) : randn(D, rng, 0.3f, 1.0f);
}

void PrintTo(const Shape& sh, std::ostream* os) {
  *os << "T" << sh.T << "H" << sh.H << "G" << sh.G << "D" << sh.D;
}

using Param = std::tuple<Shape, bool>;  // shape, zero_centered_gamma

std::string name_of(const Param& p) {
  const Shape& sh = std::get<0>(p);
  return "T" + std::to_string(sh.T) + "H" + std::to_string(sh.H) + "G" + std::to_string(sh.G) + "D" +
         std::to_string(sh.D) + (std::get<1>(p) ? "ZeroCentered" : "Plain");
}

class QkNormTest : public ::testing::TestWithParam<Param> {};
INSTANTIATE_TEST_SUITE_P(Shapes, QkNormTest,
                         ::testing::Combine(::testing::Values(Shape{7, 4, 2, 6},   // GQA, Qwen3-like ratio
                                                              Shape{7, 4, 2, 8},
                                                              Shape{7, 3, 3, 5},   // MHA, odd D
                                                              Shape{5, 4, 1, 8}),  // one group
                                            ::testing::Bool()),
                         [](const auto& info) { return name_of(info.param); });

TEST_P(QkNormTest, ForwardMatchesFp64Twin) {
  const auto [sh, zc] = GetParam();
  std::mt19937 rng(801);
  const auto qkv = qkv_input(sh, rng);
  const auto qg = gamma_for(zc, sh.D, rng), kg = gamma_for(zc, sh.D, rng);
  auto out = nans(qkv.size()), rstd = nans(sh.T * (sh.H + sh.G));
  qk_rmsnorm_forward(qkv.data(), qg.data(), kg.data(), out.data(), rstd.data(), sh.T, sh.H, sh.G, sh.D, kEps, zc);
  const auto want = qk_norm_twin(to_double(qkv), to_double(qg), to_double(kg), sh, zc);
  expect_close_per_slot(out, want.out, sh.D, kForwardTol, "out");
  // rstd: a double sum rounded once to fp32 (relative to each statistic's own value).
  for (size_t i = 0; i < want.rstd.size(); ++i)
    EXPECT_NEAR(rstd[i], want.rstd[i], 2e-7 * want.rstd[i]) << "rstd " << i;
  // v is copied bitwise.
  const int64_t Q = sh.H / sh.G;
  for (int64_t t = 0; t < sh.T; ++t)
    for (int64_t g = 0; g < sh.G; ++g)
      for (int64_t d = 0; d < sh.D; ++d) {
        const int64_t c = t * sh.row() + (g * (Q + 2) + Q + 1) * sh.D + d;
        EXPECT_EQ(out[c], qkv[c]) << "v of token " << t << " group " << g;
      }
}

TEST_P(QkNormTest, BackwardMatchesFiniteDifferences) {
  const auto [sh, zc] = GetParam();
  std::mt19937 rng(802);
  const auto qkv = qkv_input(sh, rng);
  const auto qg = gamma_for(zc, sh.D, rng), kg = gamma_for(zc, sh.D, rng);
  const auto r = randn(qkv.size(), rng);
  std::vector<float> out(qkv.size()), rstd(sh.T * (sh.H + sh.G));
  qk_rmsnorm_forward(qkv.data(), qg.data(), kg.data(), out.data(), rstd.data(), sh.T, sh.H, sh.G, sh.D, kEps, zc);

  auto dqkv = nans(qkv.size());  // overwritten everywhere (q, k and v slots)
  const auto dqg0 = randn(sh.D, rng), dkg0 = randn(sh.D, rng);  // accumulated into
  auto dqg = dqg0, dkg = dkg0;
  qk_rmsnorm_backward(r.data(), qkv.data(), qg.data(), kg.data(), rstd.data(), dqkv.data(), dqg.data(), dkg.data(),
                      sh.T, sh.H, sh.G, sh.D, zc);

  auto xd = to_double(qkv), qgd = to_double(qg), kgd = to_double(kg);
  const auto rd = to_double(r);
  auto loss = [&] { return project(rd, qk_norm_twin(xd, qgd, kgd, sh, zc).out); };
  expect_close_per_slot(dqkv, numeric_grad(loss, xd), sh.D, kGradTol, "dqkv");
  std::vector<float> gq(sh.D), gk(sh.D);
  for (int64_t d = 0; d < sh.D; ++d) {
    gq[d] = dqg[d] - dqg0[d];
    gk[d] = dkg[d] - dkg0[d];
  }
  // The increments carry the rounding of the accumulators (|dgamma0| ~ 1): 1 ulp of those.
  expect_close(gq, numeric_grad(loss, qgd), kGradTol, "dq_gamma");
  expect_close(gk, numeric_grad(loss, kgd), kGradTol, "dk_gamma");
}

TEST_P(QkNormTest, BackwardInPlaceEqualsOutOfPlace) {
  const auto [sh, zc] = GetParam();
  std::mt19937 rng(803);
  const auto qkv = qkv_input(sh, rng);
  const auto qg = gamma_for(zc, sh.D, rng), kg = gamma_for(zc, sh.D, rng);
  const auto r = randn(qkv.size(), rng);
  std::vector<float> out(qkv.size()), rstd(sh.T * (sh.H + sh.G));
  qk_rmsnorm_forward(qkv.data(), qg.data(), kg.data(), out.data(), rstd.data(), sh.T, sh.H, sh.G, sh.D, kEps, zc);
  auto dqkv = nans(qkv.size());
  std::vector<float> dqg(sh.D, 0.0f), dkg(sh.D, 0.0f), dqg2(sh.D, 0.0f), dkg2(sh.D, 0.0f);
  qk_rmsnorm_backward(r.data(), qkv.data(), qg.data(), kg.data(), rstd.data(), dqkv.data(), dqg.data(), dkg.data(),
                      sh.T, sh.H, sh.G, sh.D, zc);
  auto inplace = r;
  qk_rmsnorm_backward(inplace.data(), qkv.data(), qg.data(), kg.data(), rstd.data(), inplace.data(), dqg2.data(),
                      dkg2.data(), sh.T, sh.H, sh.G, sh.D, zc);
  EXPECT_EQ(inplace, dqkv);
  EXPECT_EQ(dqg2, dqg);
  EXPECT_EQ(dkg2, dkg);
}

// Statistics are per head: scaling one q head of one token leaves every other head's output
// bitwise as it was, and that head's output (nearly: eps) too.
TEST(QkNorm, EachHeadIsNormalisedOnItsOwn) {
  const Shape sh{3, 4, 2, 8};
  std::mt19937 rng(804);
  const auto qkv = randn(sh.T * sh.row(), rng);
  const auto qg = randn(sh.D, rng, 0.3f, 1.0f), kg = randn(sh.D, rng, 0.3f, 1.0f);
  std::vector<float> out(qkv.size()), rstd(sh.T * (sh.H + sh.G));
  qk_rmsnorm_forward(qkv.data(), qg.data(), kg.data(), out.data(), rstd.data(), sh.T, sh.H, sh.G, sh.D, kEps, false);
  auto scaled = qkv;
  const int64_t head = 1 * 4 * sh.D + 1 * sh.D;  // token 0, group 1, q slot 1 (query head 3)
  for (int64_t d = 0; d < sh.D; ++d) scaled[head + d] *= 8.0f;
  std::vector<float> out2(qkv.size()), rstd2(rstd.size());
  qk_rmsnorm_forward(scaled.data(), qg.data(), kg.data(), out2.data(), rstd2.data(), sh.T, sh.H, sh.G, sh.D, kEps,
                     false);
  for (size_t c = 0; c < out.size(); ++c) {
    if (static_cast<int64_t>(c) >= head && static_cast<int64_t>(c) < head + sh.D) {
      EXPECT_NEAR(out2[c], out[c], 2e-5 * std::abs(out[c]) + 1e-6) << c;
    } else {
      EXPECT_EQ(out2[c], out[c]) << c;
    }
  }
  EXPECT_NEAR(rstd2[3], rstd[3] / 8.0f, 2e-5 * rstd[3]);  // query head 3's statistic, token 0
}

// q heads use q_gamma and k uses k_gamma: with unit inputs of mean square 1, out = x * gamma.
TEST(QkNorm, QueryHeadsUseQGammaAndKeysUseKGamma) {
  const Shape sh{1, 2, 1, 4};  // one group: q0 q1 k v
  std::vector<float> qkv(sh.row(), 1.0f);
  const std::vector<float> qg{2.0f, 2.0f, 2.0f, 2.0f}, kg{3.0f, 3.0f, 3.0f, 3.0f};
  std::vector<float> out(qkv.size()), rstd(3);
  qk_rmsnorm_forward(qkv.data(), qg.data(), kg.data(), out.data(), rstd.data(), 1, 2, 1, 4, 0.0f, false);
  for (int64_t d = 0; d < 4; ++d) {
    EXPECT_EQ(out[d], 2.0f);
    EXPECT_EQ(out[4 + d], 2.0f);
    EXPECT_EQ(out[8 + d], 3.0f);
    EXPECT_EQ(out[12 + d], 1.0f);  // v
  }
}

TEST(QkNorm, HeadsMustBeAMultipleOfGroups) {
  std::vector<float> buf(256), g(4);
  EXPECT_THROW(qk_rmsnorm_forward(buf.data(), g.data(), g.data(), buf.data(), buf.data(), 1, 3, 2, 4, kEps),
               laoyao::Error);
  EXPECT_THROW(qk_rmsnorm_backward(buf.data(), buf.data(), g.data(), g.data(), buf.data(), buf.data(), g.data(),
                                   g.data(), 1, 3, 2, 4),
               laoyao::Error);
}

}  // namespace
}  // namespace laoyao::kernels::cpu::test
