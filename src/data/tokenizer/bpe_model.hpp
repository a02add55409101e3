// HF tokenizers' BPE model (tokenizers/src/models/bpe): a word (already in the model's alphabet,
// e.g. byte-level characters) starts as one symbol per character, unknown characters fall back
// to <0xXX> byte tokens (byte_fallback) or the unk token (consecutive ones fused with fuse_unk),
// then merges are applied from a priority queue ordered by (merge rank, position) — HF's
// Word::merge_all, including its check that a queued merge is still current.
#pragma once
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "data/tokenizer/tokenizer.hpp"
#include "data/tokenizer/word_cache.hpp"

namespace laoyao::tokenizer {

struct BpeModelConfig {
  std::unordered_map<std::string, TokenId> vocab;
  std::vector<std::pair<std::string, std::string>> merges;  // in rank order
  std::optional<std::string> unk_token;
  bool fuse_unk = false;
  bool byte_fallback = false;
  // Llama 3: a word that is itself in the vocab is emitted whole, without merging.
  bool ignore_merges = false;
};

class BpeModel {
 public:
  // `what` names the source for errors (a merge whose parts or result are not in the vocab is a
  // UsageError, as HF refuses to load such a file).
  BpeModel(BpeModelConfig config, const std::string& what);

  // Appends the ids of `word` to `out`.
  void encode_word(std::string_view word, std::vector<TokenId>& out) const;

  std::optional<TokenId> token_to_id(std::string_view token) const;
  const std::string* id_to_token(TokenId id) const;
  const std::unordered_map<std::string, TokenId>& vocab() const { return vocab_; }

 private:
  void merge_word(std::string_view word, std::vector<TokenId>& out) const;

  std::unordered_map<std::string, TokenId> vocab_;
  std::unordered_map<TokenId, std::string> vocab_r_;
  std::unordered_map<uint64_t, std::pair<uint32_t, TokenId>> merges_;  // (a,b) -> (rank, new id)
  std::optional<TokenId> unk_id_;
  bool fuse_unk_, byte_fallback_, ignore_merges_;
  WordCache cache_;
};

}  // namespace laoyao::tokenizer
