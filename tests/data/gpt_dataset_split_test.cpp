// Split strings -> weights, split matrix and document ranges, as Megatron-Core's
// parse_and_normalize_split / convert_split_vector_to_split_matrix / _build_megatron_dataset_splits.
// Expected values were printed by numpy 1.24.2 running a transcription of those functions
// (float.hex() for exact doubles).
#include "data/gpt_dataset_split.hpp"

#include <gtest/gtest.h>

#include "core/error.hpp"

namespace laoyao::data {
namespace {

TEST(Split, ParseAndNormalize) {
  EXPECT_EQ(parse_split("969,30,1"),
            (std::array<double, 3>{0x1.f020c49ba5e35p-1, 0x1.eb851eb851eb8p-6, 0x1.0624dd2f1a9fcp-10}));
  EXPECT_EQ(parse_split("98,1,1"),
            (std::array<double, 3>{0x1.f5c28f5c28f5cp-1, 0x1.47ae147ae147bp-7, 0x1.47ae147ae147bp-7}));
  EXPECT_EQ(parse_split("1,1,1"),
            (std::array<double, 3>{0x1.5555555555555p-2, 0x1.5555555555555p-2, 0x1.5555555555555p-2}));
  // Missing entries are 0; any non-number characters separate the weights.
  EXPECT_EQ(parse_split("99,1"), (std::array<double, 3>{0x1.fae147ae147aep-1, 0x1.47ae147ae147bp-7, 0.0}));
  EXPECT_EQ(parse_split("0.5 0.25 0.25"), (std::array<double, 3>{0.5, 0.25, 0.25}));
  EXPECT_EQ(parse_split("2/1/1"), (std::array<double, 3>{0.5, 0.25, 0.25}));
}

TEST(Split, BadSplitsAreUsageErrors) {
  EXPECT_THROW(parse_split("1,2,3,4"), UsageError);
  EXPECT_THROW(parse_split("0,0,0"), UsageError);
  EXPECT_THROW(parse_split("train"), UsageError);  // no numbers: all-zero split
  EXPECT_THROW(parse_split("-1,1,1"), UsageError);
  EXPECT_THROW(parse_split("1.2.3,1"), UsageError);
  EXPECT_THROW(parse_split("."), UsageError);
}

TEST(Split, MatrixDropsZeroWidthSplits) {
  const auto m = split_matrix(parse_split("100,0,0"));
  ASSERT_TRUE(m[0].has_value());
  EXPECT_EQ(*m[0], (SplitBounds{0.0, 1.0}));
  EXPECT_FALSE(m[1].has_value());
  EXPECT_FALSE(m[2].has_value());
  const auto t = split_matrix(parse_split("1,1,1"));
  ASSERT_TRUE(t[0] && t[1] && t[2]);
  EXPECT_EQ(t[1]->begin, 0x1.5555555555555p-2);
  EXPECT_EQ(t[1]->end, 0x1.5555555555555p-1);
  EXPECT_EQ(t[2]->end, 1.0);
}

TEST(Split, DocumentRanges) {
  auto r = split_document_ranges("969,30,1", 1000000);
  EXPECT_EQ(*r[0], (DocumentRange{0, 969000}));
  EXPECT_EQ(*r[1], (DocumentRange{969000, 999000}));
  EXPECT_EQ(*r[2], (DocumentRange{999000, 1000000}));
  r = split_document_ranges("98,1,1", 12345);
  EXPECT_EQ(*r[0], (DocumentRange{0, 12098}));
  EXPECT_EQ(*r[1], (DocumentRange{12098, 12222}));
  EXPECT_EQ(*r[2], (DocumentRange{12222, 12345}));
  r = split_document_ranges("2,1,1", 12);
  EXPECT_EQ(*r[0], (DocumentRange{0, 6}));
  EXPECT_EQ(*r[1], (DocumentRange{6, 9}));
  EXPECT_EQ(*r[2], (DocumentRange{9, 12}));
  r = split_document_ranges("100,0,0", 10);
  EXPECT_EQ(*r[0], (DocumentRange{0, 10}));
  EXPECT_FALSE(r[1] || r[2]);
}

TEST(Split, DocumentRangesRoundHalfToEvenLikePython) {
  // round(0.5 * 5) == 2 and round(0.5 * 7) == 4 in Python.
  auto r = split_document_ranges("1,1", 5);
  EXPECT_EQ(*r[0], (DocumentRange{0, 2}));
  EXPECT_EQ(*r[1], (DocumentRange{2, 5}));
  EXPECT_FALSE(r[2].has_value());
  r = split_document_ranges("1,1", 7);
  EXPECT_EQ(*r[0], (DocumentRange{0, 4}));
  EXPECT_EQ(*r[1], (DocumentRange{4, 7}));
}

TEST(Split, NumpySumIsPairwise) {
  // np.sum / utils.normalize of random doubles (random.seed(5)); only the first three inputs
  // are listed for n=3, so this checks n < 8 exactly, and normalize for it.
  const std::vector<double> a{0x1.f25244618b646p+5, 0x1.1ed412a384f48p+5, 0x1.78fae8b813571p+6};
  EXPECT_EQ(numpy_sum(a), 0x1.80c70a1d4dc1cp+7);
  const auto n = normalize_weights(a);
  EXPECT_EQ(n[0], 0x1.4b8afed2b8204p-2);
  EXPECT_EQ(n[2], 0x1.f59fdee57abe8p-2);
  EXPECT_EQ(normalize_weights(std::vector<double>{1, 2, 3.5}),
            (std::vector<double>{0x1.3b13b13b13b14p-3, 0x1.3b13b13b13b14p-2, 0x1.13b13b13b13b1p-1}));
}

TEST(Split, NumpySumUnrolledAndRecursiveOrders) {
  // With 8 interleaved accumulators and recursive halving the result differs from a plain
  // left-to-right sum: 1e16 + 1 + 1 ... loses every 1 sequentially but not pairwise.
  // np.sum([1e16] + [1.0]*15) == 1.0000000000000014e16 (hex 0x1.1c37937e08007p+53); a loop
  // gives 1e16.
  std::vector<double> v(16, 1.0);
  v[0] = 1e16;
  EXPECT_EQ(numpy_sum(v), 0x1.1c37937e08007p+53);
  double sequential = 0.0;
  for (double x : v) sequential += x;
  EXPECT_NE(numpy_sum(v), sequential);
  // Recursive halves above 128 elements: np.sum([1e16] + [1.0]*299) == 1.000000000000029e16
  std::vector<double> w(300, 1.0);
  w[0] = 1e16;
  EXPECT_EQ(numpy_sum(w), 0x1.1c37937e08091p+53);
}

}  // namespace
}  // namespace laoyao::data
