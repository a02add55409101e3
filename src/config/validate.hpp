// The one validation pass every front end goes through: it fills the fields Megatron derives
// (ffn_hidden_size, kv_channels, global batch size, scheduler steps in samples, the padded
// vocabulary, ...), applies Bridge's post-processing rules (seq_length sync, warmup/decay guard,
// distributed-optimizer OR rule, mixed-precision preset) and refuses inconsistent settings with
// one UsageError that names the setting the way the user's front end spells it.
// validate() is idempotent: validating a validated config changes nothing.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "config/config_container.hpp"
#include "data/batch_rampup.hpp"

namespace laoyao::config {

enum class FrontEnd { MegatronLM, Bridge };

struct ValidateOptions {
  FrontEnd front_end = FrontEnd::Bridge;
  int64_t world_size = 1;
};

struct Validated {
  Derived derived;
  std::vector<std::string> warnings;  // printed as "WARNING: ..." by the CLI
  std::vector<std::string> notes;     // informational lines ("Let mock = True, ...")
};

Validated validate(ConfigContainer& c, const ValidateOptions& opt);

// How the front end names a field: "--num-layers" for Megatron-LM flags, "model.num_layers" for
// recipes. Falls back to the path when no flag maps to it.
std::string display_name(const std::string& path, FrontEnd fe);

// Sets the model's vocabulary from the tokenizer's (size and EOD id) by Bridge's rule; validate()
// calls it for the NullTokenizer, the run calls it once a file-based tokenizer is loaded.
void apply_vocab_rule(ConfigContainer& c, Derived& d, int64_t tokenizer_vocab, int64_t eod, FrontEnd fe);

// train.rampup_batch_size as a schedule (decrease_if_needed, the data-parallel size and the
// micro-batch size filled in); the empty schedule (start 0) without ramp-up.
data::BatchRampup batch_rampup(const ConfigContainer& c, const Derived& d);

// Megatron's padded vocabulary: ceil(v / (divisor * tp)) * divisor * tp.
int64_t padded_vocab_size(int64_t vocab, int64_t divisor, int64_t tp);

// The NaN or infinity that field `path` may not hold in `v` (every float setting must be finite;
// optimizer.clip_grad may be +inf), or nullopt. validate() refuses them; the Megatron-LM front end
// names the flag the user typed.
std::optional<double> forbidden_non_finite(const std::string& path, const Value& v);

// The mixed-precision presets Bridge registers (names with '_'; '-' aliases are accepted).
std::vector<std::string> mixed_precision_presets();

}  // namespace laoyao::config
