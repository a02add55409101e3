// GPT-2's reversible byte <-> printable-unicode map (encoder.py bytes_to_unicode, HF ByteLevel):
// bytes '!'..'~', '¡'..'¬', '®'..'ÿ' map to themselves, the other 68 bytes to U+0100.. in order.
#pragma once
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace laoyao::tokenizer {

// UTF-8 of the character byte `b` maps to.
const std::string& byte_level_char(unsigned char b);
// The byte a character stands for, or -1 if it is not one of the 256.
int byte_level_byte(char32_t c);
// Every byte of `bytes` replaced by its character.
std::string to_byte_level(std::string_view bytes);
// The inverse; characters outside the map are kept as their own UTF-8 (HF's ByteLevel decoder)
// or, with `strict`, make the function return false.
bool from_byte_level(std::string_view s, std::string& bytes, bool strict = false);
// A byte-level vocabulary spells every text with the 256 characters: the first byte whose
// character `has_token` does not find, described for a message ("0x0A (byte-level character
// 'Ċ')"), or nullopt when all are there.
std::optional<std::string> byte_without_token(const std::function<bool(const std::string&)>& has_token);

}  // namespace laoyao::tokenizer
