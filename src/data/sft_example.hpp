// Fine-tuning examples as Megatron-Bridge tokenises them (docs/reference/megatron-bridge-finetuning.md
// §2): a prompt-completion row ({"input": ..., "output": ...} in the SQuAD recipes' JSONL) becomes
// the prompt's tokens then the completion's then EOS, each piece tokenised on its own without
// special tokens, the loss on the completion and EOS only; a row too long for the sequence loses
// its prompt's tail first (Bridge's "right" truncation keeps the beginning).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "data/tokenizer/tokenizer.hpp"

namespace laoyao::data {

// Bridge's PromptCompletionSFTPreprocessingConfig, as the SFT recipes set it.
struct PromptCompletionConfig {
  std::string prompt_column = "input", completion_column = "output";
  std::string prompt_template = "{prompt}";  // "{prompt}" is replaced by the prompt
  std::string separator = " ";               // put before the completion (its first space only where it matters)
  bool completion_loss_only = true;          // loss_mode "completion" (else "full")
  bool strip_whitespace = true;              // ASCII spaces trimmed from both ends of each part
  bool add_bos = false, add_eos = true;
  bool truncate_right = true;  // "right": keep a piece's beginning; "left": its end
};

// What Bridge asks of the tokenizer: text to ids without special tokens, its EOS (and BOS), whether
// a leading space changes the tokens ("x y" versus "x" then "y"), and the ids that never get loss
// (data/token_utils.py's PAD_TOKENS among the tokenizer's added tokens).
class SftTokenizer {
 public:
  virtual ~SftTokenizer() = default;
  virtual std::vector<tokenizer::TokenId> encode(std::string_view text) const = 0;
  virtual tokenizer::TokenId eos() const = 0;
  virtual tokenizer::TokenId bos() const { return -1; }
  virtual std::vector<tokenizer::TokenId> skipped_ids() const { return {}; }
  bool space_sensitive() const;
};

// A Hugging Face tokenizer (tokenizer.json, or the folder holding it) as Bridge uses it for SFT:
// no post-processor tokens, EOS from its config, PAD_TOKENS' ids among its tokens skipped.
std::unique_ptr<SftTokenizer> hf_sft_tokenizer(const std::string& path);

struct SftExample {
  std::vector<tokenizer::TokenId> input_ids;  // context (prompt) then target (completion, EOS)
  std::vector<uint8_t> loss_mask;             // per input id, unshifted: 1 on the target
  int64_t context_length = 0;
};

// One row's prompt and completion (max_length <= 0: no limit). UsageError when no two tokens remain
// or a non-empty completion keeps no supervised token (Bridge's ValueErrors).
SftExample tokenize_prompt_completion(std::string_view prompt, std::string_view completion, const SftTokenizer& tok,
                                      const PromptCompletionConfig& cfg, int64_t max_length);

// The examples of a JSONL file of prompt-completion rows. A line that is not a JSON object, lacks
// the prompt or completion column, holds a non-string there or is not UTF-8 is a UsageError naming
// the file and the line number; blank lines are skipped.
std::vector<SftExample> read_prompt_completion_jsonl(const std::string& path, const SftTokenizer& tok,
                                                     const PromptCompletionConfig& cfg, int64_t max_length);

// A training row of `seq_length` tokens from one example, as Bridge's collate makes it: tokens =
// input_ids[:-1], labels = input_ids[1:], loss_mask = the mask's [1:], padded with EOS (mask 0) to
// seq_length; positions 0 .. seq_length-1. (Bridge pads a batch to its longest row rounded up to
// 16 unless pad_to_max_length; past the last real token padding changes no loss under causal
// attention, so rows of seq_length give the same numbers.)
struct SftRow {
  std::vector<tokenizer::TokenId> tokens, labels;
  std::vector<float> loss_mask;
};
SftRow sft_row(const SftExample& ex, int64_t seq_length, tokenizer::TokenId eos);

}  // namespace laoyao::data
