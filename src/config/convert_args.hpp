// `laoyao convert-args`: the run-recipe command equal to a Megatron-LM command line. Start from
// the vanilla GPT recipe and override every field whose value differs from what the Megatron-LM
// flags give (optimizer betas, weight decay, decay style, fusions, tokenizer semantics, ...), so
// both resolve to the same ConfigContainer field for field.
#pragma once
#include <string>
#include <vector>

#include "config/config_container.hpp"

namespace laoyao::config {

struct Conversion {
  std::string recipe = "vanilla_gpt_pretrain_config";
  std::vector<std::string> overrides;  // KEY=VALUE, in field order
};

// Overrides that the validation pass makes redundant (ddp.grad_reduce_in_fp32 under a bf16
// preset, a split that mock data forces, ...) are dropped, so the command shows only what
// matters; the result still resolves to the same config, which the tests check.
Conversion convert_mlm_args(const std::vector<std::string>& mlm_args, int64_t world_size = 1);

// The overrides that turn `base` into `target` (fields compared before validation).
std::vector<std::string> overrides_between(ConfigContainer& base, ConfigContainer& target);

// "laoyao run-recipe --recipe R \\\n  k=v \\\n ..." with shell quoting where a token needs it.
std::string format_command(const Conversion& c);

// A token quoted for a POSIX shell if it has characters the shell would interpret.
std::string shell_quote(const std::string& token);

}  // namespace laoyao::config
