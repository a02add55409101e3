// Megatron-Bridge's fine-tuning batch sampler (MegatronPretrainingBatchSampler with shuffle; drop_last
// for training, padding for validation and test) and the torch.randperm it draws each epoch's order from.
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

// Bridge's sampler as its generator runs it, written out: an epoch's order from consumed_samples,
// whole global batches dealt interleaved, the partial last one dealt the same way and padded with -1
// to gbs / dp on each rank (consumed then advances by gbs), every yield one rank's global batch.
std::vector<std::vector<int64_t>> bridge_padded_yields(int64_t rows, int64_t gbs, int64_t dp, int64_t rank,
                                                       uint64_t seed, int64_t consumed, int64_t yields) {
  std::vector<std::vector<int64_t>> out;
  while (static_cast<int64_t>(out.size()) < yields) {  // cyclic_iter: iterate the sampler again
    const int64_t active = (rows + gbs - 1) / gbs * gbs;
    const int64_t epoch = consumed / active;
    std::vector<int64_t> order = torch_randperm(rows, seed + static_cast<uint64_t>(epoch));
    order.erase(order.begin(), order.begin() + consumed % active);
    std::vector<int64_t> batch;
    auto deal = [&] {
      std::vector<int64_t> mine;
      for (size_t i = static_cast<size_t>(rank); i < batch.size(); i += static_cast<size_t>(dp)) mine.push_back(batch[i]);
      mine.resize(static_cast<size_t>(gbs / dp), -1);
      out.push_back(mine);
      consumed += gbs;
      batch.clear();
    };
    for (int64_t idx : order) {
      batch.push_back(idx);
      if (static_cast<int64_t>(batch.size()) == gbs) deal();
    }
    if (!batch.empty()) deal();
  }
  out.resize(static_cast<size_t>(yields));
  return out;
}

TEST(BatchSampler, ValidationKeepsTheLastPartialBatchPaddedAndReadsOnCyclically) {
  // 21 rows, gbs 8 (mbs 2, dp 2, two micro-batches a rank): epochs of 3 batches, the third holding
  // 5 rows: rank 0 takes 3 of them and one pad, rank 1 two and two pads.
  for (int64_t consumed_at_start : {0, 16, 40}) {
    for (int64_t rank = 0; rank < 2; ++rank) {
      const BatchSampler s{21, 2, 2, 8, 77, /*drop_last=*/false};
      const auto want = bridge_padded_yields(21, 8, 2, rank, 77, consumed_at_start, 7);
      for (int64_t y = 0; y < 7; ++y) {
        std::vector<int64_t> got;
        for (int64_t m = 0; m < 2; ++m)
          for (int64_t row : s.micro_batch(consumed_at_start + 8 * y, m, rank)) got.push_back(row);
        EXPECT_EQ(got, want[static_cast<size_t>(y)]) << "start " << consumed_at_start << " rank " << rank << " yield " << y;
      }
    }
  }
  const BatchSampler s{21, 2, 2, 8, 77, false};
  const std::vector<int64_t> first = torch_randperm(21, 77);
  EXPECT_EQ(s.micro_batch(16, 0, 0), (std::vector<int64_t>{first[16], first[18]}));
  EXPECT_EQ(s.micro_batch(16, 1, 0), (std::vector<int64_t>{first[20], kPadRow}));
  EXPECT_EQ(s.micro_batch(16, 1, 1), (std::vector<int64_t>{kPadRow, kPadRow}));
  EXPECT_EQ(s.micro_batch(24, 0, 0)[0], torch_randperm(21, 78)[0]);  // the next epoch
  // Fewer rows than one global batch still make one padded batch.
  EXPECT_EQ((BatchSampler{3, 2, 2, 8, 5, false}.micro_batch(0, 1, 0)), (std::vector<int64_t>{kPadRow, kPadRow}));
}

}  // namespace
}  // namespace laoyao::data
