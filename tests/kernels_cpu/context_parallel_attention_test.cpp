// A context-parallel rank's attention: its chunks' queries against the whole sequence's keys give
// the rows the whole sequence's attention gives them, and the ranks' gradients, their key and
// value parts summed, give the whole attention's gradient, for CP 2 and 4, MHA and GQA.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "kernels/cpu/ops.hpp"
#include "test_util.hpp"

namespace laoyao::kernels::cpu::test {
namespace {

struct CpCase {
  int64_t b, S, H, G, D, cp;
};

// Rank r's local token i of sequence position: chunks r and 2 cp - 1 - r of S / (2 cp) tokens.
int64_t place(int64_t i, int64_t r, const CpCase& k) {
  const int64_t c = k.S / (2 * k.cp);
  return (i < c ? r : 2 * k.cp - 1 - r) * c + i % c;
}

}  // namespace

TEST(ContextParallelAttention, EachRankGetsItsRowsOfTheWholeAttentionAndTheSumOfTheGradients) {
  for (const CpCase k : {CpCase{2, 8, 2, 2, 4, 2}, CpCase{1, 16, 4, 2, 3, 4}, CpCase{2, 12, 3, 1, 5, 3}}) {
    SCOPED_TRACE("S " + std::to_string(k.S) + " cp " + std::to_string(k.cp));
    std::mt19937 rng(static_cast<unsigned>(k.S * 31 + k.cp));
    const int64_t row = k.G * (k.H / k.G + 2) * k.D, s = k.S / k.cp;
    const float scale = 1.0f / std::sqrt(static_cast<float>(k.D));
    const auto qkv = randn(static_cast<size_t>(k.b * k.S * row), rng);
    const auto dctx = randn(static_cast<size_t>(k.b * k.S * k.H * k.D), rng);
    std::vector<float> ctx(static_cast<size_t>(k.b * k.S * k.H * k.D)), probs(static_cast<size_t>(k.b * k.H * k.S * k.S));
    std::vector<float> dqkv(qkv.size());
    attention_forward(qkv.data(), ctx.data(), probs.data(), k.b, k.S, k.H, k.G, k.D, scale);
    attention_backward(qkv.data(), probs.data(), dctx.data(), dqkv.data(), k.b, k.S, k.H, k.G, k.D, scale);

    std::vector<std::vector<float>> local_dqkv(static_cast<size_t>(k.cp));
    std::vector<double> summed_full(qkv.size(), 0.0);
    for (int64_t r = 0; r < k.cp; ++r) {
      std::vector<float> q_local, dctx_local;
      std::vector<int32_t> pos;
      for (int64_t bi = 0; bi < k.b; ++bi)
        for (int64_t i = 0; i < s; ++i) {
          const int64_t p = place(i, r, k), t = bi * k.S + p;
          q_local.insert(q_local.end(), qkv.begin() + t * row, qkv.begin() + (t + 1) * row);
          dctx_local.insert(dctx_local.end(), dctx.begin() + t * k.H * k.D, dctx.begin() + (t + 1) * k.H * k.D);
          pos.push_back(static_cast<int32_t>(p));
        }
      std::vector<float> c(static_cast<size_t>(k.b * s * k.H * k.D)), pr(static_cast<size_t>(k.b * k.H * s * k.S));
      context_parallel_attention_forward(q_local.data(), qkv.data(), c.data(), pr.data(), k.b, s, k.S, k.H, k.G, k.D,
                                         scale, pos.data());
      for (int64_t bi = 0; bi < k.b; ++bi)
        for (int64_t i = 0; i < s; ++i) {
          const int64_t t = bi * k.S + place(i, r, k), u = bi * s + i;
          for (int64_t e = 0; e < k.H * k.D; ++e)
            ASSERT_NEAR(c[static_cast<size_t>(u * k.H * k.D + e)], ctx[static_cast<size_t>(t * k.H * k.D + e)], 1e-5)
                << "rank " << r << " token " << u;
        }
      std::vector<float>& dl = local_dqkv[static_cast<size_t>(r)];
      dl = nans(q_local.size());  // every element overwritten
      std::vector<float> dfull = nans(qkv.size());
      context_parallel_attention_backward(q_local.data(), qkv.data(), pr.data(), dctx_local.data(), dl.data(),
                                          dfull.data(), k.b, s, k.S, k.H, k.G, k.D, scale, pos.data());
      for (size_t e = 0; e < dfull.size(); ++e) summed_full[e] += dfull[e];
    }
    // Each rank's rows: its query gradients plus the keys' and values' summed over the ranks.
    for (int64_t r = 0; r < k.cp; ++r)
      for (int64_t bi = 0; bi < k.b; ++bi)
        for (int64_t i = 0; i < s; ++i) {
          const int64_t t = bi * k.S + place(i, r, k), u = bi * s + i;
          for (int64_t e = 0; e < row; ++e) {
            const double got = local_dqkv[static_cast<size_t>(r)][static_cast<size_t>(u * row + e)] +
                               summed_full[static_cast<size_t>(t * row + e)];
            ASSERT_NEAR(got, dqkv[static_cast<size_t>(t * row + e)], 1e-5 + 1e-5 * std::abs(dqkv[static_cast<size_t>(t * row + e)]))
                << "rank " << r << " token " << u << " column " << e;
          }
        }
  }
}

// Multi-latent attention's form (separate q, k, v; q/k and v head dims differ): the same two facts.
TEST(ContextParallelAttention, SeparateQueryKeyValueRowsAndSummedGradientsAreTheWholeAttentions) {
  for (const CpCase k : {CpCase{2, 8, 2, 2, 5, 2}, CpCase{1, 16, 3, 3, 4, 4}}) {
    SCOPED_TRACE("S " + std::to_string(k.S) + " cp " + std::to_string(k.cp));
    std::mt19937 rng(static_cast<unsigned>(k.S * 17 + k.cp));
    const int64_t dqk = k.D, dv = k.D + 2, s = k.S / k.cp, T = k.b * k.S;
    const float scale = 0.7f / std::sqrt(static_cast<float>(dqk));
    const auto q = randn(static_cast<size_t>(T * k.H * dqk), rng), key = randn(q.size(), rng);
    const auto v = randn(static_cast<size_t>(T * k.H * dv), rng), dctx = randn(v.size(), rng);
    std::vector<float> ctx(v.size()), probs(static_cast<size_t>(k.b * k.H * k.S * k.S));
    std::vector<float> dq(q.size()), dk(q.size()), dvv(v.size());
    separate_attention_forward(q.data(), key.data(), v.data(), ctx.data(), probs.data(), k.b, k.S, k.H, dqk, dv, scale);
    separate_attention_backward(q.data(), key.data(), v.data(), probs.data(), dctx.data(), dq.data(), dk.data(),
                                dvv.data(), k.b, k.S, k.H, dqk, dv, scale);
    std::vector<double> dk_sum(dk.size(), 0.0), dv_sum(dvv.size(), 0.0);
    for (int64_t r = 0; r < k.cp; ++r) {
      std::vector<float> q_local, dctx_local;
      std::vector<int32_t> pos;
      for (int64_t bi = 0; bi < k.b; ++bi)
        for (int64_t i = 0; i < s; ++i) {
          const int64_t p = place(i, r, k), t = bi * k.S + p;
          q_local.insert(q_local.end(), q.begin() + t * k.H * dqk, q.begin() + (t + 1) * k.H * dqk);
          dctx_local.insert(dctx_local.end(), dctx.begin() + t * k.H * dv, dctx.begin() + (t + 1) * k.H * dv);
          pos.push_back(static_cast<int32_t>(p));
        }
      std::vector<float> c(static_cast<size_t>(k.b * s * k.H * dv)), pr(static_cast<size_t>(k.b * k.H * s * k.S));
      context_parallel_separate_attention_forward(q_local.data(), key.data(), v.data(), c.data(), pr.data(), k.b, s,
                                                  k.S, k.H, dqk, dv, scale, pos.data());
      std::vector<float> dq_local = nans(q_local.size()), dk_full = nans(dk.size()), dv_full = nans(dvv.size());
      context_parallel_separate_attention_backward(q_local.data(), key.data(), v.data(), pr.data(), dctx_local.data(),
                                                   dq_local.data(), dk_full.data(), dv_full.data(), k.b, s, k.S, k.H,
                                                   dqk, dv, scale, pos.data());
      for (int64_t bi = 0; bi < k.b; ++bi)
        for (int64_t i = 0; i < s; ++i) {
          const int64_t t = bi * k.S + place(i, r, k), u = bi * s + i;
          for (int64_t e = 0; e < k.H * dv; ++e)
            ASSERT_NEAR(c[static_cast<size_t>(u * k.H * dv + e)], ctx[static_cast<size_t>(t * k.H * dv + e)], 1e-5)
                << "rank " << r << " token " << u;
          for (int64_t e = 0; e < k.H * dqk; ++e)
            ASSERT_NEAR(dq_local[static_cast<size_t>(u * k.H * dqk + e)], dq[static_cast<size_t>(t * k.H * dqk + e)],
                        1e-5 + 1e-5 * std::abs(dq[static_cast<size_t>(t * k.H * dqk + e)]))
                << "dq, rank " << r << " token " << u;
        }
      for (size_t e = 0; e < dk_sum.size(); ++e) dk_sum[e] += dk_full[e];
      for (size_t e = 0; e < dv_sum.size(); ++e) dv_sum[e] += dv_full[e];
    }
    for (size_t e = 0; e < dk_sum.size(); ++e) ASSERT_NEAR(dk_sum[e], dk[e], 1e-5 + 1e-5 * std::abs(dk[e])) << "dk " << e;
    for (size_t e = 0; e < dv_sum.size(); ++e) ASSERT_NEAR(dv_sum[e], dvv[e], 1e-5 + 1e-5 * std::abs(dvv[e])) << "dv " << e;
  }
}

}  // namespace laoyao::kernels::cpu::test
