// Megatron-Bridge's theoretical memory report (report_theoretical_memory, verbose), printed on
// rank 0 before the first memory lines: its parameter counts and its estimate of the weights' and
// optimizer's memory (and, with sequence parallelism and selective recomputation, the
// activations'), by its own formulas as they are. They are Bridge's estimate, not laoyao's: the
// MLP term counts ffn_hidden_size once per expert (moe_ffn_hidden_size and shared experts are not
// in it), the norms count as LayerNorms with biases, the pipeline size is 1 here.
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

// The lines as Bridge prints them (the full form's last line ends in "\n", as its f-string does).
std::vector<std::string> bridge_theoretical_memory_lines(const config::ConfigContainer& c, const config::Derived& d);

// The lines as Megatron-LM prints them (the last ends in "\n"); g: the run's model (whole, not a
// rank's share).
std::vector<std::string> mlm_theoretical_memory_lines(const config::ConfigContainer& c, const config::Derived& d,
                                                      const model::GptConfig& g);

}  // namespace laoyao::train
