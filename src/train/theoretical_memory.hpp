// Megatron-Bridge's theoretical memory report (report_theoretical_memory, verbose), printed on
// rank 0 before the first memory lines: its parameter counts and its estimate of the weights' and
// optimizer's memory (and, with sequence parallelism and selective recomputation, the
// activations'), by its own formulas as they are. They are Bridge's estimate, not laoyao's: the
// MLP term counts ffn_hidden_size once per expert (moe_ffn_hidden_size and shared experts are not
// in it), the norms count as LayerNorms with biases, the pipeline size is 1 here.
#pragma once
#include <string>
#include <vector>

#include "config/config_container.hpp"

namespace laoyao::train {

// The lines as Bridge prints them (the full form's last line ends in "\n", as its f-string does).
std::vector<std::string> bridge_theoretical_memory_lines(const config::ConfigContainer& c, const config::Derived& d);

}  // namespace laoyao::train
