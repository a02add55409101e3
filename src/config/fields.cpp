#include "config/fields.hpp"

#include <cmath>
#include <map>
#include <type_traits>

#include "core/error.hpp"
#include "core/text.hpp"

namespace laoyao::config {
namespace {

[[noreturn]] void bad_value(const std::string& path, const Value& v, const std::string& want) {
  throw UsageError("bad value " + to_override_text(v) + " for " + path + ": expected " + want);
}

// Conversions between Value and the field types used in config_container.hpp.
template <class T> struct Conv;

template <> struct Conv<int64_t> {
  static std::string type() { return "an integer"; }
  static Value to(const int64_t& x) { return Value::integer(x); }
  static void from(const Value& v, int64_t& x, const std::string& path) {
    if (v.kind == Value::Kind::Int) return void(x = v.i);
    bad_value(path, v, type());
  }
};

template <> struct Conv<double> {
  static std::string type() { return "a number"; }
  static Value to(const double& x) { return Value::real(x); }
  static void from(const Value& v, double& x, const std::string& path) {
    if (v.kind == Value::Kind::Float) return void(x = v.f);
    if (v.kind == Value::Kind::Int) return void(x = static_cast<double>(v.i));
    bad_value(path, v, type());
  }
};

template <> struct Conv<bool> {
  static std::string type() { return "true or false"; }
  static Value to(const bool& x) { return Value::boolean(x); }
  static void from(const Value& v, bool& x, const std::string& path) {
    if (v.kind == Value::Kind::Bool) return void(x = v.b);
    bad_value(path, v, type());
  }
};

template <> struct Conv<std::string> {
  static std::string type() { return "a string"; }
  static Value to(const std::string& x) { return Value::string(x); }
  static void from(const Value& v, std::string& x, const std::string& path) {
    switch (v.kind) {
      case Value::Kind::String: x = v.s; return;
      // A path or name that happens to look like a number stays the text the user wrote.
      case Value::Kind::Int: x = std::to_string(v.i); return;
      case Value::Kind::Float: x = format_double(v.f); return;
      default: bad_value(path, v, type());
    }
  }
};

template <class T> struct Conv<std::optional<T>> {
  static std::string type() { return Conv<T>::type() + " or null"; }
  static Value to(const std::optional<T>& x) { return x ? Conv<T>::to(*x) : Value::null(); }
  static void from(const Value& v, std::optional<T>& x, const std::string& path) {
    if (v.is_null()) return void(x.reset());
    T t{};
    Conv<T>::from(v, t, path);
    x = std::move(t);
  }
};

template <class T> struct Conv<std::vector<T>> {
  static std::string type() { return "a list of " + element(); }
  static std::string element() {
    if constexpr (std::is_same_v<T, int64_t>) return "integers";
    else if constexpr (std::is_same_v<T, double>) return "numbers";
    else return "strings";
  }
  static Value to(const std::vector<T>& x) {
    std::vector<Value> out;
    for (const auto& e : x) out.push_back(Conv<T>::to(e));
    return Value::make_list(std::move(out));
  }
  static void from(const Value& v, std::vector<T>& x, const std::string& path) {
    if (v.is_null()) return void(x.clear());
    std::vector<T> out;
    if (v.kind == Value::Kind::List) {
      for (const auto& e : v.list) {
        T t{};
        Conv<T>::from(e, t, path);
        out.push_back(std::move(t));
      }
    } else if constexpr (std::is_same_v<T, std::string>) {
      // MLM style: one space-separated string ("0.3 a 0.7 b") is accepted for string lists.
      if (v.kind != Value::Kind::String) bad_value(path, v, type());
      for (auto& part : split(v.s, ' '))
        if (!part.empty()) out.push_back(part);
    } else {
      bad_value(path, v, type());
    }
    x = std::move(out);
  }
};

template <> struct Conv<std::map<std::string, std::string>> {
  static std::string type() { return "a mapping of names to strings"; }
  static Value to(const std::map<std::string, std::string>& x) {
    std::vector<Value::Entry> out;
    for (const auto& [k, s] : x) out.emplace_back(k, Value::string(s));
    return Value::make_map(std::move(out));
  }
  static void from(const Value& v, std::map<std::string, std::string>& x, const std::string& path) {
    if (v.is_null()) return void(x.clear());
    if (v.kind != Value::Kind::Map) bad_value(path, v, type());
    std::map<std::string, std::string> out;
    for (const auto& [k, e] : v.map) Conv<std::string>::from(e, out[k], path + "." + k);
    x = std::move(out);
  }
};

// Structured fields (dataset.blend, model.moe_layer_freq) keep the raw value; validate() checks it.
template <> struct Conv<Value> {
  static std::string type() { return "a value"; }
  static Value to(const Value& x) { return x; }
  static void from(const Value& v, Value& x, const std::string&) { x = v; }
};

struct Collector {
  std::vector<Field>* out;
  std::string prefix;

  template <class T> void add(const std::string& name, T& ref, Choices choices, bool derived) {
    Field f;
    f.path = prefix + name;
    f.type = Conv<T>::type();
    f.derived = derived;
    f.choices = choices;
    T* p = &ref;
    std::string path = f.path;
    f.get = [p] { return Conv<T>::to(*p); };
    f.set = [p, path, choices](const Value& v) {
      T tmp = *p;
      Conv<T>::from(v, tmp, path);
      if constexpr (std::is_same_v<T, std::string> || std::is_same_v<T, OptString>) {
        const std::string* s = nullptr;
        if constexpr (std::is_same_v<T, std::string>) s = &tmp;
        else if (tmp) s = &*tmp;
        if (s && !choices.empty()) {
          bool ok = false;
          for (const auto& c : choices) ok = ok || c == *s;
          if (!ok)
            throw UsageError("bad value '" + *s + "' for " + path + ": choose from " +
                             join(choices, ", ") + did_you_mean(*s, choices));
        }
      }
      *p = std::move(tmp);
    };
    out->push_back(std::move(f));
  }
  template <class T> void field(const std::string& name, T& ref) { add(name, ref, {}, false); }
  template <class T> void field(const std::string& name, T& ref, Choices c) { add(name, ref, c, false); }
  template <class T> void derived(const std::string& name, T& ref) { add(name, ref, {}, true); }
  template <class S> void section(const std::string& name, S& s) {
    Collector sub{out, prefix + name + "."};
    s.visit(sub);
  }
};

}  // namespace

std::vector<Field> fields_of(ConfigContainer& c) {
  std::vector<Field> out;
  Collector col{&out, ""};
  c.visit(col);
  return out;
}

Field* find_field(std::vector<Field>& fields, const std::string& path) {
  for (auto& f : fields)
    if (f.path == path) return &f;
  return nullptr;
}

std::vector<std::string> field_paths(const std::vector<Field>& fields) {
  std::vector<std::string> out;
  for (const auto& f : fields) out.push_back(f.path);
  return out;
}

Value default_value(const std::string& path) {
  static ConfigContainer defaults;
  static std::map<std::string, Value> values = [] {
    std::map<std::string, Value> m;
    for (auto& f : fields_of(defaults)) m[f.path] = f.get();
    return m;
  }();
  auto it = values.find(path);
  if (it == values.end()) throw Error("no config field " + path);
  return it->second;
}

namespace {
struct SectionNames {
  std::vector<std::string> out;
  template <class T> void field(const std::string& n, T&) { out.push_back(n); }
  template <class S> void section(const std::string& n, S&) { out.push_back(n); }
};
}  // namespace

std::vector<std::string> section_names() {
  SectionNames names;
  ConfigContainer c;
  c.visit(names);
  return names.out;
}

}  // namespace laoyao::config
