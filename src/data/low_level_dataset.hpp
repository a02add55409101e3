// A corpus of documents of token ids: what GPTDataset draws samples from. Megatron's two
// implementations are the indexed .bin/.idx files (IndexedDataset) and the mock corpus
// (MockGPTLowLevelDataset); laoyao's mirror them behind this interface.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace laoyao::data {

class LowLevelDataset {
 public:
  virtual ~LowLevelDataset() = default;
  // Number of documents (Megatron: len(dataset.document_indices) - 1 for indexed data).
  virtual int64_t num_documents() const = 0;
  // Number of tokens of document `doc` (Megatron: sequence_lengths[doc]).
  virtual int64_t document_length(int64_t doc) const = 0;
  // Appends tokens [offset, offset + length) of document `doc` to `out`.
  // Throws laoyao::Error naming the source if the range is outside the document.
  virtual void read_tokens(int64_t doc, int64_t offset, int64_t length,
                           std::vector<int64_t>& out) const = 0;
  // For messages: the path prefix, or "mock".
  virtual std::string name() const = 0;
};

}  // namespace laoyao::data
