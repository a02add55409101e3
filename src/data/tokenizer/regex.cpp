#define PCRE2_CODE_UNIT_WIDTH 8
#include "data/tokenizer/regex.hpp"

#include <pcre2.h>

#include "core/error.hpp"

namespace laoyao::tokenizer {
namespace {

// Unicode's White_Space property, as a character-class body.
constexpr const char* kWhiteSpaceBody =
    R"(\x{09}-\x{0D}\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

pcre2_code* as_code(void* p) { return static_cast<pcre2_code*>(p); }

}  // namespace

std::string rewrite_whitespace_classes(const std::string& p) {
  std::string out;
  out.reserve(p.size() + 64);
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char n = p[i + 1];
      if (n == 's') {
        out += in_class ? std::string(kWhiteSpaceBody) : "[" + std::string(kWhiteSpaceBody) + "]";
      } else if (n == 'S' && !in_class) {
        out += "[^" + std::string(kWhiteSpaceBody) + "]";
      } else {
        out += c;
        out += n;
      }
      ++i;
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (c == ']' && in_class) in_class = false;
    out += c;
  }
  return out;
}

Regex::Regex(const std::string& pattern, const std::string& what) : pattern_(pattern) {
  const std::string rewritten = rewrite_whitespace_classes(pattern);
  int err = 0;
  PCRE2_SIZE err_off = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(rewritten.data()), rewritten.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &err, &err_off, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    throw UsageError(what + ": cannot compile regex '" + pattern + "': " +
                     reinterpret_cast<const char*>(msg) + " (at offset " + std::to_string(err_off) +
                     " of the rewritten pattern)");
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // speed only; matching works without it
  code_ = code;
}

Regex::~Regex() { pcre2_code_free(as_code(code_)); }

std::vector<std::pair<size_t, size_t>> Regex::find_all(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> out;
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(as_code(code_), nullptr);
  if (!md) throw Error("out of memory creating PCRE2 match data");
  size_t pos = 0;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  while (pos < text.size()) {
    int rc = pcre2_match(as_code(code_), subject, text.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      pcre2_match_data_free(md);
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof(msg));
      throw Error("regex '" + pattern_ + "' failed: " + reinterpret_cast<const char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t b = ov[0], e = ov[1];
    if (e > b) {
      out.emplace_back(b, e);
      pos = e;
    } else {
      // An empty match: step over one UTF-8 character.
      pos = b + 1;
      while (pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) ++pos;
    }
  }
  pcre2_match_data_free(md);
  return out;
}

}  // namespace laoyao::tokenizer
