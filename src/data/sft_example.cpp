#include "data/sft_example.hpp"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.hpp"
#include "data/tokenizer/hf_tokenizer.hpp"

namespace laoyao::data {

namespace {

using tokenizer::TokenId;

std::string strip_spaces(std::string_view s) {
  const size_t a = s.find_first_not_of(' ');
  if (a == std::string_view::npos) return "";
  return std::string(s.substr(a, s.find_last_not_of(' ') - a + 1));
}

// Bridge's _truncate: keep target_length ids, from the beginning ("right") or the end ("left").
void truncate(std::vector<TokenId>& ids, int64_t target_length, bool right) {
  if (target_length <= 0) return ids.clear();
  if (static_cast<int64_t>(ids.size()) <= target_length) return;
  if (right)
    ids.resize(static_cast<size_t>(target_length));
  else
    ids.erase(ids.begin(), ids.end() - target_length);
}

// Megatron-Bridge's data/token_utils.py PAD_TOKENS (Qwen, LLaVA, Llama, Gemma, Gemma 3n): added
// tokens that never get loss. Assistant-turn terminators are not among them.
constexpr const char* kPadTokens[] = {
    "<|im_start|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
    "<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>", "<image>", "<pad>", "<|begin_of_text|>",
    "<|finetune_right_pad_id|>", "<|step_id|>", "<|start_header_id|>", "<|end_header_id|>", "<|python_tag|>",
    "<|image|>", "<image_soft_token>", "<audio_soft_token>", "<start_of_audio>", "<start_of_image>",
    "<end_of_audio>", "<end_of_image>"};

class HfSftTokenizer final : public SftTokenizer {
 public:
  explicit HfSftTokenizer(const std::string& path) {
    tokenizer::HuggingFaceTokenizerOptions o;
    o.add_special_tokens = false;  // Bridge: encode(text, add_special_tokens=False)
    tok_ = std::make_unique<tokenizer::HuggingFaceTokenizer>(path, o);
    for (const char* t : kPadTokens)
      if (auto id = tok_->token_to_id(t)) skipped_.push_back(*id);
  }
  std::vector<TokenId> encode(std::string_view text) const override { return tok_->tokenize(text); }
  TokenId eos() const override { return tok_->eod(); }
  std::vector<TokenId> skipped_ids() const override { return skipped_; }

 private:
  std::unique_ptr<tokenizer::HuggingFaceTokenizer> tok_;
  std::vector<TokenId> skipped_;
};

}  // namespace

std::unique_ptr<SftTokenizer> hf_sft_tokenizer(const std::string& path) { return std::make_unique<HfSftTokenizer>(path); }

bool SftTokenizer::space_sensitive() const {
  std::vector<TokenId> parts = encode("x");
  const std::vector<TokenId> y = encode("y");
  parts.insert(parts.end(), y.begin(), y.end());
  return encode("x y") != parts;
}

SftExample tokenize_prompt_completion(std::string_view prompt, std::string_view completion, const SftTokenizer& tok,
                                      const PromptCompletionConfig& cfg, int64_t max_length) {
  std::string p(prompt), c(completion);
  if (cfg.strip_whitespace) p = strip_spaces(p), c = strip_spaces(c);
  std::string prompt_text = cfg.prompt_template;
  for (size_t at = prompt_text.find("{prompt}"); at != std::string::npos; at = prompt_text.find("{prompt}", at + p.size()))
    prompt_text.replace(at, 8, p);
  std::string separator = cfg.separator;
  // A tokenizer for which a leading space changes nothing drops one boundary space (Bridge keeps
  // GPTSFTDataset's split-template behaviour); a space-sensitive one keeps it on the completion.
  if (!separator.empty() && separator[0] == ' ' && !tok.space_sensitive()) separator.erase(0, 1);
  std::vector<TokenId> prompt_ids = tok.encode(prompt_text), completion_ids = tok.encode(separator + c);
  const TokenId bos = cfg.add_bos ? tok.bos() : -1, eos = cfg.add_eos ? tok.eos() : -1;
  if (cfg.add_bos && bos < 0) throw UsageError("prompt-completion preprocessing asks for BOS, and the tokenizer has none");
  if (cfg.add_eos && eos < 0) throw UsageError("prompt-completion preprocessing asks for EOS, and the tokenizer has none");
  if (max_length > 0) {
    const int64_t special = (bos >= 0) + (eos >= 0);
    if (special > max_length) throw UsageError("the sequence length is shorter than the special tokens of one example");
    int64_t overflow = static_cast<int64_t>(prompt_ids.size() + completion_ids.size()) - (max_length - special);
    if (overflow > 0) {  // the prompt first, then the completion
      const int64_t cut = std::min<int64_t>(static_cast<int64_t>(prompt_ids.size()), overflow);
      truncate(prompt_ids, static_cast<int64_t>(prompt_ids.size()) - cut, cfg.truncate_right);
      overflow -= cut;
    }
    if (overflow > 0)
      truncate(completion_ids, std::max<int64_t>(0, static_cast<int64_t>(completion_ids.size()) - overflow),
               cfg.truncate_right);
  }
  SftExample ex;
  if (bos >= 0) ex.input_ids.push_back(bos);
  ex.input_ids.insert(ex.input_ids.end(), prompt_ids.begin(), prompt_ids.end());
  ex.context_length = static_cast<int64_t>(ex.input_ids.size());
  ex.input_ids.insert(ex.input_ids.end(), completion_ids.begin(), completion_ids.end());
  if (eos >= 0) ex.input_ids.push_back(eos);
  if (ex.input_ids.size() < 2) throw UsageError("an example tokenises to fewer than two tokens (nothing to predict)");
  ex.loss_mask.assign(ex.input_ids.size(), 1);
  if (cfg.completion_loss_only)
    std::fill(ex.loss_mask.begin(), ex.loss_mask.begin() + ex.context_length, uint8_t{0});
  const std::vector<TokenId> skipped = tok.skipped_ids();
  const std::set<TokenId> never(skipped.begin(), skipped.end());
  for (size_t i = 0; i < ex.input_ids.size(); ++i)
    if (never.count(ex.input_ids[i])) ex.loss_mask[i] = 0;
  if (cfg.completion_loss_only && !c.empty() && std::none_of(ex.loss_mask.begin() + 1, ex.loss_mask.end(), [](uint8_t m) { return m != 0; }))
    throw UsageError("an example with a completion keeps no token to learn from (the sequence length leaves it none)");
  return ex;
}

std::vector<SftExample> read_prompt_completion_jsonl(const std::string& path, const SftTokenizer& tok,
                                                     const PromptCompletionConfig& cfg, int64_t max_length) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError("cannot read fine-tuning data '" + path + "'");
  std::vector<SftExample> out;
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    const std::string where = path + ":" + std::to_string(number);
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json row;
    try {
      row = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw UsageError(where + ": not a JSON line (" + std::string(e.what()) + ")");
    }
    if (!row.is_object()) throw UsageError(where + ": not a JSON object");
    auto field = [&](const std::string& key) {
      if (!row.contains(key)) throw UsageError(where + ": no \"" + key + "\" field (a prompt-completion row needs \"" +
                                               cfg.prompt_column + "\" and \"" + cfg.completion_column + "\")");
      if (!row[key].is_string()) throw UsageError(where + ": \"" + key + "\" is not a string");
      return row[key].get<std::string>();
    };
    try {
      out.push_back(tokenize_prompt_completion(field(cfg.prompt_column), field(cfg.completion_column), tok, cfg,
                                               max_length));
    } catch (const UsageError& e) {
      const std::string what = e.what();
      throw UsageError(what.rfind(where, 0) == 0 ? what : where + ": " + what);
    }
  }
  if (out.empty()) throw UsageError("fine-tuning data '" + path + "' holds no examples");
  return out;
}

SftRow sft_row(const SftExample& ex, int64_t seq_length, tokenizer::TokenId eos) {
  SftRow r;
  const int64_t n = std::min<int64_t>(static_cast<int64_t>(ex.input_ids.size()) - 1, seq_length);
  r.tokens.assign(static_cast<size_t>(seq_length), eos);
  r.labels.assign(static_cast<size_t>(seq_length), eos);
  r.loss_mask.assign(static_cast<size_t>(seq_length), 0.0f);
  for (int64_t t = 0; t < n; ++t) {
    r.tokens[static_cast<size_t>(t)] = ex.input_ids[static_cast<size_t>(t)];
    r.labels[static_cast<size_t>(t)] = ex.input_ids[static_cast<size_t>(t + 1)];
    r.loss_mask[static_cast<size_t>(t)] = ex.loss_mask[static_cast<size_t>(t + 1)];
  }
  return r;
}

}  // namespace laoyao::data
