#include "data/tokenizer/byte_level.hpp"

#include <array>
#include <cstdio>

#include "data/tokenizer/unicode.hpp"

namespace laoyao::tokenizer {
namespace {

struct Tables {
  std::array<std::string, 256> chars;
  std::array<int, 512> bytes;  // code point (< 512) -> byte or -1
  Tables() {
    bytes.fill(-1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const char32_t cp = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      append_utf8(chars[b], cp);
      bytes[cp] = b;
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

const std::string& byte_level_char(unsigned char b) { return tables().chars[b]; }

int byte_level_byte(char32_t c) { return c < 512 ? tables().bytes[c] : -1; }

std::string to_byte_level(std::string_view bytes) {
  const auto& t = tables();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) out += t.chars[b];
  return out;
}

bool from_byte_level(std::string_view s, std::string& bytes, bool strict) {
  for (size_t i = 0; i < s.size();) {
    const size_t start = i;
    const char32_t c = utf8_next(s, i);
    const int b = byte_level_byte(c);
    if (b >= 0) {
      bytes.push_back(static_cast<char>(b));
    } else {
      if (strict) return false;
      bytes.append(s.substr(start, i - start));
    }
  }
  return true;
}

std::optional<std::string> byte_without_token(const std::function<bool(const std::string&)>& has_token) {
  for (int b = 0; b < 256; ++b) {
    const std::string& ch = byte_level_char(static_cast<unsigned char>(b));
    if (has_token(ch)) continue;
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02X", b);
    return std::string(hex) + " (byte-level character " + quote_text(ch) + ")";
  }
  return std::nullopt;
}

}  // namespace laoyao::tokenizer
