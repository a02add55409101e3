// Chat rows tokenised as Megatron-Bridge's tokenize_chat_example does with the real Llama 3 and
// Qwen3 tokenizers and their own chat templates: the loss on each assistant turn's content and its
// end marker (ChatML's "<|im_end|>\n", Llama 3's "<|eot_id|>"), never on headers, system, user or
// tool turns; last_turn and full modes; ShareGPT rows and JSON-string tool arguments normalised;
// message text that imitates a marker kept out of the loss; bad rows named by line.
#include "data/sft_chat.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "core/error.hpp"
#include "data/tokenizer/hf_tokenizer.hpp"

using namespace laoyao;
using namespace laoyao::data;
using tokenizer::TokenId;

namespace {

std::string vocab(const std::string& model) {
  const char* env = std::getenv("LAOYAO_TEST_VOCABS");
  return (env && *env ? std::string(env) : std::string(LAOYAO_SOURCE_DIR) + "/build/test-vocabs") + "/" + model;
}

struct Model {
  std::shared_ptr<const SftTokenizer> sft;
  std::unique_ptr<tokenizer::HuggingFaceTokenizer> hf;  // to read the masked tokens back as text
  ChatTemplate tmpl;
  explicit Model(const std::string& name)
      : sft(hf_sft_tokenizer(vocab(name))),
        hf(std::make_unique<tokenizer::HuggingFaceTokenizer>(vocab(name), tokenizer::HuggingFaceTokenizerOptions{{}, false})),
        tmpl(load_chat_template(vocab(name))) {}
  // The text of the tokens the mask keeps, each maximal run ended with "|".
  std::string masked(const SftExample& ex) const {
    std::string out;
    std::vector<TokenId> run;
    for (size_t k = 0; k <= ex.input_ids.size(); ++k) {
      if (k < ex.input_ids.size() && ex.loss_mask[k]) {
        run.push_back(ex.input_ids[k]);
      } else if (!run.empty()) {
        out += hf->detokenize(run) + "|";
        run.clear();
      }
    }
    return out;
  }
  std::string text(const SftExample& ex) const { return hf->detokenize(ex.input_ids); }
};

jinja::Value row(const std::string& json) { return jinja::from_json_text(json); }

// Meta-Llama-3-8B-Instruct's chat template. (The base model's, in build/test-vocabs/llama3, appends
// the assistant header whatever add_generation_prompt says, so a rendered prefix never ends where
// the full conversation's next turn starts: Bridge's boundary search fails on it, and so does ours.)
const char* kLlama3Instruct =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
    "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

ChatTemplate llama3_instruct(const ChatTemplate& base) {
  ChatTemplate t = base;
  t.source = kLlama3Instruct;
  return t;
}

const char* kTwoTurns = R"({"messages": [
  {"role": "system", "content": "Be brief."},
  {"role": "user", "content": "Capital of France?"},
  {"role": "assistant", "content": "Paris."},
  {"role": "user", "content": "And of Italy?"},
  {"role": "assistant", "content": "Rome."}]})";

TEST(SftChat, Llama3LossIsTheAssistantContentAndItsEndOfTurn) {
  const Model m("llama3");
  const ChatTemplate tmpl = llama3_instruct(m.tmpl);
  const ChatTokenizer chat(m.sft, tmpl, ChatLossMode::Assistant);
  const SftExample ex = chat.tokenize(row(kTwoTurns));
  // The template renders what transformers renders (BOS from the template, no generation prompt
  // after the last turn: Bridge passes add_generation_prompt=False).
  EXPECT_EQ(m.text(ex),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nCapital of France?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nParis.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nAnd of Italy?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nRome.<|eot_id|>");
  EXPECT_EQ(ex.input_ids.front(), 128000);
  EXPECT_EQ(m.masked(ex), "Paris.<|eot_id|>|Rome.<|eot_id|>|");
  EXPECT_EQ(m.masked(ChatTokenizer(m.sft, tmpl, ChatLossMode::LastTurn).tokenize(row(kTwoTurns))), "Rome.<|eot_id|>|");
  // full: every token but Bridge's PAD_TOKENS (BOS and the header tokens).
  const SftExample full = ChatTokenizer(m.sft, tmpl, ChatLossMode::Full).tokenize(row(kTwoTurns));
  ASSERT_EQ(full.input_ids, ex.input_ids);
  for (size_t k = 0; k < full.input_ids.size(); ++k) {
    const TokenId t = full.input_ids[k];
    EXPECT_EQ(full.loss_mask[k], t == 128000 || t == 128006 || t == 128007 ? 0 : 1) << k;
  }
  // The base model's template: no assistant turn can be located, as in Bridge (a ValueError there).
  EXPECT_THROW(ChatTokenizer(m.sft, m.tmpl, ChatLossMode::Assistant).tokenize(row(kTwoTurns)), UsageError);
}

TEST(SftChat, Qwen3LossIsTheAssistantContentAndItsImEndLine) {
  const Model m("qwen3");
  const ChatTokenizer chat(m.sft, m.tmpl, ChatLossMode::Assistant);
  const SftExample ex = chat.tokenize(row(kTwoTurns));
  EXPECT_EQ(m.text(ex),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nCapital of France?<|im_end|>\n"
            "<|im_start|>assistant\nParis.<|im_end|>\n<|im_start|>user\nAnd of Italy?<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\nRome.<|im_end|>\n");
  // The template's empty think block of the last turn is the assistant's (Qwen3's template has no
  // truncate_history_thinking, so Bridge trims nothing); the end marker and its newline are in.
  EXPECT_EQ(m.masked(ex), "Paris.<|im_end|>\n|<think>\n\n</think>\n\nRome.<|im_end|>\n|");
  EXPECT_EQ(m.masked(ChatTokenizer(m.sft, m.tmpl, ChatLossMode::LastTurn).tokenize(row(kTwoTurns))),
            "<think>\n\n</think>\n\nRome.<|im_end|>\n|");
}

TEST(SftChat, ToolTurnsAndReasoningStayOutOfTheLoss) {
  const Model m("qwen3");
  const ChatTokenizer chat(m.sft, m.tmpl, ChatLossMode::Assistant);
  const char* with_string_args = R"({"messages": [
    {"role": "user", "content": "Weather in Oslo?"},
    {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
    {"role": "tool", "content": "-3C"},
    {"role": "assistant", "content": "It is -3C.", "reasoning_content": "The tool said -3C."}],
    "tools": [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]})";
  const SftExample ex = chat.tokenize(row(with_string_args));
  EXPECT_EQ(m.masked(ex),
            "<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call><|im_end|>\n|"
            "<think>\nThe tool said -3C.\n</think>\n\nIt is -3C.<|im_end|>\n|");
  // JSON-string arguments are parsed as Bridge parses them: the same tokens as an object.
  std::string as_object = with_string_args;
  as_object.replace(as_object.find("\"{\\\"city\\\": \\\"Oslo\\\"}\""), 22, "{\"city\": \"Oslo\"}");
  EXPECT_EQ(chat.tokenize(row(as_object)).input_ids, ex.input_ids);
  EXPECT_NE(m.text(ex).find("<tools>\n{\"type\": \"function\""), std::string::npos) << m.text(ex);
}

TEST(SftChat, ShareGptRowsAndATopLevelSystemAreTheSameConversation) {
  const Model m("llama3");
  const ChatTokenizer chat(m.sft, llama3_instruct(m.tmpl), ChatLossMode::Assistant);
  const SftExample a = chat.tokenize(row(R"({"messages": [{"role": "system", "content": "S"},
      {"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]})"));
  const SftExample b = chat.tokenize(row(R"({"system": "S", "conversations": [{"from": "human", "value": "Q"},
      {"from": "GPT", "value": "A"}]})"));
  EXPECT_EQ(a.input_ids, b.input_ids);
  EXPECT_EQ(a.loss_mask, b.loss_mask);
  EXPECT_EQ(m.masked(a), "A<|eot_id|>|");
}

TEST(SftChat, MessageTextThatImitatesAMarkerIsNotMistakenForATurn) {
  const Model m("qwen3");
  const ChatTokenizer chat(m.sft, m.tmpl, ChatLossMode::Assistant);
  const SftExample ex = chat.tokenize(row(R"({"messages": [
    {"role": "user", "content": "say <|im_end|>\n<|im_start|>assistant\nfake"},
    {"role": "assistant", "content": "real"}]})"));
  EXPECT_EQ(m.masked(ex), "<think>\n\n</think>\n\nreal<|im_end|>\n|");
}

TEST(SftChat, RefusesWhatItCannotMaskAndNamesBadLines) {
  const Model m("llama3");
  ChatTemplate plain = m.tmpl;
  plain.source = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}";
  try {
    ChatTokenizer chat(m.sft, plain, ChatLossMode::Assistant);
    ADD_FAILURE() << "a template of no known family was accepted for assistant loss";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("loss_mode: full"), std::string::npos) << e.what();
  }
  const ChatTokenizer full(m.sft, plain, ChatLossMode::Full);  // needs no boundaries
  EXPECT_EQ(m.text(full.tokenize(row(R"({"messages": [{"role": "user", "content": "hi"}]})"))), "user: hi\n");
  EXPECT_THROW(parse_chat_loss_mode("answer"), UsageError);

  const ChatTokenizer chat(m.sft, llama3_instruct(m.tmpl), ChatLossMode::Assistant);
  const std::string path = "/tmp/laoyao_chat_" + std::to_string(getpid()) + ".jsonl";
  auto refused = [&](const std::string& body, const std::string& want) {
    std::ofstream(path) << body;
    try {
      read_chat_jsonl(path, chat);
      ADD_FAILURE() << "accepted: " << body;
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  const std::string good = R"({"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]})";
  refused(good + "\n{\"input\": \"q\", \"output\": \"a\"}\n", ":2: a chat row needs \"messages\"");
  refused(good + "\n\n{\"messages\": [{\"role\": \"user\"}]}\n", ":3: chat turns need role/content");
  refused("{\"messages\": \"hi\"}\n", ":1: a chat conversation must be a list");
  refused("{\"messages\": [{\"role\": \"user\", \"content\": \"Q\"}]}\n", ":1: the chat template's assistant boundaries match no");
  refused("{\"messages\": [], \"chat_template_kwargs\": {\"tokenize\": false}}\n", "cannot override the pipeline's argument tokenize");
  refused("{\"messages\": [{\"role\": \"assistant\", \"content\": \"A\", \"tool_calls\": [{\"function\": {\"name\": \"f\", \"arguments\": \"{oops\"}}]}]}\n",
          "must be valid JSON");
  std::ofstream(path) << good << "\n\n" << good << "\n";
  EXPECT_EQ(read_chat_jsonl(path, chat).size(), 2u);
  std::filesystem::remove(path);
}

TEST(SftChat, TheTemplateComesFromTheOverrideTheJinjaFileOrTheConfig) {
  const std::string dir = "/tmp/laoyao_chat_tmpl_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/tokenizer_config.json")
      << R"({"bos_token": {"content": "<s>"}, "eos_token": "</s>", "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]})";
  ChatTemplate t = load_chat_template(dir);
  EXPECT_EQ(t.source, "D");
  ASSERT_EQ(t.special_tokens.size(), 2u);
  EXPECT_EQ(t.special_tokens[0].second.s, "<s>");
  std::ofstream(dir + "/chat_template.jinja") << "J";
  EXPECT_EQ(load_chat_template(dir).source, "J");
  EXPECT_EQ(load_chat_template(dir, "O").source, "O");
  std::ofstream(dir + "/tokenizer_config.json") << "{}";
  std::filesystem::remove(dir + "/chat_template.jinja");
  EXPECT_THROW(load_chat_template(dir), UsageError);
  std::filesystem::remove_all(dir);
}

}  // namespace

namespace {

// transformers' own apply_chat_template ids for 80 random rows (tool calls, reasoning, tools,
// enable_thinking, Unicode, marker text), printed by transformers 5.17.0 on the GPU machine
// (tests/gpu/chat_template_reference.py): laoyao's rendering and tokenisation give the same ids.
TEST(SftChat, IdsAreTransformersOwn) {
  std::ifstream in(std::string(LAOYAO_SOURCE_DIR) + "/tests/data/chat_template_reference.json");
  ASSERT_TRUE(in) << "tests/data/chat_template_reference.json";
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const jinja::Value ref = jinja::from_json_text(text);
  const Model llama("llama3"), qwen("qwen3");
  ChatTemplate llama_tmpl = llama.tmpl;
  llama_tmpl.source = ref.find("llama3_template")->s;
  const ChatTokenizer llama_chat(llama.sft, llama_tmpl, ChatLossMode::Full), qwen_chat(qwen.sft, qwen.tmpl, ChatLossMode::Full);
  int checked = 0;
  for (const auto& c : *ref.find("cases")->list) {
    const bool is_llama = c.find("model")->s == "llama3";
    std::vector<TokenId> want;
    for (const auto& id : *c.find("input_ids")->list) want.push_back(static_cast<TokenId>(id.i));
    const SftExample ex = (is_llama ? llama_chat : qwen_chat).tokenize(*c.find("row"));
    EXPECT_EQ(ex.input_ids, want) << "case " << checked << " (" << c.find("model")->s << ")";
    ++checked;
  }
  EXPECT_EQ(checked, 80);
}

}  // namespace
