// UTF-8 helpers shared by the tokenizers.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace laoyao::tokenizer {

inline constexpr char32_t kReplacementChar = 0xFFFD;

// Length in bytes of the (possibly invalid) UTF-8 character starting at s[i]: 1 for an invalid
// lead byte or a truncated/overlong sequence (it is then treated as one byte).
size_t utf8_char_len(std::string_view s, size_t i);
// Decodes the character at s[i] and advances i; invalid sequences give U+FFFD and advance 1.
char32_t utf8_next(std::string_view s, size_t& i);
void append_utf8(std::string& out, char32_t c);
bool is_valid_utf8(std::string_view s);
// Python's bytes.decode('utf-8', errors='replace'): each maximal invalid subpart becomes U+FFFD.
std::string utf8_replace_invalid(std::string_view s);

}  // namespace laoyao::tokenizer
