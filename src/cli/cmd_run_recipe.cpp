// laoyao run-recipe: Megatron-Bridge's scripts/training/run_recipe.py.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <string>
#include <vector>

#include "cli/cli.hpp"
#include "cli/run_common.hpp"
#include "config/front_ends.hpp"
#include "config/yaml_io.hpp"
#include "core/file_io.hpp"

extern char** environ;

namespace laoyao::cli {
namespace {

// run_recipe.py --dump-env: the environment, sorted, with secrets redacted.
void print_environment() {
  std::vector<std::string> vars;
  for (char** e = environ; *e; ++e) vars.emplace_back(*e);
  std::sort(vars.begin(), vars.end());
  std::printf("Environment:\n");
  for (const auto& v : vars) {
    const auto eq = v.find('=');
    std::string name = v.substr(0, eq), upper = name;
    for (auto& ch : upper) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    const bool secret = upper.find("TOKEN") != std::string::npos || upper.find("KEY") != std::string::npos ||
                        upper.find("SECRET") != std::string::npos || upper.find("PASSWORD") != std::string::npos;
    std::printf("  %s=%s\n", name.c_str(), secret ? "<redacted>" : v.substr(eq + 1).c_str());
  }
}

}  // namespace

int cmd_run_recipe(const Args& args) {
  config::RecipeInvocation inv = config::parse_run_recipe_args(args);
  if (inv.help) {
    std::printf("%s", config::run_recipe_usage().c_str());
    return 0;
  }
  if (inv.dump_env) print_environment();
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
