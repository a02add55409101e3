// Chat rows of fine-tuning data as Megatron-Bridge tokenises them (its ChatSFTPreprocessingConfig;
// data/conversation_processing.py, facts in docs/reference/bridge-lora-experts-and-chat.md part B):
// the row's conversation rendered by the tokenizer's chat template (as transformers'
// apply_chat_template, add_generation_prompt off) and tokenised without added special tokens;
// the loss on the assistant turns' content and end markers, located by rendering the conversation
// up to each turn, for the template families Bridge recognises by their markers (ChatML/Qwen,
// Llama 3, Gemma, Kimi, gpt-oss Harmony, GLM-5.2, ...).
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/jinja.hpp"
#include "data/sft_example.hpp"

namespace laoyao::data {

// Bridge's ChatSFTPreprocessingConfig.loss_mode.
enum class ChatLossMode { Assistant, LastTurn, Full };
ChatLossMode parse_chat_loss_mode(const std::string& s);  // UsageError naming the accepted values

// Token boundaries of the roles' turns (Bridge's AssistantMaskBoundaryConfig), as marker strings
// tokenised by the run's tokenizer.
struct ChatBoundaries {
  std::vector<std::pair<std::string, std::vector<tokenizer::TokenId>>> role_start;  // assistant first
  std::vector<tokenizer::TokenId> role_end;                  // every role's (empty: GLM's rendered ends)
  std::vector<std::vector<tokenizer::TokenId>> role_end_variants;
  std::vector<std::vector<tokenizer::TokenId>> trim_leading;  // e.g. an empty <think></think>
  bool rendered_turn_end = false;  // the assistant's turn ends where the next role starts (GLM-5.2)
  const std::vector<tokenizer::TokenId>* start_of(const std::string& role) const;
};

// A tokenizer's chat template and the variables transformers renders it with.
struct ChatTemplate {
  std::string source;        // the Jinja text
  jinja::Dict special_tokens;  // bos_token, eos_token, unk_token, pad_token: the strings the config names
};

// The chat template of a Hugging Face tokenizer folder (or tokenizer.json file): `override_text`
// when given (Bridge's tokenizer.chat_template), else the folder's chat_template.jinja, else
// tokenizer_config.json's chat_template (a string, or the list entry named "default"). UsageError
// naming the folder when it has none.
ChatTemplate load_chat_template(const std::string& tokenizer_path, const std::string& override_text = "");

class ChatTokenizer {
 public:
  // UsageError when the template does not parse, or when its loss boundaries cannot be inferred
  // (loss modes other than full need them), naming the template's family markers Bridge knows.
  ChatTokenizer(std::shared_ptr<const SftTokenizer> tok, const ChatTemplate& tmpl, ChatLossMode mode);

  // One row ({"messages": [...]}, {"conversation": [...]} or ShareGPT {"conversations": [{"from",
  // "value"}], "system": ...}; optional "tools" and "chat_template_kwargs"): its ids and unshifted
  // loss mask. Bridge truncates nothing here (the row builder keeps the first seq_length + 1).
  SftExample tokenize(const jinja::Value& row) const;

  // The conversation as Bridge normalises it (roles, null content, tool-call arguments parsed).
  static jinja::Value normalize(const jinja::Value& row);
  std::string render(const jinja::Value& conversation, const jinja::Value& row) const;

 private:
  std::vector<tokenizer::TokenId> render_ids(const jinja::Value& conversation, const jinja::Value& row) const;
  std::vector<uint8_t> assistant_mask(const jinja::Value& conversation, const jinja::Value& row,
                                      const std::vector<tokenizer::TokenId>& ids) const;

  std::shared_ptr<const SftTokenizer> tok_;
  std::shared_ptr<const jinja::Template> template_;
  jinja::Dict special_;
  ChatLossMode mode_;
  std::optional<ChatBoundaries> boundaries_;
};

// The examples of a JSONL file of chat rows; a bad line is a UsageError naming the file and line.
std::vector<SftExample> read_chat_jsonl(const std::string& path, const ChatTokenizer& chat);

}  // namespace laoyao::data
