// Megatron-LM's SFTTokenizer and SFTDataset (data/mlm_sft_dataset.hpp).
#include "data/mlm_sft_dataset.hpp"

#include <algorithm>
#include <fstream>
#include <optional>

#include "core/error.hpp"

namespace laoyao::data {

using jinja::Value;
using Kind = jinja::Value::Kind;
using tokenizer::TokenId;

namespace {

// The prompt formats' chat templates (sft_tokenizer.py's, as Jinja text).
const char* kNemotronHAligned =
    "{% for message in messages %}{% if message['role'] == 'system' %}{{ '<SPECIAL_10>System\\n' + "
    "message['content'].strip() + '\\n' }}{% elif message['role'] == 'user' %}{{ '<SPECIAL_11>User\\n' + "
    "message['content'].strip() + '\\n' + '<SPECIAL_11>Assistant\\n' }}{% elif message['role'] == 'assistant' %}{{ "
    "message['content'].strip() + '\\n' }}{% endif %}{% endfor %}";
const char* kNemotronNanoV2 =
    "{% for message in messages %}{% set content = message['content'] %}{% if message['role'] == 'system' %}{{ "
    "'<SPECIAL_10>System\\n' + content.replace('/think', '').replace('/no_think', '').strip() + '\\n' }}{% elif "
    "message['role'] == 'user' %}{{ '<SPECIAL_11>User\\n' + content.replace('/think', '').replace('/no_think', "
    "'').strip() + '\\n' }}{% elif message['role'] == 'assistant' %}{{ '<SPECIAL_11>Assistant\\n' + content.strip() + "
    "'\\n<SPECIAL_12>\\n' }}{% endif %}{% endfor %}";
const char* kIdentity = "{% for message in messages %}{{ message['content'] }}{% endfor %}";

const char* kFormats = "nemotron-h-aligned, nemotron-nano-v2, identity, default";

std::string lower(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

std::string text_of(const Value& turn, const char* key) {
  const Value* v = turn.find(key);
  return v && v->kind == Kind::String ? v->s : std::string();
}

// The tokenizer as the chat renderer asks for it (one tokenizer loaded, not two).
class Encoder final : public SftTokenizer {
 public:
  explicit Encoder(std::shared_ptr<const tokenizer::HuggingFaceTokenizer> hf) : hf_(std::move(hf)) {}
  std::vector<TokenId> encode(std::string_view text) const override { return hf_->tokenize(text); }
  TokenId eos() const override { return hf_->eod(); }

 private:
  std::shared_ptr<const tokenizer::HuggingFaceTokenizer> hf_;
};

}  // namespace

MlmSftTokenizer::MlmSftTokenizer(const std::string& tokenizer_path, const std::string& prompt_format)
    : format_(prompt_format) {
  tokenizer::HuggingFaceTokenizerOptions o;
  o.add_special_tokens = false;  // apply_chat_template(tokenize=True) adds none
  hf_ = std::make_shared<const tokenizer::HuggingFaceTokenizer>(tokenizer_path, o);
  const char* custom = format_ == "nemotron-nano-v2"     ? kNemotronNanoV2
                       : format_ == "nemotron-h-aligned" ? kNemotronHAligned
                       : format_ == "identity"           ? kIdentity
                                                         : "";
  if (!*custom && format_ != "default")
    throw UsageError("unknown --sft-tokenizer-prompt-format '" + format_ + "' (tokenizer.tokenizer_prompt_format); "
                     "choose from " + kFormats);
  // The format's template, or the tokenizer's own (UsageError when it has none); either way the
  // special tokens tokenizer_config.json names.
  const ChatTemplate tmpl = load_chat_template(tokenizer_path, custom);
  auto named = [&](const char* name) -> std::optional<TokenId> {
    for (const auto& [n, v] : tmpl.special_tokens)
      if (n == name) return hf_->token_to_id(v.s);
    return std::nullopt;
  };
  // transformers' convert_tokens_to_ids: the token's id, else the unknown token's, else none.
  auto token_id = [&](const std::string& token) -> TokenId {
    if (auto id = hf_->token_to_id(token)) return *id;
    if (auto unk = named("unk_token")) return *unk;
    throw UsageError("--sft-tokenizer-prompt-format " + format_ + " pads with the token '" + token +
                     "', which the tokenizer at '" + tokenizer_path + "' has not, nor an unknown token to stand for it");
  };
  if (format_ == "nemotron-nano-v2") pad_ = token_id("<unk>"), assistant_prefix_len_ = 3;
  else if (format_ == "nemotron-h-aligned") pad_ = token_id("<SPECIAL_233>");
  else if (format_ == "identity") pad_ = token_id("<unk>");
  else pad_ = named("pad_token").value_or(hf_->eod());  // pad_token_id, else eos_token_id
  chat_ = std::make_unique<ChatTokenizer>(std::make_shared<Encoder>(hf_), tmpl, ChatLossMode::Full);
}

std::vector<TokenId> MlmSftTokenizer::ids(const Value& messages) const {
  return hf_->tokenize(chat_->render(messages, Value::make_dict()));
}

void MlmSftTokenizer::tokenize_conversation(const Value& conversation, std::vector<TokenId>& tokens,
                                            std::vector<TokenId>& targets) const {
  tokens = ids(conversation);
  targets = tokens;
  if (format_ == "default") return;  // every token's loss counts
  const jinja::List& turns = *conversation.list;
  size_t at = 0;
  for (size_t k = 0; k < turns.size(); ++k) {
    const Value& turn = turns[k];
    const std::string role = lower(text_of(turn, "role"));
    if (role == "assistant") {
      if (text_of(turn, "content").empty()) throw UsageError("an empty assistant turn (Megatron-LM's SFTTokenizer refuses it)");
      const Value& before = turns[k == 0 ? turns.size() - 1 : k - 1];  // (Python's turns[-1] for the first)
      const std::string prev = lower(text_of(before, "role"));
      if (prev != "user" && prev != "tool")
        throw UsageError("an assistant turn that does not follow a user or tool turn (Megatron-LM asserts it)");
    }
    const std::vector<TokenId> turn_ids = ids(Value::make_list({turn}));
    const size_t n = turn_ids.size();
    if (role == "system" || role == "user" || role == "tool") {
      std::fill(targets.begin() + static_cast<int64_t>(std::min(at, targets.size())),
                targets.begin() + static_cast<int64_t>(std::min(at + n, targets.size())), kIgnore);
    } else if (role == "assistant") {
      const size_t masked = std::min<size_t>(static_cast<size_t>(assistant_prefix_len_), n);
      std::fill(targets.begin() + static_cast<int64_t>(std::min(at, targets.size())),
                targets.begin() + static_cast<int64_t>(std::min(at + masked, targets.size())), kIgnore);
    } else {
      throw UsageError("a turn of role '" + text_of(turn, "role") + "' (Megatron-LM's SFTTokenizer takes system, user, "
                       "assistant and tool)");
    }
    if (at + n > tokens.size() || !std::equal(turn_ids.begin(), turn_ids.end(), tokens.begin() + static_cast<int64_t>(at)))
      throw UsageError("turn " + std::to_string(k) + " rendered alone is not the conversation's tokens at its place "
                       "under prompt format " + format_ + " (Megatron-LM asserts the turns' tokens match)");
    at += n;
  }
  if (at != tokens.size())
    throw UsageError("the turns rendered alone cover " + std::to_string(at) + " of the conversation's " +
                     std::to_string(tokens.size()) + " tokens under prompt format " + format_);
}

int64_t count_jsonl_lines(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError("cannot read the SFT data '" + path + "' (--data-path: a JSONL file of {\"messages\": [...]})");
  int64_t n = 0;
  for (std::string line; std::getline(in, line);)
    if (line.find_first_not_of(" \t\r") != std::string::npos) ++n;
  if (n == 0) throw UsageError("the SFT data '" + path + "' holds no lines");
  return n;
}

MlmSftDataset::MlmSftDataset(const std::string& path, int64_t first, int64_t last,
                             std::shared_ptr<const MlmSftTokenizer> tok, const MlmSftConfig& cfg)
    : tok_(std::move(tok)), cfg_(cfg), path_(path), first_(first) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError("cannot read the SFT data '" + path + "'");
  int64_t index = 0;
  std::string line;
  for (int64_t number = 1; std::getline(in, line) && index < last; ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    if (index++ < first) continue;
    const std::string where = path + ":" + std::to_string(number) + ": ";
    Value row;
    try {
      row = jinja::from_json_text(line);
    } catch (const std::exception& e) {
      throw UsageError(where + "not a JSON line (" + e.what() + ")");
    }
    const Value* messages = row.kind == Kind::Dict ? row.find("messages") : nullptr;
    if (!messages || messages->kind != Kind::List || messages->list->empty())
      throw UsageError(where + "needs a non-empty \"messages\" list (Megatron-LM's SFT rows)");
    for (const Value& turn : *messages->list) {
      const Value* role = turn.kind == Kind::Dict ? turn.find("role") : nullptr;
      const Value* content = turn.kind == Kind::Dict ? turn.find("content") : nullptr;
      if (!role || role->kind != Kind::String || !content || content->kind != Kind::String)
        throw UsageError(where + "each message needs string \"role\" and \"content\"");
    }
    lines_.push_back(*messages);
  }
  if (static_cast<int64_t>(lines_.size()) != last - first)
    throw UsageError("the SFT data '" + path + "' has fewer lines than its split asks (" + std::to_string(last) + ")");
  if (lines_.empty()) throw UsageError("a split of the SFT data '" + path + "' holds no lines");
  if (cfg_.seq_length < 1) throw UsageError("SFT rows need a sequence length of at least 1");
}

GptSample MlmSftDataset::get(int64_t index) const {
  if (index < 0 || index >= cfg_.num_samples)
    throw Error("SFT sample " + std::to_string(index) + " is outside [0, " + std::to_string(cfg_.num_samples) + ")");
  const size_t line = static_cast<size_t>(index % static_cast<int64_t>(lines_.size()));
  const jinja::List& merged = *lines_[line].list;
  // A new conversation at each system message.
  std::vector<Value> conversations;
  for (const Value& msg : merged) {
    if (text_of(msg, "role") == "system" || conversations.empty()) conversations.push_back(Value::make_list());
    conversations.back().list->push_back(msg);
  }
  const int64_t L = cfg_.seq_length;
  const TokenId pad = tok_->pad();
  std::vector<TokenId> toks, tgts;
  std::vector<int64_t> pos, cu = {0};
  auto extend_with_padding = [&](int64_t n) {
    const int64_t p = pos.back();
    for (int64_t k = 0; k < n; ++k) toks.push_back(pad), tgts.push_back(pad), pos.push_back(p + 1 + k);
  };
  std::vector<TokenId> t, g;
  for (const Value& conversation : conversations) {
    try {
      tok_->tokenize_conversation(conversation, t, g);
    } catch (const UsageError& e) {
      throw UsageError(path_ + ": row " + std::to_string(first_ + static_cast<int64_t>(line) + 1) +
                       " (counting non-blank lines): " + e.what());
    }
    toks.insert(toks.end(), t.begin(), t.end());
    tgts.insert(tgts.end(), g.begin(), g.end());
    for (size_t k = 0; k < t.size(); ++k) pos.push_back(static_cast<int64_t>(k));
    if (cfg_.context_parallel_size > 1 && !pos.empty()) {
      const int64_t granularity = 2 * cfg_.context_parallel_size;
      const int64_t rem = static_cast<int64_t>(toks.size()) % granularity;
      if (rem != 0) extend_with_padding(granularity - rem);
    }
    cu.push_back(static_cast<int64_t>(toks.size()));
    if (static_cast<int64_t>(toks.size()) >= L + 1) {  // cut on the right; the row's last token a pad
      toks.resize(static_cast<size_t>(L)), tgts.resize(static_cast<size_t>(L));
      toks.push_back(pad), tgts.push_back(pad);
      pos.resize(static_cast<size_t>(L + 1));
      cu.back() = L;
      break;
    }
  }
  if (pos.empty()) throw UsageError(path_ + ": a line whose conversations have no tokens");
  if (static_cast<int64_t>(toks.size()) < L + 1) {
    extend_with_padding(L + 1 - static_cast<int64_t>(toks.size()));
    cu.back() = L;
  }
  GptSample s;
  s.tokens.assign(toks.begin(), toks.end() - 1);
  s.position_ids.assign(pos.begin(), pos.end() - 1);
  s.labels.resize(static_cast<size_t>(L));
  s.loss_mask.resize(static_cast<size_t>(L));
  s.key_start.resize(static_cast<size_t>(L));
  for (int64_t k = 0; k < L; ++k) {
    const TokenId label = tgts[static_cast<size_t>(k + 1)];
    const bool counted = label != pad && label != MlmSftTokenizer::kIgnore;
    s.loss_mask[static_cast<size_t>(k)] = counted ? 1.0f : 0.0f;
    s.labels[static_cast<size_t>(k)] = label == MlmSftTokenizer::kIgnore ? pad : label;  // (masked: any valid id)
  }
  for (size_t d = 0; d + 1 < cu.size(); ++d)
    for (int64_t k = cu[d]; k < std::min(cu[d + 1], L); ++k) s.key_start[static_cast<size_t>(k)] = static_cast<int32_t>(cu[d]);
  return s;
}

}  // namespace laoyao::data
