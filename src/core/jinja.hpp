// Jinja templates as Hugging Face chat templates use them: the subset of Jinja2 that transformers'
// apply_chat_template renders (its environment: trim_blocks, lstrip_blocks, loop controls, the
// globals raise_exception and strftime_now, a tojson filter that is Python's json.dumps with
// ensure_ascii off). Values follow Python's: str() of None is "None", dicts keep insertion order,
// `a.b` falls back to `a['b']`, an undefined name renders as nothing and is false.
//
// Statements: for (with `loop`, tuple targets, `if` filters, else), if/elif/else, set (also
// `set ns.attr`, block set), break, continue, raw, generation (its body rendered as is), comments.
// Macros, includes and inheritance are refused with a TemplateError naming them.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/error.hpp"

namespace laoyao::jinja {

// A template that cannot be parsed or rendered (a syntax error, an unknown filter, an operation on
// an undefined value, raise_exception): the message names the place in the template.
struct TemplateError : UsageError {
  using UsageError::UsageError;
};

struct Value;
using List = std::vector<Value>;
using Dict = std::vector<std::pair<std::string, Value>>;

struct Value {
  enum class Kind { Undefined, None, Bool, Int, Float, String, List, Dict };
  Kind kind = Kind::Undefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::shared_ptr<List> list;  // shared: Python's reference semantics (a namespace is a Dict)
  std::shared_ptr<Dict> dict;
  bool is_namespace = false;
  bool is_tuple = false;  // a List that Python would hold as a tuple (its repr uses parentheses)

  static Value undefined() { return {}; }
  static Value none() { Value v; v.kind = Kind::None; return v; }
  static Value boolean(bool x) { Value v; v.kind = Kind::Bool; v.b = x; return v; }
  static Value integer(int64_t x) { Value v; v.kind = Kind::Int; v.i = x; return v; }
  static Value real(double x) { Value v; v.kind = Kind::Float; v.f = x; return v; }
  static Value string(std::string x) { Value v; v.kind = Kind::String; v.s = std::move(x); return v; }
  static Value make_list(List x = {}) {
    Value v; v.kind = Kind::List; v.list = std::make_shared<List>(std::move(x)); return v;
  }
  static Value make_dict(Dict x = {}) {
    Value v; v.kind = Kind::Dict; v.dict = std::make_shared<Dict>(std::move(x)); return v;
  }

  bool defined() const { return kind != Kind::Undefined; }
  const Value* find(std::string_view key) const;  // a Dict's entry, or nullptr
  void set(const std::string& key, Value v);      // a Dict's entry, added or replaced
};

// JSON (nlohmann's text) to a Value and back as Python's json.dumps writes it (", " and ": ";
// ensure_ascii off; indent > 0 breaks lines as json.dumps(indent=n) does).
Value from_json_text(std::string_view json_text);
std::string to_json(const Value& v, int indent = -1);

// Python's str() of a value (what {{ x }} prints).
std::string to_str(const Value& v);

class Template {
 public:
  explicit Template(std::string_view source);  // TemplateError on a syntax error
  ~Template();
  Template(Template&&) noexcept;
  std::string render(const Dict& variables) const;

  struct Node;

 private:
  std::shared_ptr<const Node> root_;
};

}  // namespace laoyao::jinja
