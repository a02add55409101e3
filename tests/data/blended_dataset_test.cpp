// Blending against Megatron-Core: get_blend_from_list, _get_size_per_split_per_dataset,
// helpers.cpp build_blending_indices / build_exhaustive_blending_indices and the builder's
// weighted and unweighted blends. Expected numbers were printed by a throwaway Python
// transcription of those functions (and of GPTDataset, see gpt_dataset_test.cpp) run with
// numpy 1.24.2; dataset_index sequences are written as digit strings.
#include "data/blended_dataset.hpp"

#include <gtest/gtest.h>

#include "core/error.hpp"
#include "data/blended_dataset_builder.hpp"
#include "in_memory_corpus.hpp"

namespace laoyao::data {
namespace {

using testing::corpus_a;
using testing::corpus_b;
using testing::kEod;

std::string digits(const std::vector<int16_t>& v) {
  std::string s;
  for (int16_t d : v) s += std::to_string(d);
  return s;
}

TEST(Blend, ParseWeightedAndUnweightedLists) {
  Blend b = parse_blend(std::vector<std::string>{"0.3", "a", "0.7", "b"});
  EXPECT_EQ(b.prefixes, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(b.weights, (std::vector<double>{0.3, 0.7}));
  b = parse_blend(std::vector<std::string>{"30", " path/one ", "70", "path/two"});
  EXPECT_EQ(b.prefixes, (std::vector<std::string>{"path/one", "path/two"}));
  EXPECT_EQ(b.weights, (std::vector<double>{30, 70}));
  b = parse_blend(std::vector<std::string>{"a", "b"});  // even, no numbers: two prefixes
  EXPECT_EQ(b.prefixes, (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(b.weights.empty());
  b = parse_blend(std::vector<std::string>{"1", "a", "b"});  // odd: all prefixes
  EXPECT_EQ(b.prefixes, (std::vector<std::string>{"1", "a", "b"}));
  EXPECT_TRUE(b.weights.empty());
  b = parse_blend("  1e-1 x\t0.9 y ");
  EXPECT_EQ(b.prefixes, (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(b.weights, (std::vector<double>{0.1, 0.9}));
  b = parse_blend("single_prefix");
  EXPECT_EQ(b.prefixes, (std::vector<std::string>{"single_prefix"}));
}

TEST(Blend, BadListsAreUsageErrors) {
  EXPECT_THROW(parse_blend(std::vector<std::string>{}), UsageError);
  EXPECT_THROW(parse_blend(std::vector<std::string>{"0.3", "a", "b", "c"}), UsageError);
  EXPECT_THROW(parse_blend(std::vector<std::string>{"0", "a"}), UsageError);
  EXPECT_THROW(parse_blend(std::vector<std::string>{"-1", "a", "2", "b"}), UsageError);
  EXPECT_THROW(parse_blend(std::vector<std::string>{"inf", "a"}), UsageError);
}

TEST(Blend, SamplesPerDatasetWithSurplus) {
  const std::vector<double> w = normalize_weights(std::vector<double>{0.3, 0.7});
  EXPECT_EQ(samples_per_dataset(w, 320, 0.0), (std::vector<int64_t>{96, 224}));
  EXPECT_EQ(samples_per_dataset(w, 320, kMidLevelDatasetSurplus), (std::vector<int64_t>{97, 226}));
  EXPECT_EQ(samples_per_dataset(w, 128, 0.0), (std::vector<int64_t>{39, 90}));
  EXPECT_EQ(samples_per_dataset(w, 128, kMidLevelDatasetSurplus), (std::vector<int64_t>{40, 91}));
  EXPECT_EQ(samples_per_dataset(w, 64, kMidLevelDatasetSurplus), (std::vector<int64_t>{21, 46}));
  EXPECT_EQ(samples_per_dataset(w, 0, kMidLevelDatasetSurplus), (std::vector<int64_t>{0, 0}));
  const std::vector<double> w3 = normalize_weights(std::vector<double>{1, 2, 3.5});
  EXPECT_EQ(samples_per_dataset(w3, 1000, 0.0), (std::vector<int64_t>{154, 308, 539}));
  EXPECT_EQ(samples_per_dataset(w3, 1000, kMidLevelDatasetSurplus),
            (std::vector<int64_t>{155, 310, 542}));
  const std::vector<double> w10 = normalize_weights(std::vector<double>(10, 0.1));
  EXPECT_EQ(samples_per_dataset(w10, 12345, 0.0), std::vector<int64_t>(10, 1235));
  EXPECT_EQ(samples_per_dataset(w10, 12345, kMidLevelDatasetSurplus), std::vector<int64_t>(10, 1242));
}

TEST(Blend, BlendingIndices) {
  const std::vector<double> w = normalize_weights(std::vector<double>{0.3, 0.7});
  BlendingIndex bi = build_blending_indices(w, 40);
  EXPECT_EQ(digits(bi.dataset_index), "1011011011011101101101110110110111011011");
  EXPECT_EQ(bi.dataset_sample_index,
            (std::vector<int64_t>{0,  0,  1, 2,  1,  3,  4,  2,  5,  6,  3,  7,  8,  9,
                                  4,  10, 11, 5, 12, 13, 6,  14, 15, 16, 7,  17, 18, 8,
                                  19, 20, 9, 21, 22, 23, 10, 24, 25, 11, 26, 27}));
  bi = build_blending_indices(normalize_weights(std::vector<double>{1, 2, 3.5}), 60);
  EXPECT_EQ(digits(bi.dataset_index),
            "210212212021202121221202120212122120212021212212021202121221");
  EXPECT_EQ(std::vector<int64_t>(bi.dataset_sample_index.end() - 6, bi.dataset_sample_index.end()),
            (std::vector<int64_t>{16, 29, 17, 30, 31, 18}));
  // Ties go to the lower index.
  bi = build_blending_indices(normalize_weights(std::vector<double>{0.2, 0.2, 0.6}), 10);
  EXPECT_EQ(digits(bi.dataset_index), "2012202122");
}

TEST(Blend, ExhaustiveBlendingIndices) {
  BlendingIndex bi = build_exhaustive_blending_indices(std::vector<int64_t>{3, 5});
  EXPECT_EQ(digits(bi.dataset_index), "10101101");
  EXPECT_EQ(bi.dataset_sample_index, (std::vector<int64_t>{0, 0, 1, 1, 2, 3, 2, 4}));
  bi = build_exhaustive_blending_indices(std::vector<int64_t>{2, 7, 4});
  EXPECT_EQ(digits(bi.dataset_index), "1201211210121");
  EXPECT_EQ(bi.dataset_sample_index, (std::vector<int64_t>{0, 0, 0, 1, 1, 2, 3, 2, 4, 1, 5, 3, 6}));
  bi = build_exhaustive_blending_indices(std::vector<int64_t>{1, 1, 1});
  EXPECT_EQ(digits(bi.dataset_index), "012");
}

GptDatasetConfig small_config() {
  GptDatasetConfig c;
  c.seq_length = 4;
  c.random_seed = 1234;
  c.eod_id = kEod;
  return c;
}

TEST(Blend, WeightedBlendOfTwoCorpora) {
  // --data-path 0.3 A 0.7 B --split 1,1,1, budget (20, 8, 4): per-dataset targets
  // [[6,3,2],[14,6,3]], built with the 0.5% surplus [[7,4,3],[15,7,4]].
  const SplitDatasets splits =
      build_gpt_datasets({corpus_a(), corpus_b()}, {0.3, 0.7}, "1,1,1", {20, 8, 4}, small_config());
  const auto& train = dynamic_cast<const BlendedDataset&>(*splits[0]);
  const auto& valid = dynamic_cast<const BlendedDataset&>(*splits[1]);
  const auto& test = dynamic_cast<const BlendedDataset&>(*splits[2]);
  EXPECT_EQ(train.size(), 20);
  EXPECT_EQ(valid.size(), 9);
  EXPECT_EQ(test.size(), 5);
  const auto& a_train = dynamic_cast<const GptDataset&>(train.dataset(0));
  const auto& b_train = dynamic_cast<const GptDataset&>(train.dataset(1));
  EXPECT_EQ(a_train.num_samples(), 7);
  EXPECT_EQ(b_train.num_samples(), 15);
  EXPECT_EQ(a_train.size(), 7);
  EXPECT_EQ(b_train.size(), 16);
  EXPECT_EQ(a_train.documents(), (DocumentRange{0, 4}));
  EXPECT_EQ(b_train.documents(), (DocumentRange{0, 10}));
  EXPECT_EQ(dynamic_cast<const GptDataset&>(valid.dataset(1)).num_samples(), 7);
  EXPECT_EQ(dynamic_cast<const GptDataset&>(test.dataset(0)).num_samples(), 3);

  EXPECT_EQ(digits(train.blending_index().dataset_index), "10110110110111011011");
  EXPECT_EQ(train.blending_index().dataset_sample_index,
            (std::vector<int64_t>{0, 0, 1, 2, 1, 3, 4, 2, 5, 6, 3, 7, 8, 9, 4, 10, 11, 5, 12, 13}));
  EXPECT_EQ(digits(valid.blending_index().dataset_index), "101101101");
  EXPECT_EQ(digits(test.blending_index().dataset_index), "10110");

  const std::vector<std::vector<int64_t>> train_tokens{
      {200003, 200004, 200005, 200006}, {1003, 7, 1000, 1001},
      {700000, 700001, 700002, 7},      {800008, 800009, 7, 300000},
      {3000, 3001, 3002, 3003},         {7, 1000000, 1000001, 1000002},
      {800004, 800005, 800006, 800007}, {3002, 3003, 3004, 3005},
      {400004, 400005, 400006, 400007}, {1000007, 1000008, 1000009, 1000010},
      {7, 1000, 1001, 1002},            {1000003, 1000004, 1000005, 1000006},
      {800000, 800001, 800002, 800003}, {7, 7, 900000, 900001},
      {2001, 7, 3000, 3001},            {7, 200000, 200001, 200002},
      {400000, 400001, 400002, 400003}, {1002, 1003, 7, 2000},
      {600006, 600007, 600008, 7},      {600002, 600003, 600004, 600005}};
  for (int64_t i = 0; i < train.size(); ++i) EXPECT_EQ(train.get(i).tokens, train_tokens[i]) << i;
  const std::vector<std::vector<int64_t>> valid_tokens{
      {1100001, 1100002, 1100003, 1100004}, {6004, 6005, 6006, 6007},
      {1500005, 1500006, 7, 1600000},       {1300005, 7, 2000000, 2000001},
      {6000, 6001, 6002, 6003},             {2000002, 7, 1200000, 1200001},
      {1300001, 1300002, 1300003, 1300004}, {7, 7000, 7, 8000},
      {1700003, 1700004, 1700005, 1700006}};
  for (int64_t i = 0; i < valid.size(); ++i) EXPECT_EQ(valid.get(i).tokens, valid_tokens[i]) << i;
  EXPECT_EQ(test.get(2).tokens, (std::vector<int64_t>{2600004, 2600005, 7, 7}));
  EXPECT_EQ(test.get(4).tokens, (std::vector<int64_t>{10000, 10001, 7, 11000}));
  EXPECT_THROW(train.get(20), Error);
}

TEST(Blend, UnweightedBlendUsesDatasetLengths) {
  // --data-path A B: one-epoch datasets (train lengths 3 and 16) blended by length,
  // min(requested, total) samples; without a size, exhaustively.
  SplitDatasets splits =
      build_gpt_datasets({corpus_a(), corpus_b()}, {}, "1,1,1", {10, 5, 3}, small_config());
  const auto* train = dynamic_cast<const BlendedDataset*>(splits[0].get());
  ASSERT_NE(train, nullptr);
  EXPECT_EQ(dynamic_cast<const GptDataset&>(train->dataset(0)).size(), 3);
  EXPECT_EQ(dynamic_cast<const GptDataset&>(train->dataset(1)).size(), 16);
  EXPECT_EQ(digits(train->blending_index().dataset_index), "1011111011");
  EXPECT_EQ(train->blending_index().dataset_sample_index,
            (std::vector<int64_t>{0, 0, 1, 2, 3, 4, 5, 1, 6, 7}));
  EXPECT_EQ(train->get(0).tokens, (std::vector<int64_t>{200003, 200004, 200005, 200006}));
  EXPECT_EQ(digits(dynamic_cast<const BlendedDataset&>(*splits[1]).blending_index().dataset_index),
            "10110");
  EXPECT_EQ(splits[2]->size(), 3);

  // Asking for more than there is: capped at the total (3 + 16 train samples).
  splits = build_gpt_datasets({corpus_a(), corpus_b()}, {}, "1,1,1", {1000, 1000, 1000},
                              small_config());
  EXPECT_EQ(splits[0]->size(), 19);
  EXPECT_EQ(digits(dynamic_cast<const BlendedDataset&>(*splits[0]).blending_index().dataset_index),
            "1011111011111011111");
  EXPECT_EQ(splits[1]->size(), 20);
  EXPECT_EQ(digits(dynamic_cast<const BlendedDataset&>(*splits[1]).blending_index().dataset_index),
            "10110111011101110111");
  EXPECT_EQ(splits[2]->size(), 24);

  // No size (Megatron's None): every sample of every dataset once.
  splits = build_gpt_datasets({corpus_a(), corpus_b()}, {}, "1,1,1",
                              {std::nullopt, std::nullopt, std::nullopt}, small_config());
  EXPECT_EQ(splits[0]->size(), 19);
  EXPECT_EQ(dynamic_cast<const BlendedDataset&>(*splits[0]).blending_index().dataset_index,
            build_exhaustive_blending_indices(std::vector<int64_t>{3, 16}).dataset_index);
}

TEST(Blend, SinglePrefixWithoutWeightIsPlainGptDataset) {
  const SplitDatasets splits = build_gpt_datasets({corpus_a()}, {}, "2,1,1", {10, 3, std::nullopt},
                                                  small_config());
  const auto* train = dynamic_cast<const GptDataset*>(splits[0].get());
  ASSERT_NE(train, nullptr);
  EXPECT_EQ(train->size(), 14);  // 10 samples need 2 epochs (see gpt_dataset_test)
  EXPECT_EQ(train->shuffle_index(),
            (std::vector<int64_t>{1, 0, 3, 2, 5, 4, 6, 9, 10, 12, 8, 11, 13, 7}));
  // A single prefix with a weight still goes through a BlendedDataset.
  const SplitDatasets weighted =
      build_gpt_datasets({corpus_a()}, {1.0}, "2,1,1", {10, 3, 2}, small_config());
  ASSERT_NE(dynamic_cast<const BlendedDataset*>(weighted[0].get()), nullptr);
  EXPECT_EQ(weighted[0]->size(), 10);
  EXPECT_EQ(dynamic_cast<const GptDataset&>(
                dynamic_cast<const BlendedDataset&>(*weighted[0]).dataset(0)).num_samples(),
            11);  // ceil(10 * 1.005)
}

TEST(Blend, ZeroWidthSplitsHaveNoDataset) {
  const SplitDatasets splits =
      build_gpt_datasets({corpus_a(), corpus_b()}, {0.5, 0.5}, "100,0,0", {8, 0, 0}, small_config());
  EXPECT_NE(splits[0], nullptr);
  EXPECT_EQ(splits[1], nullptr);
  EXPECT_EQ(splits[2], nullptr);
}

TEST(Blend, OversamplingIsReported) {
  auto a = std::make_shared<const GptDataset>(corpus_a(), DocumentRange{0, 6}, Split::kTrain,
                                              std::nullopt, small_config());  // 7 samples
  auto b = std::make_shared<const GptDataset>(corpus_b(), DocumentRange{0, 30}, Split::kTrain,
                                              std::nullopt, small_config());
  EXPECT_NO_THROW(BlendedDataset({a, b}, {0.5, 0.5}, 14));
  EXPECT_THROW(BlendedDataset({a, b}, {0.5, 0.5}, 16), UsageError);  // 8 from a
  EXPECT_THROW(BlendedDataset({a, b}, {0.5, 0.0}, 4), UsageError);
  EXPECT_THROW(build_gpt_datasets({corpus_a(), corpus_b()}, {0.5, 0.5}, "1,1,1",
                                  {4, std::nullopt, 4}, small_config()),
               UsageError);  // weights need sizes
}

// --train-data-path / --valid-data-path (blend_per_split): each split reads all of its own corpora.
TEST(Blend, PerSplitPathsReadWholeCorporaPerSplit) {
  std::array<SplitBlend, kNumSplits> blends;
  blends[0].corpora = {corpus_a()};
  blends[1].corpora = {corpus_a(), corpus_b()};
  blends[1].weights = {0.25, 0.75};
  const SplitDatasets splits = build_gpt_datasets_per_split(blends, {6, 8, 4}, small_config());
  ASSERT_NE(splits[0], nullptr);
  ASSERT_NE(splits[1], nullptr);
  EXPECT_EQ(splits[2], nullptr) << "no test paths: no test dataset";
  // The train split is the plain GptDataset over every document of corpus a.
  GptDataset whole(corpus_a(), DocumentRange{0, corpus_a()->num_documents()}, Split::kTrain, 6, small_config());
  ASSERT_EQ(splits[0]->size(), whole.size());
  for (int64_t i = 0; i < whole.size(); ++i) EXPECT_EQ(splits[0]->get(i).tokens, whole.get(i).tokens) << i;
  // The weighted validation blend has sum(ceil(8 * w)) = 2 + 6 samples.
  EXPECT_EQ(splits[1]->size(), 8);
}

}  // namespace
}  // namespace laoyao::data
