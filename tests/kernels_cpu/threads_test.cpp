// The reductions that add into one place (parameter grads over tokens, GQA dk/dv over heads,
// embedding rows over repeated ids) are owned by one thread each and summed in a fixed order, so
// results are bitwise identical for any OpenMP thread count. Reproducible runs rely on this.
#include <gtest/gtest.h>
#include <omp.h>

#include <functional>

#include "kernels/cpu/ops.hpp"
#include "test_util.hpp"

namespace laoyao::kernels::cpu::test {
namespace {

// Runs `op` with 1 and with 3 threads (more than this machine's cores is fine) and returns both.
std::pair<std::vector<float>, std::vector<float>> with_1_and_3_threads(const std::function<std::vector<float>()>& op) {
  const int keep = omp_get_max_threads();
  omp_set_num_threads(1);
  auto one = op();
  omp_set_num_threads(3);
  auto three = op();
  omp_set_num_threads(keep);
  return {one, three};
}

TEST(Threads, NormsAreBitwiseIndependentOfThreadCount) {
  std::mt19937 rng(801);
  const int64_t T = 29, C = 13;
  const auto x = randn(T * C, rng), g = randn(C, rng), b = randn(C, rng), dy = randn(T * C, rng);
  auto [one, three] = with_1_and_3_threads([&] {
    std::vector<float> y(T * C), mean(T), rstd(T), dx(T * C), dg(C, 0.0f), db(C, 0.0f);
    layernorm_forward(x.data(), g.data(), b.data(), y.data(), mean.data(), rstd.data(), T, C, 1e-5f, false);
    layernorm_backward(dy.data(), x.data(), g.data(), mean.data(), rstd.data(), dx.data(), dg.data(), db.data(), T,
                       C, false);
    std::vector<float> all = y;
    for (const auto* v : {&dx, &dg, &db}) all.insert(all.end(), v->begin(), v->end());
    return all;
  });
  EXPECT_EQ(one, three);
}

TEST(Threads, AttentionIsBitwiseIndependentOfThreadCount) {
  std::mt19937 rng(802);
  const int64_t b = 2, s = 6, H = 6, G = 2, D = 4, W = G * (H / G + 2) * D;
  const auto qkv = randn(b * s * W, rng), dctx = randn(b * s * H * D, rng);
  auto [one, three] = with_1_and_3_threads([&] {
    std::vector<float> ctx(b * s * H * D), probs(b * H * s * s), dqkv(b * s * W);
    attention_forward(qkv.data(), ctx.data(), probs.data(), b, s, H, G, D, 0.5f);
    attention_backward(qkv.data(), probs.data(), dctx.data(), dqkv.data(), b, s, H, G, D, 0.5f);
    ctx.insert(ctx.end(), dqkv.begin(), dqkv.end());
    return ctx;
  });
  EXPECT_EQ(one, three);
}

TEST(Threads, EmbeddingAndBiasGradsAreBitwiseIndependentOfThreadCount) {
  std::mt19937 rng(803);
  const int64_t T = 40, C = 150, rows = 5;  // C > one 64-column block; ids repeat
  std::vector<int64_t> ids(T);
  for (int64_t t = 0; t < T; ++t) ids[t] = (t * 7) % rows;
  const auto dy = randn(T * C, rng);
  auto [one, three] = with_1_and_3_threads([&] {
    std::vector<float> dtable(rows * C, 0.0f), dbias(C, 0.0f);
    embedding_backward(ids.data(), dy.data(), dtable.data(), T, C);
    bias_grad_accumulate(dy.data(), dbias.data(), T, C);
    dtable.insert(dtable.end(), dbias.begin(), dbias.end());
    return dtable;
  });
  EXPECT_EQ(one, three);
}

}  // namespace
}  // namespace laoyao::kernels::cpu::test
