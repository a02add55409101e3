#include "data/sft_chat.hpp"

#include <algorithm>
#include <functional>
#include <optional>
#include <tuple>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/error.hpp"

namespace laoyao::data {

namespace {

using jinja::Value;
using tokenizer::TokenId;
using Ids = std::vector<TokenId>;
using Kind = Value::Kind;

std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw UsageError("cannot read '" + p.string() + "'");
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A deep copy (rows are edited while normalising; their values share storage).
Value copy(const Value& v) {
  Value out = v;
  if (v.kind == Kind::List) {
    out.list = std::make_shared<jinja::List>();
    for (const auto& e : *v.list) out.list->push_back(copy(e));
  } else if (v.kind == Kind::Dict) {
    out.dict = std::make_shared<jinja::Dict>();
    for (const auto& [k, e] : *v.dict) out.dict->emplace_back(k, copy(e));
  }
  return out;
}

const Value* get(const Value& v, std::string_view key) {
  const Value* x = v.find(key);
  return x && x->kind != Kind::None ? x : nullptr;
}

size_t common_prefix(const Ids& a, const Ids& b) {
  size_t k = 0;
  while (k < a.size() && k < b.size() && a[k] == b[k]) ++k;
  return k;
}

// Bridge's find_token_span: the first [start, end) at or after `from` holding `pattern`.
std::pair<int64_t, int64_t> find_span(const Ids& ids, const Ids& pattern, int64_t from) {
  if (pattern.empty() || from >= static_cast<int64_t>(ids.size())) return {-1, -1};
  const int64_t last = static_cast<int64_t>(ids.size()) - static_cast<int64_t>(pattern.size());
  for (int64_t k = from; k <= last; ++k)
    if (std::equal(pattern.begin(), pattern.end(), ids.begin() + k)) return {k, k + static_cast<int64_t>(pattern.size())};
  return {-1, -1};
}

// Bridge's _trim_leading_token_sequences: skip whole sequences matching at the span's start.
int64_t trim_leading(const Ids& ids, int64_t start, int64_t end, const std::vector<Ids>& sequences) {
  int64_t k = start;
  while (k < end) {
    bool moved = false;
    for (const auto& s : sequences) {
      const int64_t e = k + static_cast<int64_t>(s.size());
      if (!s.empty() && e <= end && std::equal(s.begin(), s.end(), ids.begin() + k)) {
        k = e;
        moved = true;
        break;
      }
    }
    if (!moved) break;
  }
  return k;
}

// The template families Bridge's infer_assistant_mask_boundary_config recognises by marker strings
// in the template: (required markers, assistant start, assistant end, end fallbacks, other roles).
struct Family {
  std::vector<std::string> required;
  std::string assistant_start, assistant_end;
  std::vector<std::string> end_fallbacks;
  std::vector<std::pair<std::string, std::string>> other_starts;
};

std::vector<Family> families() {
  auto roles = [](const std::string& open, const std::string& close, std::vector<std::string> names) {
    std::vector<std::pair<std::string, std::string>> out;
    for (auto& n : names) out.emplace_back(n, open + n + close);
    return out;
  };
  return {
      {{"<|im_start|>assistant", "<|im_end|>"}, "<|im_start|>assistant\n", "<|im_end|>\n", {"<|im_end|>"},
       roles("<|im_start|>", "\n", {"system", "developer", "user", "tool"})},
      {{"<|im_assistant|>", "<|im_user|>", "<|im_system|>", "<|im_middle|>", "<|im_end|>"},
       "<|im_assistant|>assistant<|im_middle|>", "<|im_end|>", {},
       {{"system", "<|im_system|>system<|im_middle|>"}, {"user", "<|im_user|>user<|im_middle|>"}}},
      {{"<|turn>model", "<turn|>"}, "<|turn>model\n", "<turn|>", {"<|tool_response>"}, {}},
      {{"<start_of_turn>model", "<end_of_turn>"}, "<start_of_turn>model\n", "<end_of_turn>", {}, {}},
      {{"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"}, "<|start_header_id|>assistant<|end_header_id|>\n\n",
       "<|eot_id|>", {}, roles("<|start_header_id|>", "<|end_header_id|>\n\n", {"system", "developer", "user", "tool"})},
      {{"<|start|>", "<|channel|>", "<|message|>"}, "<|start|>assistant", "<|return|>", {"<|end|>", "<|call|>"},
       roles("<|start|>", "", {"system", "developer", "user", "tool"})},
      {{"]~!b[", "]~b]", "[e~[", "<mm:think>"}, "]~b]ai\n", "[e~[\n", {},
       {{"system", "]~!b[]~b]system\n"}, {"developer", "]~b]developer\n"}, {"user", "]~b]user\n"}, {"tool", "]~b]tool"}}},
  };
}

bool has_all(const std::string& text, const std::vector<std::string>& markers) {
  return std::all_of(markers.begin(), markers.end(), [&](const std::string& m) { return text.find(m) != std::string::npos; });
}

std::optional<ChatBoundaries> infer_boundaries(const std::string& tmpl, const SftTokenizer& tok) {
  // GLM-5.2: no token ends an assistant turn; the next role's start does.
  if (has_all(tmpl, {"<|assistant|>", "clear_thinking", "<think>"})) {
    ChatBoundaries b;
    b.rendered_turn_end = true;
    b.role_start = {{"assistant", tok.encode("<|assistant|>")},
                    {"system", tok.encode("<|system|>")},
                    {"user", tok.encode("<|user|>")},
                    {"tool", tok.encode("<|observation|>")}};
    for (const auto& [role, ids] : b.role_start)
      if (ids.empty()) throw UsageError("cannot tokenise the chat template's start marker of role '" + role + "'");
    return b;
  }
  for (const Family& f : families()) {
    if (!has_all(tmpl, f.required)) continue;
    ChatBoundaries b;
    const Ids start = tok.encode(f.assistant_start), end = tok.encode(f.assistant_end);
    for (const auto& e : f.end_fallbacks)
      if (Ids ids = tok.encode(e); !ids.empty()) b.role_end_variants.push_back(std::move(ids));
    if (start.empty() || end.empty()) continue;
    b.role_start.emplace_back("assistant", start);
    for (const auto& [role, marker] : f.other_starts)
      if (Ids ids = tok.encode(marker); !ids.empty()) b.role_start.emplace_back(role, std::move(ids));
    b.role_end = end;
    if (has_all(tmpl, {"truncate_history_thinking", "<think>", "</think>"})) {
      const Ids empty_think = tok.encode("<think></think>"), think_open = tok.encode("<think>\n");
      if (!empty_think.empty() && !think_open.empty()) b.trim_leading = {empty_think, think_open};
    }
    return b;
  }
  return std::nullopt;
}

}  // namespace

const std::vector<TokenId>* ChatBoundaries::start_of(const std::string& role) const {
  for (const auto& [r, ids] : role_start)
    if (r == role) return &ids;
  return nullptr;
}

ChatLossMode parse_chat_loss_mode(const std::string& s) {
  if (s == "assistant") return ChatLossMode::Assistant;
  if (s == "last_turn") return ChatLossMode::LastTurn;
  if (s == "full") return ChatLossMode::Full;
  throw UsageError("bad chat loss_mode '" + s + "': choose from assistant, last_turn, full");
}

ChatTemplate load_chat_template(const std::string& tokenizer_path, const std::string& override_text) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::is_directory(tokenizer_path) ? fs::path(tokenizer_path) : fs::path(tokenizer_path).parent_path();
  ChatTemplate t;
  nlohmann::ordered_json cfg = nlohmann::ordered_json::object();
  if (fs::exists(dir / "tokenizer_config.json")) {
    try {
      cfg = nlohmann::ordered_json::parse(read_text(dir / "tokenizer_config.json"));
    } catch (const nlohmann::json::exception& e) {
      throw UsageError("'" + (dir / "tokenizer_config.json").string() + "' is not JSON: " + e.what());
    }
  }
  // transformers' special_tokens_map: the named tokens the config sets, as their strings.
  for (const char* name : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}) {
    if (!cfg.is_object() || !cfg.contains(name)) continue;
    const auto& v = cfg[name];
    if (v.is_string()) t.special_tokens.emplace_back(name, Value::string(v.get<std::string>()));
    else if (v.is_object() && v.contains("content") && v["content"].is_string())
      t.special_tokens.emplace_back(name, Value::string(v["content"].get<std::string>()));
  }
  if (!override_text.empty()) {
    t.source = override_text;
  } else if (fs::exists(dir / "chat_template.jinja")) {
    t.source = read_text(dir / "chat_template.jinja");
  } else if (cfg.is_object() && cfg.contains("chat_template")) {
    const auto& c = cfg["chat_template"];
    if (c.is_string()) t.source = c.get<std::string>();
    else if (c.is_array())
      for (const auto& e : c)
        if (e.is_object() && e.value("name", "") == "default" && e.contains("template") && e["template"].is_string())
          t.source = e["template"].get<std::string>();
  }
  if (t.source.empty())
    throw UsageError("the tokenizer at '" + dir.string() +
                     "' has no chat template (tokenizer_config.json's chat_template or chat_template.jinja), which "
                     "chat rows need: give one as tokenizer.chat_template or tokenizer.chat_template_path");
  return t;
}

ChatTokenizer::ChatTokenizer(std::shared_ptr<const SftTokenizer> tok, const ChatTemplate& tmpl, ChatLossMode mode)
    : tok_(std::move(tok)), template_(std::make_shared<jinja::Template>(tmpl.source)), special_(tmpl.special_tokens), mode_(mode) {
  if (mode_ == ChatLossMode::Full) return;
  boundaries_ = infer_boundaries(tmpl.source, *tok_);
  if (!boundaries_) {
    const bool generation = tmpl.source.find("generation") != std::string::npos &&
                            tmpl.source.find("endgeneration") != std::string::npos;
    throw UsageError(std::string("the chat template ") +
                     (generation ? "marks assistant tokens with {% generation %} blocks only, which laoyao does not read yet"
                                 : "is of no family whose assistant boundaries Megatron-Bridge infers") +
                     " (ChatML/Qwen <|im_start|>, Llama 3 <|start_header_id|>, Gemma <start_of_turn>, Kimi, gpt-oss, "
                     "GLM-5.2); dataset.preprocessing's loss_mode: full needs no boundaries");
  }
}

Value ChatTokenizer::normalize(const Value& row) {
  if (row.kind != Kind::Dict) throw UsageError("a chat row must be a JSON object");
  const Value* conv = get(row, "messages");
  if (!conv) conv = get(row, "conversation");
  if (!conv) conv = get(row, "conversations");
  if (!conv) throw UsageError("a chat row needs \"messages\", \"conversation\" or \"conversations\"");
  if (conv->kind != Kind::List) throw UsageError("a chat conversation must be a list of message objects");
  Value out = Value::make_list();
  for (const auto& raw : *conv->list) {
    if (raw.kind != Kind::Dict) throw UsageError("chat turns must be JSON objects");
    Value turn = copy(raw);
    if (turn.find("role") && turn.find("content")) {
      if (turn.find("content")->kind == Kind::None) turn.set("content", Value::string(""));
      // Assistant tool calls' JSON-string arguments become objects, as the templates expect.
      const Value* role = turn.find("role");
      const Value* calls = turn.find("tool_calls");
      if (role->kind == Kind::String && role->s == "assistant" && calls && calls->kind == Kind::List)
        for (auto& call : *calls->list) {
          if (call.kind != Kind::Dict) continue;
          const Value* fn = call.find("function");
          if (!fn || fn->kind != Kind::Dict) continue;
          const Value* args = fn->find("arguments");
          if (!args || args->kind != Kind::String) continue;
          Value parsed;
          try {
            parsed = jinja::from_json_text(args->s);
          } catch (const UsageError&) {
            throw UsageError("an assistant tool call's function.arguments must be valid JSON");
          }
          if (parsed.kind != Kind::Dict) throw UsageError("an assistant tool call's function.arguments must be a JSON object");
          Value f = *fn;
          f.set("arguments", parsed);
        }
      out.list->push_back(std::move(turn));
      continue;
    }
    if (turn.find("from") && turn.find("value")) {
      std::string role = jinja::to_str(*turn.find("from"));
      for (char& c : role) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      if (role == "human") role = "user";
      if (role == "gpt") role = "assistant";
      out.list->push_back(Value::make_dict({{"role", Value::string(role)}, {"content", *turn.find("value")}}));
      continue;
    }
    throw UsageError("chat turns need role/content (or ShareGPT's from/value) fields");
  }
  const Value* system = row.find("system");
  if (system && system->kind != Kind::None && !(system->kind == Kind::String && system->s.empty())) {
    const bool has_system = std::any_of(out.list->begin(), out.list->end(), [](const Value& t) {
      const Value* r = t.find("role");
      return r && r->kind == Kind::String && r->s == "system";
    });
    if (!has_system)
      out.list->insert(out.list->begin(), Value::make_dict({{"role", Value::string("system")}, {"content", *system}}));
  }
  return out;
}

// transformers' apply_chat_template(conversation, tools=..., add_generation_prompt=False) with the
// tokenizer's special tokens and the row's chat_template_kwargs (Bridge's
// chat_template_kwargs_from_example: none of the pipeline's own arguments).
std::string ChatTokenizer::render(const Value& conversation, const Value& row) const {
  jinja::Dict vars = special_;
  auto put = [&](const std::string& k, Value v) {
    for (auto& [n, x] : vars)
      if (n == k) return void(x = std::move(v));
    vars.emplace_back(k, std::move(v));
  };
  put("messages", conversation);
  put("tools", Value::none());
  put("documents", Value::none());
  put("add_generation_prompt", Value::boolean(false));
  if (const Value* kw = get(row, "chat_template_kwargs")) {
    if (kw->kind != Kind::Dict) throw UsageError("chat_template_kwargs must be a JSON object");
    static const std::set<std::string> controlled = {"add_generation_prompt", "chat_template", "continue_final_message",
                                                     "max_length", "padding", "return_assistant_tokens_mask",
                                                     "return_dict", "return_tensors", "tokenize", "tools", "truncation"};
    for (const auto& [k, v] : *kw->dict) {
      if (controlled.count(k)) throw UsageError("chat_template_kwargs cannot override the pipeline's argument " + k);
      put(k, v);
    }
  }
  if (const Value* tools = get(row, "tools")) put("tools", *tools);
  return template_->render(vars);
}

std::vector<TokenId> ChatTokenizer::render_ids(const Value& conversation, const Value& row) const {
  return tok_->encode(render(conversation, row));
}

namespace {
Value prefix(const Value& conversation, size_t n) {
  return Value::make_list(jinja::List(conversation.list->begin(), conversation.list->begin() + static_cast<std::ptrdiff_t>(n)));
}
std::string role_of(const Value& turn) {
  const Value* r = turn.find("role");
  return r && r->kind == Kind::String ? r->s : "";
}
}  // namespace

// Bridge's build_assistant_loss_mask with a boundary config and no {% generation %} mask: each
// assistant turn located by rendering the conversation before and through it
// (_assistant_mask_from_conversation_turns); where that fails and no message holds a boundary
// marker, a scan of the rendered ids for role markers (_assistant_mask_from_boundary_config).
std::vector<uint8_t> ChatTokenizer::assistant_mask(const Value& conversation, const Value& row, const Ids& ids) const {
  const ChatBoundaries& b = *boundaries_;
  const int64_t n = static_cast<int64_t>(ids.size());
  std::vector<Ids> end_patterns;
  if (!b.role_end.empty()) end_patterns.push_back(b.role_end);
  for (const auto& v : b.role_end_variants) end_patterns.push_back(v);
  const std::vector<Value>& turns = *conversation.list;

  // Whether any message (or template argument) holds a boundary marker's tokens: then a raw scan
  // could mistake content for structure, and Bridge does not scan.
  auto payload_has_markers = [&]() {
    std::vector<const Ids*> patterns;
    for (const auto& [r, s] : b.role_start) patterns.push_back(&s);
    for (const auto& p : end_patterns) patterns.push_back(&p);
    std::function<bool(const Value&)> scan = [&](const Value& v) -> bool {
      if (v.kind == Kind::String) {
        const Ids t = tok_->encode(v.s);
        return std::any_of(patterns.begin(), patterns.end(), [&](const Ids* p) { return find_span(t, *p, 0).first >= 0; });
      }
      if (v.kind == Kind::List) return std::any_of(v.list->begin(), v.list->end(), scan);
      if (v.kind == Kind::Dict)
        return std::any_of(v.dict->begin(), v.dict->end(), [&](const auto& e) { return scan(e.second); });
      return false;
    };
    for (const auto& t : turns)
      for (const auto& [k, v] : *t.dict)
        if (k != "role" && scan(v)) return true;
    if (const Value* kw = get(row, "chat_template_kwargs"); kw && scan(*kw)) return true;
    if (const Value* tools = get(row, "tools"); tools && scan(*tools)) return true;
    return false;
  };

  auto from_turns = [&]() -> std::optional<std::vector<uint8_t>> {
    std::vector<uint8_t> mask(ids.size(), 0);
    bool any = false;
    for (size_t t = 0; t < turns.size(); ++t) {
      if (role_of(turns[t]) != "assistant") continue;
      any = true;
      const Ids* start = b.start_of("assistant");
      if (!start || (end_patterns.empty() && !b.rendered_turn_end)) return std::nullopt;
      const Ids before = t > 0 ? render_ids(prefix(conversation, t), row) : Ids{};
      const Ids through = t + 1 == turns.size() ? ids : render_ids(prefix(conversation, t + 1), row);
      const int64_t search = static_cast<int64_t>(common_prefix(before, ids));
      const int64_t limit = static_cast<int64_t>(common_prefix(through, ids));
      if (search >= limit) return std::nullopt;
      auto [role_start, content_start] = find_span(ids, *start, search);
      if (role_start < 0) {
        // A tool template may continue the model's turn after a tool response without a header.
        if (t == 0 || role_of(turns[t - 1]) != "tool") return std::nullopt;
        role_start = content_start = search;
      }
      if (content_start > limit) return std::nullopt;
      int64_t content_end = 0, after_end = 0;
      if (b.rendered_turn_end) {
        content_end = after_end = limit;
        if (t + 1 < turns.size()) {  // the turn ends where the next role's marker starts
          if (payload_has_markers()) return std::nullopt;
          const Ids* next = b.start_of(role_of(turns[t + 1]));
          const int64_t at = next ? find_span(ids, *next, content_start).first : -1;
          if (at < 0) return std::nullopt;
          content_end = after_end = at;
        }
      } else {
        // The last end marker inside the turn (ties: the primary pattern).
        bool found = false;
        std::tuple<int64_t, int64_t, int64_t> best{-1, 0, 0};
        for (size_t p = 0; p < end_patterns.size(); ++p) {
          int64_t from = content_start;
          while (from < limit) {
            const auto [e0, e1] = find_span(ids, end_patterns[p], from);
            if (e0 < 0 || e1 > limit) break;
            const std::tuple<int64_t, int64_t, int64_t> cand{e0, -static_cast<int64_t>(p), e1};
            if (!found || cand > best) best = cand;
            found = true;
            from = e0 + 1;
          }
        }
        if (!found) return std::nullopt;
        content_end = std::get<0>(best);
        after_end = std::get<2>(best);
      }
      const int64_t loss_start = trim_leading(ids, content_start, content_end, b.trim_leading);
      for (int64_t k = loss_start; k < content_end; ++k) mask[static_cast<size_t>(k)] = 1;
      if (!b.rendered_turn_end)
        for (int64_t k = content_end; k < after_end; ++k) mask[static_cast<size_t>(k)] = 1;
    }
    if (!any) return std::nullopt;
    return mask;
  };

  auto from_scan = [&]() -> std::optional<std::vector<uint8_t>> {
    struct Marker {
      int64_t at;
      std::string role;
      int64_t len;
    };
    std::vector<Marker> markers;
    for (const auto& [role, s] : b.role_start) {
      int64_t from = 0;
      while (from < n) {
        const auto [a, e] = find_span(ids, s, from);
        if (a < 0) break;
        markers.push_back({a, role, static_cast<int64_t>(s.size())});
        from = e;
      }
    }
    if (markers.empty()) return std::nullopt;
    std::stable_sort(markers.begin(), markers.end(),
                     [](const Marker& x, const Marker& y) { return x.at != y.at ? x.at < y.at : x.len > y.len; });
    std::vector<Marker> kept;
    for (const auto& m : markers)
      if (kept.empty() || kept.back().at != m.at) kept.push_back(m);
    std::vector<std::string> expected, observed;
    for (const auto& t : turns)
      if (role_of(t) == "assistant") expected.push_back("assistant");
    for (const auto& m : kept)
      if (m.role == "assistant") observed.push_back("assistant");
    if (expected != observed) return std::nullopt;
    std::vector<uint8_t> mask(ids.size(), 0);
    bool found = false;
    for (size_t k = 0; k < kept.size(); ++k) {
      if (kept[k].role != "assistant") continue;
      const int64_t content_start = kept[k].at + kept[k].len;
      const int64_t next = k + 1 < kept.size() ? kept[k + 1].at : n;
      std::vector<std::tuple<int64_t, int64_t, int64_t>> ends;
      for (size_t p = 0; p < end_patterns.size(); ++p) {
        int64_t from = content_start;
        while (from < next) {
          const auto [e0, e1] = find_span(ids, end_patterns[p], from);
          if (e0 < 0 || e1 > next) break;
          ends.emplace_back(e0, static_cast<int64_t>(p), e1);
          from = e0 + 1;
        }
      }
      if (ends.empty()) continue;
      std::set<int64_t> distinct;
      for (const auto& e : ends) distinct.insert(std::get<0>(e));
      if (distinct.size() != 1) return std::nullopt;
      const auto [e0, prio, e1] = *std::min_element(ends.begin(), ends.end());
      found = true;
      const int64_t s = trim_leading(ids, content_start, e0, b.trim_leading);
      for (int64_t j = s; j < e0; ++j) mask[static_cast<size_t>(j)] = 1;
      for (int64_t j = e0; j < e1; ++j) mask[static_cast<size_t>(j)] = 1;
    }
    if (!found) return std::nullopt;
    return mask;
  };

  if (auto m = from_turns()) return *m;
  if (!b.rendered_turn_end && !payload_has_markers())
    if (auto m = from_scan()) return *m;
  throw UsageError("the chat template's assistant boundaries match no assistant turn of this row");
}

SftExample ChatTokenizer::tokenize(const Value& row) const {
  const Value conversation = normalize(row);
  SftExample ex;
  ex.input_ids = render_ids(conversation, row);
  const auto& turns = *conversation.list;
  std::vector<uint8_t> mask;
  if (mode_ == ChatLossMode::Full) {
    mask.assign(ex.input_ids.size(), 1);
  } else {
    mask = assistant_mask(conversation, row, ex.input_ids);
    if (mode_ == ChatLossMode::LastTurn) {
      // Bridge: tokens from the final assistant turn on (its start found by rendering the turns
      // before it), else the last contiguous assistant span.
      std::optional<int64_t> start;
      int64_t last = -1;
      for (size_t t = 0; t < turns.size(); ++t)
        if (role_of(turns[t]) == "assistant") last = static_cast<int64_t>(t);
      if (last == 0) start = 0;
      else if (last > 0)
        start = static_cast<int64_t>(common_prefix(render_ids(prefix(conversation, static_cast<size_t>(last)), row), ex.input_ids));
      std::optional<int64_t> first_masked;
      if (start)
        for (int64_t k = *start; k < static_cast<int64_t>(mask.size()); ++k)
          if (mask[static_cast<size_t>(k)]) {
            first_masked = k;
            break;
          }
      if (!first_masked) {
        for (int64_t k = static_cast<int64_t>(mask.size()) - 1; k >= 0; --k)
          if (mask[static_cast<size_t>(k)] && (k == 0 || !mask[static_cast<size_t>(k - 1)])) {
            first_masked = k;
            break;
          }
      }
      if (first_masked)
        std::fill(mask.begin(), mask.begin() + *first_masked, uint8_t{0});
    }
  }
  const Ids skipped = tok_->skipped_ids();
  const std::set<TokenId> never(skipped.begin(), skipped.end());
  for (size_t k = 0; k < mask.size(); ++k)
    if (never.count(ex.input_ids[k])) mask[k] = 0;
  ex.loss_mask = std::move(mask);
  if (ex.input_ids.size() < 2) throw UsageError("a chat row renders to fewer than two tokens (nothing to predict)");
  return ex;
}

std::vector<SftExample> read_chat_jsonl(const std::string& path, const ChatTokenizer& chat) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError("cannot read fine-tuning data '" + path + "'");
  std::vector<SftExample> out;
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(number);
    try {
      out.push_back(chat.tokenize(jinja::from_json_text(line)));
    } catch (const UsageError& e) {
      throw UsageError(where + ": " + e.what());
    }
  }
  if (out.empty()) throw UsageError("fine-tuning data '" + path + "' holds no examples");
  return out;
}

}  // namespace laoyao::data
