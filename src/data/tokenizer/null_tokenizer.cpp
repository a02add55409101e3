#include "data/tokenizer/null_tokenizer.hpp"

#include <limits>

#include "core/error.hpp"

namespace laoyao::tokenizer {
namespace {

// The ASCII characters Python's str.strip() removes (str.isspace()).
bool py_space(char c) {
  return c == ' ' || (c >= '\t' && c <= '\r') || (c >= '\x1c' && c <= '\x1f');
}

// Python int(piece) for base-10 ASCII input; nullopt when Python would raise ValueError (or the
// value does not fit int64).
std::optional<int64_t> parse_python_int(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && py_space(s[b])) ++b;
  while (e > b && py_space(s[e - 1])) --e;
  s = s.substr(b, e - b);
  bool neg = false;
  size_t i = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
  if (i >= s.size()) return std::nullopt;
  // Magnitude accumulated as negative to reach INT64_MIN.
  int64_t v = 0;
  bool prev_digit = false;
  for (; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '_') {
      // Underscores only between digits.
      if (!prev_digit || i + 1 >= s.size() || s[i + 1] < '0' || s[i + 1] > '9') return std::nullopt;
      prev_digit = false;
      continue;
    }
    if (c < '0' || c > '9') return std::nullopt;
    const int d = c - '0';
    if (v < (std::numeric_limits<int64_t>::min() + d) / 10) return std::nullopt;
    v = v * 10 - d;
    prev_digit = true;
  }
  if (!neg) {
    if (v == std::numeric_limits<int64_t>::min()) return std::nullopt;
    v = -v;
  }
  return v;
}

}  // namespace

NullTokenizer::NullTokenizer(int64_t vocab_size, NullTokenizerSemantics semantics,
                             std::optional<TokenId> eod_override)
    : semantics_(semantics) {
  if (vocab_size < 1) {
    throw UsageError("NullTokenizer needs --vocab-size >= 1, got " + std::to_string(vocab_size));
  }
  if (semantics == NullTokenizerSemantics::kBridge) {
    if (eod_override) {
      throw UsageError("NullTokenizer: an EOD id override exists only with Megatron-LM's semantics "
                       "(Megatron-Bridge's NullTokenizer has eod = vocab_size)");
    }
    vocab_size_ = vocab_size + 1;
    eod_ = vocab_size;
  } else {
    vocab_size_ = vocab_size;
    eod_ = eod_override ? *eod_override : vocab_size - 1;
  }
}

std::vector<TokenId> NullTokenizer::tokenize(std::string_view text) const {
  std::vector<TokenId> ids;
  size_t start = 0;
  while (true) {
    size_t sp = text.find(' ', start);
    std::string_view piece = text.substr(start, sp == std::string_view::npos ? std::string_view::npos : sp - start);
    auto v = parse_python_int(piece);
    if (!v) {
      throw UsageError("NullTokenizer: '" + std::string(piece.substr(0, 40)) +
                       "' is not an integer (its text must be token ids separated by single "
                       "spaces, e.g. \"12 7 31999\")");
    }
    ids.push_back(*v);
    if (sp == std::string_view::npos) break;
    start = sp + 1;
  }
  return ids;
}

std::string NullTokenizer::detokenize(std::span<const TokenId> ids) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out.push_back(' ');
    out += std::to_string(ids[i]);
  }
  return out;
}

}  // namespace laoyao::tokenizer
