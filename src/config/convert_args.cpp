#include "config/convert_args.hpp"

#include <optional>

#include "config/fields.hpp"
#include "config/front_ends.hpp"
#include "config/mlm_args.hpp"
#include "config/recipes.hpp"
#include "config/validate.hpp"
#include "core/error.hpp"

namespace laoyao::config {

std::vector<std::string> overrides_between(ConfigContainer& base, ConfigContainer& target) {
  auto from = fields_of(base);
  auto to = fields_of(target);
  std::vector<std::string> out;
  for (size_t k = 0; k < from.size(); ++k) {
    if (from[k].derived) continue;
    Value a = from[k].get(), b = to[k].get();
    if (!(a == b)) out.push_back(from[k].path + "=" + to_override_text(b));
  }
  return out;
}

namespace {

// The recipe with `overrides`, resolved as run-recipe resolves it; nullopt if it does not validate.
std::optional<ConfigContainer> resolve_with(const std::string& recipe, const std::vector<std::string>& overrides,
                                            int64_t world_size) {
  try {
    RecipeInvocation inv;
    inv.recipe = recipe;
    inv.mode = "pretrain";
    inv.overrides = overrides;
    return resolve_recipe(inv, world_size).cfg;
  } catch (const UsageError&) {
    return std::nullopt;
  }
}

}  // namespace

Conversion convert_mlm_args(const std::vector<std::string>& mlm_args, int64_t world_size) {
  Conversion conv;
  ConfigContainer mlm = parse_mlm_args(mlm_args);
  ConfigContainer recipe = find_recipe(conv.recipe).build();
  conv.overrides = overrides_between(recipe, mlm);
  ConfigContainer target = mlm;
  validate(target, {FrontEnd::MegatronLM, world_size});
  // Drop, one at a time, each override whose absence resolves to the same config.
  for (size_t k = conv.overrides.size(); k-- > 0;) {
    std::vector<std::string> without = conv.overrides;
    without.erase(without.begin() + static_cast<std::ptrdiff_t>(k));
    auto resolved = resolve_with(conv.recipe, without, world_size);
    if (resolved && overrides_between(*resolved, target).empty()) conv.overrides = std::move(without);
  }
  return conv;
}

std::string shell_quote(const std::string& token) {
  bool safe = !token.empty();
  for (char c : token)
    safe = safe && (std::isalnum(static_cast<unsigned char>(c)) || std::string("._/=:+-,@%").find(c) != std::string::npos);
  if (safe) return token;
  std::string out = "\"";
  for (char c : token) {
    if (c == '"' || c == '\\' || c == '$' || c == '`') out += '\\';
    out += c;
  }
  return out + "\"";
}

std::string format_command(const Conversion& c) {
  std::string out = "laoyao run-recipe --recipe " + c.recipe;
  for (const auto& o : c.overrides) out += " \\\n  " + shell_quote(o);
  return out + "\n";
}

}  // namespace laoyao::config
