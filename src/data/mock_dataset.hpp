// Megatron-Core's MockGPTLowLevelDataset (megatron/core/datasets/gpt_dataset.py, current
// version with tokens taken modulo the vocabulary): 100,000 documents whose lengths are
// numpy.random.default_rng(0).integers(1, 4096, size=100000, dtype=int32) and whose tokens are
// 1, 2, ..., L-1 (mod vocab_size) followed by the EOD id. Tokens are computed on demand; only the
// 100,000 lengths are stored.
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "data/gpt_dataset_split.hpp"
#include "data/low_level_dataset.hpp"

namespace laoyao::data {

class MockGptLowLevelDataset final : public LowLevelDataset {
 public:
  static constexpr int64_t kNumDocuments = 100000;  // Megatron's hard-coded `size`
  static constexpr uint64_t kLengthSeed = 0;        // hard-coded, not --seed
  static constexpr int32_t kMaxSequenceLength = 4096;  // exclusive bound of the lengths

  // `vocab_size` and `eod_id` are the tokenizer's (Megatron reads tokenizer.vocab_size and
  // tokenizer.eod). With Megatron's current NullTokenizer (since 2026-04-22):
  // vocab_size = --vocab-size and eod_id = vocab_size - 1 (--null-tokenizer-eod-id overrides
  // it); older Megatron used vocab_size + 1 and eod = --vocab-size. Pass the tokenizer's own
  // vocab size, not the padded one. Throws laoyao::UsageError if vocab_size < 1.
  MockGptLowLevelDataset(int64_t vocab_size, int64_t eod_id);

  int64_t num_documents() const override { return kNumDocuments; }
  int64_t document_length(int64_t doc) const override;
  void read_tokens(int64_t doc, int64_t offset, int64_t length,
                   std::vector<int64_t>& out) const override;
  std::string name() const override { return "mock"; }

  // Token `position` of document `doc`: (position + 1) % vocab_size, or the EOD id for the
  // last position.
  int64_t token(int64_t doc, int64_t position) const;
  const std::vector<int32_t>& sequence_lengths() const { return lengths_; }
  int64_t vocab_size() const { return vocab_size_; }
  int64_t eod_id() const { return eod_id_; }

 private:
  void check_doc(int64_t doc) const;
  int64_t vocab_size_;
  int64_t eod_id_;
  std::vector<int32_t> lengths_;
};

// Mock data ignores the user's --split: BlendedMegatronDatasetConfig forces "1,1,1", which
// gives train documents [0, 33333), valid [33333, 66667) and test [66667, 100000).
inline constexpr std::string_view kMockSplit = "1,1,1";
std::array<std::optional<DocumentRange>, kNumSplits> mock_split_document_ranges();

}  // namespace laoyao::data
