// Causal self-attention on Megatron-Core's fused QKV layout, against an fp64 twin written the way
// Megatron computes it (split the fused row per group, repeat_interleave k/v for GQA, masked_fill
// -10000, softmax over all keys), finite differences, and layout/mask/GQA probes.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.hpp"
#include "kernels/cpu/ops.hpp"
#include "test_util.hpp"

namespace laoyao::kernels::cpu::test {
namespace {

struct Shape {
  int64_t b, s, H, G, D;
  int64_t row() const { return G * (H / G + 2) * D; }
  int64_t T() const { return b * s; }
  float scale() const { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(D))); }
};

struct TwinOut {
  std::vector<double> ctx, probs;
};

// fp64 twin. Per token: view the fused row as [G, (H/G + 2) * D] and split each group into
// [H/G * D | D | D] = (q heads, k, v); query heads are numbered group-major (g * H/G + i);
// k/v are repeated H/G times (repeat_interleave) so head h sees group h / (H/G).
// With `mask` (0 or 1/(1-p) per probability), ctx uses the dropped-out probabilities (torch's
// dropout on attention_probs); probs stays the softmax. With `eods` (per sequence, the positions of
// its EOD tokens), the mask is built as Megatron's _get_ltor_masks_and_position_ids builds it for
// --reset-attention-mask: for each EOD at e, queries after e do not see keys up to e.
TwinOut attention_twin(const std::vector<double>& qkv, const Shape& sh, const std::vector<double>* mask = nullptr,
                       const std::vector<std::vector<int64_t>>* eods = nullptr) {
  const int64_t Q = sh.H / sh.G, D = sh.D, s = sh.s, W = sh.row();
  auto at = [&](int64_t bi, int64_t pos, int64_t col) { return qkv[(bi * s + pos) * W + col]; };
  // q[bi][h][pos][d], k/v repeated per query head
  auto q = [&](int64_t bi, int64_t h, int64_t pos, int64_t d) {
    const int64_t g = h / Q, i = h % Q;
    return at(bi, pos, g * (Q + 2) * D + i * D + d);
  };
  std::vector<double> krep(sh.b * sh.H * s * D), vrep(sh.b * sh.H * s * D);
  for (int64_t bi = 0; bi < sh.b; ++bi)
    for (int64_t g = 0; g < sh.G; ++g)
      for (int64_t rep = 0; rep < Q; ++rep)  // repeat_interleave: heads g*Q .. g*Q+Q-1
        for (int64_t pos = 0; pos < s; ++pos)
          for (int64_t d = 0; d < D; ++d) {
            const int64_t h = g * Q + rep;
            krep[((bi * sh.H + h) * s + pos) * D + d] = at(bi, pos, g * (Q + 2) * D + Q * D + d);
            vrep[((bi * sh.H + h) * s + pos) * D + d] = at(bi, pos, g * (Q + 2) * D + (Q + 1) * D + d);
          }
  TwinOut out{std::vector<double>(sh.T() * sh.H * D), std::vector<double>(sh.b * sh.H * s * s)};
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  for (int64_t bi = 0; bi < sh.b; ++bi) {
    std::vector<char> keep(s * s);  // tril(ones), then mask[e+1:, :e+1] = 0 per EOD
    for (int64_t i = 0; i < s; ++i)
      for (int64_t j = 0; j <= i; ++j) keep[i * s + j] = 1;
    if (eods)
      for (int64_t e : (*eods)[bi])
        for (int64_t i = e + 1; i < s; ++i)
          for (int64_t j = 0; j <= e; ++j) keep[i * s + j] = 0;
    for (int64_t h = 0; h < sh.H; ++h) {
      double* P = out.probs.data() + (bi * sh.H + h) * s * s;
      for (int64_t i = 0; i < s; ++i) {
        double m = -1e300;
        for (int64_t j = 0; j < s; ++j) {
          double sc = 0.0;
          for (int64_t d = 0; d < D; ++d) sc += q(bi, h, i, d) * krep[((bi * sh.H + h) * s + j) * D + d];
          sc *= scale;
          if (!keep[i * s + j]) sc = -10000.0;  // masked_fill_(mask, -10000.0)
          P[i * s + j] = sc;
          m = std::max(m, sc);
        }
        double sum = 0.0;
        for (int64_t j = 0; j < s; ++j) sum += (P[i * s + j] = std::exp(P[i * s + j] - m));
        for (int64_t j = 0; j < s; ++j) P[i * s + j] /= sum;
        for (int64_t d = 0; d < D; ++d) {
          double c = 0.0;
          for (int64_t j = 0; j < s; ++j) {
            const double keep = mask ? (*mask)[((bi * sh.H + h) * s + i) * s + j] : 1.0;
            c += P[i * s + j] * keep * vrep[((bi * sh.H + h) * s + j) * D + d];
          }
          out.ctx[(bi * s + i) * sh.H * D + h * D + d] = c;  // [s, b, H*D] heads concatenated
        }
      }
    }
  }
  return out;
}

std::string name_of(const Shape& sh) {
  return "b" + std::to_string(sh.b) + "s" + std::to_string(sh.s) + "H" + std::to_string(sh.H) + "G" +
         std::to_string(sh.G) + "D" + std::to_string(sh.D);
}

void PrintTo(const Shape& sh, std::ostream* os) { *os << name_of(sh); }

class AttentionTest : public ::testing::TestWithParam<Shape> {};
INSTANTIATE_TEST_SUITE_P(Shapes, AttentionTest,
                         ::testing::Values(Shape{2, 5, 6, 2, 4},   // GQA, 3 heads per group
                                           Shape{2, 5, 4, 1, 3},   // MQA-like: one group
                                           Shape{1, 7, 3, 3, 5},   // MHA, odd head count
                                           Shape{3, 1, 2, 2, 2}),  // s = 1: a single key
                         [](const auto& info) { return name_of(info.param); });

TEST_P(AttentionTest, ForwardMatchesFp64Twin) {
  const Shape sh = GetParam();
  std::mt19937 rng(401);
  auto qkv = randn(sh.T() * sh.row(), rng);
  auto ctx = nans(sh.T() * sh.H * sh.D), probs = nans(sh.b * sh.H * sh.s * sh.s);
  attention_forward(qkv.data(), ctx.data(), probs.data(), sh.b, sh.s, sh.H, sh.G, sh.D, sh.scale());
  const auto want = attention_twin(to_double(qkv), sh);
  expect_close(ctx, want.ctx, kForwardTol, "ctx");
  expect_close(probs, want.probs, kForwardTol, "probs");
}

TEST_P(AttentionTest, BackwardMatchesFiniteDifferences) {
  const Shape sh = GetParam();
  std::mt19937 rng(402);
  auto qkv = randn(sh.T() * sh.row(), rng);
  const auto r = randn(sh.T() * sh.H * sh.D, rng);
  std::vector<float> ctx(sh.T() * sh.H * sh.D), probs(sh.b * sh.H * sh.s * sh.s);
  attention_forward(qkv.data(), ctx.data(), probs.data(), sh.b, sh.s, sh.H, sh.G, sh.D, sh.scale());
  auto dqkv = nans(qkv.size());  // overwritten everywhere (q, k and v slots)
  attention_backward(qkv.data(), probs.data(), r.data(), dqkv.data(), sh.b, sh.s, sh.H, sh.G, sh.D, sh.scale());
  auto qd = to_double(qkv);
  const auto rd = to_double(r);
  expect_close(dqkv, numeric_grad([&] { return project(rd, attention_twin(qd, sh).ctx); }, qd), kGradTol, "dqkv");

  const auto d1 = dqkv;
  attention_backward(qkv.data(), probs.data(), r.data(), dqkv.data(), sh.b, sh.s, sh.H, sh.G, sh.D, sh.scale());
  EXPECT_EQ(dqkv, d1);  // overwritten, not accumulated
}

TEST_P(AttentionTest, DropoutOnTheProbabilitiesMatchesTwinAndFiniteDifferences) {
  const Shape sh = GetParam();
  std::mt19937 rng(405);
  auto qkv = randn(sh.T() * sh.row(), rng);
  const auto r = randn(sh.T() * sh.H * sh.D, rng);
  std::vector<float> mask(sh.b * sh.H * sh.s * sh.s);
  std::bernoulli_distribution keep(0.7);
  for (auto& m : mask) m = keep(rng) ? static_cast<float>(1.0 / 0.7) : 0.0f;
  const auto maskd = to_double(mask);
  std::vector<float> ctx(sh.T() * sh.H * sh.D), probs(sh.b * sh.H * sh.s * sh.s);
  attention_forward(qkv.data(), ctx.data(), probs.data(), sh.b, sh.s, sh.H, sh.G, sh.D, sh.scale(), mask.data());
  auto qd = to_double(qkv);
  const auto want = attention_twin(qd, sh, &maskd);
  expect_close(ctx, want.ctx, kForwardTol, "ctx with dropout");
  expect_close(probs, want.probs, kForwardTol, "probs are saved before dropout");
  auto dqkv = nans(qkv.size());
  attention_backward(qkv.data(), probs.data(), r.data(), dqkv.data(), sh.b, sh.s, sh.H, sh.G, sh.D, sh.scale(),
                     mask.data());
  const auto rd = to_double(r);
  expect_close(dqkv, numeric_grad([&] { return project(rd, attention_twin(qd, sh, &maskd).ctx); }, qd), kGradTol,
               "dqkv with dropout");
}

// Random EOD positions per sequence, and each query's first key: just after the last EOD before it.
struct Documents {
  std::vector<std::vector<int64_t>> eods;
  std::vector<int32_t> key_start;
};
Documents random_documents(const Shape& sh, std::mt19937& rng) {
  Documents docs{std::vector<std::vector<int64_t>>(sh.b), std::vector<int32_t>(sh.T())};
  std::bernoulli_distribution eod(0.35);
  for (int64_t bi = 0; bi < sh.b; ++bi) {
    int32_t start = 0;
    for (int64_t i = 0; i < sh.s; ++i) {
      docs.key_start[bi * sh.s + i] = start;
      if (eod(rng)) docs.eods[bi].push_back(i), start = static_cast<int32_t>(i + 1);
    }
  }
  return docs;
}

TEST_P(AttentionTest, DocumentMasksMatchMegatronsResetAttentionMask) {
  const Shape sh = GetParam();
  std::mt19937 rng(406);
  auto qkv = randn(sh.T() * sh.row(), rng);
  const auto r = randn(sh.T() * sh.H * sh.D, rng);
  const Documents docs = random_documents(sh, rng);
  std::vector<float> mask(sh.b * sh.H * sh.s * sh.s);
  std::bernoulli_distribution keep(0.8);
  for (auto& m : mask) m = keep(rng) ? static_cast<float>(1.0 / 0.8) : 0.0f;
  const auto maskd = to_double(mask);
  auto qd = to_double(qkv);
  const auto rd = to_double(r);
  const std::vector<float>* drops[] = {nullptr, &mask};  // without and with attention dropout
  for (const std::vector<float>* drop : drops) {
    const std::vector<double>* dropd = drop ? &maskd : nullptr;
    const float* dm = drop ? drop->data() : nullptr;
    auto ctx = nans(sh.T() * sh.H * sh.D), probs = nans(sh.b * sh.H * sh.s * sh.s);
    attention_forward(qkv.data(), ctx.data(), probs.data(), sh.b, sh.s, sh.H, sh.G, sh.D, sh.scale(), dm,
                      docs.key_start.data());
    const auto want = attention_twin(qd, sh, dropd, &docs.eods);
    expect_close(ctx, want.ctx, kForwardTol, "ctx with document masks");
    expect_close(probs, want.probs, kForwardTol, "probs with document masks");
    for (int64_t bh = 0; bh < sh.b * sh.H; ++bh)  // another document's keys: exactly zero
      for (int64_t i = 0; i < sh.s; ++i)
        for (int64_t j = 0; j < docs.key_start[(bh / sh.H) * sh.s + i]; ++j)
          EXPECT_EQ(probs[(bh * sh.s + i) * sh.s + j], 0.0f) << "query " << i << " key " << j;
    auto dqkv = nans(qkv.size());
    attention_backward(qkv.data(), probs.data(), r.data(), dqkv.data(), sh.b, sh.s, sh.H, sh.G, sh.D, sh.scale(), dm,
                       docs.key_start.data());
    expect_close(dqkv, numeric_grad([&] { return project(rd, attention_twin(qd, sh, dropd, &docs.eods).ctx); }, qd),
                 kGradTol, "dqkv with document masks");
  }
}

TEST(Attention, DocumentsChangeTheResultOnlyWhereAQueryFollowsAnEod) {
  const Shape sh{1, 6, 2, 2, 4};
  std::mt19937 rng(407);
  auto qkv = randn(sh.T() * sh.row(), rng);
  const std::vector<int32_t> key_start{0, 0, 0, 3, 3, 3};  // an EOD at position 2
  std::vector<float> ctx(sh.T() * sh.H * sh.D), ctx_docs(ctx.size()), probs(sh.b * sh.H * sh.s * sh.s);
  attention_forward(qkv.data(), ctx.data(), probs.data(), sh.b, sh.s, sh.H, sh.G, sh.D, sh.scale());
  attention_forward(qkv.data(), ctx_docs.data(), probs.data(), sh.b, sh.s, sh.H, sh.G, sh.D, sh.scale(), nullptr,
                    key_start.data());
  const int64_t W = sh.H * sh.D;
  for (int64_t t = 0; t < sh.s; ++t)
    for (int64_t c = 0; c < W; ++c) {
      if (t <= 2) {
        EXPECT_EQ(ctx_docs[t * W + c], ctx[t * W + c]) << "token " << t;
      } else {
        EXPECT_NE(ctx_docs[t * W + c], ctx[t * W + c]) << "token " << t;
      }
    }
  // Position 3 starts a document: it sees only itself.
  const int64_t Q = sh.H / sh.G;
  for (int64_t h = 0; h < sh.H; ++h)
    for (int64_t d = 0; d < sh.D; ++d)
      EXPECT_EQ(ctx_docs[3 * W + h * sh.D + d], qkv[3 * sh.row() + (h / Q) * (Q + 2) * sh.D + (Q + 1) * sh.D + d]);
}

TEST(Attention, KeyStartAfterTheQueryIsRefused) {
  const Shape sh{1, 3, 1, 1, 2};
  std::vector<float> qkv(sh.T() * sh.row(), 0.5f), ctx(sh.T() * sh.D), probs(sh.s * sh.s);
  const std::vector<int32_t> bad{0, 2, 2};  // query 1 cannot start at key 2
  EXPECT_THROW(attention_forward(qkv.data(), ctx.data(), probs.data(), sh.b, sh.s, sh.H, sh.G, sh.D, sh.scale(),
                                 nullptr, bad.data()),
               laoyao::Error);
}

TEST_P(AttentionTest, FutureKeysGetExactlyZeroProbability) {
  const Shape sh = GetParam();
  std::mt19937 rng(403);
  auto qkv = randn(sh.T() * sh.row(), rng, 2.0f);  // larger scores: a stricter test of the mask
  std::vector<float> ctx(sh.T() * sh.H * sh.D), probs(sh.b * sh.H * sh.s * sh.s);
  attention_forward(qkv.data(), ctx.data(), probs.data(), sh.b, sh.s, sh.H, sh.G, sh.D, sh.scale());
  for (int64_t bh = 0; bh < sh.b * sh.H; ++bh)
    for (int64_t i = 0; i < sh.s; ++i) {
      double sum = 0.0;
      for (int64_t j = 0; j < sh.s; ++j) {
        const float p = probs[(bh * sh.s + i) * sh.s + j];
        if (j > i) {
          EXPECT_EQ(p, 0.0f) << "query " << i << " key " << j;
        } else {
          EXPECT_GT(p, 0.0f);
        }
        sum += p;
      }
      EXPECT_NEAR(sum, 1.0, 1e-6) << "row " << i;
    }
  // ...and the first position's context is exactly its own value vector (probability 1 on itself).
  const int64_t Q = sh.H / sh.G;
  for (int64_t h = 0; h < sh.H; ++h)
    for (int64_t d = 0; d < sh.D; ++d)
      EXPECT_EQ(ctx[h * sh.D + d], qkv[(h / Q) * (Q + 2) * sh.D + (Q + 1) * sh.D + d]) << "head " << h;
}

// Only head 1's v block (columns [q1 k1 | v1]) is non-zero in an MHA layout q0 k0 v0 q1 k1 v1 q2 k2 v2:
// only ctx columns [D, 2D) may be non-zero.
TEST(Attention, MhaLayoutRoutesEachHeadsValueToItsContextColumns) {
  const Shape sh{2, 4, 3, 3, 2};
  std::mt19937 rng(404);
  auto qkv = randn(sh.T() * sh.row(), rng);
  const int64_t D = sh.D;
  for (int64_t t = 0; t < sh.T(); ++t)
    for (int64_t h = 0; h < sh.H; ++h)
      for (int64_t d = 0; d < D; ++d)
        if (h != 1) qkv[t * sh.row() + h * 3 * D + 2 * D + d] = 0.0f;  // v_h sits at h*3D + 2D
  std::vector<float> ctx(sh.T() * sh.H * D), probs(sh.b * sh.H * sh.s * sh.s);
  attention_forward(qkv.data(), ctx.data(), probs.data(), sh.b, sh.s, sh.H, sh.G, D, sh.scale());
  for (int64_t t = 0; t < sh.T(); ++t)
    for (int64_t c = 0; c < sh.H * D; ++c) {
      if (c >= D && c < 2 * D) {
        EXPECT_NE(ctx[t * sh.H * D + c], 0.0f) << "token " << t << " column " << c;
      } else {
        EXPECT_EQ(ctx[t * sh.H * D + c], 0.0f) << "token " << t << " column " << c;
      }
    }
}

// GQA H = 6, G = 2: query heads 0-2 read group 0's k/v, heads 3-5 group 1's.
TEST(Attention, GqaQueryHeadsReadTheirGroupsKeysAndValues) {
  const Shape sh{2, 5, 6, 2, 3};
  const int64_t D = sh.D, W = sh.row();  // per group: q (3 heads x D), k (D), v (D) = 5D
  std::mt19937 rng(405);
  auto qkv = randn(sh.T() * W, rng);
  std::vector<float> ctx(sh.T() * sh.H * D), probs(sh.b * sh.H * sh.s * sh.s);
  attention_forward(qkv.data(), ctx.data(), probs.data(), sh.b, sh.s, sh.H, sh.G, D, sh.scale());

  // Values: zero group 0's v -> heads 0-2's context vanishes exactly; heads 3-5 are unchanged.
  auto vzero = qkv;
  for (int64_t t = 0; t < sh.T(); ++t)
    for (int64_t d = 0; d < D; ++d) vzero[t * W + 4 * D + d] = 0.0f;
  std::vector<float> ctx_v(ctx.size()), probs_v(probs.size());
  attention_forward(vzero.data(), ctx_v.data(), probs_v.data(), sh.b, sh.s, sh.H, sh.G, D, sh.scale());
  for (int64_t t = 0; t < sh.T(); ++t)
    for (int64_t h = 0; h < sh.H; ++h)
      for (int64_t d = 0; d < D; ++d) {
        const int64_t c = t * sh.H * D + h * D + d;
        if (h < 3) {
          EXPECT_EQ(ctx_v[c], 0.0f) << "head " << h;
        } else {
          EXPECT_EQ(ctx_v[c], ctx[c]) << "head " << h;
        }
      }

  // Keys: redraw group 1's k (columns 5D + 3D .. 5D + 4D) -> only heads 3-5's probabilities move.
  // (Fresh values per token: a shift common to all keys would cancel in the softmax.)
  auto kmoved = qkv;
  for (int64_t t = 0; t < sh.T(); ++t)
    for (int64_t d = 0; d < D; ++d) kmoved[t * W + 5 * D + 3 * D + d] = randn(1, rng)[0];
  std::vector<float> ctx_k(ctx.size()), probs_k(probs.size());
  attention_forward(kmoved.data(), ctx_k.data(), probs_k.data(), sh.b, sh.s, sh.H, sh.G, D, sh.scale());
  for (int64_t bi = 0; bi < sh.b; ++bi)
    for (int64_t h = 0; h < sh.H; ++h) {
      double moved = 0.0;
      for (int64_t e = 0; e < sh.s * sh.s; ++e) {
        const int64_t k = (bi * sh.H + h) * sh.s * sh.s + e;
        moved += std::abs(probs_k[k] - probs[k]);
      }
      if (h < 3) {
        EXPECT_EQ(moved, 0.0) << "head " << h;
      } else {
        EXPECT_GT(moved, 1e-3) << "head " << h;
      }
    }

  // Gradients: dk/dv of a group are the sum over its 3 query heads; a dctx that is non-zero only
  // for head 4 gives gradient only in group 1's q4-slot, k and v.
  std::vector<float> dctx(ctx.size(), 0.0f);
  for (int64_t t = 0; t < sh.T(); ++t)
    for (int64_t d = 0; d < D; ++d) dctx[t * sh.H * D + 4 * D + d] = 1.0f + 0.1f * static_cast<float>(d + t);
  auto dqkv = nans(qkv.size());
  attention_backward(qkv.data(), probs.data(), dctx.data(), dqkv.data(), sh.b, sh.s, sh.H, sh.G, D, sh.scale());
  for (int64_t t = 0; t < sh.T(); ++t)
    for (int64_t c = 0; c < W; ++c) {
      // group 1 = columns [5D, 10D): q3 q4 q5 k v; head 4 is q slot 1 -> [6D, 7D)
      const bool live = (c >= 6 * D && c < 7 * D) || c >= 8 * D;
      if (!live) {
        EXPECT_EQ(dqkv[t * W + c], 0.0f) << "token " << t << " column " << c;
      }
    }
  double live_norm = 0.0;
  for (int64_t t = 0; t < sh.T(); ++t)
    for (int64_t c = 9 * D; c < 10 * D; ++c) live_norm += std::abs(dqkv[t * W + c]);
  EXPECT_GT(live_norm, 1e-3);  // group 1's dv really received head 4's gradient
}

TEST(Attention, HeadsMustBeAMultipleOfGroups) {
  std::vector<float> qkv(64), ctx(64), probs(64);
  EXPECT_THROW(attention_forward(qkv.data(), ctx.data(), probs.data(), 1, 2, 4, 3, 2, 0.5f), laoyao::Error);
}

}  // namespace
}  // namespace laoyao::kernels::cpu::test
