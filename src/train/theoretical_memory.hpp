// The theoretical memory reports printed on rank 0 before the first memory lines, each front end's
// by its own formulas as they are (they are their estimates, not laoyao's).
//
// Megatron-Bridge (since its PR #3910, mid-2026): the dense and embedding parameters and the routed
// experts' apart, in all and on the most loaded rank (the experts over EP x ETP, their optimizer
// state over the expert data-parallel ranks), the weights' and optimizer's memory, and with sequence
// parallelism and selective recomputation Table 2's activations (the MLP width each layer's mean: an
// MoE layer's top-k experts' and shared expert's). Its norms count as LayerNorms with biases and its
// routers not at all.
//
// Megatron-LM (core 0.20, megatron/training/theoretical_memory_usage.py) prints its own report at
// the same place: parameter counts by its formulas (RMSNorm's single weight, the MoE layers of
// --moe-layer-freq with their routers and shared experts, the routed experts' active share by top-k,
// the routed experts sharded over expert-tensor x expert parallelism with their own data-parallel
// size for the distributed optimizer), then one of its two activation estimates (with sequence
// parallelism and selective recomputation Table 2's; else its "precise, without SP" one, 5% added),
// each line as it prints it. Pipeline parallelism, MTP and latent MoE, which laoyao does not run,
// are left out (their terms are zero here).
#pragma once
#include <string>
#include <vector>

#include "config/config_container.hpp"
#include "model/gpt_config.hpp"

namespace laoyao::train {

// The lines as Bridge prints them (the full form's last line ends in "\n", as its f-string does);
// g: the run's model (whole, not a rank's share).
std::vector<std::string> bridge_theoretical_memory_lines(const config::ConfigContainer& c, const config::Derived& d,
                                                         const model::GptConfig& g);

// The lines as Megatron-LM prints them (the last ends in "\n"); g: the run's model (whole, not a
// rank's share).
std::vector<std::string> mlm_theoretical_memory_lines(const config::ConfigContainer& c, const config::Derived& d,
                                                      const model::GptConfig& g);

}  // namespace laoyao::train
