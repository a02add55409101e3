#include "data/sft_packing.hpp"

#include <algorithm>
#include <cmath>
#include <span>

#include "core/error.hpp"
#include "data/numpy_random.hpp"

namespace laoyao::data {

namespace {

// Classic First-Fit: each length goes into the leftmost bin with room for it, else a new bin.
std::vector<std::vector<int64_t>> first_fit(const std::vector<int64_t>& lengths, int64_t pack_size) {
  std::vector<std::vector<int64_t>> bins;
  std::vector<int64_t> room;
  for (int64_t len : lengths) {
    size_t b = 0;
    while (b < bins.size() && room[b] < len) ++b;
    if (b == bins.size()) {
      bins.emplace_back();
      room.push_back(pack_size);
    }
    bins[b].push_back(len);
    room[b] -= len;
  }
  return bins;
}

}  // namespace

std::vector<SftPack> pack_first_fit_shuffle(const std::vector<SftExample>& examples, int64_t pack_size, int64_t seed,
                                            PackingStats* stats) {
  if (pack_size < 1) throw UsageError("the packed sequence size must be positive, not " + std::to_string(pack_size));
  // create_hist: the examples by shifted length, in file order; longer than a pack: skipped.
  std::vector<std::vector<const SftExample*>> by_length(static_cast<size_t>(pack_size + 1));
  int64_t skipped = 0;
  for (const SftExample& ex : examples) {
    const int64_t len = static_cast<int64_t>(ex.input_ids.size()) - 1;
    if (len > pack_size) {
      ++skipped;
      continue;
    }
    by_length[static_cast<size_t>(len)].push_back(&ex);
  }
  std::vector<int64_t> lengths;  // ascending, as the histogram expands
  for (int64_t len = 0; len <= pack_size; ++len)
    lengths.insert(lengths.end(), by_length[static_cast<size_t>(len)].size(), len);
  if (lengths.empty()) throw UsageError("no fine-tuning example fits a pack of " + std::to_string(pack_size) + " tokens");
  RandomState rng(seed);  // np.random.seed(seed)
  rng.shuffle(std::span<int64_t>(lengths));
  const std::vector<std::vector<int64_t>> bins = first_fit(lengths, pack_size);

  // fill_packing_strategy: each length's examples in a permuted order (one permutation per
  // non-empty length, shortest first), taken from the end for each bin in turn.
  std::vector<std::vector<const SftExample*>> queue(by_length.size());
  for (size_t len = 0; len < by_length.size(); ++len) {
    const auto& same = by_length[len];
    if (same.empty()) continue;
    for (int64_t i : rng.permutation(static_cast<int64_t>(same.size()))) queue[len].push_back(same[static_cast<size_t>(i)]);
  }
  std::vector<SftPack> packs;
  packs.reserve(bins.size());
  for (const auto& bin : bins) {
    SftPack p;
    for (int64_t len : bin) {
      const SftExample* ex = queue[static_cast<size_t>(len)].back();
      queue[static_cast<size_t>(len)].pop_back();
      p.seq_start.push_back(static_cast<int64_t>(p.input_ids.size()));
      p.input_ids.insert(p.input_ids.end(), ex->input_ids.begin(), ex->input_ids.end());
      p.loss_mask.insert(p.loss_mask.end(), ex->loss_mask.begin() + 1, ex->loss_mask.end());
      p.loss_mask.push_back(0);
    }
    packs.push_back(std::move(p));
  }
  if (stats) {
    PackingStats& s = *stats;
    s = PackingStats{};
    s.pack_size = pack_size;
    s.skipped = skipped;
    s.dataset_max_seqlen = *std::max_element(lengths.begin(), lengths.end());
    int64_t total = 0;
    s.min_packed_seqlen = pack_size;
    for (const auto& bin : bins) {
      int64_t sum = 0;
      for (int64_t len : bin) sum += len;
      total += sum;
      s.min_packed_seqlen = std::min(s.min_packed_seqlen, sum);
      s.max_samples_per_bin = std::max<int64_t>(s.max_samples_per_bin, static_cast<int64_t>(bin.size()));
    }
    s.packing_factor = static_cast<double>(lengths.size()) / static_cast<double>(bins.size());
    s.packing_efficiency = static_cast<double>(total) / static_cast<double>(bins.size()) / static_cast<double>(pack_size) * 100;
  }
  return packs;
}

PackedRow packed_row(const SftPack& pack, int64_t max_length, tokenizer::TokenId eos) {
  PackedRow r;
  r.cu_seqlens.push_back(0);
  const size_t n = pack.seq_start.size();
  for (size_t i = 0; i < n; ++i) {
    const int64_t begin = pack.seq_start[i];
    const int64_t end = i + 1 < n ? pack.seq_start[i + 1] : static_cast<int64_t>(pack.input_ids.size());
    const int32_t first = static_cast<int32_t>(r.tokens.size());
    for (int64_t t = begin; t + 1 < end; ++t) {
      r.tokens.push_back(pack.input_ids[static_cast<size_t>(t)]);
      r.labels.push_back(pack.input_ids[static_cast<size_t>(t + 1)]);
      r.loss_mask.push_back(pack.loss_mask[static_cast<size_t>(t)]);
      r.positions.push_back(t - begin);
      r.key_start.push_back(first);
    }
    r.cu_seqlens.push_back(static_cast<int64_t>(r.tokens.size()));
  }
  if (static_cast<int64_t>(r.tokens.size()) > max_length)
    throw Error("packed_row: a pack of " + std::to_string(r.tokens.size()) + " tokens in a row of " +
                std::to_string(max_length));
  const int32_t tail = static_cast<int32_t>(r.tokens.size());
  if (r.cu_seqlens.back() != max_length) r.cu_seqlens.push_back(max_length);
  while (static_cast<int64_t>(r.tokens.size()) < max_length) {
    r.tokens.push_back(eos);
    r.labels.push_back(eos);
    r.loss_mask.push_back(0);
    r.positions.push_back(0);
    r.key_start.push_back(tail);
  }
  return r;
}

void pre_pad_example(SftExample& ex, int64_t mult, int64_t cap, tokenizer::TokenId eos) {
  const int64_t runtime = std::max<int64_t>(static_cast<int64_t>(ex.input_ids.size()) - 1, 0);
  const int64_t stored = std::min(cap, (runtime + mult - 1) / mult * mult) + 1;
  ex.input_ids.resize(static_cast<size_t>(stored), eos);
  ex.loss_mask.resize(static_cast<size_t>(stored), 0);
}

}  // namespace laoyao::data
