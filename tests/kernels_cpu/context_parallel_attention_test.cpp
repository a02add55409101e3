// A context-parallel rank's attention: its chunks' queries against the whole sequence's keys give
// the rows the whole sequence's attention gives them, and the ranks' gradients, their key and
// value parts summed, give the whole attention's gradient, for CP 2, 3 and 4, MHA and GQA, over
// Megatron's two chunks of the sequence and over packed documents split each alike.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/error.hpp"
#include "kernels/cpu/ops.hpp"
#include "test_util.hpp"

namespace laoyao::kernels::cpu::test {
namespace {

struct CpCase {
  int64_t b, S, H, G, D, cp;
};

// places[r][bi * s + i]: the place in sequence bi of rank r's local token i (s = S / cp).
using Places = std::vector<std::vector<int64_t>>;

// Megatron's split of the whole sequence: rank r holds chunks r and 2 cp - 1 - r of S / (2 cp).
Places two_chunks(const CpCase& k) {
  const int64_t c = k.S / (2 * k.cp);
  Places p(static_cast<size_t>(k.cp));
  for (int64_t r = 0; r < k.cp; ++r)
    for (int64_t bi = 0; bi < k.b; ++bi)
      for (int64_t i = 0; i < 2 * c; ++i) p[static_cast<size_t>(r)].push_back((i < c ? r : 2 * k.cp - 1 - r) * c + i % c);
  return p;
}

// Packed sequences (THD): each document (starting at `starts`, lengths multiples of 2 cp) split
// alike, rank r holding chunks r and 2 cp - 1 - r of every document, in document order.
Places per_document(const CpCase& k, const std::vector<int64_t>& starts) {
  Places p(static_cast<size_t>(k.cp));
  for (int64_t r = 0; r < k.cp; ++r)
    for (int64_t bi = 0; bi < k.b; ++bi)
      for (size_t d = 0; d < starts.size(); ++d) {
        const int64_t end = d + 1 < starts.size() ? starts[d + 1] : k.S, c = (end - starts[d]) / (2 * k.cp);
        for (const int64_t chunk : {r, 2 * k.cp - 1 - r})
          for (int64_t i = 0; i < c; ++i) p[static_cast<size_t>(r)].push_back(starts[d] + chunk * c + i);
      }
  return p;
}

// Each token's first key: its document's start ([b * S]).
std::vector<int32_t> document_key_start(const CpCase& k, const std::vector<int64_t>& starts) {
  std::vector<int32_t> ks;
  for (int64_t bi = 0; bi < k.b; ++bi)
    for (int64_t t = 0; t < k.S; ++t) {
      int64_t first = 0;
      for (const int64_t st : starts) if (st <= t) first = st;
      ks.push_back(static_cast<int32_t>(first));
    }
  return ks;
}

// The splits each test runs: Megatron's two chunks (plain causal attention), and packed documents.
struct Split {
  Places places;
  std::vector<int32_t> key_start;  // whole [b * S] (empty: none)
  const char* name;
};
std::vector<Split> splits(const CpCase& k) {
  const int64_t unit = 2 * k.cp, n = k.S / unit;  // documents of 1, n - 2 and 1 units (at least one unit each)
  const std::vector<int64_t> starts = {0, unit, (n - 1) * unit};
  return {{two_chunks(k), {}, "two chunks"}, {per_document(k, starts), document_key_start(k, starts), "documents"}};
}

// A rank's inputs, gathered from the whole sequences' at its places: its query rows (q_row wide),
// their output gradients (ctx_row wide), each query's place and (with documents) first key.
struct RankRows {
  std::vector<float> q, dctx;
  std::vector<int32_t> pos, key_start;
  const int32_t* key_start_or_null() const { return key_start.empty() ? nullptr : key_start.data(); }
};
RankRows rank_rows(const std::vector<int64_t>& P, const CpCase& k, const std::vector<float>& q, int64_t q_row,
                   const std::vector<float>& dctx, int64_t ctx_row, const std::vector<int32_t>& key_start) {
  RankRows out;
  const int64_t s = k.S / k.cp;
  for (int64_t bi = 0; bi < k.b; ++bi)
    for (int64_t i = 0; i < s; ++i) {
      const int64_t p = P[static_cast<size_t>(bi * s + i)], t = bi * k.S + p;
      out.q.insert(out.q.end(), q.begin() + t * q_row, q.begin() + (t + 1) * q_row);
      out.dctx.insert(out.dctx.end(), dctx.begin() + t * ctx_row, dctx.begin() + (t + 1) * ctx_row);
      out.pos.push_back(static_cast<int32_t>(p));
      if (!key_start.empty()) out.key_start.push_back(key_start[static_cast<size_t>(t)]);
    }
  return out;
}

}  // namespace

TEST(ContextParallelAttention, EachRankGetsItsRowsOfTheWholeAttentionAndTheSumOfTheGradients) {
  for (const CpCase k : {CpCase{2, 24, 2, 2, 4, 2}, CpCase{1, 32, 4, 2, 3, 4}, CpCase{2, 18, 3, 1, 5, 3}})
    for (const Split& split : splits(k)) {
      SCOPED_TRACE("S " + std::to_string(k.S) + " cp " + std::to_string(k.cp) + ", " + split.name);
      std::mt19937 rng(static_cast<unsigned>(k.S * 31 + k.cp));
      const int64_t row = k.G * (k.H / k.G + 2) * k.D, s = k.S / k.cp;
      const float scale = 1.0f / std::sqrt(static_cast<float>(k.D));
      const int32_t* ks = split.key_start.empty() ? nullptr : split.key_start.data();
      const auto qkv = randn(static_cast<size_t>(k.b * k.S * row), rng);
      const auto dctx = randn(static_cast<size_t>(k.b * k.S * k.H * k.D), rng);
      std::vector<float> ctx(static_cast<size_t>(k.b * k.S * k.H * k.D)), probs(static_cast<size_t>(k.b * k.H * k.S * k.S));
      std::vector<float> dqkv(qkv.size());
      attention_forward(qkv.data(), ctx.data(), probs.data(), k.b, k.S, k.H, k.G, k.D, scale, nullptr, ks);
      attention_backward(qkv.data(), probs.data(), dctx.data(), dqkv.data(), k.b, k.S, k.H, k.G, k.D, scale, nullptr, ks);

      std::vector<std::vector<float>> local_dqkv(static_cast<size_t>(k.cp));
      std::vector<double> summed_full(qkv.size(), 0.0);
      for (int64_t r = 0; r < k.cp; ++r) {
        const auto& P = split.places[static_cast<size_t>(r)];
        const RankRows rows = rank_rows(P, k, qkv, row, dctx, k.H * k.D, split.key_start);
        const std::vector<float>& q_local = rows.q;
        const int32_t* kl = rows.key_start_or_null();
        std::vector<float> c(static_cast<size_t>(k.b * s * k.H * k.D)), pr(static_cast<size_t>(k.b * k.H * s * k.S));
        context_parallel_attention_forward(q_local.data(), qkv.data(), c.data(), pr.data(), k.b, s, k.S, k.H, k.G, k.D,
                                           scale, rows.pos.data(), nullptr, kl);
        for (int64_t bi = 0; bi < k.b; ++bi)
          for (int64_t i = 0; i < s; ++i) {
            const int64_t t = bi * k.S + P[static_cast<size_t>(bi * s + i)], u = bi * s + i;
            for (int64_t e = 0; e < k.H * k.D; ++e)
              ASSERT_NEAR(c[static_cast<size_t>(u * k.H * k.D + e)], ctx[static_cast<size_t>(t * k.H * k.D + e)], 1e-5)
                  << "rank " << r << " token " << u;
          }
        std::vector<float>& dl = local_dqkv[static_cast<size_t>(r)];
        dl = nans(q_local.size());  // every element overwritten
        std::vector<float> dfull = nans(qkv.size());
        context_parallel_attention_backward(q_local.data(), qkv.data(), pr.data(), rows.dctx.data(), dl.data(),
                                            dfull.data(), k.b, s, k.S, k.H, k.G, k.D, scale, rows.pos.data(), nullptr, kl);
        for (size_t e = 0; e < dfull.size(); ++e) summed_full[e] += dfull[e];
      }
      // Each rank's rows: its query gradients plus the keys' and values' summed over the ranks.
      for (int64_t r = 0; r < k.cp; ++r)
        for (int64_t bi = 0; bi < k.b; ++bi)
          for (int64_t i = 0; i < s; ++i) {
            const int64_t t = bi * k.S + split.places[static_cast<size_t>(r)][static_cast<size_t>(bi * s + i)];
            const int64_t u = bi * s + i;
            for (int64_t e = 0; e < row; ++e) {
              const double want = dqkv[static_cast<size_t>(t * row + e)];
              const double got = local_dqkv[static_cast<size_t>(r)][static_cast<size_t>(u * row + e)] +
                                 summed_full[static_cast<size_t>(t * row + e)];
              ASSERT_NEAR(got, want, 1e-5 + 1e-5 * std::abs(want)) << "rank " << r << " token " << u << " column " << e;
            }
          }
    }
  // A first key after the query's place is refused (one head of dim 2: rows of 6).
  std::mt19937 rng(5);
  const auto qkv = randn(8 * 6, rng);
  std::vector<float> c(4 * 2), pr(4 * 8);
  const std::vector<int32_t> pos = {0, 1, 6, 7}, late = {0, 2, 0, 0};
  EXPECT_THROW(context_parallel_attention_forward(qkv.data(), qkv.data(), c.data(), pr.data(), 1, 4, 8, 1, 1, 2, 1.0f,
                                                  pos.data(), nullptr, late.data()),
               Error);
}

// Multi-latent attention's form (separate q, k, v; q/k and v head dims differ): the same two facts.
TEST(ContextParallelAttention, SeparateQueryKeyValueRowsAndSummedGradientsAreTheWholeAttentions) {
  for (const CpCase k : {CpCase{2, 24, 2, 2, 5, 2}, CpCase{1, 32, 3, 3, 4, 4}})
    for (const Split& split : splits(k)) {
      SCOPED_TRACE("S " + std::to_string(k.S) + " cp " + std::to_string(k.cp) + ", " + split.name);
      std::mt19937 rng(static_cast<unsigned>(k.S * 17 + k.cp));
      const int64_t dqk = k.D, dv = k.D + 2, s = k.S / k.cp, T = k.b * k.S;
      const float scale = 0.7f / std::sqrt(static_cast<float>(dqk));
      const int32_t* ks = split.key_start.empty() ? nullptr : split.key_start.data();
      const auto q = randn(static_cast<size_t>(T * k.H * dqk), rng), key = randn(q.size(), rng);
      const auto v = randn(static_cast<size_t>(T * k.H * dv), rng), dctx = randn(v.size(), rng);
      std::vector<float> ctx(v.size()), probs(static_cast<size_t>(k.b * k.H * k.S * k.S));
      std::vector<float> dq(q.size()), dk(q.size()), dvv(v.size());
      separate_attention_forward(q.data(), key.data(), v.data(), ctx.data(), probs.data(), k.b, k.S, k.H, dqk, dv, scale,
                                 nullptr, ks);
      separate_attention_backward(q.data(), key.data(), v.data(), probs.data(), dctx.data(), dq.data(), dk.data(),
                                  dvv.data(), k.b, k.S, k.H, dqk, dv, scale, nullptr, ks);
      std::vector<double> dk_sum(dk.size(), 0.0), dv_sum(dvv.size(), 0.0);
      for (int64_t r = 0; r < k.cp; ++r) {
        const auto& P = split.places[static_cast<size_t>(r)];
        const RankRows rows = rank_rows(P, k, q, k.H * dqk, dctx, k.H * dv, split.key_start);
        const std::vector<float>& q_local = rows.q;
        const int32_t* kl = rows.key_start_or_null();
        std::vector<float> c(static_cast<size_t>(k.b * s * k.H * dv)), pr(static_cast<size_t>(k.b * k.H * s * k.S));
        context_parallel_separate_attention_forward(q_local.data(), key.data(), v.data(), c.data(), pr.data(), k.b, s,
                                                    k.S, k.H, dqk, dv, scale, rows.pos.data(), nullptr, kl);
        std::vector<float> dq_local = nans(q_local.size()), dk_full = nans(dk.size()), dv_full = nans(dvv.size());
        context_parallel_separate_attention_backward(q_local.data(), key.data(), v.data(), pr.data(), rows.dctx.data(),
                                                     dq_local.data(), dk_full.data(), dv_full.data(), k.b, s, k.S, k.H,
                                                     dqk, dv, scale, rows.pos.data(), nullptr, kl);
        for (int64_t bi = 0; bi < k.b; ++bi)
          for (int64_t i = 0; i < s; ++i) {
            const int64_t t = bi * k.S + P[static_cast<size_t>(bi * s + i)], u = bi * s + i;
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
