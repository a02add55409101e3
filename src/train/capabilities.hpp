// What this build of laoyao can train. A config that asks for more is refused before anything
// is written, with every missing feature named (never silently ignored).
#pragma once
#include <string>
#include <vector>

#include "config/config_container.hpp"

namespace laoyao::train {

// One line per feature the config needs that the engine does not have; empty = trainable.
std::vector<std::string> missing_features(const config::ConfigContainer& c, int64_t world_size);

}  // namespace laoyao::train
