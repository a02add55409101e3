// Megatron's distributed optimizer (--use-distributed-optimizer, megatron-lm.md §8.3): each
// data-parallel rank keeps Adam's moments (and steps the fp32 main parameters) of its share of the
// parameters only; the averaged gradients are reduce-scattered into the shares and the updated
// shares all-gathered. Mathematically the plain optimizer's step.
//
// The flat parameter buffer is cut into runs, each sharded over one group: without expert
// parallelism one run, the whole model, over the data-parallel group; with it the routed experts'
// runs over the expert data-parallel group (the ranks holding the same experts; none when EP
// covers the data-parallel ranks: this rank then owns its experts whole) and the runs between them
// over the data-parallel group (Megatron's two optimizer instances). Rank k of a run's group of g
// owns the k-th of g equal pieces of the run's first g * floor(count / g) elements; the last
// count % g elements, the tail, are reduced whole and stepped alike by every rank (no padding, and
// no collective that cuts across a run). The moments of a rank's owned segments are stored
// one after the other. With --overlap-grad-reduce the dense runs are cut further, at the edges of
// the parts of the model the backward finishes one by one (overlap_bucket_cuts: a layer, the head),
// so that each run can be reduce-scattered as soon as its part is final (Megatron's buckets, each
// sharded over the ranks).
//
// Checkpoints hold each rank's share as parts of the moments (train/rank_checkpoint.hpp): a save
// gathers nothing, and a load at another layout reads each share from the parts it meets.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "dist/process_group.hpp"
#include "model/parameters.hpp"
#include "optim/adamw.hpp"

namespace laoyao::train {

// A group a run is sharded over: the group (null when one rank) and this rank's place in it.
struct ShardGroup {
  dist::ProcessGroup* group = nullptr;
  int64_t rank = 0, size = 1;
};
ShardGroup shard_group(dist::ProcessGroup* g);  // {} for null or a group of one

struct ShardRun {
  // In the gradients' buffer: the trained parameters' (the model's buffer from the table's
  // trainable_offset on; all of it without PEFT).
  int64_t offset = 0, count = 0;
  ShardGroup over;
  int64_t piece() const { return count / over.size; }  // what each rank owns of the even part
  int64_t own_offset() const { return offset + over.rank * piece(); }
  int64_t tail_offset() const { return offset + piece() * over.size; }
  int64_t tail() const { return offset + count - tail_offset(); }
};

struct OwnedSegment {
  int64_t offset = 0, count = 0;  // in the flat buffer
  int64_t moment = 0;             // where its moments start in the rank's moment buffers
  // Counted in the model's norms and zero counts (a tail is, on its group's last rank only: the
  // rank whose piece it continues), and contributed to a gather of the moments.
  bool counted = true;
};

struct OptimizerShards {
  std::vector<ShardRun> runs;
  std::vector<OwnedSegment> owned;  // in buffer order
  int64_t owned_total = 0;          // the moment buffers' size
  // The group a model-wide sum (the gradient norm) is taken over: every rank's counted segments
  // together count each parameter once. Null when nothing is sharded.
  dist::ProcessGroup* sum_group = nullptr;
  bool sharded() const { return sum_group != nullptr; }
};

// n parameters with the routed experts at expert_ranges (sorted, as
// GptModel::routed_expert_ranges; empty without expert parallelism), the rest over `dense`, the
// experts over `experts`; the dense runs also cut at `cuts` (sorted offsets).
OptimizerShards plan_optimizer_shards(int64_t n, const std::vector<std::pair<int64_t, int64_t>>& expert_ranges,
                                      ShardGroup dense, ShardGroup experts, const std::vector<int64_t>& cuts = {});
// The offsets where the model's parts change (the embeddings, each decoder layer, the final norm
// and output layer), in buffer order: the runs of an overlapped distributed optimizer.
std::vector<int64_t> overlap_bucket_cuts(const model::ParameterTable& table);
// Not sharded: one segment, the whole model.
inline OptimizerShards whole_model_shards(int64_t n) { return plan_optimizer_shards(n, {}, {}, {}); }

// AdamW over the owned segments of `table`'s parameters (weight decay kept). hold_moments: as
// AdamW's (false where the engine keeps them on its device).
std::unique_ptr<optim::AdamW> make_shard_adam(const model::ParameterTable& table, const OptimizerShards& shards,
                                              const optim::AdamWSettings& s, bool hold_moments = true);

// One AdamW step (Megatron's clip first) of the owned segments of weights/grads on the host
// (decoupled_lr: the embedding and output layer's rate, --decoupled-lr). scratch: the caller's,
// reused across steps.
void step_owned(optim::AdamW& adam, const OptimizerShards& shards, float* weights, float* grads, double norm,
                double max_norm, double lr, double wd, std::optional<double> decoupled_lr, std::vector<float>& scratch);

// weights: every rank's owned pieces up to date; after the call the whole buffer is (collective
// over the runs' groups: an all-reduce of each rank's pieces over zeros). scratch: the caller's.
void gather_shares(float* weights, const OptimizerShards& shards, std::vector<float>& scratch);

// The owned segments cut where AdamW's ranges (in moment space, tiling it) change between the word
// embeddings or output layer and the rest (--decoupled-lr's two rates), neighbours of one kind
// merged: what the CUDA engine steps with one rate each. Throws if the ranges leave a segment
// part uncovered.
struct StepRun {
  int64_t offset = 0, moment = 0, count = 0;  // in the flat buffers, in the moment buffers
  bool decoupled = false;
};
std::vector<StepRun> plan_step_runs(const OptimizerShards& shards, const std::vector<optim::ParamRange>& ranges);

// AdamW's ranges for `table`: each parameter with its weight-decay multiplier and whether it is an
// embedding or output layer (--decoupled-lr).
std::vector<optim::ParamRange> adam_ranges(const model::ParameterTable& table);
// A whole-size AdamW over `table` with zero moments (every trained parameter, weight decay kept;
// its offsets those of the gradients: from the table's trainable_offset).
std::unique_ptr<optim::AdamW> make_whole_adam(const model::ParameterTable& table, const optim::AdamWSettings& s,
                                              bool hold_moments = true);
}  // namespace laoyao::train
