// Megatron's rank layout: coordinates and groups (order tp-cp-dp-pp, tensor-parallel innermost).
#include <gtest/gtest.h>

#include <algorithm>

#include "core/error.hpp"
#include "dist/parallel_layout.hpp"

using laoyao::dist::ParallelLayout;
using laoyao::dist::RankCoords;
using V = std::vector<int64_t>;

TEST(ParallelLayout, TensorParallelRanksAreConsecutive) {
  // 8 ranks, TP=2, PP=2: DP=2. Megatron's groups for this world:
  //   TP {0,1} {2,3} {4,5} {6,7}; DP {0,2} {1,3} {4,6} {5,7}; PP {0,4} {1,5} {2,6} {3,7}.
  const ParallelLayout L(8, {2, 1, 2});
  EXPECT_EQ(L.dp(), 2);
  EXPECT_EQ(L.tp_group(3), (V{2, 3}));
  EXPECT_EQ(L.dp_group(5), (V{5, 7}));
  EXPECT_EQ(L.dp_group(0), (V{0, 2}));
  EXPECT_EQ(L.pp_group(6), (V{2, 6}));
  EXPECT_EQ(L.cp_group(6), (V{6}));
  const RankCoords c = L.coords(7);
  EXPECT_EQ(c.tp, 1);
  EXPECT_EQ(c.dp, 1);
  EXPECT_EQ(c.pp, 1);
}

TEST(ParallelLayout, ContextParallelSitsBetweenTensorAndData) {
  const ParallelLayout L(8, {2, 2, 1});  // DP=2
  EXPECT_EQ(L.cp_group(1), (V{1, 3}));
  EXPECT_EQ(L.dp_group(1), (V{1, 5}));
  for (int64_t r = 0; r < 8; ++r) EXPECT_EQ(L.rank_of(L.coords(r)), r);
}

TEST(ParallelLayout, EveryRankIsInExactlyOneGroupOfEachKind) {
  const ParallelLayout L(12, {2, 1, 3});  // DP=2
  using Group = V (ParallelLayout::*)(int64_t) const;
  for (const Group group : {&ParallelLayout::tp_group, &ParallelLayout::dp_group, &ParallelLayout::pp_group})
    for (int64_t r = 0; r < 12; ++r) {
      const V g = (L.*group)(r);
      EXPECT_NE(std::find(g.begin(), g.end(), r), g.end()) << "rank " << r;
      for (int64_t m : g) EXPECT_EQ((L.*group)(m), g) << "rank " << r << ", member " << m;
    }
}

TEST(ParallelLayout, WorldNotDivisibleIsAUsageError) {
  EXPECT_THROW(ParallelLayout(6, {4, 1, 1}), laoyao::UsageError);
  EXPECT_THROW(ParallelLayout(4, {0, 1, 1}), laoyao::UsageError);
  EXPECT_THROW(ParallelLayout(4, {2, 1, 1}).coords(4), laoyao::Error);
}
