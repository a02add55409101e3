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

// Reads one of the two files, saying which flag it came from when it cannot be read (a
// directory, a missing file).
std::string read_tokenizer_file(const std::string& path, const char* what) {
  try {
    return read_file(path);
  } catch (const UsageError& e) {
    throw UsageError(std::string("GPT2BPETokenizer ") + what + ": " + e.what());
  }
}

// vocab.json: a non-empty JSON object of token -> id, ids unique and in [0, 2^31).
std::unordered_map<std::string, TokenId> parse_vocab(const std::string& text, const std::string& file) {
  const std::string where = "GPT2BPETokenizer vocab file '" + file + "'";
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    throw UsageError(where + " is not valid JSON: " + e.what());
  }
  if (!j.is_object()) {
    throw UsageError(where + " must be a JSON object of token -> id (GPT-2's vocab.json / encoder.json), not " +
                     std::string(j.type_name()));
  }
  if (j.empty()) throw UsageError(where + " is an empty JSON object (expected token -> id entries)");
  std::unordered_map<std::string, TokenId> vocab;
  std::unordered_map<TokenId, std::string> by_id;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const auto& v = it.value();
    const bool in_range = (v.is_number_unsigned() && v.get<uint64_t>() <= INT32_MAX) ||
                          (v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() <= INT32_MAX);
    if (!in_range) {
      throw UsageError(where + ": the id of token " + quote_text(it.key()) + " is " + v.dump() +
                       " (expected an integer in [0, 2^31))");
    }
    const TokenId id = v.get<TokenId>();
    if (auto [other, fresh] = by_id.emplace(id, it.key()); !fresh) {
      throw UsageError(where + ": tokens " + quote_text(other->second) + " and " + quote_text(it.key()) +
                       " both have id " + std::to_string(id) + " (ids must be unique)");
    }
    vocab.emplace(it.key(), id);
  }
  // Byte-level BPE spells every text with these 256 characters; without one of them a byte of the
  // input has no token (Megatron would fail with a KeyError in the middle of preprocessing).
  if (const auto missing = byte_without_token([&](const std::string& ch) { return vocab.contains(ch); }))
    throw UsageError(where + " has no token for byte " + *missing +
                     "; a GPT-2 byte-level vocabulary has one for each of the 256 bytes");
  return vocab;
}

// merges.txt as gpt2_tokenization.py reads it (read().split('\n')[1:-1], then str.split() per
// line), refusing what that reader would silently misread: the first line must be the
// "#version" header (it is skipped unread), the file must end with a newline (the text after
// the last one is dropped), and each other non-blank line is one merge "a b" whose halves and
// concatenation are all tokens of vocab.json (HF refuses a merge outside the vocab).
std::unordered_map<std::string, int64_t> parse_merges(const std::string& text, const std::string& file,
                                                      const std::unordered_map<std::string, TokenId>& vocab,
                                                      const std::string& vocab_file) {
  const std::string where = "GPT2BPETokenizer merge file '" + file + "'";
  const auto at_line = [&](size_t n) { return where + " line " + std::to_string(n) + ": "; };
  if (text.empty()) {
    throw UsageError(where + " is empty (expected a '#version' header line, then one 'a b' merge per line)");
  }
  std::vector<std::string_view> lines;
  std::string_view all(text);
  for (size_t start = 0;;) {
    const size_t nl = all.find('\n', start);
    lines.push_back(all.substr(start, nl == std::string_view::npos ? std::string_view::npos : nl - start));
    if (nl == std::string_view::npos) break;
    start = nl + 1;
  }
  // Python decodes the whole file as UTF-8 first.
  for (size_t i = 0; i < lines.size(); ++i) {
    if (size_t bad = first_invalid_utf8(lines[i]); bad != std::string_view::npos) {
      throw UsageError(at_line(i + 1) + "not valid UTF-8 (byte " + std::to_string(bad + 1) + " of the line; " +
                       quote_text(lines[i]) + "); a merges file is UTF-8 text");
    }
  }
  if (!lines[0].starts_with("#version")) {
    throw UsageError(at_line(1) + quote_text(lines[0]) +
                     " is not the '#version: ...' header (Megatron skips the first line unread, so "
                     "a merges file without the header would silently lose its first merge)");
  }
  if (lines.size() > 1 && !split_ws(lines.back()).empty()) {
    throw UsageError(at_line(lines.size()) + quote_text(lines.back()) +
                     " does not end with a newline (Megatron drops a last line without one; end the "
                     "file with a newline)");
  }
  std::unordered_map<std::string, int64_t> ranks;
  for (size_t i = 1; i + 1 < lines.size(); ++i) {
    const auto parts = split_ws(lines[i]);
    if (parts.empty()) continue;  // a blank line is no merge (its tuple never matches a pair)
    if (parts.size() != 2) {
      throw UsageError(at_line(i + 1) + quote_text(lines[i]) + " has " + std::to_string(parts.size()) +
                       " field" + (parts.size() == 1 ? "" : "s") + "; expected one merge 'a b' (two tokens)");
    }
    for (const std::string& tok : {parts[0], parts[1], parts[0] + parts[1]}) {
      if (!vocab.contains(tok)) {
        throw UsageError(at_line(i + 1) + "merge " + quote_text(lines[i]) + " uses " + quote_text(tok) +
                         ", which is not a token of vocab file '" + vocab_file +
                         "' (the merges and vocab files do not belong together)");
      }
    }
    // dict(zip(merges, range(len(merges)))): a later duplicate pair overwrites the earlier rank.
    ranks[parts[0] + " " + parts[1]] = static_cast<int64_t>(i - 1);
  }
  return ranks;
}

}  // namespace

GPT2BPETokenizer::GPT2BPETokenizer(const std::string& vocab_file, const std::string& merge_file) {
  load(read_tokenizer_file(vocab_file, "vocab file (--vocab-file)"),
       read_tokenizer_file(merge_file, "merge file (--merge-file)"), vocab_file, merge_file);
}

std::unique_ptr<GPT2BPETokenizer> GPT2BPETokenizer::from_strings(const std::string& vocab_json,
                                                                 const std::string& merges_txt) {
  std::unique_ptr<GPT2BPETokenizer> t(new GPT2BPETokenizer());
  t->load(vocab_json, merges_txt, "<vocab.json>", "<merges.txt>");
  return t;
}

void GPT2BPETokenizer::load(const std::string& vocab_json, const std::string& merges_txt,
                            const std::string& vocab_name, const std::string& merges_name) {
  encoder_ = parse_vocab(vocab_json, vocab_name);
  for (const auto& [tok, id] : encoder_) decoder_.emplace(id, tok);
  ranks_ = parse_merges(merges_txt, merges_name, encoder_, vocab_name);
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
