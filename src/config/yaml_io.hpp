// ConfigContainer <-> YAML: the resolved config a run writes (Bridge's run_config.yaml layout:
// one mapping per section), and `--config-file F.yaml` merged onto a recipe.
#pragma once
#include <string>

#include "config/config_container.hpp"

namespace laoyao::config {

std::string to_yaml(ConfigContainer& c);

// Sets every field the YAML document names. Unknown sections or keys are UsageErrors naming
// `source` and the nearest known key; derived fields are accepted and ignored (validate()
// recomputes them), so `recipes show` output reads back unchanged.
void apply_yaml(ConfigContainer& c, const std::string& yaml_text, const std::string& source);

// Converts YAML text to a Value tree (scalars typed as Hydra types them; quoted scalars stay
// strings). Used by compare-logs' config diff too. A document nesting deeper than 64 levels or
// expanding (through aliases) to more than 100000 nodes is a UsageError naming `source`.
Value yaml_to_value(const std::string& yaml_text, const std::string& source);

}  // namespace laoyao::config
