#include "data/tokenizer/gpt2_bpe_tokenizer.hpp"

#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "core/file_io.hpp"
#include "data/tokenizer/byte_level.hpp"
#include "data/tokenizer/unicode.hpp"

namespace laoyao::tokenizer {
namespace {

// Python's str.split() with no argument: runs of whitespace separate, no empty parts.
std::vector<std::string> split_ws(std::string_view s) {
  std::vector<std::string> parts;
  size_t i = 0;
  auto ws = [](char c) { return c == ' ' || (c >= '\t' && c <= '\r') || (c >= '\x1c' && c <= '\x1f'); };
  while (i < s.size()) {
    while (i < s.size() && ws(s[i])) ++i;
    size_t j = i;
    while (j < s.size() && !ws(s[j])) ++j;
    if (j > i) parts.emplace_back(s.substr(i, j - i));
    i = j;
  }
  return parts;
}

}  // namespace

GPT2BPETokenizer::GPT2BPETokenizer(const std::string& vocab_file, const std::string& merge_file) {
  load(read_file(vocab_file), read_file(merge_file), vocab_file, merge_file);
}

std::unique_ptr<GPT2BPETokenizer> GPT2BPETokenizer::from_strings(const std::string& vocab_json,
                                                                 const std::string& merges_txt) {
  std::unique_ptr<GPT2BPETokenizer> t(new GPT2BPETokenizer());
  t->load(vocab_json, merges_txt, "<vocab.json>", "<merges.txt>");
  return t;
}

void GPT2BPETokenizer::load(const std::string& vocab_json, const std::string& merges_txt,
                            const std::string& vocab_name, const std::string& merges_name) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(vocab_json);
  } catch (const std::exception& e) {
    throw UsageError("GPT2BPETokenizer vocab file '" + vocab_name + "' is not valid JSON: " + e.what());
  }
  if (!j.is_object()) {
    throw UsageError("GPT2BPETokenizer vocab file '" + vocab_name +
                     "' must be a JSON object of token -> id (GPT-2's vocab.json / encoder.json)");
  }
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!it.value().is_number_integer()) {
      throw UsageError("GPT2BPETokenizer vocab file '" + vocab_name + "': the id of token '" +
                       it.key() + "' is not an integer");
    }
    const TokenId id = it.value().get<TokenId>();
    encoder_[it.key()] = id;
    decoder_[id] = it.key();
  }
  // gpt2_tokenization.py: merges = read().split('\n')[1:-1]; ranks = dict(zip(merges, range())):
  // the first line is skipped, and a later duplicate pair overwrites the earlier rank.
  std::vector<std::string_view> lines;
  std::string_view all(merges_txt);
  size_t start = 0;
  while (true) {
    size_t nl = all.find('\n', start);
    if (nl == std::string_view::npos) {
      lines.push_back(all.substr(start));
      break;
    }
    lines.push_back(all.substr(start, nl - start));
    start = nl + 1;
  }
  if (lines.size() < 2) {
    throw UsageError("GPT2BPETokenizer merge file '" + merges_name +
                     "' has no merges (expected a '#version' line, then one 'a b' pair per line)");
  }
  for (size_t i = 1; i + 1 < lines.size(); ++i) {
    auto parts = split_ws(lines[i]);
    if (parts.size() != 2) continue;  // such a tuple never equals a pair in Python either
    ranks_[parts[0] + " " + parts[1]] = static_cast<int64_t>(i - 1);
  }
  auto eod = encoder_.find("<|endoftext|>");
  if (eod == encoder_.end()) {
    throw UsageError("GPT2BPETokenizer vocab file '" + vocab_name +
                     "' has no '<|endoftext|>' token (the end-of-document id)");
  }
  eod_ = eod->second;
  pattern_ = std::make_unique<Regex>(kGpt2Pattern, "GPT-2 pre-tokenizer");
}

std::vector<std::string> GPT2BPETokenizer::bpe(const std::string& token) const {
  std::vector<std::string> word;
  for (size_t i = 0; i < token.size();) {
    const size_t n = utf8_char_len(token, i);
    word.emplace_back(token.substr(i, n));
    i += n;
  }
  if (word.size() <= 1) return word;
  std::string key;
  while (true) {
    // The adjacent pair of lowest rank.
    int64_t best = std::numeric_limits<int64_t>::max();
    size_t best_i = 0;
    for (size_t i = 0; i + 1 < word.size(); ++i) {
      key.assign(word[i]).append(" ").append(word[i + 1]);
      auto it = ranks_.find(key);
      if (it != ranks_.end() && it->second < best) best = it->second, best_i = i;
    }
    if (best == std::numeric_limits<int64_t>::max()) break;
    const std::string first = word[best_i], second = word[best_i + 1];
    // Merge every occurrence, scanning left to right (encoder.py).
    std::vector<std::string> merged;
    merged.reserve(word.size());
    for (size_t i = 0; i < word.size();) {
      if (i + 1 < word.size() && word[i] == first && word[i + 1] == second) {
        merged.push_back(first + second);
        i += 2;
      } else {
        merged.push_back(word[i]);
        ++i;
      }
    }
    word.swap(merged);
    if (word.size() == 1) break;
  }
  return word;
}

std::vector<TokenId> GPT2BPETokenizer::tokenize(std::string_view raw) const {
  std::string fixed;
  std::string_view text = raw;
  if (!is_valid_utf8(raw)) {
    fixed = utf8_replace_invalid(raw);
    text = fixed;
  }
  std::vector<TokenId> ids;
  for (const auto& [b, e] : pattern_->find_all(text)) {
    const std::string piece = to_byte_level(text.substr(b, e - b));
    if (cache_.get(piece, ids)) continue;
    const size_t before = ids.size();
    for (const auto& tok : bpe(piece)) {
      auto it = encoder_.find(tok);
      if (it == encoder_.end()) {
        throw UsageError("GPT2BPETokenizer: BPE produced '" + tok +
                         "', which is not in the vocab file (vocab.json and merges.txt do not "
                         "belong together)");
      }
      ids.push_back(it->second);
    }
    cache_.put(piece, ids.data() + before, ids.size() - before);
  }
  return ids;
}

std::string GPT2BPETokenizer::detokenize(std::span<const TokenId> ids) const {
  std::string chars;
  for (TokenId id : ids) {
    auto it = decoder_.find(id);
    if (it == decoder_.end()) {
      throw UsageError("GPT2BPETokenizer: token id " + std::to_string(id) + " is not in the vocabulary");
    }
    chars += it->second;
  }
  std::string bytes;
  from_byte_level(chars, bytes);
  return utf8_replace_invalid(bytes);
}

}  // namespace laoyao::tokenizer
