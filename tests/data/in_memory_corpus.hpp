// A LowLevelDataset held in memory, for tests: document d of a corpus built by make_corpus has
// tokens base*(d+1) + 0, 1, ..., L-2 followed by kEod, so every token says where it came from.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "data/low_level_dataset.hpp"

namespace laoyao::data::testing {

inline constexpr int64_t kEod = 7;

class InMemoryCorpus final : public LowLevelDataset {
 public:
  explicit InMemoryCorpus(std::vector<std::vector<int64_t>> docs) : docs_(std::move(docs)) {}
  int64_t num_documents() const override { return static_cast<int64_t>(docs_.size()); }
  int64_t document_length(int64_t doc) const override {
    return static_cast<int64_t>(docs_.at(static_cast<size_t>(doc)).size());
  }
  void read_tokens(int64_t doc, int64_t offset, int64_t length,
                   std::vector<int64_t>& out) const override {
    const auto& d = docs_.at(static_cast<size_t>(doc));
    if (offset < 0 || length < 0 || offset + length > static_cast<int64_t>(d.size())) {
      throw Error("in-memory corpus: read outside document " + std::to_string(doc));
    }
    out.insert(out.end(), d.begin() + offset, d.begin() + offset + length);
  }
  std::string name() const override { return "in-memory"; }

 private:
  std::vector<std::vector<int64_t>> docs_;
};

inline std::shared_ptr<const InMemoryCorpus> make_corpus(const std::vector<int>& lengths,
                                                         int64_t base) {
  std::vector<std::vector<int64_t>> docs;
  for (size_t d = 0; d < lengths.size(); ++d) {
    std::vector<int64_t> doc;
    for (int k = 0; k + 1 < lengths[d]; ++k) doc.push_back(base * static_cast<int64_t>(d + 1) + k);
    doc.push_back(kEod);
    docs.push_back(std::move(doc));
  }
  return std::make_shared<const InMemoryCorpus>(std::move(docs));
}

// The corpus the GPT and blend tests share: 12 documents, 64 tokens.
inline std::shared_ptr<const InMemoryCorpus> corpus_a() {
  return make_corpus({5, 3, 7, 1, 4, 9, 2, 6, 8, 3, 5, 11}, 1000);
}

// 30 documents with lengths (7d mod 13) + 1.
inline std::shared_ptr<const InMemoryCorpus> corpus_b() {
  std::vector<int> lengths;
  for (int d = 0; d < 30; ++d) lengths.push_back((d * 7) % 13 + 1);
  return make_corpus(lengths, 100000);
}

}  // namespace laoyao::data::testing
