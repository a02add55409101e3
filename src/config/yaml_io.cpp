#include "config/yaml_io.hpp"

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <string>

#include "config/fields.hpp"
#include "core/error.hpp"
#include "core/text.hpp"

namespace laoyao::config {
namespace {

std::string scalar_text(const Value& v) {
  if (v.kind != Value::Kind::String) return to_override_text(v);
  // Quote a string when a YAML reader would type it as something else or misparse it.
  bool plain = !v.s.empty() && parse_scalar(v.s).kind == Value::Kind::String &&
               v.s.find_first_of(":#,[]{}&*!|>'\"%@`") == std::string::npos &&
               v.s.front() != ' ' && v.s.back() != ' ' && v.s.front() != '-' && v.s.front() != '?';
  if (plain) return v.s;
  std::string out = "'";
  for (char c : v.s) out += (c == '\'') ? std::string("''") : std::string(1, c);
  return out + "'";
}

std::string flow(const Value& v) {
  if (v.kind == Value::Kind::List) {
    std::string out = "[";
    for (size_t k = 0; k < v.list.size(); ++k) out += (k ? ", " : "") + flow(v.list[k]);
    return out + "]";
  }
  if (v.kind == Value::Kind::Map) {
    std::string out = "{";
    for (size_t k = 0; k < v.map.size(); ++k)
      out += (k ? ", " : "") + scalar_text(Value::string(v.map[k].first)) + ": " + flow(v.map[k].second);
    return out + "}";
  }
  return scalar_text(v);
}

// yaml-cpp keeps an alias as the very node it names, so a document is a graph: an alias inside
// its own anchor is a cycle, and aliases of aliases ("billion laughs") expand exponentially when
// copied out. Both limits are far above any real config (a resolved config is a few hundred
// fields) and stop such a document before it exhausts the stack or the memory.
constexpr int kMaxYamlDepth = 64;
constexpr int64_t kMaxYamlNodes = 100000;

struct NodeConverter {
  const std::string& source;
  int64_t nodes = 0;

  Value convert(const YAML::Node& n, int depth) {
    if (depth > kMaxYamlDepth)
      throw UsageError("YAML file '" + source + "' nests deeper than " + std::to_string(kMaxYamlDepth) +
                       " levels (an alias that refers to itself?)");
    if (++nodes > kMaxYamlNodes)
      throw UsageError("YAML file '" + source + "' expands to more than " + std::to_string(kMaxYamlNodes) +
                       " nodes (YAML aliases of aliases?); a config has a few hundred");
    switch (n.Type()) {
      case YAML::NodeType::Null:
      case YAML::NodeType::Undefined: return Value::null();
      case YAML::NodeType::Scalar:
        // yaml-cpp tags quoted scalars "!" and plain ones "?": only plain ones get typed.
        if (n.Tag() == "!") return Value::string(n.Scalar());
        return parse_scalar(n.Scalar());
      case YAML::NodeType::Sequence: {
        std::vector<Value> items;
        for (const auto& e : n) items.push_back(convert(e, depth + 1));
        return Value::make_list(std::move(items));
      }
      case YAML::NodeType::Map: {
        std::vector<Value::Entry> items;
        for (const auto& kv : n) items.emplace_back(kv.first.as<std::string>(), convert(kv.second, depth + 1));
        return Value::make_map(std::move(items));
      }
    }
    return Value::null();
  }
};

}  // namespace

std::string to_yaml(ConfigContainer& c) {
  auto fields = fields_of(c);
  std::string out, section;
  for (auto& f : fields) {
    auto dot = f.path.find('.');
    Value v = f.get();
    if (dot == std::string::npos) {  // top-level scalar or mapping
      section.clear();
      if (v.kind == Value::Kind::Map) {
        out += f.path + ":" + (v.map.empty() ? " {}\n" : "\n");
        for (auto& [k, e] : v.map) out += "  " + scalar_text(Value::string(k)) + ": " + flow(e) + "\n";
      } else {
        out += f.path + ": " + flow(v) + "\n";
      }
      continue;
    }
    std::string s = f.path.substr(0, dot);
    if (s != section) {
      section = s;
      out += s + ":\n";
    }
    out += "  " + f.path.substr(dot + 1) + ": " + flow(v) + "\n";
  }
  return out;
}

Value yaml_to_value(const std::string& yaml_text, const std::string& source) {
  try {
    return NodeConverter{source}.convert(YAML::Load(yaml_text), 0);
  } catch (const YAML::Exception& e) {
    throw UsageError("cannot parse YAML file '" + source + "': " + e.what());
  }
}

void apply_yaml(ConfigContainer& c, const std::string& yaml_text, const std::string& source) {
  Value root = yaml_to_value(yaml_text, source);
  if (root.is_null()) return;  // an empty file changes nothing
  if (root.kind != Value::Kind::Map)
    throw UsageError("YAML file '" + source + "' must be a mapping of config sections (model:, train:, ...)");
  auto fields = fields_of(c);
  auto paths = field_paths(fields);
  auto sections = section_names();
  for (auto& [key, val] : root.map) {
    if (Field* f = find_field(fields, key)) {  // top-level scalar (mixed_precision, env_vars)
      f->set(val);
      continue;
    }
    bool is_section = false;
    for (auto& s : sections) is_section = is_section || s == key;
    if (!is_section)
      throw UsageError("unknown config section '" + key + "' in '" + source + "'" + did_you_mean(key, sections));
    if (val.is_null()) continue;
    if (val.kind != Value::Kind::Map)
      throw UsageError("config section '" + key + "' in '" + source + "' must be a mapping");
    for (auto& [name, v] : val.map) {
      std::string path = key + "." + name;
      Field* f = find_field(fields, path);
      if (!f) throw UsageError("unknown config key '" + path + "' in '" + source + "'" + did_you_mean(path, paths));
      if (f->derived) continue;
      try {
        f->set(v);
      } catch (const UsageError& e) {
        throw UsageError(std::string(e.what()) + " (in '" + source + "')");
      }
    }
  }
}

}  // namespace laoyao::config
