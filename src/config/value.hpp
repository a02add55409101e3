// A dynamically typed configuration value: what a YAML node, a Hydra override's right-hand side
// or a Megatron-LM flag's argument becomes before it is stored in a typed config field.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace laoyao::config {

struct Value {
  enum class Kind { Null, Bool, Int, Float, String, List, Map };
  Kind kind = Kind::Null;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::vector<Value> list;
  struct Entry;            // a key and its value (defined below: Value is complete there)
  std::vector<Entry> map;  // insertion order kept

  // Defined below the class (as Entry is): clang with libstdc++ instantiates a vector's destructor
  // where a body builds a Value, which needs its element type complete.
  static Value null();
  static Value boolean(bool v);
  static Value integer(int64_t v);
  static Value real(double v);
  static Value string(std::string v);
  static Value make_list(std::vector<Value> v);
  static Value make_map(std::vector<Entry> v);

  bool is_null() const { return kind == Kind::Null; }
  bool operator==(const Value& o) const;
};

// A std::pair here would be instantiated while Value is incomplete, which clang refuses.
struct Value::Entry {
  std::string first;
  Value second;
  Entry(std::string key, Value value) : first(std::move(key)), second(std::move(value)) {}
  bool operator==(const Entry& o) const { return first == o.first && second == o.second; }
};

inline Value Value::null() { return {}; }
inline Value Value::boolean(bool v) { Value x; x.kind = Kind::Bool; x.b = v; return x; }
inline Value Value::integer(int64_t v) { Value x; x.kind = Kind::Int; x.i = v; return x; }
inline Value Value::real(double v) { Value x; x.kind = Kind::Float; x.f = v; return x; }
inline Value Value::string(std::string v) { Value x; x.kind = Kind::String; x.s = std::move(v); return x; }
inline Value Value::make_list(std::vector<Value> v) { Value x; x.kind = Kind::List; x.list = std::move(v); return x; }
inline Value Value::make_map(std::vector<Entry> v) {
  Value x; x.kind = Kind::Map; x.map = std::move(v); return x;
}

const char* kind_name(Value::Kind k);

// Types a bare scalar as Hydra/OmegaConf do: null, true/false (any case), int, float
// (3e-4, 1.5, inf, nan), else a string.
Value parse_scalar(std::string_view text);

// Parses the right-hand side of a Hydra override: a scalar, a quoted string ('a b' or "a b"),
// a list [a, b, [c]] or a dict {k: v}. Throws UsageError naming `what` on malformed text.
Value parse_override_value(std::string_view text, std::string_view what);

// Shortest text that reads back as the same double ("0.0003", "1.0", "1e-08", "inf").
std::string format_double(double v);

// Renders a value the way an override's right-hand side is written (round-trips through
// parse_override_value): strings quoted only when they would otherwise be typed differently.
std::string to_override_text(const Value& v);

}  // namespace laoyao::config
