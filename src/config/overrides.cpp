#include "config/overrides.hpp"

#include "config/fields.hpp"
#include "core/error.hpp"
#include "core/text.hpp"

namespace laoyao::config {

Override parse_override(const std::string& token) {
  Override o;
  o.original = token;
  std::string t = token;
  if (starts_with(t, "++")) o.op = Override::Op::Force, t = t.substr(2);
  else if (starts_with(t, "+")) o.op = Override::Op::Add, t = t.substr(1);
  else if (starts_with(t, "~")) o.op = Override::Op::Delete, t = t.substr(1);
  else if (starts_with(t, "-"))
    throw UsageError("unknown option: " + token + " (overrides are written KEY=VALUE, e.g. train.train_iters=10)");
  auto eq = t.find('=');
  if (o.op == Override::Op::Delete) {
    o.path = eq == std::string::npos ? t : t.substr(0, eq);
  } else {
    if (eq == std::string::npos)
      throw UsageError("expected override in KEY=VALUE form, got '" + token + "'");
    o.path = t.substr(0, eq);
    o.value_text = t.substr(eq + 1);
  }
  o.path = trim(o.path);
  if (o.path.empty()) throw UsageError("override '" + token + "' names no key");
  return o;
}

void apply_override(ConfigContainer& c, const Override& o) {
  // env_vars is an open mapping: env_vars.NAME=value adds or replaces one variable.
  if (starts_with(o.path, "env_vars.")) {
    std::string name = o.path.substr(9);
    if (o.op == Override::Op::Delete) {
      c.env_vars.erase(name);
      return;
    }
    Value v = parse_override_value(o.value_text, o.path);
    if (o.op == Override::Op::Add && c.env_vars.count(name))
      throw UsageError("cannot add " + o.path + ": it is already set (use " + o.path + "=... or ++" + o.path + "=...)");
    c.env_vars[name] = v.kind == Value::Kind::String ? v.s : to_override_text(v);
    return;
  }
  auto fields = fields_of(c);
  Field* f = find_field(fields, o.path);
  if (!f) {
    auto paths = field_paths(fields);
    paths.emplace_back("env_vars.NAME");
    throw UsageError("unknown config key '" + o.path + "' in override '" + o.original + "'" +
                     did_you_mean(o.path, paths));
  }
  if (f->derived)
    throw UsageError(o.path + " is computed from other fields and cannot be set (override '" + o.original +
                     "'); set the *_iters / *_samples fields it is derived from instead");
  switch (o.op) {
    case Override::Op::Add:
      throw UsageError("cannot add " + o.path + ": the key already exists (write " + o.path + "=" +
                       o.value_text + ")");
    case Override::Op::Delete: f->set(default_value(o.path)); return;
    case Override::Op::Set:
    case Override::Op::Force: f->set(parse_override_value(o.value_text, o.path)); return;
  }
}

void apply_overrides(ConfigContainer& c, const std::vector<std::string>& tokens) {
  for (const auto& t : tokens) apply_override(c, parse_override(t));
}

}  // namespace laoyao::config
