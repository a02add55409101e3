#include "data/mock_dataset.hpp"

#include "core/error.hpp"
#include "data/numpy_random.hpp"

namespace laoyao::data {

MockGptLowLevelDataset::MockGptLowLevelDataset(int64_t vocab_size, int64_t eod_id)
    : vocab_size_(vocab_size), eod_id_(eod_id) {
  if (vocab_size < 1) {
    throw UsageError("mock data: vocab size must be >= 1 (the tokenizer's vocab size, e.g. "
                     "--vocab-size for NullTokenizer), got " + std::to_string(vocab_size));
  }
  lengths_ = default_rng(kLengthSeed).integers_int32(1, kMaxSequenceLength, kNumDocuments);
}

void MockGptLowLevelDataset::check_doc(int64_t doc) const {
  if (doc < 0 || doc >= kNumDocuments) {
    throw Error("mock: document " + std::to_string(doc) + " out of range [0, " +
                std::to_string(kNumDocuments) + ")");
  }
}

int64_t MockGptLowLevelDataset::document_length(int64_t doc) const {
  check_doc(doc);
  return lengths_[static_cast<size_t>(doc)];
}

int64_t MockGptLowLevelDataset::token(int64_t doc, int64_t position) const {
  const int64_t length = document_length(doc);
  if (position < 0 || position >= length) {
    throw Error("mock: position " + std::to_string(position) + " outside document " +
                std::to_string(doc) + " of length " + std::to_string(length));
  }
  return position == length - 1 ? eod_id_ : (position + 1) % vocab_size_;
}

void MockGptLowLevelDataset::read_tokens(int64_t doc, int64_t offset, int64_t length,
                                         std::vector<int64_t>& out) const {
  const int64_t doc_length = document_length(doc);
  if (offset < 0 || length < 0 || offset + length > doc_length) {
    throw Error("mock: tokens [" + std::to_string(offset) + ", " + std::to_string(offset + length) +
                ") outside document " + std::to_string(doc) + " of length " +
                std::to_string(doc_length));
  }
  out.reserve(out.size() + static_cast<size_t>(length));
  for (int64_t p = offset; p < offset + length; ++p) {
    out.push_back(p == doc_length - 1 ? eod_id_ : (p + 1) % vocab_size_);
  }
}

std::array<std::optional<DocumentRange>, kNumSplits> mock_split_document_ranges() {
  return split_document_ranges(kMockSplit, MockGptLowLevelDataset::kNumDocuments);
}

}  // namespace laoyao::data
