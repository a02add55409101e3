#include "core/jinja.hpp"

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/text.hpp"

namespace laoyao::jinja {

using Kind = Value::Kind;

const Value* Value::find(std::string_view key) const {
  if (kind != Kind::Dict) return nullptr;
  for (const auto& [k, v] : *dict)
    if (k == key) return &v;
  return nullptr;
}

void Value::set(const std::string& key, Value v) {
  for (auto& [k, x] : *dict)
    if (k == key) return void(x = std::move(v));
  dict->emplace_back(key, std::move(v));
}

namespace {

[[noreturn]] void fail(const std::string& what) { throw TemplateError("chat template: " + what); }

// Bounds that keep a hostile template (tokenizer files are untrusted input) from exhausting the
// stack, the memory or the time: nesting of the syntax and of values, the length of any string
// or list it builds, and the steps one render may take.
constexpr int kMaxNesting = 200;
constexpr size_t kMaxLength = size_t{64} << 20;
constexpr int64_t kMaxSteps = 2'000'000;
constexpr double kMaxSeconds = 10.0;  // a render's wall time, checked at every step

void check_length(size_t n) {
  if (n > kMaxLength) fail("a value longer than " + std::to_string(kMaxLength) + " elements");
}

int nesting(const Value& v) {
  int d = 0;
  if (v.kind == Value::Kind::List)
    for (const auto& e : *v.list) d = std::max(d, nesting(e) + 1);
  else if (v.kind == Value::Kind::Dict)
    for (const auto& [k, e] : *v.dict) d = std::max(d, nesting(e) + 1);
  return d;
}

// 64-bit integer arithmetic that refuses to overflow (Python's integers are unbounded).
int64_t int_op(char op, int64_t a, int64_t b) {
  int64_t r = 0;
  const bool overflow = op == '+' ? __builtin_add_overflow(a, b, &r)
                        : op == '-' ? __builtin_sub_overflow(a, b, &r)
                                    : __builtin_mul_overflow(a, b, &r);
  if (overflow) fail("integer overflow (Python's integers are unbounded; laoyao's are 64-bit)");
  return r;
}

// ---- text helpers: Python strings are code points, our strings UTF-8 --------------------------

std::u32string decode(std::string_view s) {
  std::u32string out;
  for (size_t k = 0; k < s.size();) {
    const auto c = static_cast<unsigned char>(s[k]);
    const int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    char32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (int j = 1; j < n && k + static_cast<size_t>(j) < s.size(); ++j)
      cp = (cp << 6) | (static_cast<unsigned char>(s[k + static_cast<size_t>(j)]) & 0x3F);
    out.push_back(cp);
    k += static_cast<size_t>(n);
  }
  return out;
}

std::string encode(std::u32string_view s) {
  std::string out;
  for (char32_t c : s) append_utf8(out, c);
  return out;
}

// Python's str.isspace() for the characters chat data holds (ASCII and the common Unicode spaces).
bool py_space(char32_t c) {
  return c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

// str.strip / lstrip / rstrip: whitespace, or the given characters.
std::string py_strip(const std::string& s, const Value* chars, bool left, bool right) {
  const std::u32string u = decode(s);
  std::u32string set;
  const bool ws = !chars || chars->kind == Kind::None || !chars->defined();
  if (!ws) {
    if (chars->kind != Kind::String) fail("strip() takes a string of characters");
    set = decode(chars->s);
  }
  auto strip_it = [&](char32_t c) { return ws ? py_space(c) : set.find(c) != std::u32string::npos; };
  size_t a = 0, b = u.size();
  if (left)
    while (a < b && strip_it(u[a])) ++a;
  if (right)
    while (b > a && strip_it(u[b - 1])) --b;
  return encode(u.substr(a, b - a));
}

// Python's repr() of a float: the shortest digits that read back, fixed between 1e-4 and 1e16.
std::string py_float(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[64];
  int digits = 1;
  for (; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*e", digits - 1, x);
    if (std::strtod(buf, nullptr) == x) break;
  }
  // buf: [-]d.ddde[+-]XX
  std::string m(buf);
  const size_t e = m.find('e');
  const int exp = std::atoi(m.c_str() + e + 1);
  std::string mant = m.substr(0, e);
  const bool neg = mant[0] == '-';
  if (neg) mant.erase(0, 1);
  mant.erase(std::remove(mant.begin(), mant.end(), '.'), mant.end());
  while (mant.size() > 1 && mant.back() == '0') mant.pop_back();
  std::string out;
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + mant;
    } else if (static_cast<int>(mant.size()) <= exp + 1) {
      out = mant + std::string(static_cast<size_t>(exp + 1) - mant.size(), '0') + ".0";
    } else {
      out = mant.substr(0, static_cast<size_t>(exp + 1)) + "." + mant.substr(static_cast<size_t>(exp + 1));
    }
  }
  if (out.empty()) {
    out = mant.substr(0, 1);
    if (mant.size() > 1) out += "." + mant.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += eb;
  }
  return neg ? "-" + out : out;
}

std::string py_repr_string(const std::string& s) {
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  for (char32_t c : decode(s)) {
    if (c == static_cast<char32_t>(q) || c == '\\') out += '\\', out += static_cast<char>(c);
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7F) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", static_cast<unsigned>(c));
      out += b;
    } else {
      out += encode(std::u32string(1, c));
    }
  }
  return out + q;
}

std::string py_repr(const Value& v);

std::string py_str(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined: return "";
    case Kind::None: return "None";
    case Kind::Bool: return v.b ? "True" : "False";
    case Kind::Int: return std::to_string(v.i);
    case Kind::Float: return py_float(v.f);
    case Kind::String: return v.s;
    default: return py_repr(v);
  }
}

std::string py_repr(const Value& v) {
  switch (v.kind) {
    case Kind::String: return py_repr_string(v.s);
    case Kind::List: {
      std::string out = v.is_tuple ? "(" : "[";
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += ", ";
        out += py_repr((*v.list)[k]);
      }
      if (v.is_tuple && v.list->size() == 1) out += ",";
      return out + (v.is_tuple ? ")" : "]");
    }
    case Kind::Dict: {
      std::string out = v.is_namespace ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [k, x] : *v.dict) {
        if (!first) out += ", ";
        first = false;
        out += py_repr_string(k);
        out += ": ";
        out += py_repr(x);
      }
      return out + (v.is_namespace ? "}>" : "}");
    }
    default: return py_str(v);
  }
}

void json_string(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char b[8];
          std::snprintf(b, sizeof b, "\\u%04x", c);
          out += b;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

void json_dump(std::string& out, const Value& v, int indent, int depth) {
  auto newline = [&](int d) {
    out += '\n';
    out.append(static_cast<size_t>(indent * d), ' ');
  };
  switch (v.kind) {
    case Kind::Undefined: fail("tojson of an undefined value");
    case Kind::None: out += "null"; return;
    case Kind::Bool: out += v.b ? "true" : "false"; return;
    case Kind::Int: out += std::to_string(v.i); return;
    case Kind::Float:
      out += std::isnan(v.f) ? "NaN" : std::isinf(v.f) ? (v.f > 0 ? "Infinity" : "-Infinity") : py_float(v.f);
      return;
    case Kind::String: json_string(out, v.s); return;
    case Kind::List: {
      if (v.list->empty()) return void(out += "[]");
      out += '[';
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += indent >= 0 ? "," : ", ";
        if (indent >= 0) newline(depth + 1);
        json_dump(out, (*v.list)[k], indent, depth + 1);
      }
      if (indent >= 0) newline(depth);
      out += ']';
      return;
    }
    case Kind::Dict: {
      if (v.dict->empty()) return void(out += "{}");
      out += '{';
      bool first = true;
      for (const auto& [k, x] : *v.dict) {
        if (!first) out += indent >= 0 ? "," : ", ";
        first = false;
        if (indent >= 0) newline(depth + 1);
        json_string(out, k);
        out += ": ";
        json_dump(out, x, indent, depth + 1);
      }
      if (indent >= 0) newline(depth);
      out += '}';
      return;
    }
  }
}

Value from_json(const nlohmann::ordered_json& j) {
  if (j.is_null()) return Value::none();
  if (j.is_boolean()) return Value::boolean(j.get<bool>());
  if (j.is_number_integer()) return Value::integer(j.get<int64_t>());
  if (j.is_number()) return Value::real(j.get<double>());
  if (j.is_string()) return Value::string(j.get<std::string>());
  if (j.is_array()) {
    List l;
    for (const auto& e : j) l.push_back(from_json(e));
    return Value::make_list(std::move(l));
  }
  Dict d;
  for (const auto& [k, e] : j.items()) d.emplace_back(k, from_json(e));
  return Value::make_dict(std::move(d));
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined:
    case Kind::None: return false;
    case Kind::Bool: return v.b;
    case Kind::Int: return v.i != 0;
    case Kind::Float: return v.f != 0;
    case Kind::String: return !v.s.empty();
    case Kind::List: return !v.list->empty();
    case Kind::Dict: return v.is_namespace || !v.dict->empty();
  }
  return false;
}

const char* type_name(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined: return "undefined";
    case Kind::None: return "None";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return "str";
    case Kind::List: return "list";
    case Kind::Dict: return v.is_namespace ? "namespace" : "dict";
  }
  return "?";
}

bool is_number(const Value& v) { return v.kind == Kind::Int || v.kind == Kind::Float || v.kind == Kind::Bool; }
double num(const Value& v) { return v.kind == Kind::Float ? v.f : v.kind == Kind::Int ? static_cast<double>(v.i) : v.b; }
int64_t as_int(const Value& v) { return v.kind == Kind::Bool ? v.b : v.i; }
bool int_like(const Value& v) { return v.kind == Kind::Int || v.kind == Kind::Bool; }

bool equal(const Value& a, const Value& b) {
  if (is_number(a) && is_number(b)) return num(a) == num(b);
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::Undefined:
    case Kind::None: return true;
    case Kind::String: return a.s == b.s;
    case Kind::List:
      if (a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k)
        if (!equal((*a.list)[k], (*b.list)[k])) return false;
      return true;
    case Kind::Dict:
      if (a.dict->size() != b.dict->size()) return false;
      for (const auto& [k, x] : *a.dict) {
        const Value* y = b.find(k);
        if (!y || !equal(x, *y)) return false;
      }
      return true;
    default: return false;
  }
}

// a < b as Python orders numbers, strings and lists.
bool less(const Value& a, const Value& b) {
  if (is_number(a) && is_number(b)) return num(a) < num(b);
  if (a.kind == Kind::String && b.kind == Kind::String) return decode(a.s) < decode(b.s);
  if (a.kind == Kind::List && b.kind == Kind::List) {
    const size_t n = std::min(a.list->size(), b.list->size());
    for (size_t k = 0; k < n; ++k) {
      if (less((*a.list)[k], (*b.list)[k])) return true;
      if (less((*b.list)[k], (*a.list)[k])) return false;
    }
    return a.list->size() < b.list->size();
  }
  fail(std::string("cannot compare ") + type_name(a) + " with " + type_name(b));
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind) {
    case Kind::String:
      if (item.kind != Kind::String) fail("'in <string>' needs a string on the left");
      return container.s.find(item.s) != std::string::npos;
    case Kind::List:
      return std::any_of(container.list->begin(), container.list->end(), [&](const Value& x) { return equal(x, item); });
    case Kind::Dict: return item.kind == Kind::String && container.find(item.s) != nullptr;
    default: fail(std::string("'in' on ") + type_name(container));
  }
}

// Iteration as Python's: a list's items, a dict's keys, a string's characters; undefined: nothing.
List iterate(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined: return {};
    case Kind::List: return *v.list;
    case Kind::Dict: {
      List out;
      for (const auto& [k, x] : *v.dict) out.push_back(Value::string(k));
      return out;
    }
    case Kind::String: {
      List out;
      for (char32_t c : decode(v.s)) out.push_back(Value::string(encode(std::u32string(1, c))));
      return out;
    }
    default: fail(std::string(type_name(v)) + " is not iterable");
  }
}

int64_t length(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined: return 0;
    case Kind::String: return static_cast<int64_t>(decode(v.s).size());
    case Kind::List: return static_cast<int64_t>(v.list->size());
    case Kind::Dict: return static_cast<int64_t>(v.dict->size());
    default: fail(std::string("length of ") + type_name(v));
  }
}

// ---- lexing ----------------------------------------------------------------------------------

struct Token {
  enum class T { Name, String, Int, Float, Op, End } t = T::End;
  std::string s;
  int64_t i = 0;
  double f = 0;
};

// A piece of the template: text, {{ expression }} or {% statement %}.
struct Piece {
  enum class P { Text, Output, Statement } p = P::Text;
  std::string text;
  std::vector<Token> tokens;
  int line = 1;
};

bool name_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// Tokens from `at` until the closing delimiter `close` ("}}" or "%}"), honouring strings. Returns
// the position after the delimiter and whether it was preceded by '-' (strip what follows).
size_t lex_tag(std::string_view src, size_t at, std::string_view close, std::vector<Token>& out, bool& strip_after,
               int line) {
  auto where = [&] { return " (line " + std::to_string(line) + ")"; };
  while (true) {
    while (at < src.size() && std::isspace(static_cast<unsigned char>(src[at]))) ++at;
    if (at >= src.size()) fail("a tag is not closed" + where());
    if (src[at] == '-' && src.substr(at + 1, close.size()) == close) {
      strip_after = true;
      return at + 1 + close.size();
    }
    if (src.substr(at, close.size()) == close) {
      strip_after = false;
      return at + close.size();
    }
    const char c = src[at];
    Token t;
    if (c == '"' || c == '\'') {
      std::string s;
      size_t k = at + 1;
      for (; k < src.size() && src[k] != c; ++k) {
        if (src[k] == '\\' && k + 1 < src.size()) {
          const char e = src[++k];
          switch (e) {
            case 'n': s += '\n'; break;
            case 't': s += '\t'; break;
            case 'r': s += '\r'; break;
            case '\\': s += '\\'; break;
            case '\'': s += '\''; break;
            case '"': s += '"'; break;
            case 'u': {
              if (k + 4 >= src.size()) fail("a bad \\u escape" + where());
              const std::string hex(src.substr(k + 1, 4));
              if (hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos) fail("a bad \\u escape" + where());
              const char32_t cp = static_cast<char32_t>(std::stoul(hex, nullptr, 16));
              s += encode(std::u32string(1, cp));
              k += 4;
              break;
            }
            default: s += '\\', s += e;
          }
        } else {
          s += src[k];
        }
      }
      if (k >= src.size()) fail("a string is not closed" + where());
      t.t = Token::T::String, t.s = std::move(s);
      at = k + 1;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t k = at;
      while (k < src.size() && (std::isdigit(static_cast<unsigned char>(src[k])) || src[k] == '_')) ++k;
      bool is_float = false;
      if (k + 1 < src.size() && src[k] == '.' && std::isdigit(static_cast<unsigned char>(src[k + 1]))) {
        is_float = true;
        ++k;
        while (k < src.size() && std::isdigit(static_cast<unsigned char>(src[k]))) ++k;
      }
      if (k < src.size() && (src[k] == 'e' || src[k] == 'E')) {
        size_t e = k + 1;
        if (e < src.size() && (src[e] == '+' || src[e] == '-')) ++e;
        if (e < src.size() && std::isdigit(static_cast<unsigned char>(src[e]))) {
          is_float = true;
          k = e;
          while (k < src.size() && std::isdigit(static_cast<unsigned char>(src[k]))) ++k;
        }
      }
      std::string digits(src.substr(at, k - at));
      digits.erase(std::remove(digits.begin(), digits.end(), '_'), digits.end());
      if (is_float) t.t = Token::T::Float, t.f = std::strtod(digits.c_str(), nullptr);
      else {
        errno = 0;
        t.t = Token::T::Int, t.i = std::strtoll(digits.c_str(), nullptr, 10);
        if (errno == ERANGE) fail("an integer literal out of range" + where());
      }
      at = k;
    } else if (name_start(c)) {
      size_t k = at;
      while (k < src.size() && name_char(src[k])) ++k;
      t.t = Token::T::Name, t.s = std::string(src.substr(at, k - at));
      at = k;
    } else {
      static const char* two[] = {"==", "!=", "<=", ">=", "//", "**"};
      t.t = Token::T::Op;
      for (const char* op : two)
        if (src.substr(at, 2) == op) t.s = op;
      if (t.s.empty()) {
        if (std::string_view("+-*/%~|.,:()[]{}<>=").find(c) == std::string_view::npos)
          fail(std::string("unexpected character '") + c + "'" + where());
        t.s = std::string(1, c);
      }
      at += t.s.size();
    }
    out.push_back(std::move(t));
  }
}

int line_of(std::string_view src, size_t at) {
  return 1 + static_cast<int>(std::count(src.begin(), src.begin() + static_cast<std::ptrdiff_t>(at), '\n'));
}

// The template as pieces, with Jinja's whitespace control applied as transformers configures it
// (jinja2's lexer, trim_blocks and lstrip_blocks on): newlines normalised to "\n" and one trailing
// newline dropped (keep_trailing_newline off); '-' inside a tag strips every space on that side;
// a newline right after a block or comment tag is dropped; spaces and tabs between the start of a
// line and a block or comment tag are dropped ('+' keeps them).
std::vector<Piece> lex(std::string_view source) {
  std::string src;
  for (size_t k = 0; k < source.size(); ++k) {
    if (source[k] == '\r') {
      src += '\n';
      if (k + 1 < source.size() && source[k + 1] == '\n') ++k;
    } else {
      src += source[k];
    }
  }
  if (!src.empty() && src.back() == '\n') src.pop_back();
  const std::string_view sv(src);
  std::vector<Piece> out;
  std::string text;
  bool line_starting = true;  // what the lexer consumed last ended a line
  size_t at = 0;
  auto flush_text = [&] {
    if (!text.empty()) out.push_back({Piece::P::Text, std::move(text), {}, 0});
    text.clear();
  };
  auto is_ws = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f'; };
  // After a tag's closing delimiter: '-' eats the whitespace that follows; a block or comment tag
  // eats one newline.
  auto after_close = [&](size_t pos, bool minus, bool block) {
    if (minus) {
      while (pos < sv.size() && is_ws(sv[pos])) ++pos;
      line_starting = pos > 0 && sv[pos - 1] == '\n';
    } else if (block && pos < sv.size() && sv[pos] == '\n') {
      ++pos;
      line_starting = true;
    } else {
      line_starting = false;
    }
    return pos;
  };
  while (at < sv.size()) {
    size_t open = at;
    while ((open = sv.find('{', open)) != std::string_view::npos &&
           (open + 1 >= sv.size() || std::string_view("{%#").find(sv[open + 1]) == std::string_view::npos))
      ++open;
    std::string chunk(sv.substr(at, open == std::string_view::npos ? std::string_view::npos : open - at));
    if (open == std::string_view::npos) {
      text += chunk;
      break;
    }
    const char kind = sv[open + 1];
    const char sign = open + 2 < sv.size() ? sv[open + 2] : '\0';
    if (sign == '-') {
      size_t k = chunk.size();
      while (k > 0 && is_ws(chunk[k - 1])) --k;
      chunk.erase(k);
    } else if (sign != '+' && kind != '{') {
      const size_t nl = chunk.rfind('\n');
      const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
      if ((l_pos > 0 || line_starting) && l_pos < chunk.size() &&
          std::all_of(chunk.begin() + static_cast<std::ptrdiff_t>(l_pos), chunk.end(), is_ws))
        chunk.erase(l_pos);
    }
    text += chunk;
    const size_t body = open + 2 + ((sign == '-' || sign == '+') ? 1 : 0);
    const int line = line_of(sv, open);
    if (kind == '#') {
      const size_t end = sv.find("#}", body);
      if (end == std::string_view::npos) fail("a comment is not closed (line " + std::to_string(line) + ")");
      at = after_close(end + 2, end > body && sv[end - 1] == '-', true);
      continue;
    }
    Piece p;
    p.line = line;
    bool minus_after = false;
    at = lex_tag(sv, body, kind == '{' ? "}}" : "%}", p.tokens, minus_after, line);
    if (kind == '%' && p.tokens.size() == 1 && p.tokens[0].t == Token::T::Name && p.tokens[0].s == "raw") {
      // Everything up to {% endraw %} is text, as written.
      size_t end = at, close = 0;
      std::vector<Token> endraw;
      bool minus_end = false;
      while (true) {
        end = sv.find("{%", end);
        if (end == std::string_view::npos) fail("{% raw %} without {% endraw %} (line " + std::to_string(line) + ")");
        const size_t b = end + 2 + ((end + 2 < sv.size() && (sv[end + 2] == '-' || sv[end + 2] == '+')) ? 1 : 0);
        endraw.clear();
        close = lex_tag(sv, b, "%}", endraw, minus_end, line);
        if (endraw.size() == 1 && endraw[0].t == Token::T::Name && endraw[0].s == "endraw") break;
        end += 2;
      }
      std::string raw(sv.substr(at, end - at));
      if (minus_after) raw.erase(0, std::min(raw.size(), raw.find_first_not_of(" \t\n\v\f")));
      if (sv[end + 2] == '-')
        while (!raw.empty() && is_ws(raw.back())) raw.pop_back();
      text += raw;
      at = after_close(close, minus_end, true);
      continue;
    }
    p.p = kind == '{' ? Piece::P::Output : Piece::P::Statement;
    flush_text();
    out.push_back(std::move(p));
    at = after_close(at, minus_after, kind == '%');
  }
  flush_text();
  return out;
}

// ---- syntax tree ------------------------------------------------------------------------------

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class E {
    Const, Name, List, Dict, Attr, Item, Slice, Call, Filter, Test, Unary, Binary, Not, And, Or, Cond, Concat
  } e = E::Const;
  Value constant;
  std::string name;  // Name, Attr, Filter, Test, Unary/Binary operator
  std::vector<ExprPtr> args;  // operands, elements, call arguments (args[0] the callee or object)
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  bool negated = false;  // `is not`
  int line = 0;
};

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

struct Stmt {
  enum class S { Text, Output, If, For, Set, SetBlock, Break, Continue, Block } s = S::Text;
  std::string text;
  ExprPtr expr;                                  // Output, Set's value, For's iterable
  std::vector<std::pair<ExprPtr, Body>> branches;  // If: (condition, body) ...
  Body body, else_body;                          // For, SetBlock, Block (generation), If's else
  std::vector<std::string> targets;              // For / Set names (Set: "ns.attr" as {"ns", "attr"})
  bool attribute_target = false;
  ExprPtr filter;                                // For's `if`
  int line = 0;
};

// ---- parsing ----------------------------------------------------------------------------------

class ExprParser {
 public:
  ExprParser(const std::vector<Token>& t, size_t start, int line) : t_(t), k_(start), line_(line) {}

  ExprPtr expression() { return conditional(); }
  ExprPtr without_condition() { return or_expr(); }  // a for loop's iterable: `if` is its filter
  bool at_end() const { return k_ >= t_.size(); }
  size_t position() const { return k_; }
  const Token& peek() const { static const Token end; return k_ < t_.size() ? t_[k_] : end; }
  bool peek_op(std::string_view op) const { return peek().t == Token::T::Op && peek().s == op; }
  bool peek_name(std::string_view n) const { return peek().t == Token::T::Name && peek().s == n; }
  void expect_op(std::string_view op) {
    if (!peek_op(op)) error(std::string("expected '") + std::string(op) + "'");
    ++k_;
  }
  std::string expect_name() {
    if (peek().t != Token::T::Name) error("expected a name");
    return t_[k_++].s;
  }
  void expect_end() {
    if (!at_end()) error("unexpected '" + describe(peek()) + "'");
  }
  [[noreturn]] void error(const std::string& what) const { fail(what + " (line " + std::to_string(line_) + ")"); }

  // A target list: a, b (for loops and set).
  std::vector<std::string> targets() {
    std::vector<std::string> out = {expect_name()};
    while (peek_op(",")) ++k_, out.push_back(expect_name());
    return out;
  }

  ExprPtr conditional() {
    struct Depth {
      int& d;
      explicit Depth(int& x, const ExprParser& p) : d(x) {
        if (++d > kMaxNesting) p.error("expressions nested too deeply");
      }
      ~Depth() { --d; }
    } depth(depth_, *this);
    ExprPtr body = or_expr();
    while (peek_name("if")) {
      ++k_;
      ExprPtr cond = or_expr();
      ExprPtr other;
      if (peek_name("else")) ++k_, other = conditional();
      auto n = node(Expr::E::Cond);
      n->args.push_back(std::move(cond));
      n->args.push_back(std::move(body));
      if (other) n->args.push_back(std::move(other));
      body = std::move(n);
    }
    return body;
  }

 private:
  static std::string describe(const Token& t) {
    switch (t.t) {
      case Token::T::String: return "'" + t.s + "'";
      case Token::T::Int: return std::to_string(t.i);
      case Token::T::Float: return py_float(t.f);
      default: return t.s;
    }
  }
  ExprPtr node(Expr::E e) {
    auto n = std::make_unique<Expr>();
    n->e = e;
    n->line = line_;
    return n;
  }
  ExprPtr binary(Expr::E e, std::string op, ExprPtr a, ExprPtr b) {
    auto n = node(e);
    n->name = std::move(op);
    n->args.push_back(std::move(a));
    n->args.push_back(std::move(b));
    return n;
  }
  ExprPtr or_expr() {
    ExprPtr a = and_expr();
    while (peek_name("or")) ++k_, a = binary(Expr::E::Or, "or", std::move(a), and_expr());
    return a;
  }
  ExprPtr and_expr() {
    ExprPtr a = not_expr();
    while (peek_name("and")) ++k_, a = binary(Expr::E::And, "and", std::move(a), not_expr());
    return a;
  }
  ExprPtr not_expr() {
    if (peek_name("not")) {
      ++k_;
      auto n = node(Expr::E::Not);
      n->args.push_back(not_expr());
      return n;
    }
    return compare();
  }
  ExprPtr compare() {
    ExprPtr a = math1();
    while (true) {
      static const char* ops[] = {"==", "!=", "<", ">", "<=", ">="};
      std::string op;
      for (const char* o : ops)
        if (peek_op(o)) op = o;
      if (!op.empty()) {
        ++k_;
        a = binary(Expr::E::Binary, op, std::move(a), math1());
      } else if (peek_name("in")) {
        ++k_;
        a = binary(Expr::E::Binary, "in", std::move(a), math1());
      } else if (peek_name("not") && k_ + 1 < t_.size() && t_[k_ + 1].t == Token::T::Name && t_[k_ + 1].s == "in") {
        k_ += 2;
        a = binary(Expr::E::Binary, "not in", std::move(a), math1());
      } else {
        return a;
      }
    }
  }
  ExprPtr math1() {
    ExprPtr a = concat();
    while (peek_op("+") || peek_op("-")) {
      const std::string op = t_[k_++].s;
      a = binary(Expr::E::Binary, op, std::move(a), concat());
    }
    return a;
  }
  ExprPtr concat() {
    ExprPtr a = math2();
    if (!peek_op("~")) return a;
    auto n = node(Expr::E::Concat);
    n->args.push_back(std::move(a));
    while (peek_op("~")) ++k_, n->args.push_back(math2());
    return n;
  }
  ExprPtr math2() {
    ExprPtr a = power();
    while (peek_op("*") || peek_op("/") || peek_op("//") || peek_op("%")) {
      const std::string op = t_[k_++].s;
      a = binary(Expr::E::Binary, op, std::move(a), power());
    }
    return a;
  }
  ExprPtr power() {
    ExprPtr a = unary(true);
    while (peek_op("**")) ++k_, a = binary(Expr::E::Binary, "**", std::move(a), unary(true));
    return a;
  }
  ExprPtr unary(bool with_filter) {
    if (++unary_depth_ > kMaxNesting) error("expressions nested too deeply");
    struct Leave {
      int& d;
      ~Leave() { --d; }
    } leave{unary_depth_};
    ExprPtr n;
    if (peek_op("-") || peek_op("+")) {
      auto u = node(Expr::E::Unary);
      u->name = t_[k_++].s;
      u->args.push_back(unary(false));
      n = std::move(u);
    } else {
      n = postfix(primary());
    }
    if (with_filter) n = filters(std::move(n));
    return n;
  }
  ExprPtr primary() {
    const Token& t = peek();
    if (at_end()) error("an expression ends early");
    if (t.t == Token::T::String) {
      auto n = node(Expr::E::Const);
      std::string s;
      while (peek().t == Token::T::String && !at_end()) s += t_[k_++].s;  // adjacent strings join
      n->constant = Value::string(std::move(s));
      return n;
    }
    if (t.t == Token::T::Int || t.t == Token::T::Float) {
      auto n = node(Expr::E::Const);
      n->constant = t.t == Token::T::Int ? Value::integer(t.i) : Value::real(t.f);
      ++k_;
      return n;
    }
    if (t.t == Token::T::Name) {
      ++k_;
      auto n = node(Expr::E::Const);
      if (t.s == "true" || t.s == "True") n->constant = Value::boolean(true);
      else if (t.s == "false" || t.s == "False") n->constant = Value::boolean(false);
      else if (t.s == "none" || t.s == "None") n->constant = Value::none();
      else n->e = Expr::E::Name, n->name = t.s;
      return n;
    }
    if (peek_op("(")) {
      ++k_;
      if (peek_op(")")) {
        ++k_;
        auto n = node(Expr::E::List);  // the empty tuple
        n->name = "tuple";
        return n;
      }
      ExprPtr first = expression();
      if (!peek_op(",")) {
        expect_op(")");
        return first;
      }
      auto n = node(Expr::E::List);  // a tuple
      n->name = "tuple";
      n->args.push_back(std::move(first));
      while (peek_op(",")) {
        ++k_;
        if (peek_op(")")) break;
        n->args.push_back(expression());
      }
      expect_op(")");
      return n;
    }
    if (peek_op("[")) {
      ++k_;
      auto n = node(Expr::E::List);
      while (!peek_op("]")) {
        n->args.push_back(expression());
        if (!peek_op(",")) break;
        ++k_;
      }
      expect_op("]");
      return n;
    }
    if (peek_op("{")) {
      ++k_;
      auto n = node(Expr::E::Dict);
      while (!peek_op("}")) {
        n->args.push_back(expression());
        expect_op(":");
        n->args.push_back(expression());
        if (!peek_op(",")) break;
        ++k_;
      }
      expect_op("}");
      return n;
    }
    error("unexpected '" + describe(t) + "'");
  }
  void call_arguments(Expr& n) {
    expect_op("(");
    while (!peek_op(")")) {
      if (peek().t == Token::T::Name && k_ + 1 < t_.size() && t_[k_ + 1].t == Token::T::Op && t_[k_ + 1].s == "=") {
        std::string key = t_[k_].s;
        k_ += 2;
        n.kwargs.emplace_back(std::move(key), expression());
      } else {
        n.args.push_back(expression());
      }
      if (!peek_op(",")) break;
      ++k_;
    }
    expect_op(")");
  }
  ExprPtr postfix(ExprPtr n) {
    while (true) {
      if (peek_op(".")) {
        ++k_;
        auto a = node(Expr::E::Attr);
        if (peek().t == Token::T::Int) a->name = std::to_string(t_[k_++].i);
        else a->name = expect_name();
        a->args.push_back(std::move(n));
        n = std::move(a);
      } else if (peek_op("[")) {
        ++k_;
        ExprPtr parts[3];
        bool slice = false;
        for (int p = 0; p < 3; ++p) {
          if (!peek_op(":") && !peek_op("]")) parts[p] = expression();
          if (p < 2 && peek_op(":")) {
            slice = true;
            ++k_;
          } else {
            break;
          }
        }
        expect_op("]");
        auto s = node(slice ? Expr::E::Slice : Expr::E::Item);
        s->args.push_back(std::move(n));
        for (auto& p : parts) s->args.push_back(std::move(p));
        if (!slice) s->args.resize(2);
        if (!slice && !s->args[1]) error("an empty subscript");
        n = std::move(s);
      } else if (peek_op("(")) {
        auto c = node(Expr::E::Call);
        c->args.push_back(std::move(n));
        call_arguments(*c);
        n = std::move(c);
      } else {
        return n;
      }
    }
  }
  ExprPtr filters(ExprPtr n) {
    while (true) {
      if (peek_op("|")) {
        ++k_;
        auto f = node(Expr::E::Filter);
        f->name = expect_name();
        while (peek_op(".")) {
          ++k_;
          f->name += '.';
          f->name += expect_name();
        }
        f->args.push_back(std::move(n));
        if (peek_op("(")) call_arguments(*f);
        n = std::move(f);
      } else if (peek_name("is")) {
        ++k_;
        auto t = node(Expr::E::Test);
        if (peek_name("not")) ++k_, t->negated = true;
        t->name = expect_name();
        t->args.push_back(std::move(n));
        if (peek_op("(")) {
          call_arguments(*t);
        } else if (!at_end() && (peek().t == Token::T::String || peek().t == Token::T::Int ||
                                 peek().t == Token::T::Float ||
                                 (peek().t == Token::T::Name && peek().s != "else" && peek().s != "or" &&
                                  peek().s != "and" && peek().s != "if" && peek().s != "is" && peek().s != "in" &&
                                  peek().s != "not"))) {
          t->args.push_back(postfix(primary()));  // `is divisibleby 3`, `is sameas false`
        }
        n = std::move(t);
      } else if (peek_op("(")) {
        auto c = node(Expr::E::Call);
        c->args.push_back(std::move(n));
        call_arguments(*c);
        n = std::move(c);
      } else {
        return n;
      }
    }
  }

  const std::vector<Token>& t_;
  size_t k_;
  int line_;
  int depth_ = 0, unary_depth_ = 0;
};

class Parser {
 public:
  explicit Parser(std::vector<Piece> pieces) : p_(std::move(pieces)) {}

  Body parse_all() {
    std::string stop;
    Body b = body({}, stop);
    return b;
  }

 private:

  // Statements until one of `ends` (its word in `stop`, its piece consumed).
  Body body(const std::vector<std::string>& ends, std::string& stop) {
    Body out;
    while (k_ < p_.size()) {
      const Piece& p = p_[k_];
      if (p.p == Piece::P::Text) {
        auto s = std::make_unique<Stmt>();
        s->s = Stmt::S::Text, s->text = p.text;
        out.push_back(std::move(s));
        ++k_;
        continue;
      }
      if (p.p == Piece::P::Output) {
        ExprParser e(p.tokens, 0, p.line);
        auto s = std::make_unique<Stmt>();
        s->s = Stmt::S::Output, s->expr = e.expression(), s->line = p.line;
        e.expect_end();
        out.push_back(std::move(s));
        ++k_;
        continue;
      }
      if (p.tokens.empty() || p.tokens[0].t != Token::T::Name)
        fail("a statement without a keyword (line " + std::to_string(p.line) + ")");
      const std::string& word = p.tokens[0].s;
      for (const auto& e : ends)
        if (word == e) {
          stop = word;
          return out;
        }
      out.push_back(statement());
    }
    if (!ends.empty()) fail("the template ends inside a block: expected {% " + ends.back() + " %}");
    return out;
  }

  std::unique_ptr<Stmt> statement() {
    const Piece& p = p_[k_];
    if (++depth_ > kMaxNesting) fail("blocks nested too deeply (line " + std::to_string(p.line) + ")");
    struct Leave {
      int& d;
      ~Leave() { --d; }
    } leave{depth_};
    const std::string word = p.tokens[0].s;
    ExprParser e(p.tokens, 1, p.line);
    auto s = std::make_unique<Stmt>();
    s->line = p.line;
    ++k_;
    std::string stop;
    if (word == "if") {
      ExprPtr cond = e.expression();
      e.expect_end();
      while (true) {
        Body b = body({"elif", "else", "endif"}, stop);
        s->branches.emplace_back(std::move(cond), std::move(b));
        const Piece& q = p_[k_++];
        if (stop == "endif") break;
        if (stop == "else") {
          s->else_body = body({"endif"}, stop);
          ++k_;
          break;
        }
        ExprParser c(q.tokens, 1, q.line);
        cond = c.expression();
        c.expect_end();
      }
      s->s = Stmt::S::If;
      return s;
    }
    if (word == "for") {
      s->s = Stmt::S::For;
      s->targets = e.targets();
      if (!e.peek_name("in")) e.error("expected 'in' in a for loop");
      ExprParser rest(p.tokens, e.position() + 1, p.line);
      s->expr = rest.without_condition();  // a trailing `if` is the loop's filter
      if (rest.peek_name("if")) {
        ExprParser f(p.tokens, rest.position() + 1, p.line);
        s->filter = f.expression();
        f.expect_end();
      } else if (rest.peek_name("recursive")) {
        rest.error("recursive loops are not supported");
      } else {
        rest.expect_end();
      }
      s->body = body({"else", "endfor"}, stop);
      ++k_;
      if (stop == "else") {
        s->else_body = body({"endfor"}, stop);
        ++k_;
      }
      return s;
    }
    if (word == "set") {
      s->targets = {e.expect_name()};
      if (e.peek_op(".")) {
        e.expect_op(".");
        s->targets.push_back(e.expect_name());
        s->attribute_target = true;
      } else {
        while (e.peek_op(",")) e.expect_op(","), s->targets.push_back(e.expect_name());
      }
      if (e.at_end()) {
        if (s->targets.size() != 1 || s->attribute_target) e.error("a block set names one variable");
        s->s = Stmt::S::SetBlock;
        s->body = body({"endset"}, stop);
        ++k_;
        return s;
      }
      if (e.peek_op("|")) e.error("filtered block set is not supported");
      e.expect_op("=");
      s->s = Stmt::S::Set;
      s->expr = e.expression();
      if (e.peek_op(",")) {  // a, b = x, y
        auto tuple = std::make_unique<Expr>();
        tuple->e = Expr::E::List;
        tuple->name = "tuple";
        tuple->args.push_back(std::move(s->expr));
        while (e.peek_op(",")) e.expect_op(","), tuple->args.push_back(e.expression());
        s->expr = std::move(tuple);
      }
      e.expect_end();
      return s;
    }
    if (word == "break" || word == "continue") {
      e.expect_end();
      s->s = word == "break" ? Stmt::S::Break : Stmt::S::Continue;
      return s;
    }
    if (word == "generation") {
      // transformers' AssistantTracker: the body renders as is (its span marks assistant tokens).
      e.expect_end();
      s->s = Stmt::S::Block;
      s->body = body({"endgeneration"}, stop);
      ++k_;
      return s;
    }
    if (word == "macro" || word == "call" || word == "include" || word == "import" || word == "from" ||
        word == "extends" || word == "block" || word == "filter" || word == "with" || word == "do" ||
        word == "autoescape")
      fail("{% " + word + " %} (line " + std::to_string(p.line) + ") is not supported by laoyao's chat-template renderer");
    fail("unknown statement {% " + word + " %} (line " + std::to_string(p.line) + ")");
  }



  std::vector<Piece> p_;
  size_t k_ = 0;
  int depth_ = 0;
};

// ---- evaluation -------------------------------------------------------------------------------

enum class Flow { Normal, Break, Continue };

class Renderer {
 public:
  explicit Renderer(const Dict& globals) { scopes_.push_back({}), scopes_.back() = globals; }

  Flow run(const Body& body, std::string& out) {
    for (const auto& s : body) {
      const Flow f = exec(*s, out);
      if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

 private:
  using Scope = Dict;

  Value lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it)
      for (const auto& [k, v] : *it)
        if (k == name) return v;
    return Value::undefined();
  }
  void assign(const std::string& name, Value v) {
    for (auto& [k, x] : scopes_.back())
      if (k == name) return void(x = std::move(v));
    scopes_.back().emplace_back(name, std::move(v));
  }

  void step() {
    if (++steps_ > kMaxSteps) fail("the template runs more than " + std::to_string(kMaxSteps) + " steps");
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count() > kMaxSeconds)
      fail("the template renders for more than " + std::to_string(static_cast<int>(kMaxSeconds)) + " seconds");
  }

  Flow exec(const Stmt& s, std::string& out) {
    step();
    check_length(out.size());
    switch (s.s) {
      case Stmt::S::Text: out += s.text; return Flow::Normal;
      case Stmt::S::Output: out += py_str(eval(*s.expr)); return Flow::Normal;
      case Stmt::S::If:
        for (const auto& [cond, body] : s.branches)
          if (truthy(eval(*cond))) return run(body, out);
        return run(s.else_body, out);
      case Stmt::S::For: return exec_for(s, out);
      case Stmt::S::Set: {
        Value v = eval(*s.expr);
        if (s.attribute_target) {
          Value ns = lookup(s.targets[0]);
          if (ns.kind != Kind::Dict || !ns.is_namespace)
            fail("cannot assign attribute '" + s.targets[1] + "' on a " + type_name(ns) + " (line " +
                 std::to_string(s.line) + "): only a namespace() takes one");
          std::function<bool(const Value&)> holds_namespace = [&](const Value& e) {
            if (e.kind == Kind::Dict && (e.is_namespace || std::any_of(e.dict->begin(), e.dict->end(), [&](const auto& p) { return holds_namespace(p.second); })))
              return true;
            return e.kind == Kind::List && std::any_of(e.list->begin(), e.list->end(), holds_namespace);
          };
          if (holds_namespace(v)) fail("a namespace cannot hold a namespace (line " + std::to_string(s.line) + ")");
          if (nesting(v) > kMaxNesting) fail("values nested too deeply (line " + std::to_string(s.line) + ")");
          ns.set(s.targets[1], std::move(v));
        } else if (s.targets.size() == 1) {
          assign(s.targets[0], std::move(v));
        } else {
          unpack(s.targets, v, s.line);
        }
        return Flow::Normal;
      }
      case Stmt::S::SetBlock: {
        std::string captured;
        run(s.body, captured);
        assign(s.targets[0], Value::string(std::move(captured)));
        return Flow::Normal;
      }
      case Stmt::S::Break: return Flow::Break;
      case Stmt::S::Continue: return Flow::Continue;
      case Stmt::S::Block: return run(s.body, out);
    }
    return Flow::Normal;
  }

  void unpack(const std::vector<std::string>& names, const Value& v, int line) {
    const List items = iterate(v);
    if (items.size() != names.size())
      fail("cannot unpack " + std::to_string(items.size()) + " values into " + std::to_string(names.size()) +
           " names (line " + std::to_string(line) + ")");
    for (size_t k = 0; k < names.size(); ++k) assign(names[k], items[k]);
  }

  Flow exec_for(const Stmt& s, std::string& out) {
    List items = iterate(eval(*s.expr));
    if (s.filter) {
      List kept;
      for (auto& item : items) {
        step();
        scopes_.emplace_back();
        if (s.targets.size() == 1) assign(s.targets[0], item);
        else unpack(s.targets, item, s.line);
        const bool keep = truthy(eval(*s.filter));
        scopes_.pop_back();
        if (keep) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    if (items.empty()) return run(s.else_body, out);
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t k = 0; k < n; ++k) {
      step();
      Value loop = Value::make_dict({{"index", Value::integer(k + 1)},
                                     {"index0", Value::integer(k)},
                                     {"revindex", Value::integer(n - k)},
                                     {"revindex0", Value::integer(n - k - 1)},
                                     {"first", Value::boolean(k == 0)},
                                     {"last", Value::boolean(k == n - 1)},
                                     {"length", Value::integer(n)},
                                     {"depth", Value::integer(1)},
                                     {"depth0", Value::integer(0)}});
      loop.set("previtem", k > 0 ? items[static_cast<size_t>(k - 1)] : Value::undefined());
      loop.set("nextitem", k + 1 < n ? items[static_cast<size_t>(k + 1)] : Value::undefined());
      scopes_.emplace_back();
      assign("loop", loop);
      if (s.targets.size() == 1) assign(s.targets[0], items[static_cast<size_t>(k)]);
      else unpack(s.targets, items[static_cast<size_t>(k)], s.line);
      const Flow f = run(s.body, out);
      scopes_.pop_back();
      if (f == Flow::Break) break;
    }
    return Flow::Normal;
  }

  [[noreturn]] static void err(const Expr& x, const std::string& what) {
    fail(what + " (line " + std::to_string(x.line) + ")");
  }

  static Value attribute(const Value& obj, const std::string& name) {
    if (obj.kind == Kind::Dict) {
      if (const Value* v = obj.find(name)) return *v;
      return Value::undefined();
    }
    if (obj.kind == Kind::List) {  // `x.0`
      if (!name.empty() && name.size() < 12 && std::all_of(name.begin(), name.end(), ::isdigit)) {
        const size_t k = std::stoul(name);
        return k < obj.list->size() ? (*obj.list)[k] : Value::undefined();
      }
    }
    return Value::undefined();
  }

  static Value item(const Expr& x, const Value& obj, const Value& key) {
    switch (obj.kind) {
      case Kind::Dict:
        if (key.kind != Kind::String) return Value::undefined();
        return attribute(obj, key.s);
      case Kind::List:
      case Kind::String: {
        if (!int_like(key)) err(x, std::string("indices must be integers, not ") + type_name(key));
        const bool str = obj.kind == Kind::String;
        const std::u32string u = str ? decode(obj.s) : std::u32string();
        const int64_t n = str ? static_cast<int64_t>(u.size()) : static_cast<int64_t>(obj.list->size());
        int64_t k = as_int(key);
        if (k < 0) k += n;
        if (k < 0 || k >= n) return Value::undefined();
        return str ? Value::string(encode(u.substr(static_cast<size_t>(k), 1))) : (*obj.list)[static_cast<size_t>(k)];
      }
      case Kind::Undefined: err(x, "an item of an undefined value");
      default: return Value::undefined();
    }
  }

  Value slice(const Expr& x, const Value& obj) {
    auto part = [&](int k) -> std::optional<int64_t> {
      if (!x.args[static_cast<size_t>(k)]) return std::nullopt;
      const Value v = eval(*x.args[static_cast<size_t>(k)]);
      if (v.kind == Kind::None) return std::nullopt;
      if (!int_like(v)) err(x, "slice indices must be integers");
      return as_int(v);
    };
    const auto start = part(1), stop = part(2), step_v = part(3);
    const int64_t step = step_v.value_or(1);
    if (step == 0) err(x, "slice step cannot be zero");
    const bool str = obj.kind == Kind::String;
    if (!str && obj.kind != Kind::List) err(x, std::string("cannot slice a ") + type_name(obj));
    const std::u32string u = str ? decode(obj.s) : std::u32string();
    const int64_t n = str ? static_cast<int64_t>(u.size()) : static_cast<int64_t>(obj.list->size());
    auto clamp = [&](std::optional<int64_t> v, int64_t dflt) {
      if (!v) return dflt;
      int64_t k = *v;
      if (k < 0) k += n;
      if (step > 0) return std::clamp<int64_t>(k, 0, n);
      return std::clamp<int64_t>(k, -1, n - 1);
    };
    const int64_t a = clamp(start, step > 0 ? 0 : n - 1), b = clamp(stop, step > 0 ? n : -1);
    std::u32string su;
    List sl;
    for (int64_t k = a; step > 0 ? k < b : k > b;) {
      if (str) su.push_back(u[static_cast<size_t>(k)]);
      else sl.push_back((*obj.list)[static_cast<size_t>(k)]);
      if (__builtin_add_overflow(k, step, &k)) break;
    }
    return str ? Value::string(encode(su)) : Value::make_list(std::move(sl));
  }

  Value arith(const Expr& x, const std::string& op, const Value& a, const Value& b) {
    if (!a.defined() || !b.defined()) err(x, "'" + op + "' on an undefined value");
    if (op == "+") {
      if (a.kind == Kind::String && b.kind == Kind::String) return Value::string(a.s + b.s);
      if (a.kind == Kind::List && b.kind == Kind::List) {
        List l = *a.list;
        l.insert(l.end(), b.list->begin(), b.list->end());
        return Value::make_list(std::move(l));
      }
    }
    if (op == "+" && a.kind == Kind::String && b.kind == Kind::String) check_length(a.s.size() + b.s.size());
    if (op == "*") {
      const Value* seq = a.kind == Kind::String || a.kind == Kind::List ? &a : &b;
      const Value* count = seq == &a ? &b : &a;
      if ((seq->kind == Kind::String || seq->kind == Kind::List) && int_like(*count)) {
        const size_t unit = seq->kind == Kind::String ? seq->s.size() : seq->list->size();
        if (as_int(*count) > 0 && unit > 0) check_length(unit * static_cast<size_t>(std::min<int64_t>(as_int(*count), int64_t{1} << 40)));
        if (seq->kind == Kind::String) {
          std::string s;
          for (int64_t k = 0; k < as_int(*count); ++k) s += seq->s;
          return Value::string(std::move(s));
        }
        List l;
        for (int64_t k = 0; k < as_int(*count); ++k) l.insert(l.end(), seq->list->begin(), seq->list->end());
        return Value::make_list(std::move(l));
      }
    }
    if (!is_number(a) || !is_number(b))
      err(x, std::string("unsupported operand types for ") + op + ": " + type_name(a) + " and " + type_name(b));
    const bool ints = int_like(a) && int_like(b);
    const double p = num(a), q = num(b);
    if (op == "+") return ints ? Value::integer(int_op('+', as_int(a), as_int(b))) : Value::real(p + q);
    if (op == "-") return ints ? Value::integer(int_op('-', as_int(a), as_int(b))) : Value::real(p - q);
    if (op == "*") return ints ? Value::integer(int_op('*', as_int(a), as_int(b))) : Value::real(p * q);
    if (op == "**") {
      const double v = std::pow(p, q);
      if (ints && as_int(b) >= 0) {
        if (!(std::fabs(v) < 9.0e18)) fail("integer overflow in **");
        return Value::integer(static_cast<int64_t>(std::llround(v)));
      }
      return Value::real(v);
    }
    if (q == 0) err(x, "division by zero");
    if (op == "/") return Value::real(p / q);
    if (op == "//") {
      if (ints) {
        const int64_t i = as_int(a), j = as_int(b);
        if (i == INT64_MIN && j == -1) fail("integer overflow in //");
        int64_t d = i / j;
        if ((i % j != 0) && ((i < 0) != (j < 0))) --d;
        return Value::integer(d);
      }
      return Value::real(std::floor(p / q));
    }
    if (op == "%") {
      if (ints) {
        const int64_t i = as_int(a), j = as_int(b);
        if (j == -1) return Value::integer(0);
        int64_t m = i % j;
        if (m != 0 && ((m < 0) != (j < 0))) m += j;
        return Value::integer(m);
      }
      double m = std::fmod(p, q);
      if (m != 0 && ((m < 0) != (q < 0))) m += q;
      return Value::real(m);
    }
    err(x, "unknown operator " + op);
  }

  Value eval(const Expr& x) {
    step();
    switch (x.e) {
      case Expr::E::Const: return x.constant;
      case Expr::E::Name: return lookup(x.name);
      case Expr::E::List: {
        List l;
        for (const auto& a : x.args) l.push_back(eval(*a));
        Value v = Value::make_list(std::move(l));
        if (nesting(v) > kMaxNesting) err(x, "values nested too deeply");
        v.is_tuple = x.name == "tuple";
        return v;
      }
      case Expr::E::Dict: {
        Value d = Value::make_dict();
        for (size_t k = 0; k + 1 < x.args.size(); k += 2) {
          const Value key = eval(*x.args[k]);
          if (key.kind != Kind::String) err(x, "dict keys must be strings here");
          d.set(key.s, eval(*x.args[k + 1]));
        }
        return d;
      }
      case Expr::E::Attr: {
        const Value obj = eval(*x.args[0]);
        if (!obj.defined()) err(x, "'" + x.name + "' of an undefined value");
        return attribute(obj, x.name);
      }
      case Expr::E::Item: return item(x, eval(*x.args[0]), eval(*x.args[1]));
      case Expr::E::Slice: return slice(x, eval(*x.args[0]));
      case Expr::E::Call: return call(x);
      case Expr::E::Filter: return filter(x);
      case Expr::E::Test: {
        const bool r = test(x);
        return Value::boolean(x.negated ? !r : r);
      }
      case Expr::E::Unary: {
        const Value v = eval(*x.args[0]);
        if (!is_number(v)) err(x, std::string("bad operand for unary ") + x.name + ": " + type_name(v));
        if (x.name == "+") return v;
        if (v.kind == Kind::Float) return Value::real(-v.f);
        return Value::integer(int_op('-', 0, as_int(v)));
      }
      case Expr::E::Not: return Value::boolean(!truthy(eval(*x.args[0])));
      case Expr::E::And: {
        Value a = eval(*x.args[0]);
        return truthy(a) ? eval(*x.args[1]) : a;
      }
      case Expr::E::Or: {
        Value a = eval(*x.args[0]);
        return truthy(a) ? a : eval(*x.args[1]);
      }
      case Expr::E::Cond:
        if (truthy(eval(*x.args[0]))) return eval(*x.args[1]);
        return x.args.size() > 2 ? eval(*x.args[2]) : Value::undefined();
      case Expr::E::Concat: {
        std::string s;
        for (const auto& a : x.args) {
          s += py_str(eval(*a));
          check_length(s.size());
        }
        return Value::string(std::move(s));
      }
      case Expr::E::Binary: {
        const Value a = eval(*x.args[0]), b = eval(*x.args[1]);
        const std::string& op = x.name;
        if (op == "==") return Value::boolean(equal(a, b));
        if (op == "!=") return Value::boolean(!equal(a, b));
        if (op == "<") return Value::boolean(less(a, b));
        if (op == ">") return Value::boolean(less(b, a));
        if (op == "<=") return Value::boolean(!less(b, a));
        if (op == ">=") return Value::boolean(!less(a, b));
        if (op == "in") return Value::boolean(contains(b, a));
        if (op == "not in") return Value::boolean(!contains(b, a));
        return arith(x, op, a, b);
      }
    }
    return Value::undefined();
  }

  // Positional and keyword arguments, evaluated.
  struct Args {
    List pos;
    Dict kw;
    const Value* get(size_t k, std::string_view key) const {
      if (k < pos.size()) return &pos[k];
      for (const auto& [n, v] : kw)
        if (n == key) return &v;
      return nullptr;
    }
  };
  Args arguments(const Expr& x, size_t first) {
    Args a;
    for (size_t k = first; k < x.args.size(); ++k) a.pos.push_back(eval(*x.args[k]));
    for (const auto& [n, e] : x.kwargs) a.kw.emplace_back(n, eval(*e));
    return a;
  }

  Value call(const Expr& x) {
    const Expr& callee = *x.args[0];
    if (callee.e == Expr::E::Attr) return method(x, eval(*callee.args[0]), callee.name, arguments(x, 1));
    if (callee.e != Expr::E::Name) err(x, "only functions and methods can be called");
    const Args a = arguments(x, 1);
    const std::string& f = callee.name;
    if (f == "raise_exception") {
      const Value* m = a.get(0, "message");
      throw TemplateError("the chat template raised an error: " + (m ? py_str(*m) : std::string()));
    }
    if (f == "namespace") {
      Value ns = Value::make_dict();
      ns.is_namespace = true;
      for (const auto& v : a.pos) {
        if (v.kind != Kind::Dict) err(x, "namespace() takes a dict or keyword arguments");
        for (const auto& [k, e] : *v.dict) ns.set(k, e);
      }
      for (const auto& [k, e] : a.kw) ns.set(k, e);
      return ns;
    }
    if (f == "dict") {
      Value d = Value::make_dict();
      for (const auto& [k, e] : a.kw) d.set(k, e);
      return d;
    }
    if (f == "range") {
      if (a.pos.empty() || a.pos.size() > 3) err(x, "range() takes 1 to 3 integers");
      for (const auto& v : a.pos)
        if (!int_like(v)) err(x, "range() takes integers");
      int64_t lo = 0, hi = 0, step = 1;
      if (a.pos.size() == 1) hi = as_int(a.pos[0]);
      else lo = as_int(a.pos[0]), hi = as_int(a.pos[1]);
      if (a.pos.size() == 3) step = as_int(a.pos[2]);
      if (step == 0) err(x, "range() step cannot be zero");
      const double count = (static_cast<double>(hi) - static_cast<double>(lo)) / static_cast<double>(step);
      if (count > 1e6) err(x, "range() of more than a million numbers");
      List l;
      for (int64_t k = lo; step > 0 ? k < hi : k > hi;) {
        l.push_back(Value::integer(k));
        if (__builtin_add_overflow(k, step, &k)) break;
      }
      return Value::make_list(std::move(l));
    }
    if (f == "strftime_now") {
      const Value* fmt = a.get(0, "format");
      if (!fmt || fmt->kind != Kind::String) err(x, "strftime_now() takes a format string");
      const std::time_t now = std::time(nullptr);
      std::tm tm{};
      localtime_r(&now, &tm);
      char buf[256];
      const size_t n = std::strftime(buf, sizeof buf, fmt->s.c_str(), &tm);
      return Value::string(std::string(buf, n));
    }
    const Value v = lookup(f);
    err(x, v.defined() ? "'" + f + "' is not callable" : "unknown function '" + f + "'");
  }

  static std::vector<std::string> py_split(const std::string& s, const Value* sep, int64_t maxsplit) {
    std::vector<std::string> out;
    if (!sep || sep->kind == Kind::None) {
      const std::u32string u = decode(s);
      size_t k = 0;
      while (true) {
        while (k < u.size() && py_space(u[k])) ++k;
        if (k >= u.size()) break;
        if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
          size_t e = u.size();
          while (e > k && py_space(u[e - 1])) --e;
          out.push_back(encode(u.substr(k, e - k)));
          break;
        }
        size_t e = k;
        while (e < u.size() && !py_space(u[e])) ++e;
        out.push_back(encode(u.substr(k, e - k)));
        k = e;
      }
      return out;
    }
    if (sep->kind != Kind::String || sep->s.empty()) fail("split() takes a non-empty separator");
    size_t k = 0;
    while (true) {
      const size_t at = s.find(sep->s, k);
      if (at == std::string::npos || (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit)) break;
      out.push_back(s.substr(k, at - k));
      k = at + sep->s.size();
    }
    out.push_back(s.substr(k));
    return out;
  }

  Value method(const Expr& x, const Value& obj, const std::string& name, const Args& a) {
    if (!obj.defined()) err(x, "'" + name + "' of an undefined value");
    if (obj.kind == Kind::String) {
      const std::string& s = obj.s;
      auto str_arg = [&](size_t k, std::string_view key) -> std::string {
        const Value* v = a.get(k, key);
        if (!v || v->kind != Kind::String) err(x, name + "() takes a string");
        return v->s;
      };
      if (name == "startswith" || name == "endswith") {
        const Value* v = a.get(0, "prefix");
        if (!v) err(x, name + "() takes an argument");
        List options = v->kind == Kind::List ? *v->list : List{*v};
        for (const auto& o : options) {
          if (o.kind != Kind::String) err(x, name + "() takes strings");
          const bool hit = name == "startswith" ? s.rfind(o.s, 0) == 0
                                                : s.size() >= o.s.size() && s.compare(s.size() - o.s.size(), o.s.size(), o.s) == 0;
          if (hit) return Value::boolean(true);
        }
        return Value::boolean(false);
      }
      if (name == "strip") return Value::string(py_strip(s, a.get(0, "chars"), true, true));
      if (name == "lstrip") return Value::string(py_strip(s, a.get(0, "chars"), true, false));
      if (name == "rstrip") return Value::string(py_strip(s, a.get(0, "chars"), false, true));
      if (name == "split" || name == "rsplit") {
        const Value* m = a.get(1, "maxsplit");
        const int64_t maxsplit = m && int_like(*m) ? as_int(*m) : -1;
        if (name == "rsplit" && maxsplit >= 0) err(x, "rsplit() with maxsplit is not supported");
        List l;
        for (auto& part : py_split(s, a.get(0, "sep"), maxsplit)) l.push_back(Value::string(std::move(part)));
        return Value::make_list(std::move(l));
      }
      if (name == "upper" || name == "lower") {
        std::string t = s;
        for (char& c : t) c = static_cast<char>(name == "upper" ? std::toupper(static_cast<unsigned char>(c))
                                                                : std::tolower(static_cast<unsigned char>(c)));
        return Value::string(t);
      }
      if (name == "replace") {
        const std::string from = str_arg(0, "old"), to = str_arg(1, "new");
        const Value* c = a.get(2, "count");
        int64_t left = c && int_like(*c) ? as_int(*c) : -1;
        std::string t;
        size_t k = 0;
        if (from.empty()) err(x, "replace() of an empty string is not supported");
        while (left != 0) {
          const size_t at = s.find(from, k);
          if (at == std::string::npos) break;
          t += s.substr(k, at - k) + to;
          k = at + from.size();
          if (left > 0) --left;
        }
        return Value::string(t + s.substr(k));
      }
      if (name == "find") {
        const size_t at = s.find(str_arg(0, "sub"));
        return Value::integer(at == std::string::npos ? -1 : static_cast<int64_t>(decode(s.substr(0, at)).size()));
      }
      if (name == "count") {
        const std::string sub = str_arg(0, "sub");
        int64_t n = 0;
        for (size_t at = s.find(sub); !sub.empty() && at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
        return Value::integer(n);
      }
      if (name == "join") {
        const Value* v = a.get(0, "iterable");
        if (!v) err(x, "join() takes an iterable");
        std::string t;
        bool first = true;
        for (const auto& e : iterate(*v)) {
          if (e.kind != Kind::String) err(x, "join() takes strings");
          if (!first) t += s;
          first = false;
          t += e.s;
        }
        return Value::string(t);
      }
      if (name == "title" || name == "capitalize") return apply_filter(x, name, obj, a);
      if (name == "splitlines") {
        List l;
        size_t k = 0;
        while (k < s.size()) {
          size_t e = s.find('\n', k);
          if (e == std::string::npos) e = s.size();
          l.push_back(Value::string(s.substr(k, e - k)));
          k = e + 1;
        }
        return Value::make_list(std::move(l));
      }
      if (name == "isdigit" || name == "isspace" || name == "isalpha") {
        const std::u32string u = decode(s);
        if (u.empty()) return Value::boolean(false);
        return Value::boolean(std::all_of(u.begin(), u.end(), [&](char32_t c) {
          if (name == "isspace") return py_space(c);
          if (name == "isdigit") return c >= '0' && c <= '9';
          return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
        }));
      }
    }
    if (obj.kind == Kind::Dict && !obj.is_namespace) {
      if (name == "items") {
        List l;
        for (const auto& [k, v] : *obj.dict) {
          l.push_back(Value::make_list({Value::string(k), v}));
          l.back().is_tuple = true;
        }
        return Value::make_list(std::move(l));
      }
      if (name == "keys" || name == "values") {
        List l;
        for (const auto& [k, v] : *obj.dict) l.push_back(name == "keys" ? Value::string(k) : v);
        return Value::make_list(std::move(l));
      }
      if (name == "get") {
        const Value* key = a.get(0, "key");
        if (!key) err(x, "get() takes a key");
        const Value* dflt = a.get(1, "default");
        if (key->kind == Kind::String)
          if (const Value* v = obj.find(key->s)) return *v;
        return dflt ? *dflt : Value::none();
      }
    }
    if (obj.kind == Kind::List) {
      if (name == "append" || name == "extend" || name == "pop" || name == "insert" || name == "remove" ||
          name == "clear" || name == "sort" || name == "reverse")
        err(x, "the list method " + name + "() changes a list, which transformers' sandbox refuses");
      if (name == "index" || name == "count") {
        const Value* v = a.get(0, "value");
        if (!v) err(x, name + "() takes a value");
        int64_t n = 0;
        for (size_t k = 0; k < obj.list->size(); ++k)
          if (equal((*obj.list)[k], *v)) {
            if (name == "index") return Value::integer(static_cast<int64_t>(k));
            ++n;
          }
        if (name == "index") err(x, "index(): the value is not in the list");
        return Value::integer(n);
      }
    }
    err(x, std::string("no method ") + name + "() on a " + type_name(obj));
  }

  bool test(const Expr& x) {
    const std::string& t = x.name;
    const Value v = eval(*x.args[0]);
    const Args a = arguments(x, 1);
    auto arg = [&]() -> const Value& {
      if (a.pos.empty()) err(x, "the test '" + t + "' takes an argument");
      return a.pos[0];
    };
    if (t == "defined") return v.defined();
    if (t == "undefined") return !v.defined();
    if (t == "none") return v.kind == Kind::None;
    if (t == "string") return v.kind == Kind::String;
    if (t == "number") return v.kind == Kind::Int || v.kind == Kind::Float;
    if (t == "integer") return v.kind == Kind::Int;
    if (t == "float") return v.kind == Kind::Float;
    if (t == "boolean") return v.kind == Kind::Bool;
    if (t == "true") return v.kind == Kind::Bool && v.b;
    if (t == "false") return v.kind == Kind::Bool && !v.b;
    if (t == "mapping") return v.kind == Kind::Dict;
    if (t == "sequence") return v.kind == Kind::List || v.kind == Kind::String || v.kind == Kind::Dict;
    if (t == "iterable") return v.kind == Kind::List || v.kind == Kind::String || v.kind == Kind::Dict;
    if (t == "callable") return false;
    if (t == "equalto" || t == "eq" || t == "==" || t == "sameas") return equal(v, arg());
    if (t == "ne" || t == "!=") return !equal(v, arg());
    if (t == "lt" || t == "lessthan") return less(v, arg());
    if (t == "gt" || t == "greaterthan") return less(arg(), v);
    if (t == "le") return !less(arg(), v);
    if (t == "ge") return !less(v, arg());
    if (t == "in") return contains(arg(), v);
    if (t == "odd" || t == "even" || t == "divisibleby") {
      if (!int_like(v)) err(x, "the test '" + t + "' takes an integer");
      const int64_t d = t == "divisibleby" ? as_int(arg()) : 2;
      if (d == 0) err(x, "divisibleby 0");
      if (d == -1) return t != "odd";
      const bool div = as_int(v) % d == 0;
      return t == "odd" ? !div : div;
    }
    if (t == "lower" || t == "upper") {
      if (v.kind != Kind::String) return false;
      return std::none_of(v.s.begin(), v.s.end(), [&](char c) {
        return t == "lower" ? std::isupper(static_cast<unsigned char>(c)) : std::islower(static_cast<unsigned char>(c));
      });
    }
    err(x, "unknown test '" + t + "'");
  }

  Value filter(const Expr& x) { return apply_filter(x, x.name, eval(*x.args[0]), arguments(x, 1)); }

  Value apply_filter(const Expr& x, const std::string& f, const Value& v, const Args& a) {
    auto need_string = [&]() -> const std::string& {
      if (v.kind != Kind::String) err(x, "the filter '" + f + "' takes a string, not a " + type_name(v));
      return v.s;
    };
    if (f == "trim") return Value::string(py_strip(py_str(v), a.get(0, "chars"), true, true));
    if (f == "length" || f == "count") return Value::integer(length(v));
    if (f == "tojson") {
      const Value* indent = a.get(0, "indent");
      return Value::string(to_json(v, indent && int_like(*indent) ? static_cast<int>(as_int(*indent)) : -1));
    }
    if (f == "string") return Value::string(py_str(v));
    if (f == "upper" || f == "lower") return method(x, Value::string(py_str(v)), f, a);
    if (f == "capitalize" || f == "title") {
      std::u32string u = decode(py_str(v));
      bool start = true;
      for (size_t k = 0; k < u.size(); ++k) {
        char32_t& c = u[k];
        const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
        if (f == "capitalize") {
          if (k == 0 && c >= 'a' && c <= 'z') c -= 32;
          else if (k > 0 && c >= 'A' && c <= 'Z') c += 32;
          continue;
        }
        if (alpha) {
          if (start && c >= 'a' && c <= 'z') c -= 32;
          else if (!start && c >= 'A' && c <= 'Z') c += 32;
          start = false;
        } else {
          start = true;
        }
      }
      return Value::string(encode(u));
    }
    if (f == "default" || f == "d") {
      const Value* dflt = a.get(0, "default_value");
      const Value* boolean = a.get(1, "boolean");
      const bool use = boolean && truthy(*boolean) ? !truthy(v) : !v.defined();
      return use ? (dflt ? *dflt : Value::string("")) : v;
    }
    if (f == "first" || f == "last") {
      const List l = iterate(v);
      if (l.empty()) return Value::undefined();
      return f == "first" ? l.front() : l.back();
    }
    if (f == "join") {
      const Value* sep = a.get(0, "d");
      const Value* attr = a.get(1, "attribute");
      std::string out;
      bool first = true;
      for (const auto& e : iterate(v)) {
        if (!first) out += sep ? py_str(*sep) : "";
        first = false;
        out += py_str(attr ? attribute(e, py_str(*attr)) : e);
      }
      return Value::string(out);
    }
    if (f == "list") return Value::make_list(iterate(v));
    if (f == "int") {
      if (int_like(v)) return Value::integer(as_int(v));
      if (v.kind == Kind::Float) {
        if (!(std::fabs(v.f) < 9.0e18)) fail("int() of a float out of range");
        return Value::integer(static_cast<int64_t>(v.f));
      }
      if (v.kind == Kind::String) {
        try {
          return Value::integer(std::stoll(v.s));
        } catch (...) {
        }
      }
      const Value* dflt = a.get(0, "default");
      return dflt ? *dflt : Value::integer(0);
    }
    if (f == "float") {
      if (is_number(v)) return Value::real(num(v));
      if (v.kind == Kind::String) {
        try {
          return Value::real(std::stod(v.s));
        } catch (...) {
        }
      }
      return Value::real(0.0);
    }
    if (f == "abs") {
      if (!is_number(v)) err(x, "abs of a " + std::string(type_name(v)));
      if (v.kind == Kind::Float) return Value::real(std::fabs(v.f));
      if (as_int(v) == INT64_MIN) fail("integer overflow in abs");
      return Value::integer(std::llabs(as_int(v)));
    }
    if (f == "round") {
      if (!is_number(v)) err(x, "round of a " + std::string(type_name(v)));
      const Value* p = a.get(0, "precision");
      const double scale = std::pow(10.0, p && int_like(*p) ? static_cast<double>(as_int(*p)) : 0.0);
      return Value::real(std::nearbyint(num(v) * scale) / scale);
    }
    if (f == "replace") return method(x, Value::string(py_str(v)), "replace", a);
    if (f == "reverse") {
      if (v.kind == Kind::String) {
        std::u32string u = decode(v.s);
        std::reverse(u.begin(), u.end());
        return Value::string(encode(u));
      }
      List l = iterate(v);
      std::reverse(l.begin(), l.end());
      return Value::make_list(std::move(l));
    }
    if (f == "items") {
      if (!v.defined()) return Value::make_list();
      if (v.kind != Kind::Dict) err(x, "items of a " + std::string(type_name(v)));
      return method(x, v, "items", a);
    }
    if (f == "selectattr" || f == "rejectattr" || f == "select" || f == "reject") {
      const bool attr = f.find("attr") != std::string::npos;
      const bool keep_true = f[0] == 's';
      const size_t first = attr ? 1 : 0;
      List out;
      for (const auto& e : iterate(v)) {
        const Value subject = attr ? attribute(e, py_str(a.pos.empty() ? Value() : a.pos[0])) : e;
        bool hit;
        if (a.pos.size() <= first) {
          hit = truthy(subject);
        } else {
          Expr t;
          t.e = Expr::E::Test;
          t.line = x.line;
          t.name = py_str(a.pos[first]);
          auto c = std::make_unique<Expr>();
          c->constant = subject;
          t.args.push_back(std::move(c));
          for (size_t k = first + 1; k < a.pos.size(); ++k) {
            auto arg = std::make_unique<Expr>();
            arg->constant = a.pos[k];
            t.args.push_back(std::move(arg));
          }
          hit = test(t);
        }
        if (hit == keep_true) out.push_back(e);
      }
      return Value::make_list(std::move(out));
    }
    if (f == "map") {
      const Value* attr = a.get(99, "attribute");
      List out;
      for (const auto& e : iterate(v)) {
        if (attr) {
          out.push_back(attribute(e, py_str(*attr)));
        } else {
          if (a.pos.empty()) err(x, "map() takes a filter name or attribute=");
          Args rest;
          rest.pos.assign(a.pos.begin() + 1, a.pos.end());
          out.push_back(apply_filter(x, py_str(a.pos[0]), e, rest));
        }
      }
      return Value::make_list(std::move(out));
    }
    if (f == "unique") {
      List out;
      for (const auto& e : iterate(v))
        if (std::none_of(out.begin(), out.end(), [&](const Value& o) { return equal(o, e); })) out.push_back(e);
      return Value::make_list(std::move(out));
    }
    if (f == "sum") {
      Value total = Value::integer(0);
      for (const auto& e : iterate(v)) total = arith(x, "+", total, e);
      return total;
    }
    if (f == "min" || f == "max") {
      const List l = iterate(v);
      if (l.empty()) return Value::undefined();
      Value best = l[0];
      for (const auto& e : l)
        if (f == "min" ? less(e, best) : less(best, e)) best = e;
      return best;
    }
    if (f == "safe") return v;
    if (f == "e" || f == "escape") {
      std::string out;
      for (char c : py_str(v)) {
        switch (c) {
          case '&': out += "&amp;"; break;
          case '<': out += "&lt;"; break;
          case '>': out += "&gt;"; break;
          case '"': out += "&#34;"; break;
          case '\'': out += "&#39;"; break;
          default: out += c;
        }
      }
      return Value::string(out);
    }
    if (f == "indent") {
      const std::string& s = need_string();
      const Value* w = a.get(0, "width");
      const Value* first = a.get(1, "first");
      const Value* blank = a.get(2, "blank");
      const int64_t width = w && int_like(*w) ? std::clamp<int64_t>(as_int(*w), 0, 1024) : 4;
      const std::string pad = w && w->kind == Kind::String ? w->s : std::string(static_cast<size_t>(width), ' ');
      std::string out;
      size_t k = 0;
      bool first_line = true;
      while (true) {
        size_t e = s.find('\n', k);
        const std::string line = s.substr(k, e == std::string::npos ? std::string::npos : e - k);
        const bool pad_it = first_line ? (first && truthy(*first)) : (!line.empty() || (blank && truthy(*blank)));
        out += (pad_it ? pad : "") + line;
        if (e == std::string::npos) break;
        out += '\n';
        k = e + 1;
        first_line = false;
      }
      return Value::string(out);
    }
    if (f == "dictsort") {
      if (v.kind != Kind::Dict) err(x, "dictsort of a " + std::string(type_name(v)));
      List items;
      for (const auto& [k, e] : *v.dict) {
        items.push_back(Value::make_list({Value::string(k), e}));
        items.back().is_tuple = true;
      }
      std::stable_sort(items.begin(), items.end(),
                       [](const Value& p, const Value& q) { return (*p.list)[0].s < (*q.list)[0].s; });
      return Value::make_list(std::move(items));
    }
    err(x, "unknown filter '" + f + "'");
  }

  std::vector<Scope> scopes_;
  int64_t steps_ = 0;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace

struct Template::Node {
  Body body;
};

Template::Template(std::string_view source) {
  auto n = std::make_shared<Node>();
  n->body = Parser(lex(source)).parse_all();
  root_ = std::move(n);
}
Template::~Template() = default;
Template::Template(Template&&) noexcept = default;

std::string Template::render(const Dict& variables) const {
  std::string out;
  Renderer r(variables);
  r.run(root_->body, out);
  return out;
}

namespace {
}  // namespace

std::string to_str(const Value& v) { return py_str(v); }

std::string to_json(const Value& v, int indent) {
  std::string out;
  json_dump(out, v, indent, 0);
  return out;
}

Value from_json_text(std::string_view json_text) {
  try {
    return from_json(nlohmann::ordered_json::parse(json_text));
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(std::string("not JSON: ") + e.what());
  }
}

}  // namespace laoyao::jinja
