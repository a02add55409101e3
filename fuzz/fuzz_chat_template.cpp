// Fuzzes the chat-template renderer (core/jinja): a tokenizer folder's chat template is untrusted
// text. The input is a template, optionally followed by a JSON conversation; the template is
// parsed and rendered over it (or over a fixed one) with transformers' variables. A template may
// render or be refused (TemplateError); a crash, a hang, unbounded memory or another exception is a
// finding.
#include <cstddef>
#include <cstdint>

#include "core/jinja.hpp"
#include "fuzz/fuzz_util.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace laoyao;
  const auto parts = fuzz::split_parts(data, size, 2);
  fuzz::expect_clean([&] {
    const jinja::Template t(parts[0]);
    jinja::Value messages = jinja::from_json_text(
        R"([{"role": "system", "content": "S"}, {"role": "user", "content": "Q <|im_end|>"},
            {"role": "assistant", "content": "<think>\nr\n</think>\n\nA", "tool_calls": [{"type": "function",
             "function": {"name": "f", "arguments": {"x": 1.5, "y": [true, null]}}}]},
            {"role": "tool", "content": "R"}])");
    if (!parts[1].empty()) messages = jinja::from_json_text(parts[1]);
    jinja::Dict vars = {{"messages", messages},
                        {"add_generation_prompt", jinja::Value::boolean(true)},
                        {"bos_token", jinja::Value::string("<s>")},
                        {"eos_token", jinja::Value::string("</s>")},
                        {"tools", jinja::Value::none()}};
    (void)t.render(vars);
  });
  return 0;
}
