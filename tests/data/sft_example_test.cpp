// Fine-tuning examples tokenised as Megatron-Bridge's tokenize_prompt_completion_example does
// (docs/reference/megatron-bridge-finetuning.md §2): the pieces, the separator's space, the loss
// mask, the truncation order, the shifted and padded row; bad JSONL lines named with their numbers;
// the real Llama 3 tokenizer's settings.
#include "data/sft_example.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <algorithm>
#include <map>

#include "core/error.hpp"

using namespace laoyao;
using namespace laoyao::data;
using tokenizer::TokenId;

namespace {

// Words as tokens. Space-sensitive (byte-level BPE's way): a word after a space is another token
// ("Ġword"); otherwise spaces only separate.
class WordTokenizer final : public SftTokenizer {
 public:
  explicit WordTokenizer(bool sensitive) : sensitive_(sensitive) {}
  std::vector<TokenId> encode(std::string_view text) const override {
    std::vector<TokenId> out;
    for (size_t i = 0; i < text.size();) {
      size_t word = i;
      while (word < text.size() && text[word] == ' ') ++word;
      size_t end = word;
      while (end < text.size() && text[end] != ' ') ++end;
      if (end > word) {
        std::string token = sensitive_ && word > i ? "G" : "";  // (appended: GCC 12 misreads "x" + string)
        token += text.substr(word, end - word);
        out.push_back(id(token));
      }
      i = end;
    }
    return out;
  }
  TokenId eos() const override { return 999; }
  std::vector<TokenId> skipped_ids() const override { return skipped_; }
  TokenId id(const std::string& w) const {
    auto it = ids_.find(w);
    if (it != ids_.end()) return it->second;
    return ids_[w] = static_cast<TokenId>(ids_.size() + 1);
  }
  std::vector<TokenId> skipped_;

 private:
  bool sensitive_;
  mutable std::map<std::string, TokenId> ids_;
};

std::vector<TokenId> ids(const WordTokenizer& t, std::initializer_list<const char*> words) {
  std::vector<TokenId> out;
  for (const char* w : words) out.push_back(t.id(w));
  return out;
}

std::string write_jsonl(const std::string& name, const std::string& text) {
  const auto p = std::filesystem::temp_directory_path() / ("laoyao_sft_" + name + "_" + std::to_string(::getpid()) + ".jsonl");
  std::ofstream(p, std::ios::binary) << text;
  return p.string();
}

}  // namespace

TEST(SftExample, PromptThenCompletionThenEosWithTheLossOnTheCompletion) {
  const PromptCompletionConfig cfg;  // the recipes': separator " ", loss on the completion, EOS
  const WordTokenizer sensitive(true);
  EXPECT_TRUE(sensitive.space_sensitive());
  const SftExample ex = tokenize_prompt_completion("Context: a b Question: q Answer:", "the answer", sensitive, cfg, 0);
  // The prompt's first word has no space before it; the completion is tokenised as " the answer".
  std::vector<TokenId> want = ids(sensitive, {"Context:", "Ga", "Gb", "GQuestion:", "Gq", "GAnswer:", "Gthe", "Ganswer"});
  want.push_back(999);
  EXPECT_EQ(ex.input_ids, want);
  EXPECT_EQ(ex.context_length, 6);
  EXPECT_EQ(ex.loss_mask, (std::vector<uint8_t>{0, 0, 0, 0, 0, 0, 1, 1, 1}));

  // A tokenizer to which a leading space means nothing: the separator's space is dropped (and the
  // pieces are still tokenised apart: the completion starts a word of its own).
  const WordTokenizer plain(false);
  EXPECT_FALSE(plain.space_sensitive());
  const SftExample p = tokenize_prompt_completion("q", "a", plain, cfg, 0);
  EXPECT_EQ(p.input_ids, (std::vector<TokenId>{plain.id("q"), plain.id("a"), 999}));

  // Spaces (not newlines) are stripped from both ends of each part; "full" puts loss everywhere.
  PromptCompletionConfig full = cfg;
  full.completion_loss_only = false;
  const SftExample f = tokenize_prompt_completion("  q\n ", "  a  ", sensitive, full, 0);
  EXPECT_EQ(f.input_ids, (std::vector<TokenId>{sensitive.id("q\n"), sensitive.id("Ga"), 999}));
  EXPECT_EQ(f.loss_mask, (std::vector<uint8_t>{1, 1, 1}));
}

TEST(SftExample, TooLongAnExampleLosesItsPromptsTailFirstThenItsCompletions) {
  const WordTokenizer t(true);
  PromptCompletionConfig cfg;
  // Prompt p1..p5, completion c1 c2, EOS: 8 tokens.
  auto make = [&](int64_t max_length, const PromptCompletionConfig& c) {
    return tokenize_prompt_completion("p1 p2 p3 p4 p5", "c1 c2", t, c, max_length);
  };
  EXPECT_EQ(make(8, cfg).input_ids.size(), 8u);  // fits
  SftExample ex = make(6, cfg);                   // 2 over: the prompt's last two go
  EXPECT_EQ(ex.input_ids, (std::vector<TokenId>{t.id("p1"), t.id("Gp2"), t.id("Gp3"), t.id("Gc1"), t.id("Gc2"), 999}));
  EXPECT_EQ(ex.context_length, 3);
  ex = make(2, cfg);  // the whole prompt and then the completion's tail
  EXPECT_EQ(ex.input_ids, (std::vector<TokenId>{t.id("Gc1"), 999}));
  EXPECT_EQ(ex.loss_mask, (std::vector<uint8_t>{1, 1}));
  cfg.truncate_right = false;  // "left": the ends are kept
  ex = make(6, cfg);
  EXPECT_EQ(ex.input_ids, (std::vector<TokenId>{t.id("Gp3"), t.id("Gp4"), t.id("Gp5"), t.id("Gc1"), t.id("Gc2"), 999}));
  EXPECT_THROW(make(1, cfg), UsageError);  // fewer than two tokens: nothing to predict
}

TEST(SftExample, SkippedTokensNeverGetLossAndRowsAreShiftedAndPaddedWithEos) {
  WordTokenizer t(true);
  t.skipped_ = {t.id("G<pad>")};
  const SftExample ex = tokenize_prompt_completion("q", "a <pad> b", t, PromptCompletionConfig{}, 0);
  EXPECT_EQ(ex.loss_mask, (std::vector<uint8_t>{0, 1, 0, 1, 1}));
  const SftRow r = sft_row(ex, 6, t.eos());
  // tokens = ids[:-1], labels = ids[1:], mask = mask[1:], then EOS with no loss.
  EXPECT_EQ(r.tokens, (std::vector<TokenId>{ex.input_ids[0], ex.input_ids[1], ex.input_ids[2], ex.input_ids[3], 999, 999}));
  EXPECT_EQ(r.labels, (std::vector<TokenId>{ex.input_ids[1], ex.input_ids[2], ex.input_ids[3], 999, 999, 999}));
  EXPECT_EQ(r.loss_mask, (std::vector<float>{1, 0, 1, 1, 0, 0}));
  const SftRow cut = sft_row(ex, 2, t.eos());  // a row shorter than the example keeps its start
  EXPECT_EQ(cut.labels, (std::vector<TokenId>{ex.input_ids[1], ex.input_ids[2]}));
}

TEST(SftExample, JsonlRowsAreReadAndBadLinesNamedWithTheirNumbers) {
  const WordTokenizer t(true);
  const PromptCompletionConfig cfg;
  const std::string good = write_jsonl("good", "{\"input\": \"q1\", \"output\": \"a1\", \"original_answers\": [\"a1\"]}\n\n"
                                               "{\"input\": \"q2 x\", \"output\": \"a2\"}\n");
  const auto ex = read_prompt_completion_jsonl(good, t, cfg, 0);
  ASSERT_EQ(ex.size(), 2u);
  EXPECT_EQ(ex[1].input_ids, (std::vector<TokenId>{t.id("q2"), t.id("Gx"), t.id("Ga2"), 999}));
  auto refused = [&](const std::string& name, const std::string& text, const std::string& needle) {
    const std::string path = write_jsonl(name, text);
    try {
      read_prompt_completion_jsonl(path, t, cfg, 0);
      ADD_FAILURE() << "accepted " << text;
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    }
    std::filesystem::remove(path);
  };
  refused("json", "{\"input\": \"q\", \"output\": \"a\"}\n{\"input\": \"q\",\n", ":2: not a JSON line");
  refused("field", "{\"input\": \"q\", \"output\": \"a\"}\n\n{\"prompt\": \"q\", \"output\": \"a\"}\n", ":3: no \"input\" field");
  refused("type", "{\"input\": \"q\", \"output\": 7}\n", ":1: \"output\" is not a string");
  refused("utf8", "{\"input\": \"q\xff\", \"output\": \"a\"}\n", ":1: not a JSON line");
  refused("array", "[1, 2]\n", ":1: not a JSON object");
  refused("empty", "\n\n", "holds no examples");
  std::filesystem::remove(good);
}

TEST(SftExample, TheLlama3TokenizerIsSpaceSensitiveEndsWithEndOfTextAndSkipsItsHeaderTokens) {
  const char* env = std::getenv("LAOYAO_TEST_VOCABS");
  const std::string dir = (env && *env ? std::string(env) : std::string(LAOYAO_SOURCE_DIR) + "/build/test-vocabs") + "/llama3";
  if (!std::filesystem::exists(dir + "/tokenizer.json")) {
    ADD_FAILURE() << "test vocabulary " << dir << " is missing: run scripts/fetch_test_vocabs.sh";
    return;
  }
  const auto tok = hf_sft_tokenizer(dir);
  EXPECT_TRUE(tok->space_sensitive());
  EXPECT_EQ(tok->eos(), 128001);  // <|end_of_text|>: the base model's tokenizer_config.json
  const auto skipped = tok->skipped_ids();
  EXPECT_NE(std::find(skipped.begin(), skipped.end(), 128000), skipped.end());  // <|begin_of_text|>
  EXPECT_NE(std::find(skipped.begin(), skipped.end(), 128006), skipped.end());  // <|start_header_id|>
  EXPECT_EQ(std::find(skipped.begin(), skipped.end(), 128009), skipped.end());  // <|eot_id|> keeps its loss
  // No BOS: Bridge encodes each piece without special tokens.
  const SftExample ex = tokenize_prompt_completion("Question: 2+2? Answer:", "4", *tok, PromptCompletionConfig{}, 0);
  EXPECT_NE(ex.input_ids.front(), 128000);
  EXPECT_EQ(ex.input_ids.back(), 128001);
}
