// Megatron's distributed optimizer (--use-distributed-optimizer, megatron-lm.md §8.3) over
// data-parallel CPU ranks: each rank owns a contiguous 1/dp share of the flat parameter buffer and
// keeps Adam's moments for that share only; after the averaged gradients it updates its share and
// the updated shares are gathered on every rank. Mathematically the plain optimizer's step. Here the
// reduce-scatter is the plain all-reduce (every rank then reads its share) and the all-gather an
// all-reduce of each rank's share over zeros: the communication volume of the plain optimizer, the
// memory of the sharded one.
//
// Checkpoints hold the whole moments: a save gathers them over the group, a load keeps the share.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "dist/process_group.hpp"
#include "model/parameters.hpp"
#include "optim/adamw.hpp"

namespace laoyao::train {

// Rank r's contiguous share [begin, begin + size) of n parameters over dp ranks (the last may be short).
struct OptimizerShard {
  int64_t begin = 0, size = 0;
};
OptimizerShard optimizer_shard(int64_t n, int64_t rank, int64_t dp);

// AdamW over the parameters of `table` that fall in `shard` (offsets relative to shard.begin).
std::unique_ptr<optim::AdamW> make_shard_adam(const model::ParameterTable& table, OptimizerShard shard,
                                              const optim::AdamWSettings& s);

// weights: every rank's own share updated; after the call the whole buffer holds every share's
// update (collective over the group). scratch: n floats, the caller's (no allocation per step).
void gather_shares(float* weights, int64_t n, OptimizerShard shard, dist::ProcessGroup& group,
                   std::vector<float>& scratch);

// A whole-size AdamW holding every rank's moments (collective), for a checkpoint.
std::unique_ptr<optim::AdamW> gather_moments(const model::ParameterTable& table, const optim::AdamW& shard_adam,
                                             OptimizerShard shard, const optim::AdamWSettings& s,
                                             dist::ProcessGroup& group);
// The share of whole-size moments (a checkpoint's) into the shard's AdamW.
void keep_moment_share(const optim::AdamW& whole, OptimizerShard shard, optim::AdamW& shard_adam);

}  // namespace laoyao::train
