// GPTDataset index building and samples against Megatron-Core.
//
// How the expected numbers were derived: a throwaway Python transcription of Megatron-Core's
// gpt_dataset.py (_get_num_epochs, the separate-final-epoch rule, _build_document_index,
// _build_shuffle_index, _query_document_sample_shuffle_indices, _get_ltor_masks_and_position_ids),
// helpers.cpp::build_sample_idx and the builder's split ranges, run with numpy 1.24.2's real
// RandomState / default_rng. That transcription reproduces every value the reference records
// from a real Megatron run of the seed command (train len 133184, document_index[:8],
// shuffle_index[:8], sample 0 starting 3138; valid len 133124; test len 133373), which are
// asserted below as well.
#include "data/gpt_dataset.hpp"

#include <gtest/gtest.h>

#include "core/error.hpp"
#include "data/blended_dataset_builder.hpp"
#include "data/gpt_dataset_budget.hpp"
#include "data/mock_dataset.hpp"
#include "in_memory_corpus.hpp"

namespace laoyao::data {
namespace {

using testing::corpus_a;
using testing::kEod;

uint64_t weighted_checksum(const std::vector<int64_t>& v) {
  constexpr unsigned __int128 kMod = (static_cast<unsigned __int128>(1) << 61) - 1;
  unsigned __int128 acc = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    acc = (acc + static_cast<unsigned __int128>(i + 1) * static_cast<uint64_t>(v[i])) % kMod;
  }
  return static_cast<uint64_t>(acc);
}

std::vector<int64_t> head(const std::vector<int32_t>& v, size_t n, size_t from = 0) {
  return std::vector<int64_t>(v.begin() + from, v.begin() + from + n);
}
std::vector<int64_t> head(const std::vector<int64_t>& v, size_t n, size_t from = 0) {
  return std::vector<int64_t>(v.begin() + from, v.begin() + from + n);
}
std::vector<int64_t> sample_rows(const GptDataset& ds) {
  std::vector<int64_t> rows;
  for (int64_t r = 0; r < ds.sample_index_rows(); ++r) {
    rows.push_back(ds.sample_index(r).first);
    rows.push_back(ds.sample_index(r).second);
  }
  return rows;
}
using Row = std::pair<int64_t, int64_t>;

// ---------------------------------------------------------------------------------------------
// The seed vanilla command: --mock-data, NullTokenizer --vocab-size 32000, --seq-length 512,
// --seed 1234, --global-batch-size 32, --train-iters 10, --eval-iters 2, --eval-interval 10.

GptDatasetConfig vanilla_config() {
  GptDatasetConfig c;
  c.seq_length = 512;
  c.random_seed = 1234;
  c.eod_id = 31999;  // NullTokenizer: vocab 32000, eod = vocab - 1
  return c;
}

class SeedVanilla : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const SampleBudget budget = train_valid_test_num_samples(
        {.train_iters = 10, .global_batch_size = 32, .eval_iters = 2, .eval_interval = 10});
    auto mock = std::make_shared<const MockGptLowLevelDataset>(32000, 31999);
    splits_ = new SplitDatasets(
        build_mock_gpt_datasets(mock, {budget.train, budget.valid, budget.test}, vanilla_config()));
  }
  static void TearDownTestSuite() {
    delete splits_;
    splits_ = nullptr;
  }
  static const GptDataset& split(Split s) {
    return dynamic_cast<const GptDataset&>(*(*splits_)[static_cast<int>(s)]);
  }
  static SplitDatasets* splits_;
};
SplitDatasets* SeedVanilla::splits_ = nullptr;

TEST_F(SeedVanilla, SampleBudget) {
  EXPECT_EQ(train_valid_test_num_samples(
                {.train_iters = 10, .global_batch_size = 32, .eval_iters = 2, .eval_interval = 10}),
            (SampleBudget{320, 128, 64}));
  EXPECT_EQ(split(Split::kTrain).num_samples(), 320);
  EXPECT_EQ(split(Split::kValid).num_samples(), 128);
  EXPECT_EQ(split(Split::kTest).num_samples(), 64);
}

TEST_F(SeedVanilla, TrainIndices) {
  const GptDataset& train = split(Split::kTrain);
  EXPECT_EQ(train.documents(), (DocumentRange{0, 33333}));
  EXPECT_EQ(train.size(), 133184);  // reference [run]
  EXPECT_EQ(train.epochs().tokens_per_epoch, 68190290);
  EXPECT_EQ(train.epochs().num_epochs, 1);
  EXPECT_FALSE(train.epochs().separate_final_epoch);
  ASSERT_EQ(train.document_index().size(), 33333u);
  EXPECT_EQ(head(train.document_index(), 8),  // reference [run]
            (std::vector<int64_t>{30903, 11571, 3134, 32473, 27454, 4409, 3622, 19425}));
  EXPECT_EQ(train.document_index()[20000], 27029);
  EXPECT_EQ(train.document_index().back(), 27439);
  EXPECT_EQ(train.sample_index_rows(), 133185);
  for (int64_t r = 0; r < 5; ++r) EXPECT_EQ(train.sample_index(r), (Row{0, 512 * r}));
  EXPECT_EQ(train.sample_index(100000), (Row{25049, 1911}));
  EXPECT_EQ(train.sample_index(133184), (Row{33332, 3421}));
  EXPECT_EQ(head(train.shuffle_index(), 8),  // reference [run]
            (std::vector<int64_t>{63271, 59107, 2545, 44522, 130998, 59988, 63517, 104282}));
  EXPECT_EQ(train.shuffle_index().back(), 55495);
}

TEST_F(SeedVanilla, ValidAndTestIndices) {
  const GptDataset& valid = split(Split::kValid);
  EXPECT_EQ(valid.documents(), (DocumentRange{33333, 66667}));
  EXPECT_EQ(valid.size(), 133124);  // reference [run]
  EXPECT_EQ(valid.epochs().tokens_per_epoch, 68159742);
  EXPECT_EQ(head(valid.document_index(), 8),
            (std::vector<int64_t>{64237, 44904, 36467, 65807, 60788, 37742, 36955, 52758}));
  EXPECT_EQ(valid.document_index()[20000], 57520);
  EXPECT_EQ(valid.sample_index(1), (Row{1, 301}));
  EXPECT_EQ(valid.sample_index(100000), (Row{25000, 1895}));
  EXPECT_EQ(valid.sample_index(133124), (Row{33333, 2350}));
  EXPECT_EQ(head(valid.shuffle_index(), 8),
            (std::vector<int64_t>{77948, 46597, 96129, 79197, 12590, 9741, 55327, 108571}));

  const GptDataset& test = split(Split::kTest);
  EXPECT_EQ(test.documents(), (DocumentRange{66667, 100000}));
  EXPECT_EQ(test.size(), 133373);  // reference [run]
  EXPECT_EQ(test.epochs().tokens_per_epoch, 68287065);
  EXPECT_EQ(head(test.document_index(), 8),
            (std::vector<int64_t>{97570, 78238, 69801, 99140, 94121, 71076, 70289, 86092}));
  EXPECT_EQ(test.document_index().back(), 94106);
  EXPECT_EQ(test.sample_index(3), (Row{1, 82}));
  EXPECT_EQ(test.sample_index(133373), (Row{33332, 84}));
  EXPECT_EQ(head(test.shuffle_index(), 8),
            (std::vector<int64_t>{113528, 36441, 39539, 96588, 34425, 26406, 13723, 69859}));
}

TEST_F(SeedVanilla, FirstSamples) {
  const GptSample s = split(Split::kTrain).get(0);  // reference [run]: starts 3138 3139 3140
  ASSERT_EQ(s.tokens.size(), 512u);
  EXPECT_EQ(head(s.tokens, 8), (std::vector<int64_t>{3138, 3139, 3140, 3141, 3142, 3143, 3144, 3145}));
  EXPECT_EQ(head(s.tokens, 4, 508), (std::vector<int64_t>{3646, 3647, 3648, 3649}));
  EXPECT_EQ(head(s.labels, 4, 508), (std::vector<int64_t>{3647, 3648, 3649, 3650}));
  for (int t = 0; t < 512; ++t) {
    ASSERT_EQ(s.loss_mask[t], 1.0f);
    ASSERT_EQ(s.position_ids[t], t);
    if (t + 1 < 512) {
      ASSERT_EQ(s.labels[t], s.tokens[t + 1]);
    }
  }
  EXPECT_EQ(head(split(Split::kValid).get(0).tokens, 3), (std::vector<int64_t>{2312, 2313, 2314}));
  EXPECT_EQ(head(split(Split::kTest).get(0).tokens, 3), (std::vector<int64_t>{1070, 1071, 1072}));
}

TEST_F(SeedVanilla, SamplesCrossingDocumentBoundaries) {
  // Train sample 15 (row 65887 = (16535, 2558) .. (16536, 316)) has its first EOD at 195.
  const GptSample s = split(Split::kTrain).get(15);
  EXPECT_EQ(head(s.tokens, 5, 193), (std::vector<int64_t>{2752, 2753, 31999, 1, 2}));
  EXPECT_EQ(s.loss_mask[195], 1.0f);  // default: loss on EOD too, positions not reset
  EXPECT_EQ(s.position_ids[196], 196);
  const GptSample v = split(Split::kValid).get(1);
  EXPECT_EQ(head(v.tokens, 5, 215), (std::vector<int64_t>{1900, 1901, 31999, 1, 2}));
  const GptSample t = split(Split::kTest).get(1);
  EXPECT_EQ(head(t.tokens, 5, 458), (std::vector<int64_t>{3255, 3256, 31999, 1, 2}));
}

TEST_F(SeedVanilla, ChecksumOfFirst64SamplesPerSplit) {
  // sum((i+1) * token) mod 2^61-1 over the tokens of samples 0..63 concatenated, and EOD count.
  const std::array<uint64_t, 3> expected_checksum{719599108071ull, 785842437749ull, 856336509979ull};
  const std::array<int, 3> expected_eods{13, 17, 11};
  for (int s = 0; s < 3; ++s) {
    std::vector<int64_t> all;
    for (int64_t i = 0; i < 64; ++i) {
      const GptSample x = split(static_cast<Split>(s)).get(i);
      all.insert(all.end(), x.tokens.begin(), x.tokens.end());
    }
    EXPECT_EQ(weighted_checksum(all), expected_checksum[s]) << split_name(static_cast<Split>(s));
    EXPECT_EQ(std::count(all.begin(), all.end(), 31999), expected_eods[s]);
  }
}

TEST_F(SeedVanilla, MicroBatchOfARankReadsTheRightSamples) {
  // mbs 4, dp 2, gbs 32 -> 4 micro-batches; iteration 2, micro-batch 3, DP rank 1 reads
  // dataset indices ((2-1)*4 + 3)*4*2 + 1*4 + [0, 4) = 60..63.
  const MicroBatchLayout layout{.micro_batch_size = 4, .data_parallel_size = 2, .num_microbatches = 4};
  const std::vector<int64_t> idx = microbatch_sample_indices(layout, 2, 3, 1);
  EXPECT_EQ(idx, (std::vector<int64_t>{60, 61, 62, 63}));
  const std::vector<std::vector<int64_t>> expected{
      {324, 325, 326}, {1005, 1006, 1007}, {2196, 2197, 2198}, {1899, 1900, 1901}};
  for (size_t q = 0; q < 4; ++q) {
    EXPECT_EQ(head(split(Split::kTrain).get(idx[q]).tokens, 3), expected[q]) << "sample " << idx[q];
  }
}

// ---------------------------------------------------------------------------------------------
// More than one epoch of the mock train split (133184 samples per epoch).

TEST(GptDatasetMultiEpoch, SeparateFinalEpochWhenItIsSmall) {
  // 134184 samples: the second epoch contributes 1000 < int(0.8 * 133184) samples, so it is
  // shuffled on its own, after the first.
  auto mock = std::make_shared<const MockGptLowLevelDataset>(32000, 31999);
  const GptDataset ds(mock, {0, 33333}, Split::kTrain, 133184 + 1000, vanilla_config());
  EXPECT_EQ(ds.epochs().num_epochs, 2);
  EXPECT_TRUE(ds.epochs().separate_final_epoch);
  EXPECT_EQ(ds.epochs().num_samples_sans_final_epoch, 133184);
  EXPECT_EQ(ds.size(), 266368);
  ASSERT_EQ(ds.document_index().size(), 66666u);
  // The first epoch is shuffled exactly like a one-epoch index.
  EXPECT_EQ(head(ds.document_index(), 8),
            (std::vector<int64_t>{30903, 11571, 3134, 32473, 27454, 4409, 3622, 19425}));
  EXPECT_EQ(head(ds.document_index(), 8, 33333),
            (std::vector<int64_t>{29072, 25520, 26790, 22197, 20588, 2923, 22729, 11119}));
  EXPECT_EQ(ds.sample_index(133184), (Row{33332, 3421}));
  EXPECT_EQ(ds.sample_index(133185), (Row{33333, 430}));
  EXPECT_EQ(ds.sample_index(266368), (Row{66665, 1543}));
  EXPECT_EQ(head(ds.shuffle_index(), 8),
            (std::vector<int64_t>{47210, 37399, 123089, 41839, 70394, 35497, 115550, 43042}));
  EXPECT_EQ(head(ds.shuffle_index(), 8, 133184),
            (std::vector<int64_t>{215623, 180893, 154643, 265684, 158194, 239316, 169882, 210050}));
  EXPECT_EQ(ds.shuffle_index().back(), 265472);
  // The two shuffles never mix the epochs.
  for (size_t i = 0; i < ds.shuffle_index().size(); ++i) {
    ASSERT_EQ(ds.shuffle_index()[i] < 133184, i < 133184) << i;
  }
  EXPECT_EQ(head(ds.get(133184).tokens, 6), (std::vector<int64_t>{449, 450, 451, 452, 453, 454}));
  EXPECT_EQ(head(ds.get(266367).tokens, 6), (std::vector<int64_t>{3387, 3388, 3389, 3390, 3391, 3392}));
}

TEST(GptDatasetMultiEpoch, OneShuffleWhenTheFinalEpochIsLarge) {
  // 256368 samples: the second epoch contributes 123184 >= 106547 samples: one global shuffle.
  auto mock = std::make_shared<const MockGptLowLevelDataset>(32000, 31999);
  const GptDataset ds(mock, {0, 33333}, Split::kTrain, 2 * 133184 - 10000, vanilla_config());
  EXPECT_EQ(ds.epochs().num_epochs, 2);
  EXPECT_FALSE(ds.epochs().separate_final_epoch);
  EXPECT_EQ(ds.size(), 266368);
  EXPECT_EQ(head(ds.document_index(), 8),
            (std::vector<int64_t>{21653, 7273, 15558, 10003, 11086, 3399, 7986, 31285}));
  EXPECT_EQ(head(ds.document_index(), 8, 33333),
            (std::vector<int64_t>{580, 17123, 26654, 1733, 11866, 1195, 6782, 32894}));
  EXPECT_EQ(ds.sample_index(133184), (Row{33338, 751}));
  EXPECT_EQ(ds.sample_index(266368), (Row{66665, 3336}));
  EXPECT_EQ(head(ds.shuffle_index(), 8),
            (std::vector<int64_t>{218094, 227523, 139259, 231806, 119299, 142201, 260301, 203762}));
  EXPECT_EQ(head(ds.shuffle_index(), 8, 133184),
            (std::vector<int64_t>{214324, 234116, 201082, 18984, 68204, 192800, 194967, 159164}));
  EXPECT_EQ(ds.shuffle_index().back(), 220694);
  EXPECT_EQ(head(ds.get(133184).tokens, 6), (std::vector<int64_t>{377, 378, 379, 380, 381, 382}));
  EXPECT_EQ(head(ds.get(266367).tokens, 6), (std::vector<int64_t>{413, 414, 415, 416, 417, 418}));
}

// ---------------------------------------------------------------------------------------------
// A 12-document in-memory corpus (lengths 5 3 7 1 4 9 2 6 8 3 5 11, tokens 1000*(d+1)+k, EOD 7),
// split "2,1,1": train documents [0, 6) hold 29 tokens, i.e. 7 samples of 4+1 tokens per epoch.

GptDatasetConfig small_config(int64_t seed = 1234) {
  GptDatasetConfig c;
  c.seq_length = 4;
  c.random_seed = seed;
  c.eod_id = kEod;
  return c;
}

struct SmallCase {
  std::optional<int64_t> num_samples;
  int64_t epochs;
  bool separate;
  std::vector<int64_t> document_index, rows, shuffle;
  std::vector<std::vector<int64_t>> texts;
};

TEST(GptDatasetSmall, IndicesAndTextsForSeveralSampleCounts) {
  const std::vector<SmallCase> cases{
      // 10 samples: 2 epochs, final epoch gives 3 < int(0.8*7) = 5 -> separate.
      {10, 2, true,
       {2, 1, 5, 0, 4, 3, 0, 4, 3, 2, 5, 1},
       {0, 0, 0, 4, 1, 1, 2, 2, 2, 6, 3, 1, 4, 0, 5, 0, 6, 3, 7, 2, 9, 1, 9, 5, 10, 2, 10, 6, 11, 1},
       {1, 0, 3, 2, 5, 4, 6, 9, 10, 12, 8, 11, 13, 7},
       {{3004, 3005, 7, 2000, 2001}, {3000, 3001, 3002, 3003, 3004}, {6002, 6003, 6004, 6005, 6006},
        {2001, 7, 6000, 6001, 6002}, {1001, 1002, 1003, 7, 5000}, {6006, 6007, 7, 1000, 1001},
        {5000, 5001, 5002, 7, 7}, {5002, 7, 7, 3000, 3001}, {3001, 3002, 3003, 3004, 3005},
        {6002, 6003, 6004, 6005, 6006}, {1003, 7, 5000, 5001, 5002}, {3005, 7, 6000, 6001, 6002},
        {6006, 6007, 7, 2000, 2001}, {7, 1000, 1001, 1002, 1003}}},
      // 13 samples: final epoch gives 6 >= 5 -> one shuffle over both epochs.
      {13, 2, false,
       {1, 2, 5, 2, 3, 4, 1, 0, 4, 5, 0, 3},
       {0, 0, 1, 1, 1, 5, 2, 2, 2, 6, 3, 1, 3, 5, 5, 1, 6, 1, 7, 2, 8, 1, 9, 1, 9, 5, 10, 0, 10, 4},
       {7, 11, 2, 3, 1, 9, 5, 4, 0, 8, 6, 10, 13, 12},
       {{5001, 5002, 7, 2000, 2001}, {6001, 6002, 6003, 6004, 6005}, {3005, 7, 6000, 6001, 6002},
        {6002, 6003, 6004, 6005, 6006}, {3001, 3002, 3003, 3004, 3005}, {1002, 1003, 7, 5000, 5001},
        {3001, 3002, 3003, 3004, 3005}, {6006, 6007, 7, 3000, 3001}, {2000, 2001, 7, 3000, 3001},
        {2001, 7, 1000, 1001, 1002}, {3005, 7, 7, 5000, 5001}, {5001, 5002, 7, 6000, 6001},
        {1000, 1001, 1002, 1003, 7}, {6005, 6006, 6007, 7, 1000}}},
      // 16 samples: 3 epochs, the first two shuffled together, the third (2 samples) alone.
      {16, 3, true,
       {1, 2, 5, 2, 3, 4, 1, 0, 4, 5, 0, 3, 1, 0, 3, 2, 5, 4},
       {0, 0, 1, 1, 1, 5, 2, 2, 2, 6, 3, 1, 3, 5, 5, 1, 6, 1, 7, 2, 8, 1, 9, 1, 9, 5,
        10, 0, 10, 4, 12, 2, 13, 3, 15, 1, 15, 5, 16, 2, 16, 6, 17, 1},
       {7, 4, 1, 11, 3, 10, 2, 13, 6, 9, 12, 5, 0, 8, 19, 15, 14, 18, 17, 16, 20},
       {{5001, 5002, 7, 2000, 2001}, {6006, 6007, 7, 3000, 3001}, {3001, 3002, 3003, 3004, 3005},
        {6001, 6002, 6003, 6004, 6005}, {6002, 6003, 6004, 6005, 6006}, {5001, 5002, 7, 6000, 6001},
        {3005, 7, 6000, 6001, 6002}, {1000, 1001, 1002, 1003, 7}, {3005, 7, 7, 5000, 5001},
        {1002, 1003, 7, 5000, 5001}, {6005, 6006, 6007, 7, 1000}, {3001, 3002, 3003, 3004, 3005},
        {2000, 2001, 7, 3000, 3001}, {2001, 7, 1000, 1001, 1002}, {6002, 6003, 6004, 6005, 6006},
        {7, 1000, 1001, 1002, 1003}, {7, 7, 2000, 2001, 7}, {3005, 7, 6000, 6001, 6002},
        {3001, 3002, 3003, 3004, 3005}, {1003, 7, 7, 3000, 3001}, {6006, 6007, 7, 5000, 5001}}},
      // 20 samples: 3 epochs, final epoch gives 6 -> one shuffle.
      {20, 3, false,
       {5, 3, 5, 4, 1, 2, 0, 2, 4, 1, 1, 3, 2, 4, 0, 5, 0, 3},
       {0, 0, 0, 4, 0, 8, 2, 2, 2, 6, 3, 1, 4, 1, 5, 2, 5, 6, 6, 3, 7, 2, 7, 6,
        8, 3, 10, 0, 12, 0, 12, 4, 13, 1, 14, 1, 15, 0, 15, 4, 15, 8, 16, 3},
       {8, 19, 14, 1, 4, 11, 20, 17, 13, 9, 0, 7, 3, 10, 6, 2, 5, 12, 16, 18, 15},
       {{7, 1000, 1001, 1002, 1003}, {6004, 6005, 6006, 6007, 7}, {3000, 3001, 3002, 3003, 3004},
        {6004, 6005, 6006, 6007, 7}, {6006, 6007, 7, 5000, 5001}, {7, 5000, 5001, 5002, 7},
        {7, 1000, 1001, 1002, 1003}, {1001, 1002, 1003, 7, 6000}, {2000, 2001, 7, 7, 3000},
        {1003, 7, 3000, 3001, 3002}, {6000, 6001, 6002, 6003, 6004}, {3002, 3003, 3004, 3005, 7},
        {6002, 6003, 6004, 6005, 6006}, {3002, 3003, 3004, 3005, 7}, {2001, 7, 3000, 3001, 3002},
        {7, 7, 6000, 6001, 6002}, {5001, 5002, 7, 2000, 2001}, {7, 2000, 2001, 7, 2000},
        {5001, 5002, 7, 1000, 1001}, {6000, 6001, 6002, 6003, 6004}, {3004, 3005, 7, 5000, 5001}}},
      // No sample count (Megatron's None): one epoch.
      {std::nullopt, 1, false,
       {2, 1, 5, 0, 4, 3},
       {0, 0, 0, 4, 1, 1, 2, 2, 2, 6, 3, 1, 4, 0, 5, 0},
       {5, 0, 3, 4, 2, 6, 1},
       {{1001, 1002, 1003, 7, 5000}, {3000, 3001, 3002, 3003, 3004}, {6002, 6003, 6004, 6005, 6006},
        {6006, 6007, 7, 1000, 1001}, {2001, 7, 6000, 6001, 6002}, {5000, 5001, 5002, 7, 7},
        {3004, 3005, 7, 2000, 2001}}},
  };
  const auto corpus = corpus_a();
  for (const SmallCase& c : cases) {
    SCOPED_TRACE(c.num_samples ? std::to_string(*c.num_samples) : std::string("None"));
    const GptDataset ds(corpus, {0, 6}, Split::kTrain, c.num_samples, small_config());
    EXPECT_EQ(ds.epochs().tokens_per_epoch, 29);
    EXPECT_EQ(ds.epochs().num_epochs, c.epochs);
    EXPECT_EQ(ds.epochs().separate_final_epoch, c.separate);
    EXPECT_EQ(head(ds.document_index(), ds.document_index().size()), c.document_index);
    EXPECT_EQ(sample_rows(ds), c.rows);
    EXPECT_EQ(ds.shuffle_index(), c.shuffle);
    ASSERT_EQ(ds.size(), static_cast<int64_t>(c.texts.size()));
    for (int64_t i = 0; i < ds.size(); ++i) EXPECT_EQ(ds.text(i), c.texts[i]) << "sample " << i;
  }
}

TEST(GptDatasetSmall, ResetPositionIdsAndEodMaskLoss) {
  // Seed 99, 10 samples, --reset-position-ids --eod-mask-loss.
  GptDatasetConfig config = small_config(99);
  config.reset_position_ids = true;
  config.eod_mask_loss = true;
  const GptDataset ds(corpus_a(), {0, 6}, Split::kTrain, 10, config);
  struct Expected {
    std::vector<int64_t> tokens, labels;
    std::vector<float> loss_mask;
    std::vector<int64_t> positions;
  };
  const std::vector<Expected> expected{
      {{5001, 5002, 7, 1000}, {5002, 7, 1000, 1001}, {1, 1, 0, 1}, {0, 1, 2, 0}},
      {{6004, 6005, 6006, 6007}, {6005, 6006, 6007, 7}, {1, 1, 1, 1}, {0, 1, 2, 3}},
      {{3000, 3001, 3002, 3003}, {3001, 3002, 3003, 3004}, {1, 1, 1, 1}, {0, 1, 2, 3}},
      {{6000, 6001, 6002, 6003}, {6001, 6002, 6003, 6004}, {1, 1, 1, 1}, {0, 1, 2, 3}},
      {{7, 7, 2000, 2001}, {7, 2000, 2001, 7}, {0, 0, 1, 1}, {0, 0, 0, 1}},
      {{1001, 1002, 1003, 7}, {1002, 1003, 7, 6000}, {1, 1, 1, 0}, {0, 1, 2, 3}},
      {{3004, 3005, 7, 5000}, {3005, 7, 5000, 5001}, {1, 1, 0, 1}, {0, 1, 2, 0}},
      {{7, 7, 2000, 2001}, {7, 2000, 2001, 7}, {0, 0, 1, 1}, {0, 0, 0, 1}},
      {{7, 5000, 5001, 5002}, {5000, 5001, 5002, 7}, {0, 1, 1, 1}, {0, 0, 1, 2}},
      {{7, 6000, 6001, 6002}, {6000, 6001, 6002, 6003}, {0, 1, 1, 1}, {0, 0, 1, 2}},
      {{3002, 3003, 3004, 3005}, {3003, 3004, 3005, 7}, {1, 1, 1, 1}, {0, 1, 2, 3}},
      {{6007, 7, 3000, 3001}, {7, 3000, 3001, 3002}, {1, 0, 1, 1}, {0, 1, 0, 1}},
      {{7, 1000, 1001, 1002}, {1000, 1001, 1002, 1003}, {0, 1, 1, 1}, {0, 0, 1, 2}},
      {{6003, 6004, 6005, 6006}, {6004, 6005, 6006, 6007}, {1, 1, 1, 1}, {0, 1, 2, 3}},
  };
  ASSERT_EQ(ds.size(), static_cast<int64_t>(expected.size()));
  for (int64_t i = 0; i < ds.size(); ++i) {
    const GptSample s = ds.get(i);
    EXPECT_EQ(s.tokens, expected[i].tokens) << i;
    EXPECT_EQ(s.labels, expected[i].labels) << i;
    EXPECT_EQ(s.loss_mask, expected[i].loss_mask) << i;
    EXPECT_EQ(s.position_ids, expected[i].positions) << i;
  }
}

TEST(GptDatasetSmall, ValidationKeepsOrDropsTheLastPartialSample) {
  // Valid documents [6, 9): lengths 2 6 8, 16 tokens. Dropping: (16-1)//4 = 3 samples; keeping:
  // ceil(15/4) = 4, the last one padded with pad id -1 (tokens/labels 0, no loss on the pad).
  const auto corpus = corpus_a();
  const GptDataset dropped(corpus, {6, 9}, Split::kValid, 3, small_config());
  EXPECT_EQ(sample_rows(dropped), (std::vector<int64_t>{0, 0, 1, 2, 2, 0, 2, 4}));
  EXPECT_EQ(dropped.shuffle_index(), (std::vector<int64_t>{1, 2, 0}));

  GptDatasetConfig keep = small_config();
  keep.drop_last_partial_validation_sequence = false;
  const GptDataset kept(corpus, {6, 9}, Split::kValid, 3, keep);
  EXPECT_EQ(sample_rows(kept), (std::vector<int64_t>{0, 0, 1, 2, 2, 0, 2, 4, 2, 7}));
  EXPECT_EQ(kept.shuffle_index(), (std::vector<int64_t>{1, 2, 3, 0}));
  EXPECT_EQ(kept.text(2), (std::vector<int64_t>{9004, 9005, 9006, 7, -1}));
  const GptSample padded = kept.get(2);
  EXPECT_EQ(padded.tokens, (std::vector<int64_t>{9004, 9005, 9006, 7}));
  EXPECT_EQ(padded.labels, (std::vector<int64_t>{9005, 9006, 7, 0}));
  EXPECT_EQ(padded.loss_mask, (std::vector<float>{1, 1, 1, 0}));
  EXPECT_EQ(kept.get(3).tokens, (std::vector<int64_t>{7000, 7, 8000, 8001}));

  // The flag only applies to the validation split.
  const GptDataset train(corpus, {6, 9}, Split::kTrain, 3, keep);
  EXPECT_EQ(train.size(), 3);
}

TEST(GptDatasetSmall, WithoutTheExtraToken) {
  // add_extra_token_to_sequence = false: samples of exactly seq_length tokens, labels rolled
  // with the pad id (-> 0, no loss) in the last place.
  GptDatasetConfig config = small_config();
  config.add_extra_token_to_sequence = false;
  const GptDataset ds(corpus_a(), {0, 6}, Split::kTrain, 5, config);
  EXPECT_EQ(ds.epochs().num_epochs, 1);
  EXPECT_EQ(sample_rows(ds), (std::vector<int64_t>{0, 0, 0, 4, 1, 1, 2, 2, 2, 6, 3, 1, 3, 5, 4, 4}));
  EXPECT_EQ(ds.shuffle_index(), (std::vector<int64_t>{5, 0, 3, 4, 2, 6, 1}));
  const std::vector<std::vector<int64_t>> tokens{
      {1001, 1002, 1003, 7}, {3000, 3001, 3002, 3003}, {6002, 6003, 6004, 6005},
      {6006, 6007, 7, 1000}, {2001, 7, 6000, 6001},    {5000, 5001, 5002, 7},
      {3004, 3005, 7, 2000}};
  for (int64_t i = 0; i < ds.size(); ++i) {
    const GptSample s = ds.get(i);
    EXPECT_EQ(s.tokens, tokens[i]) << i;
    EXPECT_EQ(s.labels, (std::vector<int64_t>{tokens[i][1], tokens[i][2], tokens[i][3], 0})) << i;
    EXPECT_EQ(s.loss_mask, (std::vector<float>{1, 1, 1, 0})) << i;
  }
}

TEST(GptDatasetSmall, ResetAttentionMaskGivesEachQueryItsDocumentsFirstKey) {
  GptDatasetConfig config = small_config(99);
  config.reset_attention_mask = true;
  const GptDataset ds(corpus_a(), {0, 6}, Split::kTrain, 10, config);
  const int64_t eod = config.eod_id;
  for (int64_t i = 0; i < ds.size(); ++i) {
    const GptSample sample = ds.get(i);
    const int64_t s = static_cast<int64_t>(sample.tokens.size());
    ASSERT_EQ(static_cast<int64_t>(sample.key_start.size()), s);
    // Megatron's mask: tril(ones), then for each EOD at e, mask[e+1:, :e+1] = 0; a row's first
    // unmasked key is key_start.
    std::vector<std::vector<int>> keep(s, std::vector<int>(s, 0));
    for (int64_t q = 0; q < s; ++q)
      for (int64_t k = 0; k <= q; ++k) keep[q][k] = 1;
    for (int64_t e = 0; e < s; ++e)
      if (sample.tokens[e] == eod)
        for (int64_t q = e + 1; q < s; ++q)
          for (int64_t k = 0; k <= e; ++k) keep[q][k] = 0;
    for (int64_t q = 0; q < s; ++q)
      for (int64_t k = 0; k < s; ++k)
        EXPECT_EQ(keep[q][k], k >= sample.key_start[q] && k <= q) << "sample " << i << " query " << q << " key " << k;
    EXPECT_EQ(sample.position_ids, (std::vector<int64_t>{0, 1, 2, 3})) << "positions reset only with their own flag";
  }
  // Two samples by hand (seed 99's samples 4 and 11): 7 is the EOD.
  EXPECT_EQ(ds.get(4).tokens, (std::vector<int64_t>{7, 7, 2000, 2001}));
  EXPECT_EQ(ds.get(4).key_start, (std::vector<int32_t>{0, 1, 2, 2}));
  EXPECT_EQ(ds.get(11).tokens, (std::vector<int64_t>{6007, 7, 3000, 3001}));
  EXPECT_EQ(ds.get(11).key_start, (std::vector<int32_t>{0, 0, 2, 2}));

  // Without the dataloader's mask (Bridge's skip_getting_attention_mask_from_dataset), Megatron's
  // attention is plain causal: no key_start; nor without the flag.
  config.create_attention_mask = false;
  EXPECT_TRUE(GptDataset(corpus_a(), {0, 6}, Split::kTrain, 10, config).get(4).key_start.empty());
  EXPECT_TRUE(GptDataset(corpus_a(), {0, 6}, Split::kTrain, 10, small_config(99)).get(4).key_start.empty());
}

TEST(GptDatasetSmall, RefusedAndInvalidSettings) {
  const auto corpus = corpus_a();
  GptDatasetConfig short_seq = small_config();
  short_seq.seq_length = 1;
  EXPECT_THROW(GptDataset(corpus, {0, 6}, Split::kTrain, 4, short_seq), UsageError);
  // An empty split has no tokens to draw from.
  EXPECT_THROW(GptDataset(corpus, {3, 3}, Split::kTrain, 4, small_config()), UsageError);
  EXPECT_THROW(GptDataset(corpus, {0, 6}, Split::kTrain, -1, small_config()), UsageError);
  EXPECT_THROW(GptDataset(corpus, {0, 13}, Split::kTrain, 4, small_config()), Error);
  const GptDataset ok(corpus, {0, 6}, Split::kTrain, 4, small_config());
  EXPECT_THROW(ok.get(ok.size()), Error);
  EXPECT_THROW(ok.get(-1), Error);
}

TEST(GptDatasetSmall, SampleIndexKeepPartialCountIsSinglePrecision) {
  std::vector<int32_t> sizes{9};
  const std::vector<int32_t> doc_index{0};
  // 9 tokens, seq 4, keep partial: ceil((9-1)/4) = 2 samples, rows (0,0) (0,4) (0,8).
  EXPECT_EQ(build_sample_index(sizes, 0, doc_index, 4, 1, 9, false, true),
            (std::vector<int64_t>{0, 0, 0, 4, 0, 8}));
  // 10 tokens: ceil(9/4) = 3 samples; the last, partial one ends at the document's end.
  sizes = {10};
  EXPECT_EQ(build_sample_index(sizes, 0, doc_index, 4, 1, 10, false, true),
            (std::vector<int64_t>{0, 0, 0, 4, 0, 8, 0, 9}));
  EXPECT_EQ(build_sample_index(sizes, 0, doc_index, 4, 1, 10, true, true),
            (std::vector<int64_t>{0, 0, 0, 4, 0, 8}));
  // helpers.cpp computes ceil(float(tokens - 1) / seq_length) in float32:
  // 16777218 tokens, seq 65536 -> float32 gives 256 samples where the exact ceiling is 257.
  sizes = {16777218};
  EXPECT_EQ(build_sample_index(sizes, 0, doc_index, 65536, 1, 16777218, false, true).size(),
            2u * 257u);
  // 33566719 tokens, seq 8191 -> float32 gives 4099 where the exact ceiling is 4098: as in
  // helpers.cpp the extra sample starts and ends on the document's last token.
  sizes = {33566719};
  const std::vector<int64_t> rows =
      build_sample_index(sizes, 0, doc_index, 8191, 1, 33566719, false, true);
  ASSERT_EQ(rows.size(), 2u * 4100u);
  EXPECT_EQ(std::vector<int64_t>(rows.end() - 4, rows.end()),
            (std::vector<int64_t>{0, 33566718, 0, 33566718}));
  // Running out of documents before the last sample is where Megatron's assert fires.
  sizes = {10};
  EXPECT_THROW(build_sample_index(sizes, 0, doc_index, 4, 1, 20, true, true), Error);
}

// ---------------------------------------------------------------------------------------------
// Sample budgets and the sampler's micro-batch order.

TEST(SampleBudgetTest, MegatronFormulas) {
  // The reference's observed run: 30 iters, gbs 32, eval-interval 10, eval-iters 2.
  EXPECT_EQ(train_valid_test_num_samples(
                {.train_iters = 30, .global_batch_size = 32, .eval_iters = 2, .eval_interval = 10}),
            (SampleBudget{960, 256, 64}));
  // No eval_interval: no validation samples (Bridge).
  EXPECT_EQ(train_valid_test_num_samples({.train_iters = 30, .global_batch_size = 32, .eval_iters = 2}),
            (SampleBudget{960, 0, 64}));
  // --train-samples replaces iters*gbs; 25 // 7 = 3 -> valid (3+1)*5*8; eval gbs 8.
  EXPECT_EQ(train_valid_test_num_samples({.train_iters = 25,
                                          .train_samples = 1000,
                                          .global_batch_size = 40,
                                          .eval_iters = 5,
                                          .eval_interval = 7,
                                          .eval_global_batch_size = 8}),
            (SampleBudget{1000, 160, 40}));
  EXPECT_THROW(train_valid_test_num_samples({.train_iters = 1, .global_batch_size = 0}), UsageError);
  EXPECT_THROW(train_valid_test_num_samples({.train_iters = -1, .global_batch_size = 8}), UsageError);
}

TEST(SampleBudgetTest, MicroBatchesTileEachIterationWithoutOverlap) {
  const MicroBatchLayout layout{.micro_batch_size = 3, .data_parallel_size = 4, .num_microbatches = 5};
  EXPECT_EQ(microbatch_sample_indices(layout, 1, 0, 0), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(microbatch_sample_indices(layout, 1, 0, 3), (std::vector<int64_t>{9, 10, 11}));
  EXPECT_EQ(microbatch_sample_indices(layout, 1, 1, 0), (std::vector<int64_t>{12, 13, 14}));
  EXPECT_EQ(microbatch_sample_indices(layout, 3, 2, 1), (std::vector<int64_t>{147, 148, 149}));
  for (int64_t k = 1; k <= 3; ++k) {
    std::vector<int> seen(60, 0);
    for (int64_t m = 0; m < 5; ++m) {
      for (int64_t r = 0; r < 4; ++r) {
        for (int64_t i : microbatch_sample_indices(layout, k, m, r)) {
          ASSERT_GE(i, (k - 1) * 60);
          ASSERT_LT(i, k * 60);
          ++seen[static_cast<size_t>(i - (k - 1) * 60)];
        }
      }
    }
    for (int c : seen) EXPECT_EQ(c, 1);
  }
  // Validation continues from its own consumed count.
  EXPECT_EQ(microbatch_first_sample(layout, 64, 1, 2), 64 + 12 + 6);
  EXPECT_THROW(microbatch_sample_indices(layout, 0, 0, 0), Error);
  EXPECT_THROW(microbatch_sample_indices(layout, 1, 5, 0), Error);
  EXPECT_THROW(microbatch_sample_indices(layout, 1, 0, 4), Error);
}

}  // namespace
}  // namespace laoyao::data
