// Front end 1: Megatron-LM's pretrain_gpt.py command line -> ConfigContainer.
// Flag names, argparse semantics (--f v, --f=v, store_true / --no-* flags, multi-value flags,
// last occurrence wins, no abbreviations) and defaults are Megatron-LM's
// (shared/reference/megatron-lm.md §2), including its quirks.
#pragma once
#include <string>
#include <vector>

#include "config/config_container.hpp"

namespace laoyao::config {

// The config Megatron-LM starts from before any flag is read: Bridge's dataclass defaults with
// Megatron-LM's own CLI defaults laid over them (fusions on, NullTokenizer current semantics,
// linear decay, beta2 0.999, wd 0.01, ...).
ConfigContainer mlm_default_config();

// Parses the flags onto mlm_default_config(). UsageError (exit 2) for an unknown flag (naming
// the nearest known one), a bad value, a missing value, or a known Megatron-LM flag that
// laoyao does not support (named, with why).
ConfigContainer parse_mlm_args(const std::vector<std::string>& args);

// "--num-layers" for "model.num_layers"; "" if no flag sets that field.
std::string mlm_flag_for_path(const std::string& path);

// Every flag name laoyao knows (accepted, no-op or refused), for help and tests.
std::vector<std::string> mlm_flag_names();

}  // namespace laoyao::config
