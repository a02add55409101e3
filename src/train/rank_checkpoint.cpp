#include "train/rank_checkpoint.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "model/gpt_ep.hpp"
#include "model/gpt_layout.hpp"
#include "train/tensor_store.hpp"
#include "train/tp_state.hpp"

namespace laoyao::train {
namespace {

// FNV-1a, 64 bits: the same on every rank for the same key.
uint64_t key_hash(const std::string& key) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : key) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace

std::vector<StatePart> owned_parts(const std::vector<model::TensorPart>& parts, const model::ParameterTable& table,
                                   const OptimizerShards& shards, bool counted_only) {
  if (parts.size() != table.specs.size()) throw Error("owned_parts: one part per parameter expected");
  std::vector<StatePart> out;
  size_t first = 0;  // specs and segments are both in buffer order
  for (const OwnedSegment& seg : shards.owned) {
    if (counted_only && !seg.counted) continue;
    // The segments cover the trained parameters (from the table's trainable_offset on).
    const int64_t start = seg.offset + table.trainable_offset, end = start + seg.count;
    while (first < table.specs.size() && table.specs[first].offset + table.specs[first].numel <= start) ++first;
    for (size_t i = first; i < table.specs.size() && table.specs[i].offset < end; ++i) {
      const model::ParamSpec& p = table.specs[i];
      const int64_t lo = std::max(p.offset, start), hi = std::min(p.offset + p.numel, end);
      if (lo < hi)
        out.push_back({i, model::sub_part(parts[i], lo - p.offset, hi - p.offset), lo, seg.moment + (lo - start)});
    }
  }
  return out;
}

std::vector<bool> first_holders(const std::vector<std::string>& keys, dist::ProcessGroup* world) {
  const size_t n = keys.size();
  std::vector<bool> first(n);
  for (size_t i = 0; i < n; ++i) first[i] = !keys[i].empty();
  if (!world || world->size() == 1) return first;
  // [rank][key][2]: each rank its keys' hashes in 32-bit halves (exact in a double), zeros elsewhere;
  // summed, every rank has every rank's. An empty key hashes to (0, 0) here and never matches.
  const size_t ranks = static_cast<size_t>(world->size()), me = static_cast<size_t>(world->rank());
  std::vector<double> h(ranks * n * 2 + ranks, 0.0);
  h[ranks * n * 2 + me] = static_cast<double>(n);  // each rank's count, checked below
  for (size_t i = 0; i < n; ++i) {
    if (keys[i].empty()) continue;
    const uint64_t k = key_hash(keys[i]) | 1;  // never (0, 0)
    h[(me * n + i) * 2] = static_cast<double>(k >> 32);
    h[(me * n + i) * 2 + 1] = static_cast<double>(k & 0xffffffffu);
  }
  world->all_reduce_sum(h.data(), h.size());
  for (size_t r = 0; r < ranks; ++r)
    if (h[ranks * n * 2 + r] != static_cast<double>(n))
      throw Error("checkpoint: rank " + std::to_string(r) + " holds " + std::to_string(h[ranks * n * 2 + r]) +
                  " parts, this rank " + std::to_string(n) + " (the ranks' models differ)");
  for (size_t i = 0; i < n; ++i) {
    if (!first[i]) continue;
    const double* mine = &h[(me * n + i) * 2];
    for (size_t r = 0; r < me && first[i]; ++r) {
      const double* other = &h[(r * n + i) * 2];
      if (other[0] == mine[0] && other[1] == mine[1]) first[i] = false;
    }
  }
  return first;
}

std::vector<StatePart> parts_to_write(const RankState& r) {
  const model::ParameterTable& table = r.model.table();
  // At most one counted range of a parameter per rank: a parameter lies in one run, where the rank
  // owns one piece (its group's last rank the tail too).
  std::vector<StatePart> owned = owned_parts(rank_parts(r.model), table, r.shards, true);
  std::vector<std::string> keys(table.specs.size());
  for (const StatePart& p : owned) {
    if (!keys[p.param].empty()) throw Error("checkpoint: two counted ranges of " + p.part.name);
    keys[p.param] = part_string(p.part);  // equal for two ranks exactly when they hold the same elements
  }
  const std::vector<bool> first = first_holders(keys, r.world);
  std::vector<StatePart> out;
  for (StatePart& p : owned)
    if (first[p.param]) out.push_back(std::move(p));
  return out;
}

namespace {

using Buffer = Engine::StateBuffer;

// A part's three entries: its weights under the tensor's name, its moments under the optimizer's.
template <class Source>
void add_entries(ShardWrite& w, const StatePart& p, bool moments, Source&& source) {
  w.model.push_back(source(p.part, Buffer::kWeights));
  if (!moments) return;
  w.optimizer.push_back(source({exp_avg_name(p.part.name), p.part.shape, p.part.boxes}, Buffer::kExpAvg));
  w.optimizer.push_back(source({exp_avg_sq_name(p.part.name), p.part.shape, p.part.boxes}, Buffer::kExpAvgSq));
}

}  // namespace

ShardWrite rank_shard(const std::vector<StatePart>& parts, Engine& engine, bool moments) {
  ShardWrite w;
  for (const StatePart& p : parts)
    add_entries(w, p, moments, [](model::TensorPart part, Buffer) { return PartRef{std::move(part), nullptr}; });
  // The model file's i-th part is parts[i]'s weights; the optimizer file's 2i-th and 2i+1-th its moments.
  w.fill = [&parts, &engine](bool optimizer, size_t i, int64_t from, int64_t count, float* dst) {
    const StatePart& p = parts[optimizer ? i / 2 : i];
    const Buffer b = !optimizer ? Buffer::kWeights : i % 2 == 0 ? Buffer::kExpAvg : Buffer::kExpAvgSq;
    engine.download_state(b, (optimizer ? p.moment : p.offset) + from, count, dst);
  };
  return w;
}

ShardWrite rank_shard(const std::vector<StatePart>& parts, const std::vector<float>& weights,
                      const std::vector<float>& exp_avg, const std::vector<float>& exp_avg_sq) {
  ShardWrite w;
  int64_t at = 0;
  for (const StatePart& p : parts) {
    add_entries(w, p, !exp_avg.empty(), [&](model::TensorPart part, Buffer b) {
      const std::vector<float>& from = b == Buffer::kWeights ? weights : b == Buffer::kExpAvg ? exp_avg : exp_avg_sq;
      return PartRef{std::move(part), from.data() + at};
    });
    at += p.part.numel();
  }
  return w;
}

namespace {

bool in_set(const model::ParamSpec& p, ParamSet which) {
  return which == ParamSet::kAll || (which == ParamSet::kBase) == p.frozen;
}

}  // namespace

ParamSet saved_params(const model::GptModel& local) {
  return local.table().has_frozen() ? ParamSet::kTrained : ParamSet::kAll;
}

std::vector<ParamShape> whole_param_shapes(const model::GptModel& local, ParamSet which) {
  model::ParameterTable whole = model::build_gpt_parameters(model::ep_whole_config(local.config())).table;
  if (whole.has_frozen() && which != ParamSet::kAll)
    std::erase_if(whole.specs, [&](const model::ParamSpec& p) { return !in_set(p, which); });
  return param_shapes(whole);
}

namespace {

// Reads `part` from `store` into the engine's buffer b at `at`, a window of rows at a time (the host
// holds one window; a window of a stored entry reads only what it meets).
void read_in_windows(const TensorStore& store, const model::TensorPart& part, Buffer b, int64_t at, Engine& engine,
                     std::vector<float>& buf) {
  constexpr int64_t kWindow = int64_t{16} << 20;  // elements: 64 MB
  const int64_t n = part.numel();
  buf.resize(static_cast<size_t>(std::min(n, kWindow)));
  for (int64_t lo = 0; lo < n; lo += kWindow) {
    const int64_t hi = std::min(n, lo + kWindow);
    store.read(n <= kWindow ? part : model::sub_part(part, lo, hi), buf.data());
    engine.upload_state(b, at + lo, hi - lo, buf.data());
  }
}

model::TensorPart renamed(const model::TensorPart& p, std::string name) { return {std::move(name), p.shape, p.boxes}; }

}  // namespace

void read_rank_weights(const TensorStore& store, const model::GptModel& local, Engine& engine, ParamSet which) {
  const std::vector<model::TensorPart> parts = rank_parts(local);
  const bool peft = local.table().has_frozen();
  std::vector<float> buf;
  for (size_t i = 0; i < parts.size(); ++i) {
    const model::ParamSpec& p = local.table().specs[i];
    if (peft && !in_set(p, which)) continue;
    read_in_windows(store, parts[i], Buffer::kWeights, p.offset, engine, buf);
  }
}

void read_rank_moments(const TensorStore& store, const model::GptModel& local, const OptimizerShards& shards,
                       Engine& engine) {
  std::vector<float> buf;
  for (const StatePart& m : owned_parts(rank_parts(local), local.table(), shards, false)) {
    read_in_windows(store, renamed(m.part, exp_avg_name(m.part.name)), Buffer::kExpAvg, m.moment, engine, buf);
    read_in_windows(store, renamed(m.part, exp_avg_sq_name(m.part.name)), Buffer::kExpAvgSq, m.moment, engine, buf);
  }
}

}  // namespace laoyao::train
