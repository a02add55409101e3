#include "data/tokenizer/sentencepiece_model.hpp"

#include <algorithm>
#include <cstring>

#include "core/error.hpp"
#include "data/tokenizer/unicode.hpp"

namespace laoyao::tokenizer {
namespace {

constexpr std::string_view kSpaceSymbol = "\xE2\x96\x81";  // ▁

// Protobuf wire-format reader over one message.
struct Reader {
  std::string_view buf;
  size_t pos = 0;
  const std::string& what;

  [[noreturn]] void fail(const std::string& why) const {
    throw UsageError(what + ": not a valid SentencePiece model (" + why + " at byte " + std::to_string(pos) + ")");
  }
  bool done() const { return pos >= buf.size(); }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos >= buf.size()) fail("truncated varint");
      const uint8_t b = static_cast<uint8_t>(buf[pos++]);
      v |= static_cast<uint64_t>(b & 0x7F) << shift;
      if (!(b & 0x80)) return v;
    }
    fail("overlong varint");
  }
  std::string_view bytes() {
    const uint64_t n = varint();
    if (n > buf.size() - pos) fail("length-delimited field runs past the end");
    std::string_view s = buf.substr(pos, n);
    pos += n;
    return s;
  }
  float fixed32_float() {
    if (buf.size() - pos < 4) fail("truncated fixed32");
    float f;
    std::memcpy(&f, buf.data() + pos, 4);
    pos += 4;
    return f;
  }
  void skip(int wire) {
    switch (wire) {
      case 0: varint(); break;
      case 1:
        if (buf.size() - pos < 8) fail("truncated fixed64");
        pos += 8;
        break;
      case 2: bytes(); break;
      case 5:
        if (buf.size() - pos < 4) fail("truncated fixed32");
        pos += 4;
        break;
      default: fail("unsupported wire type " + std::to_string(wire));
    }
  }
  // The next (field number, wire type).
  std::pair<uint32_t, int> tag() {
    const uint64_t t = varint();
    if ((t >> 3) == 0) fail("field number 0");
    return {static_cast<uint32_t>(t >> 3), static_cast<int>(t & 7)};
  }
};

void expect_wire(Reader& r, int wire, int want, const char* field) {
  if (wire != want) r.fail(std::string("field ") + field + " has wire type " + std::to_string(wire));
}

void parse_piece(std::string_view b, SentencePieceModelProto::Piece& p, const std::string& what) {
  Reader r{b, 0, what};
  while (!r.done()) {
    auto [f, w] = r.tag();
    if (f == 1) { expect_wire(r, w, 2, "piece"); p.piece = std::string(r.bytes()); }
    else if (f == 2) { expect_wire(r, w, 5, "score"); p.score = r.fixed32_float(); }
    else if (f == 3) { expect_wire(r, w, 0, "type"); p.type = static_cast<int>(r.varint()); }
    else r.skip(w);
  }
}

int32_t as_int32(uint64_t v) { return static_cast<int32_t>(static_cast<uint32_t>(v)); }

void parse_trainer(std::string_view b, SentencePieceModelProto& m, const std::string& what) {
  Reader r{b, 0, what};
  while (!r.done()) {
    auto [f, w] = r.tag();
    switch (f) {
      case 3: expect_wire(r, w, 0, "model_type"); m.model_type = static_cast<int>(r.varint()); break;
      case 24: expect_wire(r, w, 0, "treat_whitespace_as_suffix"); m.treat_whitespace_as_suffix = r.varint() != 0; break;
      case 35: expect_wire(r, w, 0, "byte_fallback"); m.byte_fallback = r.varint() != 0; break;
      case 40: expect_wire(r, w, 0, "unk_id"); m.unk_id = as_int32(r.varint()); break;
      case 41: expect_wire(r, w, 0, "bos_id"); m.bos_id = as_int32(r.varint()); break;
      case 42: expect_wire(r, w, 0, "eos_id"); m.eos_id = as_int32(r.varint()); break;
      case 43: expect_wire(r, w, 0, "pad_id"); m.pad_id = as_int32(r.varint()); break;
      case 44: expect_wire(r, w, 2, "unk_surface"); m.unk_surface = std::string(r.bytes()); break;
      default: r.skip(w);
    }
  }
}

void parse_normalizer(std::string_view b, SentencePieceModelProto& m, const std::string& what) {
  Reader r{b, 0, what};
  while (!r.done()) {
    auto [f, w] = r.tag();
    switch (f) {
      case 1: expect_wire(r, w, 2, "name"); m.normalizer_name = std::string(r.bytes()); break;
      case 2: expect_wire(r, w, 2, "precompiled_charsmap"); m.precompiled_charsmap = std::string(r.bytes()); break;
      case 3: expect_wire(r, w, 0, "add_dummy_prefix"); m.add_dummy_prefix = r.varint() != 0; break;
      case 4: expect_wire(r, w, 0, "remove_extra_whitespaces"); m.remove_extra_whitespaces = r.varint() != 0; break;
      case 5: expect_wire(r, w, 0, "escape_whitespaces"); m.escape_whitespaces = r.varint() != 0; break;
      default: r.skip(w);
    }
  }
}

// Darts-clone double-array unit accessors.
bool unit_has_leaf(uint32_t u) { return (u >> 8) & 1; }
uint32_t unit_value(uint32_t u) { return u & ((1U << 31) - 1); }
uint32_t unit_label(uint32_t u) { return u & ((1U << 31) | 0xFF); }
uint32_t unit_offset(uint32_t u) { return (u >> 10) << ((u & (1U << 9)) >> 6); }

}  // namespace

SentencePieceModelProto parse_sentencepiece_model(std::string_view bytes, const std::string& what) {
  SentencePieceModelProto m;
  Reader r{bytes, 0, what};
  while (!r.done()) {
    auto [f, w] = r.tag();
    if (f == 1) {
      expect_wire(r, w, 2, "pieces");
      SentencePieceModelProto::Piece p;
      parse_piece(r.bytes(), p, what);
      m.pieces.push_back(std::move(p));
    } else if (f == 2) {
      expect_wire(r, w, 2, "trainer_spec");
      parse_trainer(r.bytes(), m, what);
    } else if (f == 3) {
      expect_wire(r, w, 2, "normalizer_spec");
      parse_normalizer(r.bytes(), m, what);
    } else {
      r.skip(w);
    }
  }
  if (m.pieces.empty()) throw UsageError(what + ": not a valid SentencePiece model (it has no pieces)");
  return m;
}

size_t longest_prefix_match(const std::vector<std::string>& longest_first, std::string_view s) {
  for (const auto& u : longest_first) {
    if (s.size() >= u.size() && s.compare(0, u.size(), u) == 0) return u.size();
  }
  return 0;
}

SentencePieceNormalizer::SentencePieceNormalizer(const SentencePieceModelProto& m,
                                                 std::vector<std::string> user_defined,
                                                 const std::string& what)
    : add_dummy_prefix_(m.add_dummy_prefix),
      remove_extra_whitespaces_(m.remove_extra_whitespaces),
      escape_whitespaces_(m.escape_whitespaces),
      suffix_(m.treat_whitespace_as_suffix),
      user_defined_(std::move(user_defined)) {
  std::stable_sort(user_defined_.begin(), user_defined_.end(),
                   [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
  const std::string& blob = m.precompiled_charsmap;
  if (blob.empty()) return;
  // uint32 trie size, the trie's units, then the replacement strings.
  if (blob.size() < 4) throw UsageError(what + ": precompiled_charsmap is truncated");
  uint32_t trie_bytes;
  std::memcpy(&trie_bytes, blob.data(), 4);
  if (trie_bytes % 4 != 0 || trie_bytes > blob.size() - 4) {
    throw UsageError(what + ": precompiled_charsmap has an invalid trie size");
  }
  trie_.resize(trie_bytes / 4);
  if (!trie_.empty()) std::memcpy(trie_.data(), blob.data() + 4, trie_bytes);
  normalized_ = blob.substr(4 + trie_bytes);
}

std::pair<std::string_view, size_t> SentencePieceNormalizer::normalize_prefix(std::string_view input) const {
  if (size_t n = longest_prefix_match(user_defined_, input)) return {input.substr(0, n), n};
  size_t longest = 0;
  uint32_t value = 0;
  if (!trie_.empty()) {
    // Darts commonPrefixSearch, keeping the longest hit.
    size_t node = 0;
    uint32_t unit = trie_[node];
    node ^= unit_offset(unit);
    for (size_t i = 0; i < input.size(); ++i) {
      const uint8_t c = static_cast<uint8_t>(input[i]);
      node ^= c;
      if (node >= trie_.size()) break;
      unit = trie_[node];
      if (unit_label(unit) != c) break;
      node ^= unit_offset(unit);
      if (node >= trie_.size()) break;
      if (unit_has_leaf(unit)) {
        longest = i + 1;
        value = unit_value(trie_[node]);
      }
    }
  }
  if (longest == 0) {
    size_t i = 0;
    utf8_next(input, i);
    if (utf8_char_len(input, 0) == 1 && static_cast<unsigned char>(input[0]) >= 0x80) {
      return {"\xEF\xBF\xBD", 1};  // malformed UTF-8 becomes U+FFFD
    }
    return {input.substr(0, i), i};
  }
  if (value >= normalized_.size()) return {input.substr(0, longest), longest};
  const char* s = normalized_.data() + value;
  return {std::string_view(s, strnlen(s, normalized_.size() - value)), longest};
}

std::string SentencePieceNormalizer::normalize(std::string_view input) const {
  std::string out;
  if (input.empty()) return out;
  if (remove_extra_whitespaces_) {
    while (!input.empty()) {
      auto p = normalize_prefix(input);
      if (p.first != " ") break;
      input.remove_prefix(p.second);
    }
  }
  if (input.empty()) return out;
  auto add_ws = [&] {
    if (escape_whitespaces_) out += kSpaceSymbol;
    else out += ' ';
  };
  if (!suffix_ && add_dummy_prefix_) add_ws();
  bool is_prev_space = remove_extra_whitespaces_;
  while (!input.empty()) {
    auto p = normalize_prefix(input);
    std::string_view sp = p.first;
    while (is_prev_space && !sp.empty() && sp[0] == ' ') sp.remove_prefix(1);
    if (!sp.empty()) {
      for (char c : sp) {
        if (escape_whitespaces_ && c == ' ') out += kSpaceSymbol;
        else out += c;
      }
      is_prev_space = sp.back() == ' ';
    }
    input.remove_prefix(p.second);
    if (!remove_extra_whitespaces_) is_prev_space = false;
  }
  if (remove_extra_whitespaces_) {
    const std::string_view space = escape_whitespaces_ ? kSpaceSymbol : std::string_view(" ");
    while (out.size() >= space.size() && std::string_view(out).substr(out.size() - space.size()) == space) {
      out.resize(out.size() - space.size());
    }
  }
  if (suffix_ && add_dummy_prefix_) add_ws();
  return out;
}

}  // namespace laoyao::tokenizer
