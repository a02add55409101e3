// The chat-template renderer against Jinja2 itself, configured as transformers' apply_chat_template
// (tests/core/jinja_reference.py, Debian's python3-jinja2): every case renders to the same text, or
// fails on both sides. Cases: the language features chat templates use, and random conversations
// through the real Llama 3 and Qwen3 templates (tool calls, reasoning, Unicode, whitespace).
#include "core/jinja.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <unistd.h>

namespace {

using nlohmann::ordered_json;
using laoyao::jinja::Template;
using laoyao::jinja::TemplateError;

struct Case {
  std::string tmpl;
  ordered_json vars = ordered_json::object();
};

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string vocab_dir() {
  const char* env = std::getenv("LAOYAO_TEST_VOCABS");
  return env && *env ? std::string(env) : std::string(LAOYAO_SOURCE_DIR) + "/build/test-vocabs";
}

// Renders every case with Jinja2: {"output": ...} or {"error": ...} per case.
ordered_json reference(const std::vector<Case>& cases, const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("laoyao_jinja_" + name + "_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  ordered_json in = ordered_json::array();
  for (const auto& c : cases) in.push_back({{"template", c.tmpl}, {"variables", c.vars}});
  std::ofstream(dir / "cases.json") << in.dump();
  const std::string cmd = "python3 " + std::string(LAOYAO_SOURCE_DIR) + "/tests/core/jinja_reference.py " +
                          (dir / "cases.json").string() + " " + (dir / "out.json").string() + " 2>&1";
  const int rc = std::system(cmd.c_str());
  EXPECT_EQ(rc, 0) << cmd << " (python3 with jinja2: Debian's python3-jinja2, which scripts/setup.sh installs)";
  ordered_json out = ordered_json::parse(slurp((dir / "out.json").string()));
  std::filesystem::remove_all(dir);
  return out;
}

void expect_same_as_jinja2(const std::vector<Case>& cases, const std::string& name) {
  const ordered_json want = reference(cases, name);
  ASSERT_EQ(want.size(), cases.size());
  int rendered = 0;
  for (size_t k = 0; k < cases.size(); ++k) {
    SCOPED_TRACE("case " + std::to_string(k) + ": " + cases[k].tmpl.substr(0, 300) + "\nvariables: " +
                 cases[k].vars.dump().substr(0, 600));
    std::string got, error;
    try {
      const Template t(cases[k].tmpl);
      laoyao::jinja::Value vars = laoyao::jinja::from_json_text(cases[k].vars.dump());
      got = t.render(*vars.dict);
    } catch (const TemplateError& e) {
      error = e.what();
    }
    if (want[k].contains("error")) {
      EXPECT_FALSE(error.empty()) << "Jinja2 failed (" << want[k]["error"].get<std::string>() << "); we rendered:\n"
                                  << got;
    } else {
      EXPECT_TRUE(error.empty()) << error;
      EXPECT_EQ(got, want[k]["output"].get<std::string>());
      ++rendered;
    }
  }
  EXPECT_GT(rendered, static_cast<int>(cases.size()) / 2) << "most cases should render";
}

TEST(Jinja, LanguageFeaturesRenderAsJinja2Does) {
  const ordered_json msgs = ordered_json::parse(
      R"([{"role": "system", "content": " sys "}, {"role": "user", "content": "hi\nthere"},
          {"role": "assistant", "content": "<think>\nr\n</think>\n\nok", "extra": null}])");
  const ordered_json v = {{"messages", msgs}, {"n", 7}, {"x", 2.5}, {"s", "a,b,,c"}, {"flag", true}, {"none", nullptr},
                          {"d", {{"b", 1}, {"a", {1, 2.0, "x"}}}}, {"u", "héllo 你好"}};
  const std::vector<std::string> templates = {
      // whitespace control: trim_blocks, lstrip_blocks, '-', '+', comments
      "a\n  {% if flag %}\n  yes\n  {% endif %}\nb",
      "a  {%- if flag -%}  yes  {%- endif -%}  b",
      "  {%+ if flag %}kept{% endif %}",
      "x {# note #}\n y\n  {#- gone -#}  z",
      "{{ 'v' }}\n{{ 'w' }}  \n",
      "line\n    {% for m in messages %}\n    {{ m.role }}\n    {% endfor %}\nend\n",
      "{% raw %}{{ not rendered }}{% endraw %}",
      // expressions
      "{{ n + 1 }} {{ n - 10 }} {{ n * 2 }} {{ n / 2 }} {{ n // 2 }} {{ -n // 2 }} {{ n % 3 }} {{ -n % 3 }} {{ 2 ** 10 }}",
      "{{ x }} {{ x * 2 }} {{ 1e-5 }} {{ 0.1 + 0.2 }} {{ 1e16 }} {{ 123456789.0 }} {{ 3.0 }}",
      "{{ 0.0001 }} {{ 0.00012 }} {{ 0.000015 }} {{ 1e15 }} {{ 1.5e16 }} {{ -0.0 }} {{ 2.5e-300 }} {{ [0.0001] | tojson }}",
      "{{ 'a' ~ n ~ none ~ flag }} {{ 'a' + 'b' }} {{ [1] + [2] }} {{ 'ab' * 3 }}",
      "{{ none }} {{ flag }} {{ d }} {{ messages[0] }} {{ [1, 'a', none, true, 2.5] }} {{ (1, 2) }}",
      "{{ undefined_name }}|{{ d.missing }}|{{ d['a'][1] }}|{{ d.a.0 }}|{{ messages[-1].role }}",
      "{{ s[1:4] }} {{ s[::-1] }} {{ s[-2:] }} {{ messages[1:] | length }} {{ u[1:3] }} {{ u | length }}",
      "{{ 1 if flag else 2 }} {{ 'yes' if none }} {{ 'a' if not flag else 'b' if n > 3 else 'c' }}",
      "{{ 1 < 2 and 'x' or 'y' }} {{ none or 'dflt' }} {{ 0 and 1 }} {{ 'b' in 'abc' }} {{ 3 not in [1, 2] }} "
      "{{ 'a' in d }}",
      "{{ n == 7.0 }} {{ 'a' != 'b' }} {{ [1, 2] == [1, 2] }} {{ 'b' > 'a' }} {{ 2 >= 2 }}",
      // tests
      "{{ x is defined }} {{ y is defined }} {{ y is not defined }} {{ none is none }} {{ s is string }} "
      "{{ n is number }} {{ d is mapping }} {{ messages is iterable }} {{ n is odd }} {{ n is divisibleby 7 }} "
      "{{ 'abc' is lower }} {{ flag is true }} {{ x is integer }} {{ n is equalto 7 }}",
      // filters
      "{{ '  pad  ' | trim }}|{{ 'xxaxx' | trim('x') }}|{{ messages | length }}|{{ s | upper }}|{{ 'AbC' | lower }}",
      "{{ d | tojson }}|{{ msgs_json }}{{ messages | tojson }}|{{ d | tojson(indent=2) }}|{{ u | tojson }}|"
      "{{ 'q\"\\\\\\n\\t' | tojson }}|{{ x | tojson }}|{{ 1e-7 | tojson }}",
      "{{ none | default('z') }}|{{ y | default('z') }}|{{ '' | default('z', true) }}|{{ y | d('w') }}",
      "{{ [3, 1, 2] | first }}{{ [3, 1, 2] | last }}{{ [3, 1, 2] | join('-') }}{{ [3, 1, 2] | sum }}"
      "{{ [3, 1, 2] | min }}{{ [3, 1, 2] | max }}{{ 'abc' | list }}{{ [1, 1, 2] | unique | list }}",
      "{{ '12' | int + 1 }} {{ '1.5' | float }} {{ -3 | abs }} {{ 2.567 | round(2) }} {{ 'hello world' | title }} "
      "{{ 'hello World' | capitalize }} {{ 'a-b' | replace('-', '+') }} {{ 'abc' | reverse }} {{ n | string }}",
      "{{ messages | selectattr('role', 'equalto', 'user') | list | length }}"
      "{{ messages | rejectattr('role', 'equalto', 'user') | map(attribute='role') | join(',') }}"
      "{{ messages | map(attribute='content') | select | list | length }}",
      "{% for k, v in d | dictsort %}{{ k }}={{ v }};{% endfor %}{% for k, v in d.items() %}{{ k }}{% endfor %}",
      "{{ 'a\nb\n\nc' | indent(2) }}|{{ 'a\nb' | indent(2, true) }}",
      // methods
      "{{ s.split(',') }} {{ '  a b  '.split() }} {{ s.split(',', 1) }} {{ 'x</think>y'.split('</think>')[-1] }}",
      "{{ ' \n x \n'.strip() }}|{{ '\n\nx'.lstrip('\n') }}|{{ 'x\n\n'.rstrip('\n') }}|{{ s.startswith('a,') }}"
      "{{ s.endswith(('q', 'c')) }}{{ s.replace(',', ';') }}{{ s.find('b') }}{{ s.count(',') }}{{ '-'.join(['a', 'b']) }}",
      "{{ d.get('b') }} {{ d.get('zz', 5) }} {{ d.get('zz') }} {{ d.keys() | list }} {{ d.values() | list | length }}",
      // loops
      "{% for m in messages %}{{ loop.index }}/{{ loop.length }}{{ '^' if loop.first }}{{ '$' if loop.last }}"
      "{{ loop.revindex0 }}{% if loop.previtem is defined %}<{{ loop.previtem.role }}{% endif %} {% endfor %}",
      "{% for m in messages if m.role != 'system' %}{{ loop.index0 }}{{ m.role }},{% endfor %}",
      "{% for m in messages %}{% if loop.index0 == 1 %}{% break %}{% endif %}{{ m.role }}{% endfor %}|"
      "{% for m in messages %}{% if m.role == 'user' %}{% continue %}{% endif %}{{ m.role }}{% endfor %}",
      "{% for m in [] %}x{% else %}empty{% endfor %}{% for c in 'ab' %}{{ c }}{% endfor %}"
      "{% for i in range(3) %}{{ i }}{% endfor %}{% for i in range(5, 1, -2) %}{{ i }}{% endfor %}",
      "{% for m in messages[::-1] %}{% set index = (messages | length - 1) - loop.index0 %}{{ index }}{% endfor %}",
      // scoping: set in a loop stays in the loop; namespaces carry out
      "{% set c = 1 %}{% for m in messages %}{% set c = c + 1 %}{{ c }}{% endfor %}{{ c }}",
      "{% set ns = namespace(found=false, i=0) %}{% for m in messages %}{% if m.role == 'user' %}"
      "{% set ns.found = true %}{% set ns.i = loop.index0 %}{% endif %}{% endfor %}{{ ns.found }}{{ ns.i }}",
      "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set t %}inner {{ n }}{% endset %}[{{ t }}]",
      "{% if n > 10 %}big{% elif n > 5 %}mid{% else %}small{% endif %}",
      "{{ messages[0]['content'] | trim + '|' }}{{ messages[2].extra is none }}{{ messages[2].extra is defined }}",
      "{% generation %}gen {{ n }}{% endgeneration %}",
      "{{ d.items() | list }} {{ (1,) }} {{ () }} {{ d | dictsort }} {{ 'it\'s' }} {{ ['it\'s', 'a\\b\n'] }}",
      "{%- for m in messages -%}\n  {{- m.role -}}\n  {%- if not loop.last %}, {% endif -%}\n{%- endfor %}\n",
      "\t{% if flag %}\t\n{% endif %}  {{ n }}\n  {% for i in range(2) %}{{ i }}\n  {% endfor %}",
      "{{ 'x' }}{# c #}\n{{ 'y' }}{#- c #}  \n {{ 'z' -}}\n\n w",
      // failures (both sides must refuse)
      "{{ raise_exception('bad role') }}",
      "{{ y.attr }}",
      "{{ 'a' + 1 }}",
      "{% for x in messages %}",
      "{{ n | nosuchfilter }}",
      "{% set d.key = 1 %}",
      "{% if %}{% endif %}",
  };
  std::vector<Case> cases;
  for (const auto& t : templates) cases.push_back({t, v});
  expect_same_as_jinja2(cases, "features");
}

// A random conversation as chat datasets hold them.
ordered_json random_conversation(std::mt19937& rng, bool qwen) {
  const std::vector<std::string> texts = {
      "Hello", " leading space", "trailing space ", "multi\nline\n", "unicode: héllo — 你好 🎉", "quote ' and \"",
      "<think>\nreasoning here\n</think>\n\nthe answer", "x</think>y", "", "{{ not a tag }} {% nor this %}",
      "tab\there", "<tool_response>r</tool_response>", "\n\nnewlines around\n\n", "What is 2+2?"};
  auto pick = [&] { return texts[rng() % texts.size()]; };
  ordered_json msgs = ordered_json::array();
  if (rng() % 2) msgs.push_back({{"role", "system"}, {"content", pick()}});
  const int turns = 1 + static_cast<int>(rng() % 4);
  for (int t = 0; t < turns; ++t) {
    msgs.push_back({{"role", "user"}, {"content", pick()}});
    ordered_json a = {{"role", "assistant"}, {"content", pick()}};
    if (qwen && rng() % 4 == 0) a["reasoning_content"] = pick();
    if (qwen && rng() % 3 == 0) {
      ordered_json call = {{"name", "get_weather"}, {"arguments", {{"city", "Paris"}, {"days", 3}, {"x", 1.5}}}};
      if (rng() % 2) call["arguments"] = "{\"city\": \"Oslo\"}";
      a["tool_calls"] = ordered_json::array({{{"type", "function"}, {"function", call}}});
      if (rng() % 2) a["tool_calls"].push_back({{"type", "function"}, {"function", {{"name", "f"}, {"arguments", ordered_json::object()}}}});
      msgs.push_back(a);
      const int tools = 1 + static_cast<int>(rng() % 2);
      for (int k = 0; k < tools; ++k) msgs.push_back({{"role", "tool"}, {"content", pick()}});
      msgs.push_back({{"role", "assistant"}, {"content", pick()}});
    } else {
      msgs.push_back(a);
    }
  }
  return msgs;
}

TEST(Jinja, RealChatTemplatesRenderAsJinja2Does) {
  std::mt19937 rng(20261205);
  std::vector<Case> cases;
  for (const char* model : {"llama3", "qwen3"}) {
    const auto cfg = ordered_json::parse(slurp(vocab_dir() + "/" + model + "/tokenizer_config.json"));
    ASSERT_TRUE(cfg.contains("chat_template")) << model;
    const std::string tmpl = cfg["chat_template"].get<std::string>();
    const bool qwen = std::string(model) == "qwen3";
    for (int k = 0; k < 60; ++k) {
      ordered_json vars = {{"messages", random_conversation(rng, qwen)},
                           {"add_generation_prompt", rng() % 2 == 0},
                           {"bos_token", "<|begin_of_text|>"},
                           {"eos_token", "<|im_end|>"},
                           {"tools", nullptr},
                           {"documents", nullptr}};
      if (qwen && rng() % 3 == 0)
        vars["tools"] = ordered_json::parse(
            R"([{"type": "function", "function": {"name": "get_weather", "description": "Weather.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])");
      if (qwen && rng() % 4 == 0) vars["enable_thinking"] = false;
      cases.push_back({tmpl, vars});
    }
  }
  expect_same_as_jinja2(cases, "real");
}

TEST(Jinja, RefusesWhatItDoesNotRenderByName) {
  for (const char* t : {"{% macro f() %}x{% endmacro %}", "{% include 'x' %}", "{% extends 'x' %}"}) {
    try {
      Template tmpl(t);
      ADD_FAILURE() << t << " was accepted";
    } catch (const TemplateError& e) {
      EXPECT_NE(std::string(e.what()).find("not supported"), std::string::npos) << e.what();
    }
  }
}

}  // namespace

namespace {

// A tokenizer's chat template is untrusted input: what would exhaust the stack, the memory or the
// time is refused with a TemplateError naming the bound.
TEST(Jinja, HostileTemplatesAreRefusedNotRun) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{{ " + std::string(1000, '(') + "1" + std::string(1000, ')') + " }}", "nested too deeply"},
      {"{{ " + std::string(1000, '-') + "1 }}", "nested too deeply"},
      {std::string(300 * 10, ' ').replace(0, 0, [] {
         std::string s;
         for (int k = 0; k < 300; ++k) s += "{% if true %}";
         return s;
       }()),
       "nested too deeply"},
      {"{{ range(1000000000) | length }}", "more than a million"},
      {"{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "steps"},
      {"{% set ns = namespace(s='a' * 60000000) %}{% for i in range(100000) %}{{ ns.s[1:2] }}{% endfor %}", "seconds"},
      {"{{ 'abc' * 1000000000 }}", "longer than"},
      {"{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", "longer than"},
      {"{% set ns = namespace(x=1) %}{% set ns.x = ns %}", "cannot hold a namespace"},
      {"{% set ns = namespace(x=1) %}{% for i in range(300) %}{% set ns.x = [ns.x] %}{% endfor %}", "nested too deeply"},
      {"{{ 9223372036854775807 + 1 }}", "integer overflow"},
      {"{{ 99999999999999999999 }}", "out of range"},
      {"{{ 2 ** 100 }}", "overflow"},
      {"{{ 7 is divisibleby 0 }}", "divisibleby 0"},
  };
  for (const auto& [tmpl, want] : cases) {
    SCOPED_TRACE(tmpl.substr(0, 120));
    try {
      const Template t(tmpl);
      t.render({});
      ADD_FAILURE() << "rendered";
    } catch (const TemplateError& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  }
}

}  // namespace
