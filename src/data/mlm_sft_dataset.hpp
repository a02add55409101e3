// Megatron-LM's own supervised fine-tuning (`pretrain_gpt.py --sft --tokenizer-type SFTTokenizer`):
// its SFTTokenizer and SFTDataset (megatron/core/tokenizers/text/libraries/sft_tokenizer.py,
// megatron/training/datasets/sft_dataset.py). Not Megatron-Bridge's fine-tuning (data/sft_*).
//
// A JSONL line is {"messages": [{"role", "content"}, ...]}: one or more conversations, a new one
// starting at each system message. Each conversation is rendered by the prompt format's chat
// template (--sft-tokenizer-prompt-format: nemotron-h-aligned, the default; nemotron-nano-v2;
// identity; default, the tokenizer's own) and tokenised without added special tokens; its targets
// are its tokens with the system, user and tool turns (and nemotron-nano-v2's three-token assistant
// prefix) masked, each turn's tokens found by rendering the turn alone (the default format masks
// nothing). Sample i is line indices[i mod lines]: its conversations packed in order into one row
// of seq_length + 1 tokens (each padded to a multiple of 2 CP under context parallelism; the one
// that reaches the end cut there, the row's last token then a pad; a short row padded, its
// positions running on), positions restarting per conversation, attention within each (the padding
// joins the last one), the loss where the label is neither masked nor the pad id.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/jinja.hpp"
#include "data/gpt_dataset.hpp"
#include "data/sft_chat.hpp"
#include "data/tokenizer/hf_tokenizer.hpp"

namespace laoyao::data {

// SFTTokenizer over a Hugging Face tokenizer folder (tokenizer.json beside tokenizer_config.json).
class MlmSftTokenizer {
 public:
  static constexpr tokenizer::TokenId kIgnore = -100;  // IGNORE_INDEX
  // UsageError naming an unknown prompt format (and the accepted ones), a folder without the
  // default format's chat template, or a pad token the tokenizer does not have.
  MlmSftTokenizer(const std::string& tokenizer_path, const std::string& prompt_format);

  // tokenize_conversation(conversation, return_target=True, add_generation_prompt=False): the ids
  // and the targets (kIgnore where masked). UsageError for an empty assistant turn, an assistant
  // turn that does not follow a user or tool turn, an unknown role, or turns whose tokens are not
  // the conversation's.
  void tokenize_conversation(const jinja::Value& conversation, std::vector<tokenizer::TokenId>& tokens,
                             std::vector<tokenizer::TokenId>& targets) const;
  tokenizer::TokenId pad() const { return pad_; }

 private:
  std::vector<tokenizer::TokenId> ids(const jinja::Value& messages) const;

  std::string format_;
  std::shared_ptr<const tokenizer::HuggingFaceTokenizer> hf_;  // no special tokens added
  std::unique_ptr<ChatTokenizer> chat_;                  // renders the format's template
  tokenizer::TokenId pad_ = -1;
  int64_t assistant_prefix_len_ = 0;
};

struct MlmSftConfig {
  int64_t seq_length = 0;
  int64_t context_parallel_size = 1;
  int64_t num_samples = 0;  // len(dataset): samples past the split's lines wrap around
};

class MlmSftDataset final : public SampleDataset {
 public:
  // Lines [first, last) of `path` (the split's share, Megatron's split_indices). UsageError naming
  // the file and line of a line that is not a JSON object with a non-empty "messages" list of
  // {"role", "content"} string pairs.
  MlmSftDataset(const std::string& path, int64_t first, int64_t last, std::shared_ptr<const MlmSftTokenizer> tok,
                const MlmSftConfig& cfg);
  int64_t size() const override { return cfg_.num_samples; }
  GptSample get(int64_t index) const override;

 private:
  std::shared_ptr<const MlmSftTokenizer> tok_;
  MlmSftConfig cfg_;
  std::vector<jinja::Value> lines_;  // the split's lines' messages
  std::string path_;
  int64_t first_ = 0;
};

// The number of non-blank lines of a JSONL file (Megatron's numel_low_level_dataset, the count the
// split divides). UsageError when it cannot be read or holds none.
int64_t count_jsonl_lines(const std::string& path);

}  // namespace laoyao::data
