// Megatron's NullTokenizer: the "text" is already token ids, written as space-separated integers.
// Two generations exist (reference/megatron-lm.md §5.2, megatron-bridge.md §3.7):
//   kMegatronLM (current Megatron-LM): vocab_size = V,     eod = V-1 (or --null-tokenizer-eod-id)
//   kBridge (Megatron-Bridge's MCore): vocab_size = V + 1, eod = V
// The config layer picks the semantics for the front end in use.
#pragma once
#include <optional>

#include "data/tokenizer/tokenizer.hpp"

namespace laoyao::tokenizer {

enum class NullTokenizerSemantics { kMegatronLM, kBridge };

class NullTokenizer final : public Tokenizer {
 public:
  // vocab_size: --vocab-size V (must be >= 1). eod_override: --null-tokenizer-eod-id
  // (kMegatronLM only).
  explicit NullTokenizer(int64_t vocab_size,
                         NullTokenizerSemantics semantics = NullTokenizerSemantics::kMegatronLM,
                         std::optional<TokenId> eod_override = std::nullopt);

  // Python's [int(x) for x in text.split(' ')]: split on single spaces only, so "" and "1  2"
  // are errors (an empty piece is not an integer); each piece may carry surrounding whitespace,
  // a sign and digit-separating underscores, as int() accepts.
  std::vector<TokenId> tokenize(std::string_view text) const override;
  // ' '.join(str(id) for id in ids)
  std::string detokenize(std::span<const TokenId> ids) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  TokenId eod() const override { return eod_; }
  TokenId pad() const { return -1; }
  std::string name() const override { return "NullTokenizer"; }
  NullTokenizerSemantics semantics() const { return semantics_; }

 private:
  NullTokenizerSemantics semantics_;
  int64_t vocab_size_;
  TokenId eod_;
};

}  // namespace laoyao::tokenizer
