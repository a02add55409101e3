// A rank's share of a checkpoint: which parts of the whole (Megatron-Core-named, full-shape)
// tensors its weights and Adam moments are, which of them it writes, and reading them back.
//
// A rank's weights are rank_parts(model) (its TP boxes, its EP experts). What it writes of them and
// of their moments are the sub-parts its owned segments cover: all of them without the distributed
// optimizer, its share with it (Megatron's fully sharded optimizer state: the fp32 main parameters
// up to date there, nothing gathered). A part held by several ranks (data-parallel replicas, tensors
// every TP rank holds whole) is written by the first of them only: every rank compares the i-th of
// its parts with the i-th of every other rank's (ranks hold equally many, in one order) through one
// all-reduce of their hashes. A load reads all of a rank's weights and its owned segments' moments.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dist/process_group.hpp"
#include "model/gpt_model.hpp"
#include "model/tensor_box.hpp"
#include "train/checkpoint.hpp"
#include "train/dist_optimizer.hpp"
#include "train/engine.hpp"

namespace laoyao::train {

// A rank in a save: its model (its table, its TP/EP place), how its moments are laid out
// (`shards`), and the world the parts are compared over (null: one rank).
struct RankState {
  const model::GptModel& model;
  const OptimizerShards& shards;
  dist::ProcessGroup* world = nullptr;
};

// Part of a parameter's state: the sub-part of the parameter's part, where its weights start in the
// model's buffer and where its moments start in the moment buffers.
struct StatePart {
  size_t param = 0;  // index in the table
  model::TensorPart part;
  int64_t offset = 0, moment = 0;
};
// The state of `parts` (rank_parts, table order) as the owned segments hold it: each segment cut at
// the parameters it meets. counted_only: the segments a gather counts (a tail once per group).
std::vector<StatePart> owned_parts(const std::vector<model::TensorPart>& parts, const model::ParameterTable& table,
                                   const OptimizerShards& shards, bool counted_only);

// Whether this rank is the first of the world's ranks holding each key (the i-th against the i-th;
// an empty key is held by no one). Collective over `world`; every rank passes equally many keys.
std::vector<bool> first_holders(const std::vector<std::string>& keys, dist::ProcessGroup* world);

// The parts this rank writes, of the weights and the moments alike: its counted owned segments'
// parts that no lower rank holds (none: it needs no host state to save). Collective over the world.
std::vector<StatePart> parts_to_write(const RankState& r);
// Those parts' weights and (with moments) moments, each streamed from the engine as its file
// reaches it: the host holds one part at a time. `parts` and `engine` must outlive the shard.
ShardWrite rank_shard(const std::vector<StatePart>& parts, Engine& engine, bool moments);
// The same from copies: the parts' weights one after another in `weights`, their moments likewise
// in exp_avg / exp_avg_sq (empty: none written).
ShardWrite rank_shard(const std::vector<StatePart>& parts, const std::vector<float>& weights,
                      const std::vector<float>& exp_avg, const std::vector<float>& exp_avg_sq);

// Which of a model's parameters: all of them, PEFT's frozen base (what its pretrained checkpoint
// holds; all of them without PEFT), or the trained ones (PEFT's adapters: what its own checkpoints
// hold, as Megatron-Bridge saves the adapters alone; all of them without PEFT).
enum class ParamSet { kAll, kBase, kTrained };
// A run's checkpoint parameters: those that train (PEFT's adapters alone).
ParamSet saved_params(const model::GptModel& local);

// The whole model's parameter shapes (every rank's experts) of `which`.
std::vector<ParamShape> whole_param_shapes(const model::GptModel& local, ParamSet which = ParamSet::kAll);

// This rank's weights of `which` from `store` into the engine, a tensor at a time (under PEFT the
// rest keep what they hold).
void read_rank_weights(const TensorStore& store, const model::GptModel& local, Engine& engine,
                       ParamSet which = ParamSet::kAll);
// This rank's moments (every owned segment, tails too) from a checkpoint's optimizer store into the
// engine, a part at a time.
void read_rank_moments(const TensorStore& store, const model::GptModel& local, const OptimizerShards& shards,
                       Engine& engine);

}  // namespace laoyao::train
