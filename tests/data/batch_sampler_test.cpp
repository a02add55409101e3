// Megatron-Bridge's fine-tuning batch sampler (MegatronPretrainingBatchSampler with shuffle, drop_last)
// and the torch.randperm it draws each epoch's order from.
#include "data/batch_sampler.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

#include "core/error.hpp"

namespace laoyao::data {
namespace {

TEST(TorchRandperm, IsASeededPermutationSwappingEachPositionWithARandomLaterOne) {
  for (int64_t n : {0, 1, 2, 7, 1000}) {
    const std::vector<int64_t> p = torch_randperm(n, 5678);
    std::vector<int64_t> sorted = p;
    std::sort(sorted.begin(), sorted.end());
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(sorted[static_cast<size_t>(i)], i) << n;
    EXPECT_EQ(torch_randperm(n, 5678), p);
  }
  EXPECT_NE(torch_randperm(1000, 5678), torch_randperm(1000, 5679));
  EXPECT_EQ(torch_randperm(50, 7), torch_randperm(50, 7 + (uint64_t{1} << 32))) << "the seed's low 32 bits";
  // randperm_cpu's rule, step by step: position i swaps with i + random() % (n - i).
  std::mt19937 engine(42);
  std::vector<int64_t> want = {0, 1, 2, 3};
  for (int64_t i = 0; i < 3; ++i) std::swap(want[i], want[i + engine() % (4 - i)]);
  EXPECT_EQ(torch_randperm(4, 42), want);
}

TEST(TorchRandperm, GivesTorchsOwnPermutations) {
  // torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()[:12], printed by torch
  // 2.x on the GPU machine (the CPU generator), for (n, seed) in ((10, 0), (20, 1234), (7, 5678),
  // (1000, 42)).
  auto head = [](int64_t n, uint64_t seed, size_t k) {
    std::vector<int64_t> p = torch_randperm(n, seed);
    p.resize(std::min(k, p.size()));
    return p;
  };
  EXPECT_EQ(head(10, 0, 10), (std::vector<int64_t>{4, 1, 7, 5, 3, 9, 0, 8, 6, 2}));
  EXPECT_EQ(head(20, 1234, 12), (std::vector<int64_t>{15, 16, 14, 17, 1, 9, 12, 0, 7, 6, 13, 5}));
  EXPECT_EQ(head(7, 5678, 7), (std::vector<int64_t>{4, 0, 2, 5, 3, 1, 6}));
  EXPECT_EQ(head(1000, 42, 12), (std::vector<int64_t>{542, 618, 816, 68, 94, 215, 60, 585, 942, 165, 968, 829}));
}

TEST(BatchSampler, EachEpochIsAPermutationDealtToTheRanksInterleaved) {
  const BatchSampler s{20, 2, 2, 8, 1234};  // 20 rows, mbs 2, dp 2, gbs 8: epochs of 16 rows
  const std::vector<int64_t> first = torch_randperm(20, 1234), second = torch_randperm(20, 1235);
  // The first global batch: rank 0 takes positions 0, 2, 4, 6 (micro-batches {0, 2}, {4, 6}), rank 1
  // positions 1, 3, 5, 7.
  EXPECT_EQ(s.micro_batch(0, 0, 0), (std::vector<int64_t>{first[0], first[2]}));
  EXPECT_EQ(s.micro_batch(0, 1, 0), (std::vector<int64_t>{first[4], first[6]}));
  EXPECT_EQ(s.micro_batch(0, 0, 1), (std::vector<int64_t>{first[1], first[3]}));
  EXPECT_EQ(s.micro_batch(0, 1, 1), (std::vector<int64_t>{first[5], first[7]}));
  // An epoch reads 16 distinct rows (the last 4 of its order dropped), then the next epoch's order.
  std::set<int64_t> epoch;
  for (int64_t consumed : {0, 8})
    for (int64_t m = 0; m < 2; ++m)
      for (int64_t r = 0; r < 2; ++r)
        for (int64_t row : s.micro_batch(consumed, m, r)) epoch.insert(row);
  EXPECT_EQ(epoch.size(), 16u);
  EXPECT_EQ(epoch, std::set<int64_t>(first.begin(), first.begin() + 16));
  EXPECT_EQ(s.micro_batch(16, 0, 0), (std::vector<int64_t>{second[0], second[2]}));
  const std::vector<int64_t> third = torch_randperm(20, 1236);  // 40 samples: epoch 2, its second batch
  EXPECT_EQ(s.micro_batch(40, 1, 1), (std::vector<int64_t>{third[8 + 5], third[8 + 7]}));
  // Fewer rows than one global batch: nothing to read (Bridge asserts the same).
  EXPECT_THROW((BatchSampler{7, 2, 2, 8, 1}.micro_batch(0, 0, 0)), UsageError);
}

}  // namespace
}  // namespace laoyao::data
