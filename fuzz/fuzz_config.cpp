// Fuzzes the configuration front ends: Megatron-LM flags (parse and validate, as `pretrain-gpt`
// does before any data is read), a recipe with Hydra overrides, and a recipe with a YAML
// --config-file. The first byte picks the front end and the recipe.
#include <cstddef>
#include <cstdint>
#include <sstream>

#include "config/front_ends.hpp"
#include "config/recipes.hpp"
#include "config/validate.hpp"
#include "config/yaml_io.hpp"
#include "fuzz/fuzz_util.hpp"

namespace {

using namespace laoyao;

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(line);
  return out;
}

std::vector<std::string> words_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const auto& recipes = config::all_recipes();
  const std::string& recipe = recipes[(data[0] >> 2) % recipes.size()].name;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (data[0] % 3) {
    case 0:
      fuzz::expect_clean([&] { config::resolve_mlm(words_of(text), 1); });
      break;
    case 1:
      fuzz::expect_clean([&] {
        config::ConfigContainer c = config::recipe_with_overrides(recipe, lines_of(text));
        config::validate(c, {});
      });
      break;
    default:
      fuzz::expect_clean([&] {
        config::ConfigContainer c = config::recipe_with_overrides(recipe, {});
        config::apply_yaml(c, text, "fuzz.yaml");
        config::validate(c, {});
      });
      break;
  }
  return 0;
}
