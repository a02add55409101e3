// laoyao recipes [show NAME [KEY=VALUE ...]]
#include <cstdio>

#include "cli/cli.hpp"
#include "config/front_ends.hpp"
#include "config/recipes.hpp"
#include "config/validate.hpp"
#include "config/yaml_io.hpp"
#include "core/error.hpp"

namespace laoyao::cli {

int cmd_recipes(const Args& args) {
  if (args.empty()) {
    for (const auto& r : config::all_recipes()) {
      std::printf("%-42s %-8s %s\n", r.name.c_str(), r.mode.c_str(), r.summary.c_str());
      for (const auto& a : r.aliases) std::printf("  alias: %s\n", a.c_str());
    }
    return 0;
  }
  if (args[0] == "--help" || args[0] == "-h") {
    std::printf("usage: laoyao recipes                       list the recipes\n"
                "       laoyao recipes show NAME [KEY=VALUE]  print one, resolved, as YAML\n"
                "The YAML that `show` prints is accepted back by `run-recipe --config-file`.\n");
    return 0;
  }
  if (args[0] != "show") throw UsageError("unknown recipes subcommand '" + args[0] + "' (use: recipes, recipes show NAME)");
  if (args.size() < 2) throw UsageError("recipes show: name a recipe (`laoyao recipes` lists them)");
  std::vector<std::string> overrides(args.begin() + 2, args.end());
  config::ConfigContainer c = config::recipe_with_overrides(args[1], overrides);
  config::ConfigContainer resolved = c;
  try {
    config::validate(resolved, {config::FrontEnd::Bridge, config::world_size_from_env()});
    std::printf("# recipe %s, resolved\n%s", config::find_recipe(args[1]).name.c_str(),
                config::to_yaml(resolved).c_str());
  } catch (const UsageError& e) {
    // Some recipes need the user's values (vanilla GPT's model shape): show them as they are.
    std::printf("# recipe %s, NOT resolved: %s\n# set the missing values with KEY=VALUE overrides\n%s",
                config::find_recipe(args[1]).name.c_str(), e.what(), config::to_yaml(c).c_str());
  }
  return 0;
}

}  // namespace laoyao::cli
