// UTF-8 helpers shared by the tokenizers.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include "core/text.hpp"

namespace laoyao::tokenizer {

inline constexpr char32_t kReplacementChar = 0xFFFD;

// Length in bytes of the (possibly invalid) UTF-8 character starting at s[i]: 1 for an invalid
// lead byte or a truncated/overlong sequence (it is then treated as one byte).
size_t utf8_char_len(std::string_view s, size_t i);
// Decodes the character at s[i] and advances i; invalid sequences give U+FFFD and advance 1.
char32_t utf8_next(std::string_view s, size_t& i);
using laoyao::append_utf8;  // (core/text.hpp)
bool is_valid_utf8(std::string_view s);
// Python's bytes.decode('utf-8', errors='replace'): each maximal invalid subpart becomes U+FFFD.
std::string utf8_replace_invalid(std::string_view s);
// Offset of the first byte of `s` that does not start a valid UTF-8 character, or npos.
size_t first_invalid_utf8(std::string_view s);
// `s` for a one-line error message, between single quotes: control characters and bytes that
// are not valid UTF-8 written as \xNN, and cut after `max_bytes` with "..." (a line of random
// bytes must not flood the terminal or break the message across lines).
std::string quote_text(std::string_view s, size_t max_bytes = 60);

}  // namespace laoyao::tokenizer
