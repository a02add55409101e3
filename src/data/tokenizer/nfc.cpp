#include "data/tokenizer/nfc.hpp"

#include <algorithm>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "data/tokenizer/unicode.hpp"

namespace laoyao::tokenizer {
namespace {

#include "data/tokenizer/nfc_tables.inc"

// Hangul syllables are (de)composed algorithmically (Unicode §3.12).
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount,
                   kSCount = kLCount * kNCount;

struct Data {
  std::unordered_map<char32_t, uint8_t> ccc;
  std::unordered_map<char32_t, std::pair<char32_t, char32_t>> decomp;
  std::unordered_map<uint64_t, char32_t> compose;
  Data() {
    for (const auto& e : kCccTable) ccc[e[0]] = static_cast<uint8_t>(e[1]);
    for (const auto& e : kDecompTable) decomp[e[0]] = {e[1], e[2]};
    for (const auto& e : kComposeTable) compose[(uint64_t{e[0]} << 32) | e[1]] = e[2];
  }
};

const Data& data() {
  static const Data d;
  return d;
}

uint8_t ccc_of(const Data& d, char32_t c) {
  auto it = d.ccc.find(c);
  return it == d.ccc.end() ? 0 : it->second;
}

void decompose(const Data& d, char32_t c, std::vector<char32_t>& out) {
  if (c >= kSBase && c < kSBase + kSCount) {
    const char32_t s = c - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount) out.push_back(kTBase + s % kTCount);
    return;
  }
  auto it = d.decomp.find(c);
  if (it == d.decomp.end()) {
    out.push_back(c);
    return;
  }
  decompose(d, it->second.first, out);
  if (it->second.second) decompose(d, it->second.second, out);
}

char32_t compose_pair(const Data& d, char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount) {
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  }
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount) {
    return a + (b - kTBase);
  }
  auto it = d.compose.find((uint64_t{a} << 32) | b);
  return it == d.compose.end() ? 0 : it->second;
}

}  // namespace

std::string nfc(std::string_view text) {
  bool ascii = true;
  for (char c : text) ascii &= static_cast<unsigned char>(c) < 0x80;
  if (ascii) return std::string(text);
  const Data& d = data();
  // 1. Full canonical decomposition.
  std::vector<char32_t> cps;
  cps.reserve(text.size());
  for (size_t i = 0; i < text.size();) decompose(d, utf8_next(text, i), cps);
  // 2. Canonical ordering: stable sort of each run of non-starters by combining class.
  for (size_t i = 0; i < cps.size();) {
    if (ccc_of(d, cps[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < cps.size() && ccc_of(d, cps[j]) != 0) ++j;
    std::stable_sort(cps.begin() + static_cast<std::ptrdiff_t>(i), cps.begin() + static_cast<std::ptrdiff_t>(j),
                     [&](char32_t a, char32_t b) { return ccc_of(d, a) < ccc_of(d, b); });
    i = j;
  }
  // 3. Canonical composition.
  std::vector<char32_t> out;
  out.reserve(cps.size());
  std::ptrdiff_t starter = -1;  // index in out of the last starter
  int last_ccc = -1;            // class of the last character appended after the starter
  for (char32_t c : cps) {
    const int cc = ccc_of(d, c);
    if (starter >= 0) {
      // Not blocked: nothing between, or the last one has a lower, non-zero class.
      const bool blocked = last_ccc != -1 && (last_ccc == 0 || last_ccc >= cc);
      if (!blocked) {
        if (char32_t comp = compose_pair(d, out[static_cast<size_t>(starter)], c)) {
          out[static_cast<size_t>(starter)] = comp;
          continue;
        }
      }
    }
    if (cc == 0) {
      starter = static_cast<std::ptrdiff_t>(out.size());
      last_ccc = -1;
    } else {
      last_ccc = cc;
    }
    out.push_back(c);
  }
  std::string s;
  s.reserve(text.size());
  for (char32_t c : out) append_utf8(s, c);
  return s;
}

}  // namespace laoyao::tokenizer
