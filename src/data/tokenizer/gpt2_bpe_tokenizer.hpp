// Megatron's GPT2BPETokenizer (megatron/training/tokenizer/gpt2_tokenization.py, OpenAI's
// encoder.py): GPT-2's regex splits the text, each piece's UTF-8 bytes become byte-level
// characters, and BPE merges them by rank exactly as encoder.py's bpe() does (repeatedly merge
// every occurrence of the lowest-ranked adjacent pair, left to right). No special tokens are
// recognised in the text: "<|endoftext|>" written in a document is ordinary text.
#pragma once
#include <memory>
#include <string>
#include <unordered_map>

#include "data/tokenizer/regex.hpp"
#include "data/tokenizer/tokenizer.hpp"
#include "data/tokenizer/word_cache.hpp"

namespace laoyao::tokenizer {

class GPT2BPETokenizer final : public Tokenizer {
 public:
  // vocab.json (token -> id) and merges.txt. As gpt2_tokenization.py reads it, the merges file's
  // first line (the "#version" header) and the text after its last newline are not merges.
  GPT2BPETokenizer(const std::string& vocab_file, const std::string& merge_file);
  // From contents already in memory (tests).
  static std::unique_ptr<GPT2BPETokenizer> from_strings(const std::string& vocab_json,
                                                        const std::string& merges_txt);

  std::vector<TokenId> tokenize(std::string_view text) const override;
  // Byte-level decode; invalid UTF-8 becomes U+FFFD (errors='replace').
  std::string detokenize(std::span<const TokenId> ids) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(encoder_.size()); }
  TokenId eod() const override { return eod_; }
  std::string name() const override { return "GPT2BPETokenizer"; }

  // The BPE of one byte-level word, as tokens (for tests).
  std::vector<std::string> bpe(const std::string& word) const;

 private:
  GPT2BPETokenizer() = default;
  void load(const std::string& vocab_json, const std::string& merges_txt, const std::string& vocab_name,
            const std::string& merges_name);

  std::unordered_map<std::string, TokenId> encoder_;
  std::unordered_map<TokenId, std::string> decoder_;
  std::unordered_map<std::string, int64_t> ranks_;  // "a b" -> rank
  std::unique_ptr<Regex> pattern_;
  TokenId eod_ = -1;
  WordCache cache_;
};

}  // namespace laoyao::tokenizer
