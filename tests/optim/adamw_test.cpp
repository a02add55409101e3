#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <random>

#include "optim/adamw.hpp"

using namespace laoyao::optim;

// A naive fp64 AdamW (torch.optim.AdamW's formula) to check ours against.
struct RefAdamW {
  std::vector<double> m, v;
  int t = 0;
  void step(std::vector<double>& p, const std::vector<double>& g, double lr, double wd, const std::vector<double>& mult,
            double b1, double b2, double eps) {
    if (m.empty()) m.assign(p.size(), 0), v.assign(p.size(), 0);
    ++t;
    for (size_t i = 0; i < p.size(); ++i) {
      p[i] *= 1 - lr * wd * mult[i];
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      double mhat = m[i] / (1 - std::pow(b1, t)), vhat = v[i] / (1 - std::pow(b2, t));
      p[i] -= lr * mhat / (std::sqrt(vhat) + eps);
    }
  }
};

TEST(AdamW, MatchesANaiveFp64ReferenceOverSteps) {
  std::mt19937 gen(3);
  std::normal_distribution<double> N(0, 1);
  const int n = 37;
  std::vector<float> p(n), g(n);
  std::vector<double> pr(n), mult(n);
  for (int i = 0; i < n; ++i) pr[i] = p[i] = static_cast<float>(N(gen)), mult[i] = i < 20 ? 1.0 : 0.0;
  AdamW opt(n, {{0, 20, 1.0}, {20, 17, 0.0}}, {0.9, 0.95, 1e-8});
  RefAdamW ref;
  for (int step = 0; step < 5; ++step) {
    std::vector<double> gr(n);
    for (int i = 0; i < n; ++i) gr[i] = g[i] = static_cast<float>(N(gen) * 0.1);
    double lr = 1e-2 * (step + 1);
    opt.step(p.data(), g.data(), lr, 0.1);
    ref.step(pr, gr, lr, 0.1, mult, 0.9, 0.95, 1e-8);
    for (int i = 0; i < n; ++i) ASSERT_NEAR(p[i], pr[i], 2e-6 * (1 + std::abs(pr[i]))) << "step " << step << " i " << i;
  }
  EXPECT_EQ(opt.steps(), 5);
}

// --decoupled-lr: the embedding_or_output ranges take their own rate (learning rate and the decay
// it scales), against the fp64 reference stepping each range with its rate; without it, every
// range the common one.
TEST(AdamW, EmbeddingAndOutputRangesTakeTheDecoupledRate) {
  std::mt19937 gen(5);
  std::normal_distribution<double> N(0, 1);
  const int n = 23;
  for (const bool decoupled : {true, false}) {
    SCOPED_TRACE(decoupled ? "decoupled" : "one rate");
    std::vector<float> p(n), g(n);
    std::vector<double> pa(8), pb(n - 8), ones_a(8, 1.0), ones_b(n - 8, 1.0);
    for (int i = 0; i < n; ++i) {
      p[i] = static_cast<float>(N(gen));
      (i < 8 ? pa[i] : pb[i - 8]) = p[i];
    }
    AdamW opt(n, {{0, 8, 1.0, true}, {8, n - 8, 1.0, false}}, {0.9, 0.95, 1e-8});
    RefAdamW ref_a, ref_b;
    for (int step = 0; step < 3; ++step) {
      std::vector<double> ga(8), gb(n - 8);
      for (int i = 0; i < n; ++i) (i < 8 ? ga[i] : gb[i - 8]) = g[i] = static_cast<float>(N(gen) * 0.1);
      const double lr = 1e-2, dlr = 5e-2;
      opt.step(p.data(), g.data(), lr, 0.1, decoupled ? std::optional<double>(dlr) : std::nullopt);
      ref_a.step(pa, ga, decoupled ? dlr : lr, 0.1, ones_a, 0.9, 0.95, 1e-8);
      ref_b.step(pb, gb, lr, 0.1, ones_b, 0.9, 0.95, 1e-8);
      for (int i = 0; i < n; ++i) {
        const double want = i < 8 ? pa[i] : pb[i - 8];
        ASSERT_NEAR(p[i], want, 2e-6 * (1 + std::abs(want))) << "step " << step << " i " << i;
      }
    }
  }
}

TEST(AdamW, FirstStepMovesEachWeightByAboutLr) {
  std::vector<float> p = {1.0f, -1.0f}, g = {0.5f, -2.0f};
  AdamW opt(2, {{0, 2, 0.0}}, {});
  opt.step(p.data(), g.data(), 0.1, 0.0);
  // m-hat = g, v-hat = g^2 => update = lr * sign(g) (eps aside).
  EXPECT_NEAR(p[0], 0.9f, 1e-6);
  EXPECT_NEAR(p[1], -0.9f, 1e-6);
}

TEST(AdamW, RangesMustTileTheBuffer) {
  EXPECT_THROW(AdamW(10, {{0, 5, 1.0}}, {}), std::exception);
  EXPECT_THROW(AdamW(10, {{0, 5, 1.0}, {6, 4, 0.0}}, {}), std::exception);
}

TEST(GradClip, NormAndMegatronsClipRule) {
  std::vector<float> g = {3.0f, 4.0f};
  double norm = grad_norm(g.data(), 2);
  EXPECT_DOUBLE_EQ(norm, 5.0);
  EXPECT_DOUBLE_EQ(clip_grads(g.data(), 2, norm, 10.0), 1.0) << "no clip when the norm is below the max";
  EXPECT_EQ(g[0], 3.0f);
  double c = clip_grads(g.data(), 2, norm, 1.0);
  EXPECT_NEAR(c, 1.0 / (5.0 + 1e-6), 1e-15);
  EXPECT_NEAR(grad_norm(g.data(), 2), 1.0, 1e-6);
}
