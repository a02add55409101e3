// The two ways a user describes a run, each resolved into a validated ConfigContainer:
//   laoyao pretrain-gpt [Megatron-LM flags]
//   laoyao run-recipe --recipe NAME [--config-file F.yaml] [convenience flags] [KEY=VALUE ...]
#pragma once
#include <string>
#include <vector>

#include "config/config_container.hpp"
#include "config/validate.hpp"

namespace laoyao::config {

struct Resolved {
  ConfigContainer cfg;
  Validated validated;
  FrontEnd front_end = FrontEnd::Bridge;
  std::string recipe;              // run-recipe: the recipe's name
  std::vector<std::string> notes;  // front-end messages printed before the run
};

// WORLD_SIZE (or its Slurm/OpenMPI forms) from the environment; 1 when unset.
int64_t world_size_from_env();

Resolved resolve_mlm(const std::vector<std::string>& args, int64_t world_size);

// run_recipe.py's command line (bridge §2.1), plus --config-file (the YAML of Bridge's tutorials).
struct RecipeInvocation {
  std::string recipe;      // --recipe NAME, or derived from --model STEM and --mode
  std::string mode;        // pretrain | sft | lora | dora ("" = inferred from the name)
  std::string config_file; // --config-file F.yaml
  std::string dataset;     // --dataset mock | megatron-indexed ("" = the recipe's)
  std::vector<std::string> convenience;  // -ms 10 etc., already turned into KEY=VALUE
  std::vector<std::string> overrides;    // trailing KEY=VALUE
  bool dry_run = false;
  bool dump_env = false;  // --dump-env: print the environment (secrets redacted) before running
  bool help = false;
};

RecipeInvocation parse_run_recipe_args(const std::vector<std::string>& args);
Resolved resolve_recipe(const RecipeInvocation& inv, int64_t world_size);

// The recipe's config with `overrides` applied and seq_length synced, before validation
// (what `recipes show` prints when the recipe is incomplete).
ConfigContainer recipe_with_overrides(const std::string& name, const std::vector<std::string>& overrides,
                                      std::vector<std::string>* notes = nullptr);

// The help text of run-recipe.
std::string run_recipe_usage();

}  // namespace laoyao::config
