#include "config/value.hpp"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <string>

#include "core/error.hpp"
#include "core/text.hpp"

namespace laoyao::config {

bool Value::operator==(const Value& o) const {
  if (kind != o.kind) return false;
  switch (kind) {
    case Kind::Null: return true;
    case Kind::Bool: return b == o.b;
    case Kind::Int: return i == o.i;
    case Kind::Float: return (std::isnan(f) && std::isnan(o.f)) || f == o.f;
    case Kind::String: return s == o.s;
    case Kind::List: return list == o.list;
    case Kind::Map: return map == o.map;
  }
  return false;
}

const char* kind_name(Value::Kind k) {
  switch (k) {
    case Value::Kind::Null: return "null";
    case Value::Kind::Bool: return "a boolean";
    case Value::Kind::Int: return "an integer";
    case Value::Kind::Float: return "a float";
    case Value::Kind::String: return "a string";
    case Value::Kind::List: return "a list";
    case Value::Kind::Map: return "a mapping";
  }
  return "?";
}

static std::string lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

static bool parse_int(std::string_view t, int64_t& out) {
  std::string_view u = t;
  if (!u.empty() && u[0] == '+') u.remove_prefix(1);
  if (u.empty()) return false;
  // Hydra accepts 1_000 style separators too.
  std::string clean;
  for (char c : u)
    if (c != '_') clean += c;
  auto r = std::from_chars(clean.data(), clean.data() + clean.size(), out);
  return r.ec == std::errc() && r.ptr == clean.data() + clean.size();
}

static bool parse_float(std::string_view t, double& out) {
  std::string l = lower(t);
  if (l == "inf" || l == "+inf" || l == ".inf") return out = INFINITY, true;
  if (l == "-inf" || l == "-.inf") return out = -INFINITY, true;
  if (l == "nan" || l == ".nan") return out = NAN, true;
  if (l.empty()) return false;
  // Must look like a number: digits with optional sign, dot and exponent.
  bool digit = false;
  for (char c : l) {
    if (std::isdigit(static_cast<unsigned char>(c))) digit = true;
    else if (c != '.' && c != 'e' && c != '+' && c != '-' && c != '_') return false;
  }
  if (!digit) return false;
  std::string clean;
  for (char c : l)
    if (c != '_') clean += c;
  const char* b = clean.c_str();
  char* e = nullptr;
  out = std::strtod(b, &e);
  return e == b + clean.size();
}

Value parse_scalar(std::string_view text) {
  std::string_view t = text;
  std::string l = lower(t);
  if (l == "null" || l == "~" || l == "none") return Value::null();
  if (l == "true") return Value::boolean(true);
  if (l == "false") return Value::boolean(false);
  int64_t i;
  if (parse_int(t, i)) return Value::integer(i);
  double f;
  if (parse_float(t, f)) return Value::real(f);
  return Value::string(std::string(t));
}

namespace {

// Far deeper than any config value (blend_per_split, the deepest, has three levels).
constexpr int kMaxOverrideDepth = 64;

struct OverrideParser {
  std::string_view t;
  std::string_view what;
  size_t p = 0;

  int depth = 0;  // lists and dicts open around the current position

  [[noreturn]] void fail(const std::string& msg) {
    throw UsageError("cannot parse the value of " + std::string(what) + ": " + msg + " in '" + shorten(t, 80) + "'");
  }
  // The parser recurses once per level: a bound keeps `a.b=[[[[...` off the end of the stack.
  void enter() {
    if (++depth > kMaxOverrideDepth)
      fail("lists and dicts nest deeper than " + std::to_string(kMaxOverrideDepth) + " levels");
  }
  void ws() {
    while (p < t.size() && (t[p] == ' ' || t[p] == '\t')) ++p;
  }
  Value parse_value(bool nested) {
    ws();
    if (p < t.size() && t[p] == '[') return parse_list();
    if (p < t.size() && t[p] == '{') return parse_dict();
    if (p < t.size() && (t[p] == '\'' || t[p] == '"')) return parse_quoted();
    // A bare element runs to the next separator (inside a list or dict) or to the end.
    size_t start = p;
    while (p < t.size()) {
      char c = t[p];
      if (nested && (c == ',' || c == ']' || c == '}')) break;
      ++p;
    }
    std::string raw(t.substr(start, p - start));
    while (!raw.empty() && (raw.back() == ' ' || raw.back() == '\t')) raw.pop_back();
    if (raw.empty() && nested) fail("empty element");
    return parse_scalar(raw);
  }
  Value parse_quoted() {
    char q = t[p++];
    std::string out;
    while (p < t.size() && t[p] != q) {
      if (t[p] == '\\' && p + 1 < t.size()) ++p;
      out += t[p++];
    }
    if (p >= t.size()) fail("unterminated quote");
    ++p;
    return Value::string(out);
  }
  Value parse_list() {
    ++p;
    enter();
    std::vector<Value> items;
    ws();
    if (p < t.size() && t[p] == ']') return ++p, --depth, Value::make_list({});
    while (true) {
      items.push_back(parse_value(true));
      ws();
      if (p >= t.size()) fail("missing ']'");
      if (t[p] == ',') { ++p; continue; }
      if (t[p] == ']') { ++p; break; }
      fail(std::string("unexpected '") + t[p] + "'");
    }
    --depth;
    return Value::make_list(std::move(items));
  }
  Value parse_dict() {
    ++p;
    enter();
    std::vector<Value::Entry> items;
    ws();
    if (p < t.size() && t[p] == '}') return ++p, --depth, Value::make_map({});
    while (true) {
      ws();
      size_t start = p;
      while (p < t.size() && t[p] != ':' && t[p] != '}' && t[p] != ',') ++p;
      if (p >= t.size() || t[p] != ':') fail("expected 'key: value' in a dict");
      std::string key(t.substr(start, p - start));
      while (!key.empty() && key.back() == ' ') key.pop_back();
      ++p;
      items.emplace_back(key, parse_value(true));
      ws();
      if (p >= t.size()) fail("missing '}'");
      if (t[p] == ',') { ++p; continue; }
      if (t[p] == '}') { ++p; break; }
      fail(std::string("unexpected '") + t[p] + "'");
    }
    --depth;
    return Value::make_map(std::move(items));
  }
};

}  // namespace

Value parse_override_value(std::string_view text, std::string_view what) {
  OverrideParser parser{text, what};
  parser.ws();
  if (parser.p < text.size() && (text[parser.p] == '[' || text[parser.p] == '{' ||
                                 text[parser.p] == '\'' || text[parser.p] == '"')) {
    Value v = parser.parse_value(false);
    parser.ws();
    if (parser.p != text.size()) parser.fail("trailing text after the value");
    return v;
  }
  return parse_scalar(std::string(text));
}

std::string format_double(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  // Plain decimals read best ("0.0003", "500000.0"); very large or small values use exponents.
  char buf[400];
  auto r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::fixed);
  std::string s(buf, r.ptr);
  if (s.size() > 16) {
    r = std::to_chars(buf, buf + sizeof buf, v);
    s.assign(buf, r.ptr);
  }
  // Keep it visibly a float: "1" -> "1.0" (but "1e-08" already is).
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

std::string to_override_text(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Null: return "null";
    case Value::Kind::Bool: return v.b ? "true" : "false";
    case Value::Kind::Int: return std::to_string(v.i);
    case Value::Kind::Float: return format_double(v.f);
    case Value::Kind::String: {
      bool plain = !v.s.empty() && parse_scalar(v.s).kind == Value::Kind::String &&
                   v.s.find_first_of(" ,[]{}'\"=:\\") == std::string::npos;
      if (plain) return v.s;
      std::string out = "'";
      for (char c : v.s) {
        if (c == '\'' || c == '\\') out += '\\';
        out += c;
      }
      return out + "'";
    }
    case Value::Kind::List: {
      std::string out = "[";
      for (size_t k = 0; k < v.list.size(); ++k) {
        if (k) out += ',';
        out += to_override_text(v.list[k]);  // (not "," + string: GCC 12's -Wrestrict false alarm)
      }
      return out + "]";
    }
    case Value::Kind::Map: {
      std::string out = "{";
      for (size_t k = 0; k < v.map.size(); ++k)
        out += (k ? "," : "") + v.map[k].first + ":" + to_override_text(v.map[k].second);
      return out + "}";
    }
  }
  return "";
}

}  // namespace laoyao::config
