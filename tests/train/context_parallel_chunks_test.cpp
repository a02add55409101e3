// A context-parallel rank's share of a micro-batch (Megatron's get_batch_on_this_cp_rank): chunks r
// and 2 CP - 1 - r of each row, or with packed documents of each document (Megatron's THD
// partition), with each token's place in its row and its document's first key, which the model
// accepts; a document that does not split into 2 CP chunks is refused, naming pad_seq_to_mult.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.hpp"
#include "model/gpt_model.hpp"
#include "train/data_pipeline.hpp"

using namespace laoyao;
using namespace laoyao::train;

namespace {

// Rows of s tokens whose ids are 100 x row + place; documents starting at starts[row].
MicroBatchData rows(int64_t s, const std::vector<std::vector<int32_t>>& starts) {
  MicroBatchData mb;
  mb.b = static_cast<int64_t>(starts.size()), mb.s = s;
  for (int64_t r = 0; r < mb.b; ++r)
    for (int32_t t = 0; t < s; ++t) {
      mb.tokens.push_back(100 * r + t), mb.labels.push_back(100 * r + t + 1), mb.positions.push_back(t);
      mb.loss_mask.push_back(static_cast<float>(t % 3 != 0));
      int32_t first = 0;
      for (const int32_t st : starts[static_cast<size_t>(r)])
        if (st <= t) first = st;
      if (!starts[static_cast<size_t>(r)].empty()) mb.key_start.push_back(first);
    }
  return mb;
}

}  // namespace

TEST(ContextParallelChunks, EachRankKeepsItsTwoChunksOfEveryRow) {
  const MicroBatchData mb = rows(8, {{}, {}});
  const std::vector<std::vector<int64_t>> want = {{0, 1, 6, 7, 100, 101, 106, 107}, {2, 3, 4, 5, 102, 103, 104, 105}};
  for (int64_t r = 0; r < 2; ++r) {
    const MicroBatchData out = context_parallel_chunks(mb, r, 2);
    EXPECT_EQ(out.s, 4);
    EXPECT_EQ(out.tokens, want[static_cast<size_t>(r)]);
    EXPECT_TRUE(out.cp_places.empty()) << "the two-chunk formula serves";
    EXPECT_TRUE(out.key_start.empty());
  }
}

TEST(ContextParallelChunks, PackedDocumentsSplitEachIntoItsOwnChunks) {
  // Row 0: documents of 8, 4 and 4 tokens; row 1: 4 and 12. CP = 2: four chunks a document.
  const MicroBatchData mb = rows(16, {{0, 8, 12}, {0, 4}});
  const std::vector<std::vector<int32_t>> places = {
      {0, 1, 6, 7, 8, 11, 12, 15, /* row 1 */ 0, 3, 4, 5, 6, 13, 14, 15},
      {2, 3, 4, 5, 9, 10, 13, 14, /* row 1 */ 1, 2, 7, 8, 9, 10, 11, 12}};
  std::vector<int32_t> seen(32, 0);
  for (int64_t r = 0; r < 2; ++r) {
    const MicroBatchData out = context_parallel_chunks(mb, r, 2);
    ASSERT_EQ(out.s, 8);
    EXPECT_EQ(out.cp_places, places[static_cast<size_t>(r)]);
    for (int64_t t = 0; t < 16; ++t) {
      const int64_t row = t / 8, p = out.cp_places[static_cast<size_t>(t)];
      EXPECT_EQ(out.tokens[static_cast<size_t>(t)], 100 * row + p) << "rank " << r << " token " << t;
      EXPECT_EQ(out.key_start[static_cast<size_t>(t)], mb.key_start[static_cast<size_t>(row * 16 + p)]);
      EXPECT_EQ(out.loss_mask[static_cast<size_t>(t)], mb.loss_mask[static_cast<size_t>(row * 16 + p)]);
      ++seen[static_cast<size_t>(row * 16 + p)];
    }
    // What the model takes: each query's document starts at or before its place, in row order.
    const model::MicroBatch in{out.b, out.s, out.tokens.data(), out.labels.data(), out.positions.data(),
                               out.key_start.data(), out.loss_mask.data(), out.cp_places.data()};
    EXPECT_NO_THROW(model::check_key_start(in)) << "rank " << r;
  }
  EXPECT_EQ(seen, std::vector<int32_t>(32, 1)) << "every token on exactly one rank";
  // A document of 6 tokens does not split into 4 chunks.
  try {
    (void)context_parallel_chunks(rows(16, {{0, 6, 12}}), 0, 2);
    FAIL() << "a document of 6 tokens at CP = 2";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("set dataset.pad_seq_to_mult to a multiple of 4"), std::string::npos)
        << e.what();
  }
}
