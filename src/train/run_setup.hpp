// From a validated ConfigContainer to the plain structs the model, optimizer and data layers
// take. The lower layers know no config; this is the one place that maps between them.
#pragma once
#include "config/config_container.hpp"
#include "model/gpt_config.hpp"
#include "optim/param_scheduler.hpp"
#include "train/flops.hpp"

namespace laoyao::train {

model::GptConfig model_config(const config::ConfigContainer& c, const config::Derived& d);
optim::ParamSchedule param_schedule(const config::ConfigContainer& c);
FlopShape flop_shape(const config::ConfigContainer& c, const config::Derived& d);

}  // namespace laoyao::train
