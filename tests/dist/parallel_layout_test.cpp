// Megatron's rank layout: coordinates and groups (order tp-cp-dp-pp, tensor-parallel innermost).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

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
  // Megatron's dp_cp group: the data- and context-parallel ranks of a TP rank, cp-minor.
  EXPECT_EQ(L.dp_cp_group(1), (V{1, 3, 5, 7}));
  EXPECT_EQ(L.dp_cp_group(6), (V{0, 2, 4, 6}));
  const ParallelLayout one(4, {1, 2, 1});  // DP=2
  EXPECT_EQ(one.dp_cp_group(3), (V{0, 1, 2, 3}));
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

// Expert parallelism (expert TP 1): EP groups are consecutive data-parallel ranks, the expert
// data-parallel groups stride over them; a size that does not divide DP is refused by name.
TEST(ParallelLayout, ExpertParallelGroupsAreConsecutiveDataParallelRanks) {
  const ParallelLayout l(8, {1, 1, 1});
  EXPECT_EQ(l.ep_group(5, 2), (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(l.ep_group(5, 4), (std::vector<int64_t>{4, 5, 6, 7}));
  EXPECT_EQ(l.expert_dp_group(5, 2), (std::vector<int64_t>{1, 3, 5, 7}));
  EXPECT_EQ(l.expert_dp_group(5, 4), (std::vector<int64_t>{1, 5}));
  EXPECT_EQ(l.expert_dp_group(3, 8), (std::vector<int64_t>{3}));
  try {
    (void)l.ep_group(0, 3);
    FAIL() << "EP 3 over 8 data-parallel ranks";
  } catch (const laoyao::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("expert-model-parallel size (3)"), std::string::npos) << e.what();
  }
  // With TP = expert TP 2 (Megatron's expert order tp-ep-dp): the same TP rank, consecutive
  // data-parallel ranks (ranks 2t + tp_rank of data-parallel rank t).
  const ParallelLayout tp(8, {2, 1, 1});
  EXPECT_EQ(tp.ep_group(5, 2), (std::vector<int64_t>{5, 7}));
  EXPECT_EQ(tp.ep_group(2, 2), (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(tp.expert_dp_group(5, 2), (std::vector<int64_t>{1, 5}));
  EXPECT_THROW((void)ParallelLayout(8, {2, 1, 1}).ep_group(0, 3), laoyao::UsageError);
}

// With context parallelism the expert layout (tp-ep-dp) reads the dense layout's context- and
// data-parallel coordinates as one flattened index (cp + CP * dp): EP groups are consecutive in it.
TEST(ParallelLayout, ExpertParallelGroupsSpanContextAndDataParallelRanks) {
  const ParallelLayout cp(4, {1, 2, 1});  // CP=2 x DP=2: rank = cp + 2 dp
  EXPECT_EQ(cp.ep_group(1, 2), (V{0, 1}));
  EXPECT_EQ(cp.ep_group(2, 2), (V{2, 3}));
  EXPECT_EQ(cp.expert_dp_group(1, 2), (V{1, 3}));
  EXPECT_EQ(cp.ep_group(2, 4), (V{0, 1, 2, 3}));
  EXPECT_EQ(cp.expert_dp_group(2, 4), (V{2}));
  const ParallelLayout tp_cp(4, {2, 2, 1});  // TP=2 x CP=2: rank = tp + 2 cp, one data-parallel rank
  EXPECT_EQ(tp_cp.ep_group(3, 2), (V{1, 3}));
  EXPECT_EQ(tp_cp.ep_group(0, 2), (V{0, 2}));
  EXPECT_EQ(tp_cp.expert_dp_group(3, 2), (V{3}));
  for (const int64_t ep : {1, 2, 4})
    for (int64_t r = 0; r < 4; ++r) {
      const V g = cp.ep_group(r, ep), d = cp.expert_dp_group(r, ep);
      EXPECT_EQ(static_cast<int64_t>(g.size() * d.size()), 4);
      for (const int64_t m : g) EXPECT_EQ(cp.ep_group(m, ep), g);
      for (const int64_t m : d) EXPECT_EQ(cp.expert_dp_group(m, ep), d);
    }
  try {
    (void)tp_cp.ep_group(0, 4);
    FAIL() << "EP 4 over 1 data-parallel x 2 context-parallel ranks";
  } catch (const laoyao::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("times the context-parallel size (2)"), std::string::npos) << e.what();
  }
  EXPECT_EQ(tp_cp.folded_ep_group(1, 4), (V{0, 1, 2, 3}));  // whole experts: consecutive ranks as without CP
}

// Whole experts under TP (expert TP 1, Megatron's expert order tp-ep-dp with tp = 1): the
// expert-parallel groups are consecutive ranks across the TP groups ("parallel folding"). With
// TP=2 on 8 ranks: TP {0,1} {2,3} ...; EP=2 folds each TP pair into one EP group, EP=4 two pairs.
TEST(ParallelLayout, WholeExpertsFoldTheExpertGroupsAcrossTensorParallelRanks) {
  const ParallelLayout tp(8, {2, 1, 1});
  EXPECT_EQ(tp.folded_ep_group(5, 2), (V{4, 5}));
  EXPECT_EQ(tp.folded_expert_dp_group(5, 2), (V{1, 3, 5, 7}));
  EXPECT_EQ(tp.folded_ep_group(5, 4), (V{4, 5, 6, 7}));
  EXPECT_EQ(tp.folded_expert_dp_group(5, 4), (V{1, 5}));
  EXPECT_EQ(tp.folded_ep_group(3, 8), (V{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(tp.folded_expert_dp_group(3, 8), (V{3}));
  // Every rank in exactly one group of each kind, and the two kinds cross in exactly one rank.
  for (const int64_t ep : {1, 2, 4, 8})
    for (int64_t r = 0; r < 8; ++r) {
      const V g = tp.folded_ep_group(r, ep), d = tp.folded_expert_dp_group(r, ep);
      EXPECT_EQ(static_cast<int64_t>(g.size() * d.size()), 8);
      EXPECT_EQ(std::count(g.begin(), g.end(), r), 1);
      EXPECT_EQ(std::count(d.begin(), d.end(), r), 1);
      for (const int64_t m : g) EXPECT_EQ(tp.folded_ep_group(m, ep), g);
      for (const int64_t m : d) EXPECT_EQ(tp.folded_expert_dp_group(m, ep), d);
    }
  try {
    (void)tp.folded_ep_group(0, 3);
    FAIL() << "EP 3 over 8 ranks";
  } catch (const laoyao::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("must divide the world size (8)"), std::string::npos) << e.what();
  }
}
