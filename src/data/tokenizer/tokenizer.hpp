// The text -> token ids interface every tokenizer implements (Megatron's MegatronTokenizer:
// tokenize / detokenize / vocab_size / eod). Implementations are immutable after construction,
// and tokenize() is safe to call from many threads at once (preprocess-data's workers do).
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace laoyao::tokenizer {

using TokenId = int64_t;

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<TokenId> tokenize(std::string_view text) const = 0;
  virtual std::string detokenize(std::span<const TokenId> ids) const = 0;
  // Megatron's tokenizer.vocab_size (before the model pads it).
  virtual int64_t vocab_size() const = 0;
  // The end-of-document id that --append-eod appends; -1 when the tokenizer has none.
  virtual TokenId eod() const = 0;
  // Megatron's --tokenizer-type name ("GPT2BPETokenizer", ...).
  virtual std::string name() const = 0;
};

}  // namespace laoyao::tokenizer
