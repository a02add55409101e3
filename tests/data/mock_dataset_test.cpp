// MockGptLowLevelDataset against Megatron's MockGPTLowLevelDataset. Expected numbers were
// printed by numpy 1.24.2 running Megatron's definition:
//   lengths = np.random.default_rng(0).integers(1, 4096, size=100000, dtype=np.int32)
//   doc i   = concat((arange(L-1) + 1) % vocab_size, [eod])
// The first 12 lengths and the total (204,637,097) also appear in the reference's real run.
#include "data/mock_dataset.hpp"

#include <gtest/gtest.h>

#include <numeric>

#include "core/error.hpp"

namespace laoyao::data {
namespace {

TEST(MockDataset, LengthsAreNumpysDefaultRngZero) {
  const MockGptLowLevelDataset mock(32000, 31999);
  EXPECT_EQ(mock.num_documents(), 100000);
  const std::vector<int32_t> first12(mock.sequence_lengths().begin(),
                                     mock.sequence_lengths().begin() + 12);
  EXPECT_EQ(first12,
            (std::vector<int32_t>{3484, 2609, 2094, 1105, 1261, 168, 309, 68, 718, 3331, 2660, 3738}));
  EXPECT_EQ(mock.document_length(99999), 769);
  EXPECT_EQ(mock.document_length(2480), 4095);  // the longest document (argmax)
  EXPECT_EQ(mock.document_length(1711), 1);     // the first one-token document
  const auto& l = mock.sequence_lengths();
  EXPECT_EQ(std::accumulate(l.begin(), l.end(), int64_t{0}), 204637097);
  // Tokens per mock split ("1,1,1"): what each split's GPTDataset epoch holds.
  EXPECT_EQ(std::accumulate(l.begin(), l.begin() + 33333, int64_t{0}), 68190290);
  EXPECT_EQ(std::accumulate(l.begin() + 33333, l.begin() + 66667, int64_t{0}), 68159742);
  EXPECT_EQ(std::accumulate(l.begin() + 66667, l.end(), int64_t{0}), 68287065);
}

TEST(MockDataset, DocumentIsCountingTokensThenEod) {
  const MockGptLowLevelDataset mock(32000, 31999);
  std::vector<int64_t> doc5;
  mock.read_tokens(5, 0, 168, doc5);
  ASSERT_EQ(doc5.size(), 168u);
  for (int64_t p = 0; p < 167; ++p) EXPECT_EQ(doc5[p], p + 1) << "position " << p;
  EXPECT_EQ(doc5[167], 31999);
  // A slice at an offset: Mock.get(99999, offset=760, length=9)
  std::vector<int64_t> tail;
  mock.read_tokens(99999, 760, 9, tail);
  EXPECT_EQ(tail, (std::vector<int64_t>{761, 762, 763, 764, 765, 766, 767, 768, 31999}));
  // read_tokens appends.
  mock.read_tokens(1711, 0, 1, tail);
  EXPECT_EQ(tail.back(), 31999);
  EXPECT_EQ(tail.size(), 10u);
}

TEST(MockDataset, TokensWrapModuloTheVocabulary) {
  // Mock(vocab=1000, eod=999)[0][995:1005] and [0][-3:]
  const MockGptLowLevelDataset mock(1000, 999);
  std::vector<int64_t> slice;
  mock.read_tokens(0, 995, 10, slice);
  EXPECT_EQ(slice, (std::vector<int64_t>{996, 997, 998, 999, 0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(mock.token(0, 3481), 482);
  EXPECT_EQ(mock.token(0, 3482), 483);
  EXPECT_EQ(mock.token(0, 3483), 999);  // EOD
}

TEST(MockDataset, ReadsOutsideADocumentAreErrors) {
  const MockGptLowLevelDataset mock(32000, 31999);
  std::vector<int64_t> out;
  EXPECT_THROW(mock.read_tokens(5, 100, 69, out), Error);  // 100 + 69 > 168
  EXPECT_THROW(mock.read_tokens(100000, 0, 1, out), Error);
  EXPECT_THROW(mock.read_tokens(-1, 0, 1, out), Error);
  EXPECT_THROW(mock.token(5, 168), Error);
  EXPECT_TRUE(out.empty());
}

TEST(MockDataset, VocabSizeMustBePositive) {
  EXPECT_THROW(MockGptLowLevelDataset(0, 0), UsageError);
}

TEST(MockDataset, SplitIsForcedToThirds) {
  const auto ranges = mock_split_document_ranges();
  ASSERT_TRUE(ranges[0] && ranges[1] && ranges[2]);
  EXPECT_EQ(*ranges[0], (DocumentRange{0, 33333}));
  EXPECT_EQ(*ranges[1], (DocumentRange{33333, 66667}));
  EXPECT_EQ(*ranges[2], (DocumentRange{66667, 100000}));
}

}  // namespace
}  // namespace laoyao::data
