// FP8 linear layers from the config (--fp8-format and the fields beside it, or a mixed_precision
// preset): the model's Fp8Spec, and a UsageError naming what Megatron refuses or laoyao cannot run.
#pragma once
#include <optional>

#include "config/config_container.hpp"
#include "model/gpt_config.hpp"

namespace laoyao::train {

// g: the model's shapes (num_layers, widths; MLA's), for the linear layers' sizes. Empty without
// model.fp8 (where model.fp8_param is refused, as Megatron does).
std::optional<model::Fp8Spec> fp8_spec(const config::ConfigContainer& c, const model::GptConfig& g);

}  // namespace laoyao::train
