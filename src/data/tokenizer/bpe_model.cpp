#include "data/tokenizer/bpe_model.hpp"

#include <cstdio>
#include <queue>

#include "core/error.hpp"
#include "data/tokenizer/unicode.hpp"

namespace laoyao::tokenizer {
namespace {

uint64_t pair_key(TokenId a, TokenId b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

struct Symbol {
  TokenId id;
  std::ptrdiff_t prev, next;
  size_t len;  // bytes of the word it covers; 0 once merged away
};

struct Merge {
  size_t pos;
  uint32_t rank;
  TokenId new_id;
  // std::priority_queue pops the largest: make the lowest (rank, pos) the largest.
  bool operator<(const Merge& o) const {
    if (rank != o.rank) return rank > o.rank;
    return pos > o.pos;
  }
};

}  // namespace

BpeModel::BpeModel(BpeModelConfig config, const std::string& what)
    : vocab_(std::move(config.vocab)),
      fuse_unk_(config.fuse_unk),
      byte_fallback_(config.byte_fallback),
      ignore_merges_(config.ignore_merges) {
  for (const auto& [tok, id] : vocab_) {
    if (id < 0 || id > INT32_MAX) {
      throw UsageError(what + ": token " + quote_text(tok) + " has id " + std::to_string(id) + " outside [0, 2^31)");
    }
    vocab_r_[id] = tok;
  }
  if (config.unk_token) {
    auto it = vocab_.find(*config.unk_token);
    if (it == vocab_.end()) {
      throw UsageError(what + ": the unk_token " + quote_text(*config.unk_token) + " is not in the vocab");
    }
    unk_id_ = it->second;
  }
  uint32_t rank = 0;
  for (const auto& [a, b] : config.merges) {
    auto ia = vocab_.find(a), ib = vocab_.find(b), inew = vocab_.find(a + b);
    if (ia == vocab_.end() || ib == vocab_.end() || inew == vocab_.end()) {
      const std::string& missing = ia == vocab_.end() ? a : ib == vocab_.end() ? b : a + b;
      throw UsageError(what + ": merge " + std::to_string(rank) + " (" + quote_text(a) + ", " + quote_text(b) +
                       ") uses " + quote_text(missing) + ", which is not in the vocab");
    }
    // A later duplicate replaces the earlier one (HF collects the merges into a map).
    merges_[pair_key(ia->second, ib->second)] = {rank, inew->second};
    ++rank;
  }
}

std::optional<TokenId> BpeModel::token_to_id(std::string_view token) const {
  auto it = vocab_.find(std::string(token));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(TokenId id) const {
  auto it = vocab_r_.find(id);
  return it == vocab_r_.end() ? nullptr : &it->second;
}

void BpeModel::encode_word(std::string_view word, std::vector<TokenId>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    auto it = vocab_.find(std::string(word));
    if (it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  if (cache_.get(word, out)) return;
  const size_t before = out.size();
  merge_word(word, out);
  cache_.put(word, out.data() + before, out.size() - before);
}

void BpeModel::merge_word(std::string_view w, std::vector<TokenId>& out) const {
  std::vector<Symbol> symbols;
  symbols.reserve(w.size());
  auto add = [&](TokenId id, size_t len) {
    const std::ptrdiff_t n = static_cast<std::ptrdiff_t>(symbols.size());
    symbols.push_back({id, n - 1, -1, len});
    if (n > 0) symbols[static_cast<size_t>(n - 1)].next = n;
  };
  bool unk = false;  // a pending unk token covering unk_len bytes
  size_t unk_len = 0;
  for (size_t i = 0; i < w.size();) {
    const size_t n = utf8_char_len(w, i);
    const std::string ch(w.substr(i, n));
    i += n;
    auto it = vocab_.find(ch);
    if (it != vocab_.end()) {
      if (unk) add(*unk_id_, unk_len), unk = false;
      add(it->second, n);
      continue;
    }
    if (byte_fallback_) {
      std::vector<TokenId> bytes;
      for (unsigned char b : ch) {
        char name[8];
        std::snprintf(name, sizeof(name), "<0x%02X>", b);
        auto bt = vocab_.find(name);
        if (bt == vocab_.end()) break;
        bytes.push_back(bt->second);
      }
      if (bytes.size() == ch.size()) {
        // (HF adds these without flushing a pending unk first.)
        for (TokenId t : bytes) add(t, 1);
        continue;
      }
    }
    if (unk_id_) {
      if (unk && fuse_unk_) {
        unk_len += n;
      } else {
        if (unk) add(*unk_id_, unk_len);
        unk = true;
        unk_len = n;
      }
    }
    // Without an unk token the character is dropped, as HF does.
  }
  if (unk) add(*unk_id_, unk_len);

  std::priority_queue<Merge> queue;
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    auto m = merges_.find(pair_key(symbols[i].id, symbols[i + 1].id));
    if (m != merges_.end()) queue.push({i, m->second.first, m->second.second});
  }
  while (!queue.empty()) {
    const Merge top = queue.top();
    queue.pop();
    Symbol& cur = symbols[top.pos];
    if (cur.len == 0 || cur.next == -1) continue;
    const size_t next_pos = static_cast<size_t>(cur.next);
    const Symbol right = symbols[next_pos];
    auto m = merges_.find(pair_key(cur.id, right.id));
    if (m == merges_.end() || m->second.second != top.new_id) continue;  // stale entry
    cur.id = top.new_id;
    cur.len += right.len;
    cur.next = right.next;
    symbols[next_pos].len = 0;
    if (right.next > -1 && static_cast<size_t>(right.next) < symbols.size()) {
      symbols[static_cast<size_t>(right.next)].prev = static_cast<std::ptrdiff_t>(top.pos);
    }
    if (cur.prev >= 0) {
      const Symbol& p = symbols[static_cast<size_t>(cur.prev)];
      auto pm = merges_.find(pair_key(p.id, cur.id));
      if (pm != merges_.end()) queue.push({static_cast<size_t>(cur.prev), pm->second.first, pm->second.second});
    }
    if (cur.next >= 0 && static_cast<size_t>(cur.next) < symbols.size()) {
      const Symbol& nx = symbols[static_cast<size_t>(cur.next)];
      auto nm = merges_.find(pair_key(cur.id, nx.id));
      if (nm != merges_.end()) queue.push({top.pos, nm->second.first, nm->second.second});
    }
  }
  for (const Symbol& s : symbols) {
    if (s.len != 0) out.push_back(s.id);
  }
}

}  // namespace laoyao::tokenizer
