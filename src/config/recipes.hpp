// Front end 2's recipes: Megatron-Bridge's recipe functions, with the reference's exact values
// (shared/reference/megatron-bridge.md §4). Each builds a ConfigContainer; `run-recipe` then
// lays --config-file YAML and KEY=VALUE overrides over it.
#pragma once
#include <string>
#include <vector>

#include "config/config_container.hpp"

namespace laoyao::config {

struct Recipe {
  std::string name;                  // the name users type in the seed commands
  std::vector<std::string> aliases;  // Bridge's canonical long name(s)
  std::string mode;                  // pretrain | sft | peft
  std::string summary;               // one line for `laoyao recipes`
  ConfigContainer (*build)();
};

const std::vector<Recipe>& all_recipes();

// By name or alias; UsageError naming the nearest recipe otherwise (Bridge:
// "Recipe '<n>' not found in megatron.bridge.recipes ...").
const Recipe& find_recipe(const std::string& name);

}  // namespace laoyao::config
