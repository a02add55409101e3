// Builds a tokenizer from Megatron's tokenizer arguments (--tokenizer-type, --tokenizer-model,
// --vocab-file, --merge-file, --vocab-size, ...). Both front ends and preprocess-data use it.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/tokenizer/null_tokenizer.hpp"
#include "data/tokenizer/tokenizer.hpp"

namespace laoyao::tokenizer {

struct TokenizerSpec {
  std::string type;        // --tokenizer-type
  std::string model;       // --tokenizer-model (HF directory / tokenizer.json, or SentencePiece .model)
  std::string vocab_file;  // --vocab-file
  std::string merge_file;  // --merge-file
  std::optional<int64_t> vocab_size;     // --vocab-size (NullTokenizer)
  std::optional<TokenId> null_eod_id;    // --null-tokenizer-eod-id
  NullTokenizerSemantics null_semantics = NullTokenizerSemantics::kMegatronLM;
  int vocab_extra_ids = 0;               // --vocab-extra-ids (SentencePieceTokenizer)
};

// The --tokenizer-type values laoyao implements.
const std::vector<std::string>& supported_tokenizer_types();

// A UsageError names a missing argument, an unsupported Megatron tokenizer type, or (for an
// unknown name) the nearest supported one.
std::unique_ptr<Tokenizer> make_tokenizer(const TokenizerSpec& spec);

}  // namespace laoyao::tokenizer
