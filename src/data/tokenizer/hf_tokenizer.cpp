#include "data/tokenizer/hf_tokenizer.hpp"

#include <algorithm>
#include <array>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "core/file_io.hpp"
#include "data/tokenizer/bpe_model.hpp"
#include "data/tokenizer/byte_level.hpp"
#include "data/tokenizer/nfc.hpp"
#include "data/tokenizer/regex.hpp"
#include "data/tokenizer/unicode.hpp"

namespace laoyao::tokenizer {

using nlohmann::json;

namespace {

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct AddedToken {
  std::string content;
  TokenId id;
  bool single_word, lstrip, rstrip;
};

// A literal or regex pattern of a Split pre-tokenizer / Replace normalizer.
struct Pattern {
  std::string literal;
  std::unique_ptr<Regex> regex;
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view s) const {
    if (regex) return regex->find_all(s);
    std::vector<std::pair<size_t, size_t>> out;
    if (literal.empty()) return out;
    for (size_t p = s.find(literal); p != std::string_view::npos; p = s.find(literal, p + literal.size())) {
      out.emplace_back(p, p + literal.size());
    }
    return out;
  }
};

struct NormStep {
  enum Kind { kNFC, kPrepend, kReplace } kind;
  std::string text;  // Prepend: what; Replace: the replacement
  Pattern pattern;   // Replace
};

struct PreStep {
  enum Kind { kSplit, kByteLevel } kind;
  Pattern pattern;  // Split
  Behavior behavior = Behavior::kIsolated;
  bool invert = false;
  bool add_prefix_space = false, use_regex = true;  // ByteLevel
};

struct DecodeStep {
  enum Kind { kByteLevel, kReplace, kByteFallback, kFuse, kStrip } kind;
  std::string from, to;  // Replace; Strip: `from` is the content
  size_t start = 0, stop = 0;
};

bool is_ws(char32_t c) {
  return c == ' ' || (c >= 0x09 && c <= 0x0D) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

// Word characters for single_word added tokens (ASCII alphanumerics, '_' and any non-ASCII
// letter-ish character, which is what HF's is_alphanumeric() accepts in practice).
bool is_word_char(char32_t c) {
  if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  return !is_ws(c);
}

char32_t char_before(std::string_view s, size_t pos) {
  if (pos == 0) return 0;
  size_t b = pos - 1;
  while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;
  size_t i = b;
  return utf8_next(s, i);
}

std::string str_field(const json& j, const char* key, const std::string& what) {
  if (!j.contains(key) || !j[key].is_string()) {
    throw UsageError(what + ": missing string field '" + key + "'");
  }
  return j[key].get<std::string>();
}

bool bool_field(const json& j, const char* key, bool def) {
  return j.contains(key) && j[key].is_boolean() ? j[key].get<bool>() : def;
}

Pattern parse_pattern(const json& j, const std::string& what) {
  Pattern p;
  if (j.is_object() && j.contains("Regex") && j["Regex"].is_string()) {
    p.regex = std::make_unique<Regex>(j["Regex"].get<std::string>(), what);
  } else if (j.is_object() && j.contains("String") && j["String"].is_string()) {
    p.literal = j["String"].get<std::string>();
  } else {
    throw UsageError(what + ": pattern must be {\"Regex\": ...} or {\"String\": ...}");
  }
  return p;
}

// The (range, is_match) pieces of HF's NormalizedString::split for one behaviour.
std::vector<std::string> split_pieces(std::string_view s, const std::vector<std::pair<size_t, size_t>>& matches,
                                      Behavior behavior, bool invert) {
  struct Part {
    size_t b, e;
    bool match;
  };
  std::vector<Part> parts;
  size_t prev = 0;
  for (auto [b, e] : matches) {
    if (b > prev) parts.push_back({prev, b, invert});
    parts.push_back({b, e, !invert});
    prev = e;
  }
  if (prev < s.size()) parts.push_back({prev, s.size(), invert});

  std::vector<Part> kept;
  bool previous_match = false;
  switch (behavior) {
    case Behavior::kIsolated:
      kept = parts;
      break;
    case Behavior::kRemoved:
      for (const Part& p : parts) {
        if (!p.match) kept.push_back(p);
      }
      break;
    case Behavior::kMergedWithPrevious:
      for (const Part& p : parts) {
        if (p.match && !previous_match && !kept.empty()) kept.back().e = p.e;
        else kept.push_back(p);
        previous_match = p.match;
      }
      break;
    case Behavior::kMergedWithNext:
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
        if (it->match && !previous_match && !kept.empty()) kept.back().b = it->b;
        else kept.push_back(*it);
        previous_match = it->match;
      }
      std::reverse(kept.begin(), kept.end());
      break;
    case Behavior::kContiguous:
      for (const Part& p : parts) {
        if (!kept.empty() && p.match == previous_match) kept.back().e = p.e;
        else kept.push_back(p);
        previous_match = p.match;
      }
      break;
  }
  std::vector<std::string> out;
  for (const Part& p : kept) {
    if (p.e > p.b) out.emplace_back(s.substr(p.b, p.e - p.b));
  }
  return out;
}

Behavior parse_behavior(const std::string& s, const std::string& what) {
  if (s == "Removed") return Behavior::kRemoved;
  if (s == "Isolated") return Behavior::kIsolated;
  if (s == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (s == "MergedWithNext") return Behavior::kMergedWithNext;
  if (s == "Contiguous") return Behavior::kContiguous;
  throw UsageError(what + ": unknown split behavior '" + s +
                   "' (accepted: Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous)");
}

std::optional<std::string> token_name(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return std::nullopt;
}

// A token id as HF stores it: an integer in [0, 2^31).
std::optional<TokenId> json_token_id(const json& v) {
  if (v.is_number_unsigned()) {
    if (v.get<uint64_t>() <= INT32_MAX) return static_cast<TokenId>(v.get<uint64_t>());
  } else if (v.is_number_integer()) {
    const int64_t i = v.get<int64_t>();
    if (i >= 0 && i <= INT32_MAX) return static_cast<TokenId>(i);
  }
  return std::nullopt;
}

// model.vocab: a non-empty object of token -> id with unique ids.
std::unordered_map<std::string, TokenId> parse_model_vocab(const json& model, const std::string& where) {
  if (!model.contains("vocab") || !model["vocab"].is_object()) {
    throw UsageError(where + ": model.vocab must be an object of token -> id");
  }
  const json& v = model["vocab"];
  if (v.empty()) throw UsageError(where + ": model.vocab is empty (expected token -> id entries)");
  std::unordered_map<std::string, TokenId> vocab;
  std::unordered_map<TokenId, std::string> by_id;
  for (auto it = v.begin(); it != v.end(); ++it) {
    const auto id = json_token_id(it.value());
    if (!id) {
      throw UsageError(where + ": model.vocab gives token " + quote_text(it.key()) + " the id " + it.value().dump() +
                       " (expected an integer in [0, 2^31))");
    }
    if (auto [other, fresh] = by_id.emplace(*id, it.key()); !fresh) {
      throw UsageError(where + ": model.vocab gives tokens " + quote_text(other->second) + " and " +
                       quote_text(it.key()) + " the same id " + std::to_string(*id) + " (ids must be unique)");
    }
    vocab.emplace(it.key(), *id);
  }
  return vocab;
}

// model.merges: "a b" strings (HF's legacy form: exactly one space; "#version" lines skipped) or
// ["a", "b"] pairs, in rank order.
std::vector<std::pair<std::string, std::string>> parse_model_merges(const json& model, const std::string& where) {
  std::vector<std::pair<std::string, std::string>> merges;
  if (!model.contains("merges") || model["merges"].is_null()) return merges;
  const json& list = model["merges"];
  if (!list.is_array()) throw UsageError(where + ": model.merges must be a list");
  for (size_t i = 0; i < list.size(); ++i) {
    const json& m = list[i];
    std::string a, b;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      if (s.starts_with("#version")) continue;
      const size_t sp = s.find(' ');
      if (sp != std::string::npos && s.find(' ', sp + 1) == std::string::npos) {
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      }
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    }
    if (a.empty() || b.empty()) {
      throw UsageError(where + ": model.merges[" + std::to_string(i) + "] is " + quote_text(m.dump()) +
                       "; expected \"a b\" (two tokens separated by one space) or [\"a\", \"b\"]");
    }
    merges.emplace_back(std::move(a), std::move(b));
  }
  return merges;
}

// The eos_token a tokenizer_config.json / special_tokens_map.json names, if any.
std::optional<std::string> config_eos_token(const std::string& text, const std::string& file) {
  json cj;
  try {
    cj = json::parse(text);
  } catch (const json::exception& e) {
    throw UsageError("HuggingFaceTokenizer: '" + file + "' is not valid JSON: " + e.what());
  }
  if (!cj.is_object()) throw UsageError("HuggingFaceTokenizer: '" + file + "' must be a JSON object");
  if (!cj.contains("eos_token") || cj["eos_token"].is_null()) return std::nullopt;
  if (auto name = token_name(cj["eos_token"])) return name;
  throw UsageError("HuggingFaceTokenizer: '" + file + "': eos_token is " + quote_text(cj["eos_token"].dump()) +
                   "; expected a string or {\"content\": \"...\"}");
}

}  // namespace

struct HuggingFaceTokenizer::Impl {
  std::string source;
  std::vector<AddedToken> added;
  std::array<std::vector<size_t>, 256> added_by_first;  // longest first
  std::unordered_map<TokenId, std::string> added_by_id;
  std::unordered_map<std::string, TokenId> added_by_content;
  std::vector<NormStep> normalizers;
  std::vector<PreStep> pre;
  std::unique_ptr<BpeModel> model;
  std::vector<TokenId> post_prefix, post_suffix;
  std::vector<DecodeStep> decoders;
  std::string decoder_error;  // set when the file's decoder is not supported
  bool add_special_tokens = true;
  bool drops_unknown_chars = false;  // the model has neither an unk token nor byte fallback
  TokenId eod = -1;
  int64_t vocab_size = 0;

  void parse_model(const json& spec);
  void parse_added_tokens(const json& list);
  void parse_normalizer(const json& j);
  void parse_pre_tokenizer(const json& j);
  void parse_post_processor(const json& j);
  void parse_decoder(const json& j);
  // What holds between the parts: the byte-level alphabet, the post-processor's ids.
  void check_consistency() const;
  std::string normalize(std::string s) const;
  void encode_segment(std::string_view seg, std::vector<TokenId>& ids) const;
};

void HuggingFaceTokenizer::Impl::parse_normalizer(const json& j) {
  if (j.is_null()) return;
  const std::string what = source + " normalizer";
  const std::string type = str_field(j, "type", what);
  if (type == "Sequence") {
    for (const auto& n : j.value("normalizers", json::array())) parse_normalizer(n);
  } else if (type == "NFC") {
    normalizers.push_back({NormStep::kNFC, "", {}});
  } else if (type == "Prepend") {
    normalizers.push_back({NormStep::kPrepend, str_field(j, "prepend", what), {}});
  } else if (type == "Replace") {
    NormStep s{NormStep::kReplace, str_field(j, "content", what), parse_pattern(j.value("pattern", json()), what)};
    normalizers.push_back(std::move(s));
  } else {
    throw UsageError(what + ": type '" + type +
                     "' is not supported (supported: NFC, Prepend, Replace, Sequence)");
  }
}

void HuggingFaceTokenizer::Impl::parse_pre_tokenizer(const json& j) {
  if (j.is_null()) return;
  const std::string what = source + " pre_tokenizer";
  const std::string type = str_field(j, "type", what);
  if (type == "Sequence") {
    for (const auto& p : j.value("pretokenizers", json::array())) parse_pre_tokenizer(p);
  } else if (type == "Split") {
    PreStep s{PreStep::kSplit, parse_pattern(j.value("pattern", json()), what)};
    s.behavior = parse_behavior(str_field(j, "behavior", what), what);
    s.invert = bool_field(j, "invert", false);
    pre.push_back(std::move(s));
  } else if (type == "ByteLevel") {
    PreStep s{PreStep::kByteLevel, {}};
    s.add_prefix_space = bool_field(j, "add_prefix_space", true);
    s.use_regex = bool_field(j, "use_regex", true);
    if (s.use_regex) s.pattern.regex = std::make_unique<Regex>(kGpt2Pattern, what);
    pre.push_back(std::move(s));
  } else {
    throw UsageError(what + ": type '" + type +
                     "' is not supported (supported: ByteLevel, Split, Sequence)");
  }
}

void HuggingFaceTokenizer::Impl::parse_post_processor(const json& j) {
  if (j.is_null()) return;
  const std::string what = source + " post_processor";
  const std::string type = str_field(j, "type", what);
  auto special_id = [&](const json& pair) -> TokenId {
    // Roberta/Bert: ["</s>", 2]
    if (pair.is_array() && pair.size() == 2) {
      if (auto id = json_token_id(pair[1])) return *id;
    }
    throw UsageError(what + ": expected [token, id] pairs with an id in [0, 2^31), got " + quote_text(pair.dump()));
  };
  if (type == "Sequence") {
    for (const auto& p : j.value("processors", json::array())) parse_post_processor(p);
  } else if (type == "ByteLevel") {
    // Only adjusts offsets.
  } else if (type == "TemplateProcessing") {
    const json& single = j.value("single", json::array());
    const json& specials = j.value("special_tokens", json::object());
    bool seen_a = false;
    for (const auto& item : single) {
      if (item.contains("Sequence")) {
        seen_a = true;
        continue;
      }
      if (!item.contains("SpecialToken")) throw UsageError(what + ": unknown template item " + item.dump());
      const std::string name = str_field(item["SpecialToken"], "id", what);
      if (!specials.contains(name) || !specials[name].contains("ids")) {
        throw UsageError(what + ": template names special token '" + name + "' without ids");
      }
      for (const auto& v : specials[name]["ids"]) {
        const auto id = json_token_id(v);
        if (!id) {
          throw UsageError(what + ": special token '" + name + "' has id " + v.dump() +
                           "; expected an integer in [0, 2^31)");
        }
        (seen_a ? post_suffix : post_prefix).push_back(*id);
      }
    }
  } else if (type == "RobertaProcessing" || type == "BertProcessing") {
    post_prefix.push_back(special_id(j.value("cls", json())));
    post_suffix.push_back(special_id(j.value("sep", json())));
  } else {
    throw UsageError(what + ": type '" + type +
                     "' is not supported (supported: ByteLevel, TemplateProcessing, "
                     "RobertaProcessing, BertProcessing, Sequence)");
  }
}

void HuggingFaceTokenizer::Impl::parse_decoder(const json& j) {
  if (j.is_null()) return;
  const std::string type = j.value("type", "");
  if (type == "Sequence") {
    for (const auto& d : j.value("decoders", json::array())) parse_decoder(d);
  } else if (type == "ByteLevel") {
    decoders.push_back({DecodeStep::kByteLevel, "", ""});
  } else if (type == "Replace" && j.contains("pattern") && j["pattern"].contains("String")) {
    decoders.push_back({DecodeStep::kReplace, j["pattern"]["String"].get<std::string>(), j.value("content", "")});
  } else if (type == "ByteFallback") {
    decoders.push_back({DecodeStep::kByteFallback, "", ""});
  } else if (type == "Fuse") {
    decoders.push_back({DecodeStep::kFuse, "", ""});
  } else if (type == "Strip") {
    DecodeStep s{DecodeStep::kStrip, j.value("content", " "), ""};
    s.start = j.value("start", 0);
    s.stop = j.value("stop", 0);
    decoders.push_back(s);
  } else {
    decoder_error = source + " decoder: type '" + type +
                    "' is not supported (supported: ByteLevel, Replace, ByteFallback, Fuse, Strip, Sequence)";
  }
}

std::string HuggingFaceTokenizer::Impl::normalize(std::string s) const {
  for (const NormStep& n : normalizers) {
    switch (n.kind) {
      case NormStep::kNFC:
        s = nfc(s);
        break;
      case NormStep::kPrepend:
        if (!s.empty()) s = n.text + s;
        break;
      case NormStep::kReplace: {
        std::string out;
        size_t prev = 0;
        for (auto [b, e] : n.pattern.find_all(s)) {
          out.append(s, prev, b - prev);
          out += n.text;
          prev = e;
        }
        out.append(s, prev, std::string::npos);
        s = std::move(out);
        break;
      }
    }
  }
  return s;
}

void HuggingFaceTokenizer::Impl::encode_segment(std::string_view seg, std::vector<TokenId>& ids) const {
  std::vector<std::string> pieces{normalize(std::string(seg))};
  for (const PreStep& step : pre) {
    std::vector<std::string> next;
    for (std::string& p : pieces) {
      if (step.kind == PreStep::kSplit) {
        for (auto& s : split_pieces(p, step.pattern.find_all(p), step.behavior, step.invert)) next.push_back(std::move(s));
        continue;
      }
      // ByteLevel: optional prefix space, GPT-2 regex split, then bytes -> characters.
      if (step.add_prefix_space && !p.empty() && p[0] != ' ') p.insert(p.begin(), ' ');
      if (step.use_regex) {
        for (auto [b, e] : step.pattern.find_all(p)) next.push_back(to_byte_level(std::string_view(p).substr(b, e - b)));
      } else if (!p.empty()) {
        next.push_back(to_byte_level(p));
      }
    }
    pieces.swap(next);
  }
  for (const std::string& p : pieces) model->encode_word(p, ids);
}

HuggingFaceTokenizer::~HuggingFaceTokenizer() = default;

HuggingFaceTokenizer::HuggingFaceTokenizer(const std::string& path, HuggingFaceTokenizerOptions options) {
  namespace fs = std::filesystem;
  fs::path file = path;
  std::error_code ec;
  const char* kAccepted = "(expected a tokenizer.json file or a directory holding one)";
  if (!fs::exists(file, ec)) throw UsageError("HuggingFaceTokenizer: '" + path + "' does not exist " + kAccepted);
  if (fs::is_directory(file, ec)) {
    file /= "tokenizer.json";
    if (!fs::exists(file, ec)) {
      throw UsageError("HuggingFaceTokenizer: directory '" + path + "' has no tokenizer.json " + kAccepted);
    }
  }
  // The eos_token comes from the first of these beside tokenizer.json that names one; a file
  // that is there but broken is refused rather than skipped (the eod would silently change).
  std::string config;
  for (const char* name : {"tokenizer_config.json", "special_tokens_map.json"}) {
    fs::path c = file.parent_path() / name;
    if (!fs::is_regular_file(c, ec)) continue;
    std::string text = read_file(c.string());
    if (config_eos_token(text, c.string())) {
      config = std::move(text);
      break;
    }
  }
  auto t = parse(read_file(file.string()), config, options, file.string());
  impl_ = std::move(t->impl_);
}

std::unique_ptr<HuggingFaceTokenizer> HuggingFaceTokenizer::from_json(const std::string& tokenizer_json,
                                                                      const std::string& config_json,
                                                                      HuggingFaceTokenizerOptions options) {
  return parse(tokenizer_json, config_json, options, "tokenizer.json");
}

void HuggingFaceTokenizer::Impl::parse_model(const json& spec) {
  const std::string mtype = spec.value("type", "BPE");
  if (mtype != "BPE") {
    throw UsageError(source + ": model type '" + mtype +
                     "' is not supported (only BPE; use SentencePieceTokenizer for .model files)");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (spec.contains(key) && spec[key].is_string() && !spec[key].get<std::string>().empty()) {
      throw UsageError(source + ": BPE " + key + " is not supported");
    }
  }
  if (spec.contains("dropout") && !spec["dropout"].is_null() && spec["dropout"].get<double>() != 0.0) {
    throw UsageError(source + ": BPE dropout is not supported (it makes tokenization random)");
  }
  BpeModelConfig cfg;
  cfg.vocab = parse_model_vocab(spec, source);
  cfg.merges = parse_model_merges(spec, source);
  if (spec.contains("unk_token") && spec["unk_token"].is_string()) cfg.unk_token = spec["unk_token"].get<std::string>();
  cfg.fuse_unk = bool_field(spec, "fuse_unk", false);
  cfg.byte_fallback = bool_field(spec, "byte_fallback", false);
  cfg.ignore_merges = bool_field(spec, "ignore_merges", false);
  drops_unknown_chars = !cfg.unk_token && !cfg.byte_fallback;
  model = std::make_unique<BpeModel>(std::move(cfg), source + " model");
}

void HuggingFaceTokenizer::Impl::parse_added_tokens(const json& list) {
  if (list.is_null()) return;
  if (!list.is_array()) throw UsageError(source + ": added_tokens must be a list");
  for (size_t i = 0; i < list.size(); ++i) {
    const json& a = list[i];
    const std::string what = source + ": added_tokens[" + std::to_string(i) + "]";
    if (!a.is_object()) throw UsageError(what + " is " + quote_text(a.dump()) + "; expected an object");
    AddedToken tok{str_field(a, "content", what), 0, bool_field(a, "single_word", false),
                   bool_field(a, "lstrip", false), bool_field(a, "rstrip", false)};
    if (tok.content.empty()) throw UsageError(what + " has an empty \"content\"");
    const auto id = json_token_id(a.value("id", json()));
    if (!id) {
      throw UsageError(what + " " + quote_text(tok.content) + " has id " + a.value("id", json()).dump() +
                       "; expected an integer in [0, 2^31)");
    }
    tok.id = *id;
    // One id, one token: an added token may repeat a model token, but with the model's id.
    if (auto mid = model->token_to_id(tok.content); mid && *mid != tok.id) {
      throw UsageError(what + " " + quote_text(tok.content) + " has id " + std::to_string(tok.id) +
                       ", but model.vocab gives that token id " + std::to_string(*mid));
    }
    if (const std::string* other = model->id_to_token(tok.id); other && *other != tok.content) {
      throw UsageError(what + " " + quote_text(tok.content) + " has id " + std::to_string(tok.id) +
                       ", which model.vocab gives to " + quote_text(*other));
    }
    if (auto it = added_by_id.find(tok.id); it != added_by_id.end() && it->second != tok.content) {
      throw UsageError(what + " " + quote_text(tok.content) + " has id " + std::to_string(tok.id) +
                       ", as has the added token " + quote_text(it->second));
    }
    added_by_id[tok.id] = tok.content;
    added_by_content[tok.content] = tok.id;
    added.push_back(std::move(tok));
  }
  for (size_t i = 0; i < added.size(); ++i) {
    added_by_first[static_cast<unsigned char>(added[i].content[0])].push_back(i);
  }
  for (auto& v : added_by_first) {
    std::stable_sort(v.begin(), v.end(),
                     [&](size_t a, size_t b) { return added[a].content.size() > added[b].content.size(); });
  }
}

void HuggingFaceTokenizer::Impl::check_consistency() const {
  // A ByteLevel pre-tokenizer spells all text with 256 characters; a vocabulary lacking one (with
  // no unk token or byte fallback to catch it) would silently drop those bytes from the data.
  const bool byte_level =
      std::any_of(pre.begin(), pre.end(), [](const PreStep& p) { return p.kind == PreStep::kByteLevel; });
  if (byte_level && drops_unknown_chars) {
    if (const auto missing =
            byte_without_token([&](const std::string& ch) { return model->token_to_id(ch).has_value(); }))
      throw UsageError(source + ": model.vocab has no token for byte " + *missing +
                       ", which its ByteLevel pre-tokenizer produces, and no unk_token or byte_fallback (that byte "
                       "would be dropped from the data)");
  }
  for (const auto* ids : {&post_prefix, &post_suffix}) {
    for (TokenId id : *ids) {
      if (!added_by_id.contains(id) && !model->id_to_token(id)) {
        throw UsageError(source + ": post_processor adds token id " + std::to_string(id) +
                         ", which is neither in model.vocab nor in added_tokens");
      }
    }
  }
}

std::unique_ptr<HuggingFaceTokenizer> HuggingFaceTokenizer::parse(const std::string& tokenizer_json,
                                                                  const std::string& config_json,
                                                                  HuggingFaceTokenizerOptions options,
                                                                  const std::string& file) {
  std::unique_ptr<HuggingFaceTokenizer> t(new HuggingFaceTokenizer());
  t->impl_ = std::make_unique<Impl>();
  Impl& im = *t->impl_;
  im.source = "HuggingFaceTokenizer file '" + file + "'";
  im.add_special_tokens = options.add_special_tokens;
  json root;
  try {
    root = json::parse(tokenizer_json);
  } catch (const json::exception& e) {
    throw UsageError(im.source + " is not valid JSON: " + e.what());
  }
  if (!root.is_object() || !root.contains("model") || !root["model"].is_object()) {
    throw UsageError(im.source + " has no \"model\" object (is it a HF tokenizers tokenizer.json?)");
  }
  try {
    im.parse_model(root["model"]);
    im.parse_added_tokens(root.value("added_tokens", json()));
    im.parse_normalizer(root.value("normalizer", json()));
    im.parse_pre_tokenizer(root.value("pre_tokenizer", json()));
    im.parse_post_processor(root.value("post_processor", json()));
    im.parse_decoder(root.value("decoder", json()));
  } catch (const json::exception& e) {
    // A field of an unexpected JSON type that no check above names.
    throw UsageError(im.source + ": unexpected JSON structure (" + e.what() + ")");
  }
  im.check_consistency();
  // len(tokenizer): the model vocab together with the added tokens not already in it.
  im.vocab_size = static_cast<int64_t>(im.model->vocab().size());
  for (const auto& [content, id] : im.added_by_content) im.vocab_size += im.model->token_to_id(content) ? 0 : 1;

  std::optional<std::string> eos = options.eos_token;
  if (!eos && !config_json.empty()) eos = config_eos_token(config_json, "tokenizer_config.json");
  if (eos) {
    auto id = t->token_to_id(*eos);
    if (!id) throw UsageError(im.source + ": eos_token " + quote_text(*eos) + " is not in the vocabulary");
    im.eod = *id;
  }
  return t;
}

std::optional<TokenId> HuggingFaceTokenizer::token_to_id(std::string_view token) const {
  auto it = impl_->added_by_content.find(std::string(token));
  if (it != impl_->added_by_content.end()) return it->second;
  return impl_->model->token_to_id(token);
}

int64_t HuggingFaceTokenizer::vocab_size() const { return impl_->vocab_size; }
TokenId HuggingFaceTokenizer::eod() const { return impl_->eod; }

std::vector<TokenId> HuggingFaceTokenizer::tokenize(std::string_view raw) const {
  const Impl& im = *impl_;
  std::string fixed;
  std::string_view text = raw;
  if (!is_valid_utf8(raw)) {
    fixed = utf8_replace_invalid(raw);
    text = fixed;
  }
  std::vector<TokenId> ids(im.post_prefix);
  if (!im.add_special_tokens) ids.clear();
  // Added tokens first: leftmost-longest, non-overlapping (HF's AddedVocabulary).
  size_t seg_start = 0, i = 0;
  while (i < text.size()) {
    const auto& cands = im.added_by_first[static_cast<unsigned char>(text[i])];
    const AddedToken* hit = nullptr;
    for (size_t c : cands) {
      const std::string& s = im.added[c].content;
      if (text.compare(i, s.size(), s) == 0) {
        hit = &im.added[c];
        break;
      }
    }
    if (!hit) {
      ++i;
      continue;
    }
    size_t b = i, e = i + hit->content.size();
    if (hit->single_word) {
      size_t k = e;
      const bool before_ok = !is_word_char(char_before(text, b));
      const bool after_ok = e >= text.size() || !is_word_char(utf8_next(text, k));
      if (!before_ok || !after_ok) {
        i = e;
        continue;
      }
    }
    if (hit->lstrip) {
      while (b > seg_start && is_ws(char_before(text, b))) {
        --b;
        while (b > seg_start && (static_cast<unsigned char>(text[b]) & 0xC0) == 0x80) --b;
      }
    }
    if (hit->rstrip) {
      while (e < text.size()) {
        size_t k = e;
        if (!is_ws(utf8_next(text, k))) break;
        e = k;
      }
    }
    if (b > seg_start) im.encode_segment(text.substr(seg_start, b - seg_start), ids);
    ids.push_back(hit->id);
    seg_start = i = e;
  }
  if (seg_start < text.size()) im.encode_segment(text.substr(seg_start), ids);
  if (im.add_special_tokens) ids.insert(ids.end(), im.post_suffix.begin(), im.post_suffix.end());
  return ids;
}

std::string HuggingFaceTokenizer::detokenize(std::span<const TokenId> ids) const {
  const Impl& im = *impl_;
  if (!im.decoder_error.empty()) throw UsageError(im.decoder_error);
  std::vector<std::string> tokens;
  for (TokenId id : ids) {
    auto a = im.added_by_id.find(id);
    if (a != im.added_by_id.end()) {
      tokens.push_back(a->second);
      continue;
    }
    const std::string* t = im.model->id_to_token(id);
    if (!t) throw UsageError("HuggingFaceTokenizer: token id " + std::to_string(id) + " is not in the vocabulary");
    tokens.push_back(*t);
  }
  for (const DecodeStep& d : im.decoders) {
    std::vector<std::string> next;
    switch (d.kind) {
      case DecodeStep::kByteLevel: {
        std::string bytes;
        for (const auto& t : tokens) {
          std::string b;
          if (from_byte_level(t, b, /*strict=*/true)) bytes += b;
          else bytes += t;
        }
        next.push_back(utf8_replace_invalid(bytes));
        break;
      }
      case DecodeStep::kReplace:
        for (auto t : tokens) {
          std::string out;
          size_t prev = 0;
          for (size_t p = d.from.empty() ? std::string::npos : t.find(d.from); p != std::string::npos;
               p = t.find(d.from, p + d.from.size())) {
            out.append(t, prev, p - prev);
            out += d.to;
            prev = p + d.from.size();
          }
          out.append(t, prev, std::string::npos);
          next.push_back(std::move(out));
        }
        break;
      case DecodeStep::kByteFallback: {
        std::string pending;
        size_t pending_n = 0;
        auto flush = [&] {
          if (!pending_n) return;
          if (is_valid_utf8(pending)) next.push_back(pending);
          else for (size_t k = 0; k < pending_n; ++k) next.push_back("\xEF\xBF\xBD");
          pending.clear();
          pending_n = 0;
        };
        for (const auto& t : tokens) {
          unsigned v;
          if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' && std::sscanf(t.c_str() + 3, "%2x", &v) == 1) {
            pending.push_back(static_cast<char>(v));
            ++pending_n;
          } else {
            flush();
            next.push_back(t);
          }
        }
        flush();
        break;
      }
      case DecodeStep::kFuse: {
        std::string all;
        for (const auto& t : tokens) all += t;
        next.push_back(std::move(all));
        break;
      }
      case DecodeStep::kStrip:
        for (auto t : tokens) {
          size_t s = 0, e = t.size();
          for (size_t k = 0; k < d.start && t.compare(s, d.from.size(), d.from) == 0 && s < e; ++k) s += d.from.size();
          for (size_t k = 0; k < d.stop && e >= s + d.from.size() && t.compare(e - d.from.size(), d.from.size(), d.from) == 0; ++k) e -= d.from.size();
          next.push_back(t.substr(s, e - s));
        }
        break;
    }
    tokens.swap(next);
  }
  std::string out;
  for (const auto& t : tokens) out += t;
  return out;
}

}  // namespace laoyao::tokenizer
