// A compiled pre-tokenizer regex (PCRE2, UTF + Unicode properties). The patterns GPT-2, Llama 3
// and Qwen use (\p{L}, \p{N}, lookahead, (?i:...)) are valid PCRE2 as written. `\s`/`\S` are
// rewritten to the Unicode White_Space set, which is what Python's `regex` module and the Rust
// engines behind HF tokenizers mean by \s (PCRE2's own \s differs on U+0085 and U+180E, and
// between PCRE2 versions).
#pragma once
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace laoyao::tokenizer {

class Regex {
 public:
  // `what` names the pattern's origin for error messages (e.g. "tokenizer.json pre_tokenizer").
  Regex(const std::string& pattern, const std::string& what);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Every non-empty, non-overlapping match [begin, end) (byte offsets) scanning left to right,
  // as Python's finditer / Rust's find_iter. `text` must be valid UTF-8.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view text) const;

  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8*
};

// The rewrite of \s and \S described above (exposed for tests).
std::string rewrite_whitespace_classes(const std::string& pattern);

// GPT-2's pre-tokenizer pattern (also HF ByteLevel's use_regex=true).
inline constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

}  // namespace laoyao::tokenizer
