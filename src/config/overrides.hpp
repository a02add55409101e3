// Hydra-style overrides, as Megatron-Bridge's run_recipe.py takes them (bridge §2.3):
//   a.b.c=value   set a field (typed by the field: 3e-4, true, null, [1,2], 'quoted text')
//   +a.b=value    add a key that does not exist yet (only env_vars.NAME can be added)
//   ++a.b=value   set or add
//   ~a.b          delete: the field goes back to its default (the config class's, not the recipe's)
// An unknown key is an error naming the nearest field; so is a derived field.
#pragma once
#include <string>
#include <vector>

#include "config/config_container.hpp"

namespace laoyao::config {

struct Override {
  enum class Op { Set, Add, Force, Delete };
  Op op = Op::Set;
  std::string path;
  std::string value_text;  // raw right-hand side (empty for Delete)
  std::string original;    // the token as the user wrote it, for messages
};

// Parses one command-line token; UsageError if it is not KEY=VALUE / +KEY=VALUE / ~KEY.
Override parse_override(const std::string& token);

void apply_override(ConfigContainer& c, const Override& o);
void apply_overrides(ConfigContainer& c, const std::vector<std::string>& tokens);

}  // namespace laoyao::config
