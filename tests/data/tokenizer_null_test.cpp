// NullTokenizer: Megatron-LM's current semantics, Megatron-Bridge's, and Python's int() parsing.
#include <gtest/gtest.h>

#include "core/error.hpp"
#include "data/tokenizer/null_tokenizer.hpp"
#include "data/tokenizer/tokenizer_factory.hpp"

using namespace laoyao;
using namespace laoyao::tokenizer;

TEST(NullTokenizer, MegatronLMSemanticsVocabVEodVMinus1) {
  NullTokenizer t(32000);
  EXPECT_EQ(t.vocab_size(), 32000);
  EXPECT_EQ(t.eod(), 31999);
  EXPECT_EQ(t.pad(), -1);
  EXPECT_EQ(t.name(), "NullTokenizer");
  NullTokenizer o(32000, NullTokenizerSemantics::kMegatronLM, 7);
  EXPECT_EQ(o.eod(), 7);
  EXPECT_EQ(o.vocab_size(), 32000);
}

TEST(NullTokenizer, BridgeSemanticsVocabVPlus1EodV) {
  NullTokenizer t(32000, NullTokenizerSemantics::kBridge);
  EXPECT_EQ(t.vocab_size(), 32001);
  EXPECT_EQ(t.eod(), 32000);
  EXPECT_THROW(NullTokenizer(10, NullTokenizerSemantics::kBridge, 3), UsageError);
  EXPECT_THROW(NullTokenizer(0), UsageError);
}

TEST(NullTokenizer, TokenizeParsesSpaceSeparatedIntegersLikePythonInt) {
  NullTokenizer t(100);
  EXPECT_EQ(t.tokenize("1 2 3"), (std::vector<TokenId>{1, 2, 3}));
  EXPECT_EQ(t.tokenize("42"), (std::vector<TokenId>{42}));
  // int() accepts surrounding whitespace, a sign and underscores between digits.
  EXPECT_EQ(t.tokenize("7\n -3 +4 1_000\t"), (std::vector<TokenId>{7, -3, 4, 1000}));
  // Ids beyond the vocabulary are not checked (Megatron does not either).
  EXPECT_EQ(t.tokenize("123456789012"), (std::vector<TokenId>{123456789012}));
}

TEST(NullTokenizer, TokenizeRejectsWhatPythonIntRejects) {
  NullTokenizer t(100);
  for (const char* bad : {"", "1  2", "1 ", " ", "a", "1.5", "1__0", "_1", "1_", "--1", "99999999999999999999"}) {
    EXPECT_THROW(t.tokenize(bad), UsageError) << "'" << bad << "'";
  }
  try {
    t.tokenize("5 x7");
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("'x7'"), std::string::npos) << e.what();
  }
}

TEST(NullTokenizer, DetokenizeJoinsWithSpaces) {
  NullTokenizer t(100);
  std::vector<TokenId> ids{5, 0, 99};
  EXPECT_EQ(t.detokenize(ids), "5 0 99");
  EXPECT_EQ(t.tokenize(t.detokenize(ids)), ids);
}

TEST(TokenizerFactory, BuildsNullTokenizerAndRefusesOthersByName) {
  TokenizerSpec s;
  s.type = "NullTokenizer";
  s.vocab_size = 50;
  auto t = make_tokenizer(s);
  EXPECT_EQ(t->vocab_size(), 50);
  EXPECT_EQ(t->eod(), 49);
  s.null_semantics = NullTokenizerSemantics::kBridge;
  EXPECT_EQ(make_tokenizer(s)->eod(), 50);
  s.vocab_size.reset();
  EXPECT_THROW(make_tokenizer(s), UsageError);
  s.type = "TikTokenizer";
  try {
    make_tokenizer(s);
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("does not support"), std::string::npos);
  }
  s.type = "GPT2BPETokenizr";
  try {
    make_tokenizer(s);
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("did you mean GPT2BPETokenizer"), std::string::npos) << e.what();
  }
  s.type = "GPT2BPETokenizer";
  EXPECT_THROW(make_tokenizer(s), UsageError);  // no --vocab-file
}
