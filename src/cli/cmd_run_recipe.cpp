// laoyao run-recipe: Megatron-Bridge's scripts/training/run_recipe.py.
#include <cstdio>

#include "cli/cli.hpp"
#include "cli/run_common.hpp"
#include "config/front_ends.hpp"
#include "config/yaml_io.hpp"
#include "core/file_io.hpp"

namespace laoyao::cli {

int cmd_run_recipe(const Args& args) {
  config::RecipeInvocation inv = config::parse_run_recipe_args(args);
  if (inv.help) {
    std::printf("%s", config::run_recipe_usage().c_str());
    return 0;
  }
  config::Resolved r = config::resolve_recipe(inv, config::world_size_from_env());
  print_messages(r);
  std::string yaml = config::to_yaml(r.cfg);
  std::printf("Final configuration:\n%s", yaml.c_str());
  if (inv.dry_run) {
    std::string path = r.cfg.logger.save_config_filepath.value_or("ConfigContainer.yaml");
    write_file_atomic(path, yaml);
    std::printf("Dry run: configuration written to %s; not training.\n", path.c_str());
    return 0;
  }
  return start_training(r);
}

}  // namespace laoyao::cli
