#include "data/tokenizer/unicode.hpp"

namespace laoyao::tokenizer {
namespace {

// Returns the sequence length (2..4) and the code point for a valid sequence at s[i], else 0.
size_t decode_valid(std::string_view s, size_t i, char32_t& cp) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char c = b(0);
  size_t n;
  char32_t min;
  if (c < 0x80) {
    cp = c;
    return 1;
  } else if ((c & 0xE0) == 0xC0) {
    n = 2, cp = c & 0x1F, min = 0x80;
  } else if ((c & 0xF0) == 0xE0) {
    n = 3, cp = c & 0x0F, min = 0x800;
  } else if ((c & 0xF8) == 0xF0) {
    n = 4, cp = c & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((b(k) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b(k) & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return n;
}

}  // namespace

size_t utf8_char_len(std::string_view s, size_t i) {
  char32_t cp;
  size_t n = decode_valid(s, i, cp);
  return n ? n : 1;
}

char32_t utf8_next(std::string_view s, size_t& i) {
  char32_t cp;
  size_t n = decode_valid(s, i, cp);
  if (!n) {
    ++i;
    return kReplacementChar;
  }
  i += n;
  return cp;
}

bool is_valid_utf8(std::string_view s) { return first_invalid_utf8(s) == std::string_view::npos; }

size_t first_invalid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    char32_t cp;
    size_t n = decode_valid(s, i, cp);
    if (!n) return i;
    i += n;
  }
  return std::string_view::npos;
}

std::string quote_text(std::string_view s, size_t max_bytes) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out = "'";
  size_t i = 0;
  while (i < s.size() && i < max_bytes) {
    char32_t cp;
    const size_t n = decode_valid(s, i, cp);
    if (n > 1 || (n == 1 && cp >= 0x20 && cp != 0x7F)) {
      out.append(s.substr(i, n));
      i += n;
      continue;
    }
    const auto b = static_cast<unsigned char>(s[i++]);
    out += "\\x";
    out += kHex[b >> 4];
    out += kHex[b & 0xF];
  }
  if (i < s.size()) out += "...";
  return out + "'";
}

std::string utf8_replace_invalid(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    char32_t cp;
    size_t n = decode_valid(s, i, cp);
    if (n) {
      out.append(s.substr(i, n));
      i += n;
      continue;
    }
    // Maximal subpart (Unicode §3.9 / Python): the longest prefix of a valid sequence.
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t len = 1;
    unsigned char lo = 0x80, hi = 0xBF;
    size_t need = 0;
    if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c >= 0xE0 && c <= 0xEF) {
      need = 2;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      need = 3;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    }
    for (size_t k = 1; k <= need && i + k < s.size(); ++k) {
      const unsigned char d = static_cast<unsigned char>(s[i + k]);
      if (k == 1 ? (d < lo || d > hi) : (d & 0xC0) != 0x80) break;
      ++len;
    }
    append_utf8(out, kReplacementChar);
    i += len;
  }
  return out;
}

}  // namespace laoyao::tokenizer
