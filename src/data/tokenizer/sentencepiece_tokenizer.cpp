#include "data/tokenizer/sentencepiece_tokenizer.hpp"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <queue>

#include "core/error.hpp"
#include "core/file_io.hpp"
#include "data/tokenizer/unicode.hpp"

namespace laoyao::tokenizer {
namespace {

constexpr std::string_view kSpaceSymbol = "\xE2\x96\x81";
constexpr float kUnkPenalty = 10.0f;

// SentencePiece's OneCharLen: the UTF-8 length implied by the lead byte alone.
size_t one_char_len(unsigned char c) {
  static constexpr size_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[c >> 4];
}

// The byte a "<0xNN>" piece stands for (SentencePiece writes NN as two uppercase hex digits and
// accepts only that spelling), or -1.
int byte_piece_value(std::string_view piece) {
  auto hex = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1; };
  if (piece.size() != 6 || !piece.starts_with("<0x") || piece[5] != '>') return -1;
  const int hi = hex(piece[3]), lo = hex(piece[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

// What SentencePiece's ModelInterface requires of each piece, plus UTF-8 (pieces are text: an
// invalid one could never match normalized input and would only hide a corrupt file).
void check_piece(const SentencePieceModelProto::Piece& p, size_t i, const std::string& what) {
  const std::string where = what + ": piece " + std::to_string(i);
  if (p.piece.empty()) throw UsageError(where + " is empty");
  if (p.piece.size() >= 8000) {
    throw UsageError(where + " is " + std::to_string(p.piece.size()) + " bytes long (SentencePiece's limit is 7999)");
  }
  if (p.piece.find('\0') != std::string::npos) {
    throw UsageError(where + " " + quote_text(p.piece) + " contains a NUL byte");
  }
  if (size_t bad = first_invalid_utf8(p.piece); bad != std::string::npos) {
    throw UsageError(where + " " + quote_text(p.piece) + " is not valid UTF-8 (byte " + std::to_string(bad + 1) + ")");
  }
  if (p.type < SentencePieceModelProto::kNormal || p.type > SentencePieceModelProto::kByte) {
    throw UsageError(where + " " + quote_text(p.piece) + " has type " + std::to_string(p.type) +
                     " (accepted: 1 NORMAL, 2 UNKNOWN, 3 CONTROL, 4 USER_DEFINED, 5 UNUSED, 6 BYTE)");
  }
}

}  // namespace

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

SentencePieceTokenizer::SentencePieceTokenizer(const std::string& model_file, SentencePieceFlavor flavor,
                                               int vocab_extra_ids) {
  std::string bytes;
  try {
    bytes = read_file(model_file);
  } catch (const UsageError& e) {
    throw UsageError(std::string("SentencePiece model (--tokenizer-model): ") + e.what());
  }
  init(bytes, "SentencePiece model '" + model_file + "'", flavor, vocab_extra_ids);
}

std::unique_ptr<SentencePieceTokenizer> SentencePieceTokenizer::from_bytes(std::string_view model_proto,
                                                                           SentencePieceFlavor flavor,
                                                                           int vocab_extra_ids) {
  std::unique_ptr<SentencePieceTokenizer> t(new SentencePieceTokenizer());
  t->init(model_proto, "SentencePiece model", flavor, vocab_extra_ids);
  return t;
}

std::string SentencePieceTokenizer::name() const {
  switch (flavor_) {
    case SentencePieceFlavor::kMegatron: return "SentencePieceTokenizer";
    case SentencePieceFlavor::kGPT: return "GPTSentencePieceTokenizer";
    case SentencePieceFlavor::kLlama2: return "Llama2Tokenizer";
  }
  return "SentencePieceTokenizer";
}

void SentencePieceTokenizer::init(std::string_view bytes, const std::string& what, SentencePieceFlavor flavor,
                                  int extra_ids) {
  model_ = parse_sentencepiece_model(bytes, what);
  flavor_ = flavor;
  if (model_.model_type != SentencePieceModelProto::kBpe && model_.model_type != SentencePieceModelProto::kUnigram) {
    throw UsageError(what + ": model type " + std::to_string(model_.model_type) +
                     " (WORD or CHAR) is not supported; only BPE and UNIGRAM models are");
  }
  std::fill(std::begin(byte_ids_), std::end(byte_ids_), TokenId{-1});
  bool have_unk = false;
  min_score_ = 3.402823466e+38f;
  max_score_ = 1.175494351e-38f;  // FLT_MIN, as SentencePiece initialises it
  std::vector<std::string> user_defined;
  for (size_t i = 0; i < model_.pieces.size(); ++i) {
    const auto& p = model_.pieces[i];
    const TokenId id = static_cast<TokenId>(i);
    check_piece(p, i, what);
    const bool normal = p.type == SentencePieceModelProto::kNormal || p.type == SentencePieceModelProto::kUserDefined ||
                        p.type == SentencePieceModelProto::kUnused;
    Map& m = normal ? pieces_ : reserved_;
    if (!m.emplace(p.piece, id).second) throw UsageError(what + ": piece '" + p.piece + "' is defined twice");
    if (p.type == SentencePieceModelProto::kUserDefined) user_defined.push_back(p.piece);
    if (p.type == SentencePieceModelProto::kNormal) {
      min_score_ = std::min(min_score_, p.score);
      max_score_ = std::max(max_score_, p.score);
    }
    if (normal) max_piece_bytes_ = std::max(max_piece_bytes_, p.piece.size());
    if (p.type == SentencePieceModelProto::kUnknown) {
      if (have_unk) throw UsageError(what + ": more than one unknown piece");
      have_unk = true;
      unk_id_ = id;
    }
    if (p.type == SentencePieceModelProto::kByte) {
      if (!model_.byte_fallback) throw UsageError(what + ": byte piece '" + p.piece + "' found but byte_fallback is off");
      const int b = byte_piece_value(p.piece);
      if (b < 0) {
        throw UsageError(what + ": byte piece " + quote_text(p.piece) +
                         " is not of the form <0xNN> (NN: uppercase hex)");
      }
      byte_ids_[b] = id;
    }
  }
  if (!have_unk) throw UsageError(what + ": the model defines no unknown piece");
  // SentencePiece refuses a byte_fallback model that cannot spell every byte.
  if (model_.byte_fallback) {
    for (int b = 0; b < 256; ++b) {
      if (byte_ids_[b] < 0) {
        char name[8];
        std::snprintf(name, sizeof(name), "<0x%02X>", b);
        throw UsageError(what + ": byte_fallback is on but there is no byte piece " + name +
                         " (such a model has all 256)");
      }
    }
  }
  std::stable_sort(user_defined.begin(), user_defined.end(),
                   [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
  user_defined_ = user_defined;
  normalizer_ = std::make_unique<SentencePieceNormalizer>(model_, user_defined, what);

  const int64_t n = static_cast<int64_t>(model_.pieces.size());
  auto id_to_piece = [&](int id, const char* fallback) -> std::string {
    return id >= 0 && id < n ? model_.pieces[static_cast<size_t>(id)].piece : std::string(fallback);
  };
  switch (flavor) {
    case SentencePieceFlavor::kGPT:
    case SentencePieceFlavor::kLlama2:
      if (extra_ids != 0) throw UsageError(name() + " takes no --vocab-extra-ids");
      vocab_size_ = n;
      eod_ = model_.eos_id;
      break;
    case SentencePieceFlavor::kMegatron: {
      // Megatron's _SentencePieceTokenizer._initalize: vocab = the model's pieces, then each
      // special token it lacks is appended.
      std::unordered_map<std::string, TokenId> vocab;
      for (int64_t i = 0; i < n; ++i) vocab.emplace(model_.pieces[static_cast<size_t>(i)].piece, i);
      auto add = [&](const std::string& t) {
        auto it = vocab.find(t);
        TokenId id;
        if (it == vocab.end()) {
          id = static_cast<TokenId>(vocab.size());
          vocab.emplace(t, id);
        } else {
          id = it->second;
        }
        bool known = false;
        for (auto& [c, i] : specials_) known |= c == t;
        if (!known) specials_.emplace_back(t, id);
        special_by_id_[id] = t;
        return id;
      };
      add("<CLS>");
      add("<SEP>");
      eod_ = add("<EOD>");
      add("<MASK>");
      add(id_to_piece(model_.pad_id, "<PAD>"));
      add(id_to_piece(model_.bos_id, "<BOS>"));
      add(id_to_piece(model_.eos_id, "<EOS>"));
      for (int i = 0; i < extra_ids; ++i) add("<extra_id_" + std::to_string(i) + ">");
      vocab_size_ = static_cast<int64_t>(vocab.size());
      break;
    }
  }
}

TokenId SentencePieceTokenizer::piece_to_id(std::string_view piece) const {
  auto r = reserved_.find(piece);
  if (r != reserved_.end()) return r->second;
  auto p = pieces_.find(piece);
  if (p != pieces_.end()) return p->second;
  return unk_id_;
}

bool SentencePieceTokenizer::is_unused(TokenId id) const {
  return model_.pieces[static_cast<size_t>(id)].type == SentencePieceModelProto::kUnused;
}

std::vector<SentencePieceTokenizer::Piece> SentencePieceTokenizer::encode_bpe(const std::string& normalized) const {
  struct Symbol {
    std::ptrdiff_t prev, next;
    bool freeze;
    std::string_view piece;
  };
  struct Pair {
    std::ptrdiff_t left, right;
    float score;
    size_t size;
  };
  // Highest score first; among equals the leftmost (SentencePiece's SymbolPairComparator).
  auto cmp = [](const Pair& a, const Pair& b) {
    if (a.score != b.score) return a.score < b.score;
    return a.left > b.left;
  };
  std::priority_queue<Pair, std::vector<Pair>, decltype(cmp)> agenda(cmp);
  std::unordered_map<std::string_view, std::pair<std::string_view, std::string_view>> rev_merge;
  std::vector<Symbol> symbols;
  std::string_view rest(normalized);
  while (!rest.empty()) {
    size_t len = longest_prefix_match(user_defined_, rest);
    const bool freeze = len > 0;
    if (!freeze) len = std::min(rest.size(), one_char_len(static_cast<unsigned char>(rest[0])));
    const std::ptrdiff_t i = static_cast<std::ptrdiff_t>(symbols.size());
    symbols.push_back({i - 1, rest.size() == len ? -1 : i + 1, freeze, rest.substr(0, len)});
    rest.remove_prefix(len);
  }
  auto maybe_add = [&](std::ptrdiff_t l, std::ptrdiff_t r) {
    if (l == -1 || r == -1) return;
    const Symbol& a = symbols[static_cast<size_t>(l)];
    const Symbol& b = symbols[static_cast<size_t>(r)];
    if (a.freeze || b.freeze) return;
    const std::string_view piece(a.piece.data(), a.piece.size() + b.piece.size());
    auto it = pieces_.find(piece);
    if (it == pieces_.end()) return;
    agenda.push({l, r, model_.pieces[static_cast<size_t>(it->second)].score, piece.size()});
    if (is_unused(it->second)) rev_merge[piece] = {a.piece, b.piece};
  };
  for (size_t i = 1; i < symbols.size(); ++i) maybe_add(static_cast<std::ptrdiff_t>(i - 1), static_cast<std::ptrdiff_t>(i));
  while (!agenda.empty()) {
    const Pair top = agenda.top();
    agenda.pop();
    Symbol& l = symbols[static_cast<size_t>(top.left)];
    Symbol& r = symbols[static_cast<size_t>(top.right)];
    if (l.piece.empty() || r.piece.empty() || l.piece.size() + r.piece.size() != top.size) continue;
    l.piece = std::string_view(l.piece.data(), l.piece.size() + r.piece.size());
    l.next = r.next;
    if (r.next >= 0) symbols[static_cast<size_t>(r.next)].prev = top.left;
    r.piece = std::string_view();
    maybe_add(l.prev, top.left);
    maybe_add(top.left, l.next);
  }
  std::vector<Piece> out;
  std::function<void(std::string_view)> resegment = [&](std::string_view w) {
    const TokenId id = piece_to_id(w);
    if (!is_unused(id)) {
      out.push_back({w, id});
      return;
    }
    auto p = rev_merge.find(w);
    if (p == rev_merge.end()) {
      out.push_back({w, id});
      return;
    }
    resegment(p->second.first);
    resegment(p->second.second);
  };
  if (symbols.empty()) return out;
  for (std::ptrdiff_t i = 0; i != -1; i = symbols[static_cast<size_t>(i)].next) resegment(symbols[static_cast<size_t>(i)].piece);
  return out;
}

std::vector<SentencePieceTokenizer::Piece> SentencePieceTokenizer::encode_unigram(const std::string& normalized) const {
  struct Best {
    TokenId id = -1;
    float score = 0;
    std::ptrdiff_t starts_at = -1;
  };
  const size_t size = normalized.size();
  const float unk_score = min_score_ - kUnkPenalty;
  std::vector<Best> best(size + 1);
  std::string_view text(normalized);
  size_t start = 0;
  while (start < size) {
    const float till_here = best[start].score;
    const size_t mblen = std::min(one_char_len(static_cast<unsigned char>(text[start])), size - start);
    bool has_single = false;
    // Every piece that starts here, shortest first (the order of SentencePiece's trie walk).
    const size_t max_end = std::min(size, start + max_piece_bytes_);
    for (size_t end = start + 1; end <= max_end; ++end) {
      auto it = pieces_.find(text.substr(start, end - start));
      if (it == pieces_.end()) continue;
      const TokenId id = it->second;
      if (is_unused(id)) continue;
      const size_t length = end - start;
      const auto& p = model_.pieces[static_cast<size_t>(id)];
      // User-defined symbols get a bonus so that they are always chosen.
      const double score = p.type == SentencePieceModelProto::kUserDefined
                               ? static_cast<double>(static_cast<float>(length) * max_score_) - 0.1
                               : static_cast<double>(p.score);
      const double candidate = score + static_cast<double>(till_here);
      Best& t = best[end];
      if (t.starts_at == -1 || candidate > static_cast<double>(t.score)) {
        t.score = static_cast<float>(candidate);
        t.starts_at = static_cast<std::ptrdiff_t>(start);
        t.id = id;
      }
      if (!has_single && length == mblen) has_single = true;
    }
    if (!has_single) {
      Best& t = best[start + mblen];
      const float candidate = unk_score + till_here;
      if (t.starts_at == -1 || candidate > t.score) {
        t.score = candidate;
        t.starts_at = static_cast<std::ptrdiff_t>(start);
        t.id = unk_id_;
      }
    }
    start += mblen;
  }
  std::vector<Piece> out;
  for (size_t end = size; end > 0;) {
    const Best& b = best[end];
    const size_t s = static_cast<size_t>(b.starts_at);
    out.push_back({text.substr(s, end - s), b.id});
    end = s;
  }
  std::reverse(out.begin(), out.end());
  return out;
}

std::vector<SentencePieceTokenizer::Piece> SentencePieceTokenizer::encode_pieces(const std::string& normalized) const {
  std::vector<Piece> raw = model_.model_type == SentencePieceModelProto::kBpe ? encode_bpe(normalized)
                                                                              : encode_unigram(normalized);
  // PopulateSentencePieceText: unknowns become bytes (byte fallback) or one merged <unk>.
  std::vector<Piece> out;
  bool prev_unk = false;
  for (const Piece& p : raw) {
    const bool unk = p.id == unk_id_;
    if (unk && model_.byte_fallback) {
      for (size_t i = 0; i < p.text.size(); ++i) {
        const TokenId b = byte_ids_[static_cast<unsigned char>(p.text[i])];
        out.push_back({p.text.substr(i, 1), b >= 0 ? b : unk_id_});
      }
    } else if (unk && prev_unk) {
      Piece& last = out.back();
      last.text = std::string_view(last.text.data(), last.text.size() + p.text.size());
    } else {
      out.push_back(p);
    }
    prev_unk = unk;
  }
  return out;
}

std::vector<TokenId> SentencePieceTokenizer::encode_as_ids(std::string_view text) const {
  const std::string normalized = normalizer_->normalize(text);
  std::vector<TokenId> ids;
  for (const Piece& p : encode_pieces(normalized)) ids.push_back(p.id);
  return ids;
}

std::vector<std::string> SentencePieceTokenizer::encode_as_pieces(std::string_view text) const {
  const std::string normalized = normalizer_->normalize(text);
  std::vector<std::string> out;
  for (const Piece& p : encode_pieces(normalized)) {
    // A byte-fallback piece is shown as its <0xXX> name.
    const auto& mp = model_.pieces[static_cast<size_t>(p.id)];
    out.push_back(mp.type == SentencePieceModelProto::kByte ? mp.piece : std::string(p.text));
  }
  return out;
}

std::vector<TokenId> SentencePieceTokenizer::tokenize(std::string_view text) const {
  if (flavor_ == SentencePieceFlavor::kLlama2) {
    std::vector<TokenId> ids{model_.bos_id};
    auto rest = encode_as_ids(text);
    ids.insert(ids.end(), rest.begin(), rest.end());
    return ids;
  }
  if (flavor_ == SentencePieceFlavor::kGPT) return encode_as_ids(text);
  // Megatron's _SentencePieceTokenizer.tokenize: repeatedly cut at the earliest special token
  // (the first one in insertion order on a tie).
  std::vector<TokenId> ids;
  size_t idx = 0;
  while (true) {
    size_t best = std::string_view::npos;
    const std::pair<std::string, TokenId>* which = nullptr;
    for (const auto& s : specials_) {
      size_t at = text.find(s.first, idx);
      if (at != std::string_view::npos && (best == std::string_view::npos || at < best)) best = at, which = &s;
    }
    if (!which) break;
    auto part = encode_as_ids(text.substr(idx, best - idx));
    ids.insert(ids.end(), part.begin(), part.end());
    ids.push_back(which->second);
    idx = best + which->first.size();
  }
  auto part = encode_as_ids(text.substr(idx));
  ids.insert(ids.end(), part.begin(), part.end());
  return ids;
}

std::string SentencePieceTokenizer::decode_ids(std::span<const TokenId> ids) const {
  std::string out, bytes;
  bool at_start = true;
  auto flush_bytes = [&] {
    out += utf8_replace_invalid(bytes);
    bytes.clear();
  };
  for (TokenId id : ids) {
    if (id < 0 || id >= static_cast<TokenId>(model_.pieces.size())) {
      throw UsageError(name() + ": token id " + std::to_string(id) + " is not in the vocabulary");
    }
    const auto& p = model_.pieces[static_cast<size_t>(id)];
    if (p.type == SentencePieceModelProto::kControl) continue;
    if (p.type == SentencePieceModelProto::kByte) {
      unsigned v = 0;
      std::sscanf(p.piece.c_str(), "<0x%2X>", &v);
      bytes.push_back(static_cast<char>(v));
      continue;
    }
    flush_bytes();
    std::string_view piece = p.piece;
    std::string text;
    if (p.type == SentencePieceModelProto::kUnknown) {
      text = model_.unk_surface;
    } else {
      if (at_start && !model_.treat_whitespace_as_suffix && piece.substr(0, kSpaceSymbol.size()) == kSpaceSymbol) {
        piece.remove_prefix(kSpaceSymbol.size());
      }
      for (size_t i = 0; i < piece.size();) {
        if (piece.substr(i, kSpaceSymbol.size()) == kSpaceSymbol) {
          text += ' ';
          i += kSpaceSymbol.size();
        } else {
          text += piece[i++];
        }
      }
    }
    out += text;
    at_start = false;
  }
  flush_bytes();
  return out;
}

std::string SentencePieceTokenizer::detokenize(std::span<const TokenId> ids) const {
  if (flavor_ != SentencePieceFlavor::kMegatron) return decode_ids(ids);
  // Megatron: special tokens are written out with a space on each side of the decoded runs.
  std::string text;
  size_t last = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    auto it = special_by_id_.find(ids[i]);
    if (it == special_by_id_.end()) continue;
    text += decode_ids(ids.subspan(last, i - last)) + " " + it->second + " ";
    last = i + 1;
  }
  text += decode_ids(ids.subspan(last));
  return text;
}

}  // namespace laoyao::tokenizer
