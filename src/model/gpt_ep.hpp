// Expert parallelism (--expert-model-parallel-size EP): each rank of an expert-parallel group holds
// num_experts / EP of every MoE layer's routed experts, rank r the global experts r*El .. r*El+El-1
// (El = num_experts / EP) as its local_experts.0 .. El-1, as Megatron-Core does; everything else
// (attention, norms, routers, shared experts, embeddings) is whole on every rank. A rank's
// parameter table is the model's at moe.expert_parallel = EP (gpt_layout); the whole model's is at
// expert_parallel = 1, and shard/place map between the two, so that weights initialised whole
// split identically at any EP size and checkpoints hold every expert under its global number.
#pragma once
#include <cstdint>
#include <string>

#include "model/gpt_config.hpp"
#include "model/parameters.hpp"

namespace laoyao::model {

// The whole model of an expert-parallel rank's config (expert_parallel = 1).
GptConfig ep_whole_config(const GptConfig& c);

// True for a routed expert's weight (decoder.layers.N.mlp.experts.local_experts.I...).
bool is_routed_expert(const std::string& name);

// The whole model's name of a rank's parameter: local_experts.I -> local_experts.(rank*El + I);
// any other name unchanged.
std::string ep_whole_name(const std::string& local_name, int64_t rank, int64_t local_experts);

// local_w (the rank's table) = its part of whole_w (the whole table).
void ep_shard(const ParameterTable& whole_table, const float* whole_w, const ParameterTable& local_table,
              float* local_w, int64_t rank, int64_t local_experts);
// Writes the rank's local buffer into its places of whole_w: its experts, and the rest too when
// `replicated`. Summing every rank's whole_w (zero elsewhere, the rest from one rank only) over the
// expert-parallel group is the all-reduce way to gather the whole model.
void ep_place(const ParameterTable& whole_table, float* whole_w, const ParameterTable& local_table,
              const float* local_w, int64_t rank, int64_t local_experts, bool replicated);

}  // namespace laoyao::model
