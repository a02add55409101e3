// Bridge's offline packing (docs/reference/megatron-bridge-finetuning.md §4): every example in one
// pack, none over the pack size, First-Fit's bins, the longest examples skipped and counted, and a
// pack's training row (shifted per example, positions restarting, attention inside each example).
#include "data/sft_packing.hpp"

#include <gtest/gtest.h>

#include <map>
#include <numeric>

#include "core/error.hpp"
#include "data/numpy_random.hpp"

using namespace laoyao;
using namespace laoyao::data;
using tokenizer::TokenId;

namespace {

// An example of n ids (shifted length n - 1), its ids tagged with the example's number.
SftExample example(int64_t number, int64_t n, int64_t context) {
  SftExample ex;
  for (int64_t i = 0; i < n; ++i) ex.input_ids.push_back(number * 1000 + i);
  ex.loss_mask.assign(static_cast<size_t>(n), 0);
  for (int64_t i = context; i < n; ++i) ex.loss_mask[static_cast<size_t>(i)] = 1;
  ex.context_length = context;
  return ex;
}

}  // namespace

TEST(SftPacking, EveryExampleLandsInOnePackNoneOverTheSizeAndTheLongestAreSkipped) {
  std::vector<SftExample> examples;
  const std::vector<int64_t> lengths = {5, 9, 3, 17, 8, 2, 30, 6, 11, 4, 7, 5, 13, 2, 9};  // ids each
  for (size_t i = 0; i < lengths.size(); ++i) examples.push_back(example(static_cast<int64_t>(i), lengths[i], 1));
  PackingStats stats;
  const auto packs = pack_first_fit_shuffle(examples, 16, 5678, &stats);
  std::map<int64_t, int> seen;
  int64_t total = 0;
  for (const SftPack& p : packs) {
    int64_t shifted = 0;
    ASSERT_EQ(p.input_ids.size(), p.loss_mask.size());
    for (size_t i = 0; i < p.seq_start.size(); ++i) {
      const int64_t begin = p.seq_start[i];
      const int64_t end = i + 1 < p.seq_start.size() ? p.seq_start[i + 1] : static_cast<int64_t>(p.input_ids.size());
      const int64_t number = p.input_ids[static_cast<size_t>(begin)] / 1000;
      ++seen[number];
      EXPECT_EQ(end - begin, lengths[static_cast<size_t>(number)]);
      // The mask is the example's, rolled left by one: its last entry 0.
      EXPECT_EQ(p.loss_mask[static_cast<size_t>(end - 1)], 0);
      EXPECT_EQ(p.loss_mask[static_cast<size_t>(begin)], 1);  // (context 1: the first label is trained on)
      shifted += end - begin - 1;
    }
    EXPECT_LE(shifted, 16);
    total += shifted;
  }
  // 17 and 30 ids (16 and 29 shifted): only 30 is over a pack of 16.
  EXPECT_EQ(stats.skipped, 1);
  EXPECT_EQ(seen.size(), lengths.size() - 1);
  for (const auto& [number, count] : seen) EXPECT_EQ(count, 1) << number;
  EXPECT_EQ(seen.count(6), 0u);
  EXPECT_EQ(stats.dataset_max_seqlen, 16);
  EXPECT_EQ(stats.max_samples_per_bin, [&] {
    size_t m = 0;
    for (const auto& p : packs) m = std::max(m, p.seq_start.size());
    return static_cast<int64_t>(m);
  }());
  EXPECT_DOUBLE_EQ(stats.packing_efficiency, static_cast<double>(total) / static_cast<double>(packs.size()) / 16 * 100);
  // First-Fit never leaves two bins that could have been one... for equal lengths it fills bins in
  // turn: 10 examples of 4 ids (3 shifted) in packs of 7 are 5 packs of two.
  std::vector<SftExample> same;
  for (int i = 0; i < 10; ++i) same.push_back(example(i, 4, 1));
  const auto pairs = pack_first_fit_shuffle(same, 7, 1234);
  ASSERT_EQ(pairs.size(), 5u);
  for (const auto& p : pairs) EXPECT_EQ(p.seq_start, (std::vector<int64_t>{0, 4}));
  EXPECT_THROW(pack_first_fit_shuffle({example(0, 40, 1)}, 16, 1), UsageError);  // nothing fits
}

TEST(SftPacking, TheOrderIsNumpysSeededShuffleThenFirstFitThenPermutedPerLength) {
  // The same steps spelt out with numpy's RandomState: shuffle the ascending lengths, First-Fit
  // them, then per length (shortest first) a permutation of its examples, taken from the end.
  std::vector<SftExample> examples;
  const std::vector<int64_t> lengths = {4, 6, 4, 9, 3, 6, 4, 8};
  for (size_t i = 0; i < lengths.size(); ++i) examples.push_back(example(static_cast<int64_t>(i), lengths[i], 0));
  const auto packs = pack_first_fit_shuffle(examples, 12, 42);
  RandomState rng(42);
  std::vector<int64_t> sorted;
  for (int64_t n : lengths) sorted.push_back(n - 1);
  std::sort(sorted.begin(), sorted.end());
  rng.shuffle(std::span<int64_t>(sorted));
  std::vector<std::vector<int64_t>> bins;
  std::vector<int64_t> room;
  for (int64_t len : sorted) {
    size_t b = 0;
    while (b < bins.size() && room[b] < len) ++b;
    if (b == bins.size()) bins.emplace_back(), room.push_back(12);
    bins[b].push_back(len), room[b] -= len;
  }
  std::map<int64_t, std::vector<int64_t>> queue;  // shifted length -> example numbers
  for (int64_t len = 0; len <= 12; ++len) {
    std::vector<int64_t> same;
    for (size_t i = 0; i < lengths.size(); ++i)
      if (lengths[i] - 1 == len) same.push_back(static_cast<int64_t>(i));
    if (same.empty()) continue;
    for (int64_t i : rng.permutation(static_cast<int64_t>(same.size()))) queue[len].push_back(same[static_cast<size_t>(i)]);
  }
  ASSERT_EQ(packs.size(), bins.size());
  for (size_t b = 0; b < bins.size(); ++b) {
    ASSERT_EQ(packs[b].seq_start.size(), bins[b].size());
    for (size_t k = 0; k < bins[b].size(); ++k) {
      const int64_t want = queue[bins[b][k]].back();
      queue[bins[b][k]].pop_back();
      EXPECT_EQ(packs[b].input_ids[static_cast<size_t>(packs[b].seq_start[k])] / 1000, want) << "bin " << b;
    }
  }
}

// pad_seq_to_mult 4 with packs of 10: shifted lengths 2, 4, 5 and 11 become 4, 4, 8 and 8 (the pack
// rounded down to a multiple, cut), EOS ids with no loss; so in a pack's row every example starts at
// a multiple of 4, and its padding keeps its positions running.
TEST(SftPacking, PadSeqToMultRoundsEachExampleUpToAMultipleAndCutsAtThePackSize) {
  const TokenId eos = 99;
  std::vector<SftExample> ex = {example(1, 3, 1), example(2, 5, 2), example(3, 6, 3), example(4, 12, 4)};
  for (SftExample& e : ex) pre_pad_example(e, 4, 8, eos);
  std::vector<size_t> sizes;
  for (const SftExample& e : ex) sizes.push_back(e.input_ids.size());
  EXPECT_EQ(sizes, (std::vector<size_t>{5, 5, 9, 9}));
  EXPECT_EQ(ex[0].input_ids, (std::vector<TokenId>{1000, 1001, 1002, eos, eos}));
  EXPECT_EQ(ex[0].loss_mask, (std::vector<uint8_t>{0, 1, 1, 0, 0}));
  EXPECT_EQ(ex[1].input_ids, (std::vector<TokenId>{2000, 2001, 2002, 2003, 2004}));  // already a multiple
  EXPECT_EQ(ex[3].input_ids.back(), 4008);  // cut to 8 shifted tokens
  EXPECT_EQ(ex[3].loss_mask, (std::vector<uint8_t>{0, 0, 0, 0, 1, 1, 1, 1, 1}));
  PackingStats stats;
  const std::vector<SftPack> packs = pack_first_fit_shuffle(ex, 10, 1234, &stats);
  EXPECT_EQ(stats.skipped, 0);
  for (const SftPack& p : packs) {
    const PackedRow r = packed_row(p, 10, eos);
    for (size_t t = 0; t < r.key_start.size(); ++t) {
      if (t >= static_cast<size_t>(r.cu_seqlens[r.cu_seqlens.size() - 2])) break;  // (the row's tail padding)
      EXPECT_EQ(r.key_start[t] % 4, 0) << "token " << t;
      EXPECT_EQ(r.positions[t], static_cast<int64_t>(t) - r.key_start[t]) << "token " << t;
    }
  }
}

TEST(SftPacking, APackIsARowOfShiftedExamplesWithPositionsAndAttentionRestarting) {
  SftPack p;
  // Two examples: ids 10 11 12 (loss on 12) and 20 21 22 23 (loss on 22 23); masks rolled.
  p.input_ids = {10, 11, 12, 20, 21, 22, 23};
  p.loss_mask = {0, 1, 0, 0, 1, 1, 0};
  p.seq_start = {0, 3};
  const PackedRow r = packed_row(p, 8, 99);
  EXPECT_EQ(r.tokens, (std::vector<TokenId>{10, 11, 20, 21, 22, 99, 99, 99}));
  EXPECT_EQ(r.labels, (std::vector<TokenId>{11, 12, 21, 22, 23, 99, 99, 99}));
  EXPECT_EQ(r.loss_mask, (std::vector<float>{0, 1, 0, 1, 1, 0, 0, 0}));
  EXPECT_EQ(r.positions, (std::vector<int64_t>{0, 1, 0, 1, 2, 0, 0, 0}));
  EXPECT_EQ(r.key_start, (std::vector<int32_t>{0, 0, 2, 2, 2, 5, 5, 5}));
  EXPECT_EQ(r.cu_seqlens, (std::vector<int64_t>{0, 2, 5, 8}));  // the padding: one more sequence
  const PackedRow full = packed_row(p, 5, 99);
  EXPECT_EQ(full.cu_seqlens, (std::vector<int64_t>{0, 2, 5}));
  EXPECT_THROW(packed_row(p, 4, 99), Error);
}
