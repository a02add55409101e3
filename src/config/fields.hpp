// A flat, generic view of a ConfigContainer: one Field per leaf, addressed by its dotted path
// ("model.num_layers"). YAML output, overrides, convert-args and config diffs all work on this.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "config/config_container.hpp"
#include "config/value.hpp"

namespace laoyao::config {

struct Field {
  std::string path;     // "model.num_layers"
  std::string type;     // for messages: "an integer", "a float or null", ...
  Choices choices;      // accepted strings, if restricted
  bool derived = false; // computed by validate(); a user may not set it
  std::function<Value()> get;
  // Converts and stores; throws UsageError naming the path, the value and the accepted type.
  std::function<void(const Value&)> set;
};

// Every leaf of `c`, in declaration order. The closures point into `c`.
std::vector<Field> fields_of(ConfigContainer& c);

// The field at `path`, or nullptr. `env_vars.NAME` is not a field (see overrides).
Field* find_field(std::vector<Field>& fields, const std::string& path);

// Paths of all fields (for "did you mean" suggestions).
std::vector<std::string> field_paths(const std::vector<Field>& fields);

// The value a field has in a default-constructed ConfigContainer.
Value default_value(const std::string& path);

// Section names in order ("rng", "train", "model", ...) plus the top-level scalars.
std::vector<std::string> section_names();

}  // namespace laoyao::config
