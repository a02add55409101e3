// A bounded, thread-safe cache of word -> token ids: BPE of a word is a pure function, and real
// text repeats words, so both GPT-2's encoder and HF tokenizers cache it. Sharded by hash so that
// preprocess-data's worker threads rarely contend; a full shard is simply cleared.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace laoyao::tokenizer {

class WordCache {
 public:
  static constexpr size_t kShards = 16;
  static constexpr size_t kMaxPerShard = 1 << 14;
  static constexpr size_t kMaxWordBytes = 256;  // long words are not worth caching

  bool get(std::string_view word, std::vector<int64_t>& out) const {
    if (word.size() > kMaxWordBytes) return false;
    const size_t h = std::hash<std::string_view>{}(word);
    Shard& s = shards_[h % kShards];
    std::lock_guard<std::mutex> lock(s.mu);
    auto it = s.map.find(std::string(word));
    if (it == s.map.end()) return false;
    out.insert(out.end(), it->second.begin(), it->second.end());
    return true;
  }

  void put(std::string_view word, const int64_t* ids, size_t n) const {
    if (word.size() > kMaxWordBytes) return;
    const size_t h = std::hash<std::string_view>{}(word);
    Shard& s = shards_[h % kShards];
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.map.size() >= kMaxPerShard) s.map.clear();
    s.map.emplace(std::string(word), std::vector<int64_t>(ids, ids + n));
  }

 private:
  struct Shard {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<int64_t>> map;
  };
  mutable std::array<Shard, kShards> shards_;
};

}  // namespace laoyao::tokenizer
