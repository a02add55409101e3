// The distributed optimizer's shares and their host-side collectives (see dist_optimizer.hpp).
#include "train/dist_optimizer.hpp"

#include <algorithm>
#include <string>

#include "core/error.hpp"

namespace laoyao::train {

ShardGroup shard_group(dist::ProcessGroup* g) {
  if (!g || g->size() <= 1) return {};
  return {g, g->rank(), g->size()};
}

OptimizerShards plan_optimizer_shards(int64_t n, const std::vector<std::pair<int64_t, int64_t>>& expert_ranges,
                                      ShardGroup dense, ShardGroup experts, const std::vector<int64_t>& cuts) {
  if (!std::is_sorted(cuts.begin(), cuts.end())) throw Error("plan_optimizer_shards: the cuts are not sorted");
  if (experts.size > 1 && dense.size <= 1)
    throw Error("plan_optimizer_shards: the experts' group is part of the data-parallel group");
  OptimizerShards out;
  auto own = [&](int64_t offset, int64_t count, bool counted) {
    if (count <= 0) return;
    if (!out.owned.empty()) {  // neighbours of one kind merge (a last rank's piece and its tail)
      OwnedSegment& last = out.owned.back();
      if (last.offset + last.count == offset && last.counted == counted) {
        last.count += count;
        out.owned_total += count;
        return;
      }
    }
    // Moments start at the segment's offset modulo 4: the GPU's vectorised step needs the
    // parameters and moments equally aligned. The few elements skipped are never read.
    out.owned_total += ((offset - out.owned_total) % 4 + 4) % 4;
    out.owned.push_back({offset, count, out.owned_total, counted});
    out.owned_total += count;
  };
  auto add_run = [&](int64_t offset, int64_t count, ShardGroup over) {
    if (count <= 0) return;
    const ShardRun run{offset, count, over};
    out.runs.push_back(run);
    own(run.own_offset(), run.piece(), true);
    own(run.tail_offset(), run.tail(), over.rank == over.size - 1);
  };
  auto add_dense = [&](int64_t offset, int64_t count) {  // cut where `cuts` say
    int64_t from = offset;
    for (auto c = std::upper_bound(cuts.begin(), cuts.end(), offset); c != cuts.end() && *c < offset + count; ++c)
      add_run(from, *c - from, dense), from = *c;
    add_run(from, offset + count - from, dense);
  };
  int64_t at = 0;
  for (const auto& [offset, count] : expert_ranges) {
    if (offset < at || offset + count > n) throw Error("plan_optimizer_shards: expert ranges out of order");
    add_dense(at, offset - at);
    add_run(offset, count, experts);
    at = offset + count;
  }
  add_dense(at, n - at);
  out.sum_group = dense.size > 1 ? dense.group : nullptr;
  return out;
}

std::vector<int64_t> overlap_bucket_cuts(const model::ParameterTable& table) {
  // A parameter's part: "decoder.layers.N." for a layer's, "head" for the final norm and the output
  // layer (reported together), "" for the rest (the embeddings).
  auto part_of = [](const std::string& name) -> std::string {
    const std::string layers = "decoder.layers.";
    if (name.rfind(layers, 0) == 0) return name.substr(0, name.find('.', layers.size()) + 1);
    if (name.rfind("decoder.final_layernorm.", 0) == 0 || name.rfind("output_layer.", 0) == 0) return "head";
    return "";
  };
  std::vector<int64_t> cuts;
  std::string last;
  for (size_t i = 0; i < table.specs.size(); ++i) {
    const std::string part = part_of(table.specs[i].name);
    if (i > 0 && part != last) cuts.push_back(table.specs[i].offset);
    last = part;
  }
  return cuts;
}

std::unique_ptr<optim::AdamW> make_shard_adam(const model::ParameterTable& table, const OptimizerShards& shards,
                                              const optim::AdamWSettings& s, bool hold_moments) {
  std::vector<optim::ParamRange> ranges;
  size_t first = 0;  // specs and segments are both in buffer order
  int64_t covered = 0;
  auto cover = [&](int64_t offset, int64_t numel, const model::ParamSpec& p) {
    if (offset > covered) ranges.push_back({covered, offset - covered, 0.0});  // alignment's gap
    ranges.push_back({offset, numel, p.weight_decay ? 1.0 : 0.0, p.embedding_or_output});
    covered = offset + numel;
  };
  for (const OwnedSegment& seg : shards.owned) {
    const int64_t end = seg.offset + seg.count;
    while (first < table.specs.size() && table.specs[first].offset + table.specs[first].numel <= seg.offset) ++first;
    for (size_t i = first; i < table.specs.size() && table.specs[i].offset < end; ++i) {
      const model::ParamSpec& p = table.specs[i];
      const int64_t lo = std::max(p.offset, seg.offset), hi = std::min(p.offset + p.numel, end);
      if (lo < hi) cover(seg.moment + lo - seg.offset, hi - lo, p);
    }
  }
  if (shards.owned_total > covered) ranges.push_back({covered, shards.owned_total - covered, 0.0});
  return std::make_unique<optim::AdamW>(shards.owned_total, ranges, s, hold_moments);
}

void step_owned(optim::AdamW& adam, const OptimizerShards& shards, float* weights, float* grads, double norm,
                double max_norm, double lr, double wd, std::optional<double> decoupled_lr, std::vector<float>& scratch) {
  if (shards.owned.size() == 1 && shards.owned[0].moment == 0) {  // the moments match the segment: in place
    const OwnedSegment& seg = shards.owned[0];
    optim::clip_grads(grads + seg.offset, seg.count, norm, max_norm);
    adam.step(weights + seg.offset, grads + seg.offset, lr, wd, decoupled_lr);
    return;
  }
  if (scratch.size() != 2 * static_cast<size_t>(shards.owned_total))  // the gaps stay zero
    scratch.assign(2 * static_cast<size_t>(shards.owned_total), 0.0f);
  float* w = scratch.data();
  float* g = w + shards.owned_total;
  for (const OwnedSegment& seg : shards.owned) {
    std::copy(weights + seg.offset, weights + seg.offset + seg.count, w + seg.moment);
    std::copy(grads + seg.offset, grads + seg.offset + seg.count, g + seg.moment);
  }
  optim::clip_grads(g, shards.owned_total, norm, max_norm);
  adam.step(w, g, lr, wd, decoupled_lr);
  for (const OwnedSegment& seg : shards.owned) std::copy(w + seg.moment, w + seg.moment + seg.count, weights + seg.offset);
}

void gather_shares(float* weights, const OptimizerShards& shards, std::vector<float>& scratch) {
  for (const ShardRun& run : shards.runs) {
    if (run.over.size <= 1 || run.piece() == 0) continue;  // a tail is every rank's already
    const int64_t even = run.piece() * run.over.size;
    scratch.assign(static_cast<size_t>(even), 0.0f);
    std::copy(weights + run.own_offset(), weights + run.own_offset() + run.piece(),
              scratch.begin() + (run.own_offset() - run.offset));
    run.over.group->all_reduce_sum(scratch.data(), scratch.size());
    std::copy(scratch.begin(), scratch.end(), weights + run.offset);
  }
}

std::vector<StepRun> plan_step_runs(const OptimizerShards& shards, const std::vector<optim::ParamRange>& ranges) {
  std::vector<StepRun> runs;
  int64_t planned = 0, owned = 0;
  size_t k = 0;
  for (const OwnedSegment& seg : shards.owned) {
    owned += seg.count;
    const int64_t end = seg.moment + seg.count;
    while (k < ranges.size() && ranges[k].offset + ranges[k].numel <= seg.moment) ++k;
    for (size_t i = k; i < ranges.size() && ranges[i].offset < end; ++i) {
      const int64_t lo = std::max(ranges[i].offset, seg.moment), hi = std::min(ranges[i].offset + ranges[i].numel, end);
      const int64_t offset = seg.offset + (lo - seg.moment);
      const bool decoupled = ranges[i].embedding_or_output;
      planned += hi - lo;
      StepRun* last = runs.empty() ? nullptr : &runs.back();
      if (last && last->decoupled == decoupled && last->moment + last->count == lo && last->offset + last->count == offset)
        last->count += hi - lo;
      else
        runs.push_back({offset, lo, hi - lo, decoupled});
    }
  }
  if (planned != owned) throw Error("plan_step_runs: AdamW's ranges do not cover the owned segments");
  return runs;
}

std::vector<optim::ParamRange> adam_ranges(const model::ParameterTable& table) {
  std::vector<optim::ParamRange> ranges;
  for (const auto& p : table.specs)
    if (!p.frozen)
      ranges.push_back({p.offset - table.trainable_offset, p.numel, p.weight_decay ? 1.0 : 0.0, p.embedding_or_output});
  return ranges;
}

std::unique_ptr<optim::AdamW> make_whole_adam(const model::ParameterTable& table, const optim::AdamWSettings& s,
                                              bool hold_moments) {
  return std::make_unique<optim::AdamW>(table.trainable(), adam_ranges(table), s, hold_moments);
}

}  // namespace laoyao::train
