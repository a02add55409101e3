// Embedding lookup and gradient scatter-add against fp64 twins and finite differences; id checks.
#include <gtest/gtest.h>

#include "core/error.hpp"
#include "kernels/cpu/ops.hpp"
#include "test_util.hpp"

namespace laoyao::kernels::cpu::test {
namespace {

std::vector<double> embedding_twin(const std::vector<int64_t>& ids, const std::vector<double>& table,
                                   const std::vector<double>* y0, int64_t C) {
  const int64_t T = static_cast<int64_t>(ids.size());
  std::vector<double> y(T * C);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c) y[t * C + c] = (y0 ? (*y0)[t * C + c] : 0.0) + table[ids[t] * C + c];
  return y;
}

// Repeated ids (3 appears three times, 0 twice) exercise the scatter-add.
const std::vector<int64_t> kIds{3, 0, 8, 3, 5, 0, 3};
constexpr int64_t kRows = 9, kC = 13;

TEST(Embedding, ForwardCopiesOrAddsRows) {
  std::mt19937 rng(601);
  const int64_t T = static_cast<int64_t>(kIds.size());
  const auto table = randn(kRows * kC, rng), y0 = randn(T * kC, rng);
  auto y = nans(T * kC);
  embedding_forward(kIds.data(), table.data(), y.data(), T, kC, kRows, false);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < kC; ++c) EXPECT_EQ(y[t * kC + c], table[kIds[t] * kC + c]);  // a copy is exact

  auto acc = y0;  // accumulate = true: y += table[id] (the position embedding added onto the word one)
  embedding_forward(kIds.data(), table.data(), acc.data(), T, kC, kRows, true);
  const auto y0d = to_double(y0);
  expect_close(acc, embedding_twin(kIds, to_double(table), &y0d, kC), 1e-7, "y0 + table[id]");
}

TEST(Embedding, BackwardMatchesFiniteDifferencesAndAccumulates) {
  std::mt19937 rng(602);
  const int64_t T = static_cast<int64_t>(kIds.size());
  const auto table = randn(kRows * kC, rng), r = randn(T * kC, rng);
  std::vector<float> dtable(kRows * kC, 0.0f);
  embedding_backward(kIds.data(), r.data(), dtable.data(), T, kC);
  auto td = to_double(table);
  const auto rd = to_double(r);
  const auto fd = numeric_grad([&] { return project(rd, embedding_twin(kIds, td, nullptr, kC)); }, td);
  expect_close(dtable, fd, kGradTol, "dtable");
  for (int64_t c = 0; c < kC; ++c) EXPECT_EQ(dtable[1 * kC + c], 0.0f);  // row 1 is never looked up

  auto twice = to_double(dtable);
  for (auto& v : twice) v *= 2;
  embedding_backward(kIds.data(), r.data(), dtable.data(), T, kC);
  expect_close(dtable, twice, 1e-6, "dtable after two calls");
}

TEST(Embedding, OutOfRangeIdThrowsNamingIdAndRange) {
  std::mt19937 rng(603);
  const auto table = randn(kRows * kC, rng);
  for (const int64_t bad : {kRows, int64_t{-1}, int64_t{1} << 40}) {
    const std::vector<int64_t> ids{2, bad, 4};
    std::vector<float> y(3 * kC, 7.0f);
    try {
      embedding_forward(ids.data(), table.data(), y.data(), 3, kC, kRows, false);
      ADD_FAILURE() << "no error for id " << bad;
    } catch (const laoyao::Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("id " + std::to_string(bad)), std::string::npos) << msg;
      EXPECT_NE(msg.find("[0, " + std::to_string(kRows) + ")"), std::string::npos) << msg;
    }
    for (float v : y) EXPECT_EQ(v, 7.0f);  // nothing written, not even the valid first row
  }
}

}  // namespace
}  // namespace laoyao::kernels::cpu::test
