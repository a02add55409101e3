// Megatron's HuggingFaceTokenizer for byte-level BPE `tokenizer.json` files (GPT-2, Llama 3,
// Qwen2/3 and BPE files of that shape), without Python: the HF tokenizers pipeline
//   added/special tokens split out of the raw text (leftmost-longest; lstrip/rstrip/single_word)
//   -> normalizer (NFC, Prepend, Replace, Sequence)
//   -> pre-tokenizer (Split with a regex or string and any split behaviour, ByteLevel, Sequence)
//   -> BPE model (byte_fallback, unk/fuse_unk, ignore_merges; merges as "a b" or ["a", "b"])
//   -> post-processor (ByteLevel, TemplateProcessing, Roberta/Bert, Sequence)
// Anything else in the file is refused by name with a UsageError.
//
// Megatron's text_to_ids is `AutoTokenizer(text).input_ids` (include_special_tokens=True), so
// the post-processor's special tokens (e.g. a BOS) are added; vocab_size is len(tokenizer) (model
// vocab plus added tokens); eod is the id of eos_token from tokenizer_config.json (or
// special_tokens_map.json) beside tokenizer.json, unless given explicitly.
#pragma once
#include <memory>
#include <optional>
#include <string>

#include "data/tokenizer/tokenizer.hpp"

namespace laoyao::tokenizer {

struct HuggingFaceTokenizerOptions {
  std::optional<std::string> eos_token;  // overrides the config file's eos_token
  bool add_special_tokens = true;        // apply the post-processor (Megatron's default)
};

class HuggingFaceTokenizer final : public Tokenizer {
 public:
  // `path`: a tokenizer.json file, or a directory that holds one (Megatron's --tokenizer-model is
  // usually such a directory).
  explicit HuggingFaceTokenizer(const std::string& path, HuggingFaceTokenizerOptions options = {});
  // From the contents of tokenizer.json (and optionally tokenizer_config.json) in memory.
  static std::unique_ptr<HuggingFaceTokenizer> from_json(const std::string& tokenizer_json,
                                                         const std::string& config_json = "",
                                                         HuggingFaceTokenizerOptions options = {});
  ~HuggingFaceTokenizer() override;

  std::vector<TokenId> tokenize(std::string_view text) const override;
  // HF's decoder over the tokens of `ids` (special tokens kept, as Megatron's ids_to_text).
  std::string detokenize(std::span<const TokenId> ids) const override;
  int64_t vocab_size() const override;
  TokenId eod() const override;
  std::string name() const override { return "HuggingFaceTokenizer"; }

  std::optional<TokenId> token_to_id(std::string_view token) const;

  struct Impl;

 private:
  HuggingFaceTokenizer() = default;
  // `file` names the source in error messages.
  static std::unique_ptr<HuggingFaceTokenizer> parse(const std::string& tokenizer_json, const std::string& config_json,
                                                     HuggingFaceTokenizerOptions options, const std::string& file);
  std::unique_ptr<Impl> impl_;
};

}  // namespace laoyao::tokenizer
