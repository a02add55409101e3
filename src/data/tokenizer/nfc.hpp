// Unicode Normalization Form C (HF's "NFC" normalizer, which Qwen2/Qwen3's tokenizer.json uses).
// Tables are generated from Python's unicodedata by gen_nfc_tables.py.
#pragma once
#include <string>
#include <string_view>

namespace laoyao::tokenizer {

// NFC of valid UTF-8 text (ASCII passes through untouched).
std::string nfc(std::string_view text);

}  // namespace laoyao::tokenizer
