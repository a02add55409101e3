// laoyao convert-args [Megatron-LM flags]: the equivalent run-recipe command (and YAML).
#include <cstdio>

#include "cli/cli.hpp"
#include "config/convert_args.hpp"
#include "config/front_ends.hpp"
#include "config/yaml_io.hpp"
#include "core/error.hpp"

namespace laoyao::cli {

int cmd_convert_args(const Args& args) {
  std::string emit = "overrides";
  Args mlm;
  for (size_t k = 0; k < args.size(); ++k) {
    if (args[k] == "--help" || args[k] == "-h") {
      std::printf("usage: laoyao convert-args [--emit overrides|yaml|both] [Megatron-LM flags]\n\n"
                  "Prints the `laoyao run-recipe --recipe vanilla_gpt_pretrain_config ...` command whose resolved\n"
                  "config equals the one the Megatron-LM flags give, field by field: every field where the\n"
                  "recipe's default differs from Megatron-LM's (optimizer betas, weight decay, decay style,\n"
                  "warmup, fusions, tokenizer semantics, ...) is overridden. --emit yaml prints the resolved\n"
                  "config as YAML instead (run-recipe --config-file accepts it); both prints the two.\n");
      return 0;
    }
    if (args[k] == "--emit" || args[k].rfind("--emit=", 0) == 0) {
      if (args[k] == "--emit") {
        if (k + 1 >= args.size()) throw UsageError("argument --emit: expected one argument");
        emit = args[++k];
      } else {
        emit = args[k].substr(7);
      }
      if (emit != "overrides" && emit != "yaml" && emit != "both")
        throw UsageError("argument --emit: invalid choice '" + emit + "' (choose from overrides, yaml, both)");
      continue;
    }
    mlm.push_back(args[k]);
  }
  // Validate the Megatron-LM command first: a bad command gets its error, not a conversion.
  int64_t world = config::world_size_from_env();
  config::Resolved r = config::resolve_mlm(mlm, world);
  config::Conversion conv = config::convert_mlm_args(mlm, world);
  if (emit != "yaml") std::printf("%s", config::format_command(conv).c_str());
  if (emit == "both") std::printf("\n---\n");
  if (emit != "overrides") std::printf("%s", config::to_yaml(r.cfg).c_str());
  return 0;
}

}  // namespace laoyao::cli
