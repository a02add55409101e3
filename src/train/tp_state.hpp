// Checkpoints hold whole tensors (Megatron-Core names, full shapes), whatever the tensor-parallel
// size: with tensor parallelism a save first gathers the ranks' shards of the weights and of
// Adam's moments into a whole model (an all-reduce over the TP group, each rank contributing its
// places and zeros elsewhere), and a load restores the whole model and keeps this rank's shards.
// A checkpoint saved at TP=2 so resumes at TP=1 or any other TP size, and the other way round.
#pragma once
#include <memory>

#include "model/gpt_model.hpp"
#include "optim/adamw.hpp"

namespace laoyao::train {

struct WholeState {
  std::unique_ptr<model::GptModel> model;  // one rank's model at full size
  std::unique_ptr<optim::AdamW> adam;
};

// An empty whole model (zero weights and moments) of local's full configuration.
WholeState make_whole_state(const model::GptModel& local, const optim::AdamWSettings& settings);
// Every rank of local's TP group gets the whole weights, moments and step count (collective).
WholeState gather_whole_state(const model::GptModel& local, const optim::AdamW& adam,
                              const optim::AdamWSettings& settings);
// This rank's shards of a whole state into local/adam.
void keep_shards(const WholeState& whole, model::GptModel& local, optim::AdamW& adam);

}  // namespace laoyao::train
