// Byte-level BPE on small hand-made vocabularies: GPT-2's merge order (encoder.py semantics and
// Megatron's merges-file reading), HF's BPE model and tokenizer.json pipeline, NFC, the regex.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "core/error.hpp"
#include "data/tokenizer/bpe_model.hpp"
#include "data/tokenizer/byte_level.hpp"
#include "data/tokenizer/gpt2_bpe_tokenizer.hpp"
#include "data/tokenizer/hf_tokenizer.hpp"
#include "data/tokenizer/nfc.hpp"
#include "data/tokenizer/regex.hpp"
#include "data/tokenizer/unicode.hpp"

using namespace laoyao;
using namespace laoyao::tokenizer;
using nlohmann::json;

namespace {

// Every byte-level character (ids 0..255 in byte order), then `extra` tokens.
json byte_vocab(const std::vector<std::string>& extra) {
  json v = json::object();
  for (int b = 0; b < 256; ++b) v[byte_level_char(static_cast<unsigned char>(b))] = b;
  int id = 256;
  for (const auto& t : extra) v[t] = id++;
  return v;
}

}  // namespace

TEST(ByteLevel, MapsEveryByteReversiblyAndPrintably) {
  EXPECT_EQ(byte_level_char(' '), "\xC4\xA0");  // Ġ = U+0120
  EXPECT_EQ(byte_level_char('\n'), "\xC4\x8A");  // Ċ = U+010A
  EXPECT_EQ(byte_level_char('a'), "a");
  EXPECT_EQ(byte_level_char(0xAD), "\xC5\x83");  // the soft hyphen is not printable: U+0143
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  std::string back;
  EXPECT_TRUE(from_byte_level(to_byte_level(all), back, true));
  EXPECT_EQ(back, all);
}

TEST(Regex, Gpt2PatternSplitsLikeEncoderPy) {
  Regex re(kGpt2Pattern, "test");
  std::string s = "I'm  ok!! 123abc\n\n x";
  std::vector<std::string> parts;
  for (auto [b, e] : re.find_all(s)) parts.push_back(s.substr(b, e - b));
  EXPECT_EQ(parts, (std::vector<std::string>{"I", "'m", " ", " ok", "!!", " 123", "abc", "\n\n", " x"}));
}

TEST(Regex, WhitespaceMeansUnicodeWhiteSpace) {
  Regex re("\\s+", "test");
  std::string s = "a\xC2\x85" "b\xE3\x80\x80" "c\xE2\x80\x8B" "d";  // NEL, ideographic space, ZWSP
  auto m = re.find_all(s);
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0], (std::pair<size_t, size_t>{1, 3}));
  EXPECT_EQ(m[1], (std::pair<size_t, size_t>{4, 7}));  // U+200B is not White_Space
  EXPECT_EQ(rewrite_whitespace_classes("[^\\s\\p{L}]\\S"),
            "[^\\x{09}-\\x{0D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
            "\\x{205F}\\x{3000}\\p{L}][^\\x{09}-\\x{0D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}"
            "\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}]");
  EXPECT_THROW(Regex("(unclosed", "my pattern"), UsageError);
}

TEST(Nfc, ComposesReordersAndRespectsExclusions) {
  EXPECT_EQ(nfc("plain ascii"), "plain ascii");
  EXPECT_EQ(nfc("e\xCC\x81"), "\xC3\xA9");                            // e + U+0301 -> é
  EXPECT_EQ(nfc("\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8"), "\xEA\xB0\x81");  // Hangul L V T -> 각
  EXPECT_EQ(nfc("a\xCC\xA3\xCC\x87"), "\xE1\xBA\xA1\xCC\x87");        // a + dot below + dot above
  EXPECT_EQ(nfc("a\xCC\x87\xCC\xA3"), "\xE1\xBA\xA1\xCC\x87");        // reordered first
  EXPECT_EQ(nfc("\xE0\xA5\x98"), "\xE0\xA4\x95\xE0\xA4\xBC");         // U+0958 is excluded
  EXPECT_EQ(nfc("A\xCC\x8A\xCC\x81"), "\xC7\xBA");                    // Å + acute -> Ǻ
  EXPECT_EQ(nfc("\xE2\x84\xAB"), "\xC3\x85");                         // Angstrom sign -> Å
  EXPECT_EQ(nfc("x\xCC\x81\xCC\x81"), "x\xCC\x81\xCC\x81");
}

TEST(Unicode, InvalidUtf8BecomesReplacementCharsLikePython) {
  EXPECT_TRUE(is_valid_utf8("h\xC3\xA9"));
  EXPECT_FALSE(is_valid_utf8("\xC3"));
  EXPECT_FALSE(is_valid_utf8("\xED\xA0\x80"));  // a surrogate
  // b'a\xe2\x82b\xff'.decode('utf-8', 'replace') == 'a\ufffdb\ufffd'
  EXPECT_EQ(utf8_replace_invalid("a\xE2\x82" "b\xFF"), "a\xEF\xBF\xBD" "b\xEF\xBF\xBD");
}

// --- GPT2BPETokenizer -------------------------------------------------------------------------

TEST(Gpt2Bpe, MergesInRankOrderNotLeftToRight) {
  json vocab = byte_vocab({"ll", "he", "hell", "llo", "<|endoftext|>"});
  auto t = GPT2BPETokenizer::from_strings(vocab.dump(), "#version: 0.2\nl l\nh e\nhe ll\nll o\n");
  // l+l (rank 0), then h+e, then he+ll; "ll o" never applies because "ll" is gone.
  EXPECT_EQ(t->bpe("hello"), (std::vector<std::string>{"hell", "o"}));
  EXPECT_EQ(t->tokenize("hello"), (std::vector<TokenId>{258, 'o'}));
  EXPECT_EQ(t->vocab_size(), 261);
  EXPECT_EQ(t->eod(), 260);
  EXPECT_EQ(t->name(), "GPT2BPETokenizer");
}

TEST(Gpt2Bpe, ReadsTheMergesFileAsMegatronDoes) {
  json vocab = byte_vocab({"ll", "he", "ab", "bc", "<|endoftext|>"});
  // A repeated pair takes its last rank (dict(zip(...)) in Python).
  auto dup = GPT2BPETokenizer::from_strings(vocab.dump(), "#version: 0.2\na b\nb c\na b\n");
  EXPECT_EQ(dup->bpe("abc"), (std::vector<std::string>{"a", "bc"}));
  // Fields are split as str.split() splits them; blank lines are no merges; CRLF is fine.
  auto loose = GPT2BPETokenizer::from_strings(vocab.dump(), "#version: 0.2\r\nl\tl\r\n\n  \nh  e\r\n");
  EXPECT_EQ(loose->bpe("hello"), (std::vector<std::string>{"he", "ll", "o"}));
  // Only a header: byte-level tokens, no merges.
  auto header_only = GPT2BPETokenizer::from_strings(vocab.dump(), "#version: 0.2");
  EXPECT_EQ(header_only->bpe("hello"), (std::vector<std::string>{"h", "e", "l", "l", "o"}));
}

TEST(Gpt2Bpe, EveryOccurrenceOfTheBestPairMergesLeftToRight) {
  json vocab = byte_vocab({"aa", "aaaa", "<|endoftext|>"});
  auto t = GPT2BPETokenizer::from_strings(vocab.dump(), "#version: 0.2\na a\naa aa\n");
  EXPECT_EQ(t->bpe("aaa"), (std::vector<std::string>{"aa", "a"}));
  EXPECT_EQ(t->bpe("aaaaa"), (std::vector<std::string>{"aaaa", "a"}));
}

TEST(Gpt2Bpe, ByteLevelTextRoundTripsAndSpecialTextIsNotSpecial) {
  json vocab = byte_vocab({"<|endoftext|>"});
  auto t = GPT2BPETokenizer::from_strings(vocab.dump(), "#version: 0.2\n");
  const std::string s = "Z\xC3\xBC" "rich <|endoftext|>\n\t\xF0\x9F\xA4\x96";
  auto ids = t->tokenize(s);
  EXPECT_EQ(ids.size(), s.size());  // no merges: one token per byte; "<|endoftext|>" is text
  EXPECT_EQ(t->detokenize(ids), s);
  EXPECT_EQ(ids[0], 'Z');
  EXPECT_EQ(ids[1], 0xC3);
}

TEST(Gpt2Bpe, BadFilesAreUsageErrors) {
  json vocab = byte_vocab({"<|endoftext|>"});
  const std::string header = "#version: 0.2\n";
  EXPECT_THROW(GPT2BPETokenizer::from_strings("{not json", header), UsageError);
  EXPECT_THROW(GPT2BPETokenizer::from_strings("[1, 2]", header), UsageError);
  EXPECT_THROW(GPT2BPETokenizer::from_strings(byte_vocab({}).dump(), header), UsageError);  // no EOD
  EXPECT_THROW(GPT2BPETokenizer("/nonexistent/vocab.json", "/nonexistent/merges.txt"), UsageError);
  // A merge whose result is not in the vocab is refused on loading, not when it first applies.
  EXPECT_THROW(GPT2BPETokenizer::from_strings(vocab.dump(), header + "x y\n"), UsageError);
}

namespace {

// A scratch directory per test, for tokenizer files read by path.
struct TokDir {
  std::filesystem::path dir;
  TokDir() {
    dir = std::filesystem::temp_directory_path() /
          ("laoyao_tok_" + std::to_string(::getpid()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
  }
  ~TokDir() { std::filesystem::remove_all(dir); }
  std::string write(const std::string& name, const std::string& contents) const {
    const std::string p = (dir / name).string();
    std::filesystem::create_directories(std::filesystem::path(p).parent_path());
    std::ofstream(p, std::ios::binary) << contents;
    return p;
  }
};

// Runs `make`, which must throw a UsageError whose message contains every fragment.
template <typename F>
void expect_refused(F make, const std::vector<std::string>& fragments, const std::string& label) {
  try {
    make();
    ADD_FAILURE() << label << ": accepted";
  } catch (const UsageError& e) {
    const std::string msg = e.what();
    for (const auto& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << label << ": '" << msg << "' lacks '" << f << "'";
    EXPECT_EQ(msg.find('\n'), std::string::npos) << label << ": the message is not one line: " << msg;
  }
}

std::string random_bytes(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng() & 0xFF);
  return s;
}

}  // namespace

TEST(Gpt2Bpe, MalformedMergesFilesAreRefusedNamingFileAndLine) {
  TokDir d;
  const std::string v = d.write("vocab.json", byte_vocab({"ll", "he", "<|endoftext|>"}).dump());
  struct Case {
    std::string merges;
    std::vector<std::string> expect;
  };
  const std::vector<Case> cases = {
      {"#version: 0.2\nl l\nhe\n", {"line 3", "'he' has 1 field;"}},
      {"#version: 0.2\nl l\nh e l l\n", {"line 3", "has 4 fields"}},
      {"l l\nh e\n", {"line 1", "'l l' is not the '#version: ...' header"}},
      {"#version: 0.2\nl l\nh e", {"line 3", "'h e' does not end with a newline"}},
      {"#version: 0.2\nl l\n\xC3\x28 e\n", {"line 3", "not valid UTF-8", "'\\xC3( e'"}},
      {"#version: 0.2\nl l\nq z\n", {"line 3", "uses 'qz'", v}},
      {"#version: 0.2\nh \xC4\xA0\n", {"line 2", "uses 'h\xC4\xA0'"}},
      {"", {"is empty"}},
      {random_bytes(4096, 1), {"line "}},
      {random_bytes(4096, 2), {"line "}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string m = d.write("merges" + std::to_string(i) + ".txt", cases[i].merges);
    auto want = cases[i].expect;
    want.push_back("GPT2BPETokenizer merge file '" + m + "'");
    expect_refused([&] { (void)GPT2BPETokenizer(v, m); }, want, "case " + std::to_string(i));
  }
  // Random bytes, however they happen to be, never load.
  for (unsigned seed = 3; seed < 40; ++seed) {
    const std::string m = d.write("random.txt", random_bytes(2000, seed));
    EXPECT_THROW(GPT2BPETokenizer(v, m), UsageError) << "seed " << seed;
  }
}

TEST(Gpt2Bpe, MalformedVocabFilesAreRefusedNamingTheFile) {
  TokDir d;
  const std::string m = d.write("merges.txt", "#version: 0.2\n");
  json dup_id = byte_vocab({"<|endoftext|>"});
  dup_id["extra"] = 5;
  json no_newline_byte = byte_vocab({"<|endoftext|>"});
  no_newline_byte.erase(byte_level_char('\n'));
  struct Case {
    std::string vocab;
    std::vector<std::string> expect;
  };
  const std::vector<Case> cases = {
      {"{}", {"is an empty JSON object"}},
      {"[\"a\"]", {"must be a JSON object of token -> id", "not array"}},
      {"{\"a\": 1,}", {"is not valid JSON"}},
      {"{\"a\xFF\": 1}", {"is not valid JSON"}},  // invalid UTF-8 in a token
      {R"({"a": -1})", {"the id of token 'a' is -1", "[0, 2^31)"}},
      {R"({"a": "1"})", {"the id of token 'a' is \"1\""}},
      {R"({"a": 1.5})", {"the id of token 'a' is 1.5"}},
      {R"({"a": 4294967296})", {"the id of token 'a' is 4294967296"}},
      {dup_id.dump(), {"both have id 5", "'extra'"}},
      {no_newline_byte.dump(), {"no token for byte 0x0A"}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string v = d.write("vocab" + std::to_string(i) + ".json", cases[i].vocab);
    auto want = cases[i].expect;
    want.push_back("GPT2BPETokenizer vocab file '" + v + "'");
    expect_refused([&] { (void)GPT2BPETokenizer(v, m); }, want, "case " + std::to_string(i));
  }
}

TEST(Gpt2Bpe, DirectoriesAreRefusedByFlagAndPath) {
  TokDir d;
  const std::string v = d.write("vocab.json", byte_vocab({"<|endoftext|>"}).dump());
  const std::string m = d.write("merges.txt", "#version: 0.2\n");
  const std::string dir = d.dir.string();
  expect_refused([&] { (void)GPT2BPETokenizer(dir, m); }, {"--vocab-file", "'" + dir + "' is a directory"}, "vocab");
  expect_refused([&] { (void)GPT2BPETokenizer(v, dir); }, {"--merge-file", "'" + dir + "' is a directory"}, "merges");
}

// --- HF BPE model -------------------------------------------------------------------------------

TEST(HfBpeModel, PriorityQueueMergesAndStaleEntries) {
  BpeModelConfig c;
  c.vocab = {{"a", 0}, {"aa", 1}, {"aaaa", 2}, {"b", 3}, {"ab", 4}};
  c.merges = {{"a", "a"}, {"aa", "aa"}, {"a", "b"}};
  BpeModel m(c, "test");
  std::vector<TokenId> out;
  m.encode_word("aaaa", out);
  EXPECT_EQ(out, (std::vector<TokenId>{2}));
  out.clear();
  m.encode_word("aaab", out);  // a a (pos 0) first, then a b: [aa, ab]
  EXPECT_EQ(out, (std::vector<TokenId>{1, 4}));
  EXPECT_THROW(BpeModel(BpeModelConfig{{{"a", 0}}, {{"a", "a"}}, std::nullopt}, "test"), UsageError);
}

TEST(HfBpeModel, IgnoreMergesEmitsWholeVocabWords) {
  BpeModelConfig c;
  c.vocab = {{"h", 0}, {"i", 1}, {"hi", 2}, {"hih", 3}};
  c.merges = {{"h", "i"}};
  std::vector<TokenId> out;
  BpeModel(c, "t").encode_word("hih", out);
  EXPECT_EQ(out, (std::vector<TokenId>{2, 0}));
  c.ignore_merges = true;
  out.clear();
  BpeModel(c, "t").encode_word("hih", out);
  EXPECT_EQ(out, (std::vector<TokenId>{3}));
}

TEST(HfBpeModel, ByteFallbackAndFusedUnknowns) {
  BpeModelConfig c;
  c.vocab = {{"<unk>", 0}, {"a", 1}, {"<0xC3>", 2}, {"<0xA9>", 3}};
  c.unk_token = "<unk>";
  std::vector<TokenId> out;
  BpeModel(c, "t").encode_word("a\xC3\xA9xy", out);
  EXPECT_EQ(out, (std::vector<TokenId>{1, 0, 0, 0}));  // é, x, y each unknown
  c.fuse_unk = true;
  out.clear();
  BpeModel(c, "t").encode_word("a\xC3\xA9xya", out);
  EXPECT_EQ(out, (std::vector<TokenId>{1, 0, 1}));
  c.byte_fallback = true;
  out.clear();
  BpeModel(c, "t").encode_word("a\xC3\xA9xy", out);
  EXPECT_EQ(out, (std::vector<TokenId>{1, 2, 3, 0}));  // é -> bytes; x,y have none -> one fused unk
}

// --- HF tokenizer.json pipeline -----------------------------------------------------------------

namespace {

json byte_level_tokenizer(json vocab, json merges, json pre_tokenizer) {
  return json{{"version", "1.0"},
              {"added_tokens", json::array()},
              {"normalizer", nullptr},
              {"pre_tokenizer", pre_tokenizer},
              {"post_processor", nullptr},
              {"decoder", {{"type", "ByteLevel"}}},
              {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}}};
}

json gpt2_pre() { return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}; }

}  // namespace

TEST(HfTokenizer, MergesInStringOrArrayFormAreTheSame) {
  json vocab = byte_vocab({"ll", "he", "hell", "\xC4\xA0" "w"});
  auto a = HuggingFaceTokenizer::from_json(
      byte_level_tokenizer(vocab, json{"l l", "h e", "he ll", "\xC4\xA0 w"}, gpt2_pre()).dump());
  auto b = HuggingFaceTokenizer::from_json(
      byte_level_tokenizer(vocab,
                           json::array({json::array({"l", "l"}), json::array({"h", "e"}), json::array({"he", "ll"}),
                                        json::array({"\xC4\xA0", "w"})}),
                           gpt2_pre()).dump());
  const std::vector<TokenId> want{258, 'o', 259, 'o'};  // hell o Ġw o
  EXPECT_EQ(a->tokenize("hello wo"), want);
  EXPECT_EQ(b->tokenize("hello wo"), want);
  EXPECT_EQ(a->detokenize(want), "hello wo");
  EXPECT_EQ(a->vocab_size(), 260);
  EXPECT_EQ(a->eod(), -1);  // no eos_token anywhere
}

TEST(HfTokenizer, AddedTokensAreSplitOutFirstWithStripOptions) {
  json vocab = byte_vocab({"<|eos|>", "<m>", "<w>"});
  json j = byte_level_tokenizer(vocab, json::array(), gpt2_pre());
  j["added_tokens"] = json::array({
      {{"id", 256}, {"content", "<|eos|>"}, {"single_word", false}, {"lstrip", false}, {"rstrip", false}, {"normalized", false}, {"special", true}},
      {{"id", 257}, {"content", "<m>"}, {"single_word", false}, {"lstrip", true}, {"rstrip", true}, {"normalized", false}, {"special", true}},
      {{"id", 258}, {"content", "<w>"}, {"single_word", true}, {"lstrip", false}, {"rstrip", false}, {"normalized", false}, {"special", false}},
      {{"id", 300}, {"content", "<|eos|>x"}, {"single_word", false}, {"lstrip", false}, {"rstrip", false}, {"normalized", false}, {"special", true}},
  });
  auto t = HuggingFaceTokenizer::from_json(j.dump(), R"({"eos_token": "<|eos|>"})");
  EXPECT_EQ(t->eod(), 256);
  EXPECT_EQ(t->vocab_size(), 260);  // 259 model tokens + "<|eos|>x"
  EXPECT_EQ(t->tokenize("a<|eos|>b"), (std::vector<TokenId>{'a', 256, 'b'}));
  EXPECT_EQ(t->tokenize("<|eos|>x"), (std::vector<TokenId>{300}));  // longest match wins
  // lstrip/rstrip absorb the surrounding spaces.
  EXPECT_EQ(t->tokenize("a  <m>  b"), (std::vector<TokenId>{'a', 257, 'b'}));
  // single_word: only between non-word characters.
  EXPECT_EQ(t->tokenize("x <w> y"), (std::vector<TokenId>{'x', ' ', 258, ' ', 'y'}));  // Ġ has id 32
  EXPECT_EQ(t->tokenize("x<w>"), (std::vector<TokenId>{'x', '<', 'w', '>'}));
}

TEST(HfTokenizer, SplitBehaviorsAndNormalizers) {
  json vocab = byte_vocab({});
  json split = {{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"invert", false}};
  json bl = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}};
  auto run = [&](const std::string& behavior, const std::string& text) {
    json s = split;
    s["behavior"] = behavior;
    // Each piece is one BPE word; with no merges every byte is a token, so count pieces through
    // a merge that only fires inside a piece: "a-" (merged) vs "a" "-" (isolated).
    json v = byte_vocab({"a-", "-b"});
    auto t = HuggingFaceTokenizer::from_json(
        byte_level_tokenizer(v, json{"a -", "- b"}, json{{"type", "Sequence"}, {"pretokenizers", {s, bl}}}).dump());
    return t->tokenize(text);
  };
  EXPECT_EQ(run("Isolated", "a-b"), (std::vector<TokenId>{'a', '-', 'b'}));
  EXPECT_EQ(run("Removed", "a-b"), (std::vector<TokenId>{'a', 'b'}));
  EXPECT_EQ(run("MergedWithPrevious", "a-b"), (std::vector<TokenId>{256, 'b'}));
  EXPECT_EQ(run("MergedWithNext", "a-b"), (std::vector<TokenId>{'a', 257}));
  EXPECT_THROW(run("Sideways", "a-b"), UsageError);

  json j = byte_level_tokenizer(vocab, json::array(), bl);
  j["normalizer"] = {{"type", "Sequence"},
                     {"normalizers", {{{"type", "NFC"}}, {{"type", "Replace"}, {"pattern", {{"String", "x"}}}, {"content", "yy"}}}}};
  auto t = HuggingFaceTokenizer::from_json(j.dump());
  EXPECT_EQ(t->tokenize("e\xCC\x81x"), (std::vector<TokenId>{0xC3, 0xA9, 'y', 'y'}));
  j["normalizer"] = {{"type", "Lowercase"}};
  EXPECT_THROW(HuggingFaceTokenizer::from_json(j.dump()), UsageError);
}

TEST(HfTokenizer, TemplatePostProcessorAddsBosUnlessDisabled) {
  json vocab = byte_vocab({"<s>", "</s>"});
  json j = byte_level_tokenizer(vocab, json::array(), gpt2_pre());
  j["added_tokens"] = json::array({{{"id", 256}, {"content", "<s>"}, {"special", true}},
                                   {{"id", 257}, {"content", "</s>"}, {"special", true}}});
  j["post_processor"] = {
      {"type", "Sequence"},
      {"processors",
       {{{"type", "ByteLevel"}},
        {{"type", "TemplateProcessing"},
         {"single", {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}, {{"SpecialToken", {{"id", "</s>"}, {"type_id", 0}}}}}},
         {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {256}}, {"tokens", {"<s>"}}}}, {"</s>", {{"id", "</s>"}, {"ids", {257}}, {"tokens", {"</s>"}}}}}}}}}};
  auto t = HuggingFaceTokenizer::from_json(j.dump(), R"({"eos_token": {"content": "</s>"}})");
  EXPECT_EQ(t->tokenize("hi"), (std::vector<TokenId>{256, 'h', 'i', 257}));
  EXPECT_EQ(t->eod(), 257);
  HuggingFaceTokenizerOptions o;
  o.add_special_tokens = false;
  auto raw = HuggingFaceTokenizer::from_json(j.dump(), "", o);
  EXPECT_EQ(raw->tokenize("hi"), (std::vector<TokenId>{'h', 'i'}));
}

TEST(HfTokenizer, UnsupportedOrBrokenFilesAreUsageErrors) {
  json vocab = byte_vocab({});
  EXPECT_THROW(HuggingFaceTokenizer::from_json("{"), UsageError);
  EXPECT_THROW(HuggingFaceTokenizer::from_json(R"({"model": {"type": "WordPiece"}})"), UsageError);
  json j = byte_level_tokenizer(vocab, json{"q z"}, gpt2_pre());  // "qz" not in the vocab
  EXPECT_THROW(HuggingFaceTokenizer::from_json(j.dump()), UsageError);
  j = byte_level_tokenizer(vocab, json::array(), {{"type", "Metaspace"}});
  try {
    HuggingFaceTokenizer::from_json(j.dump());
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("Metaspace"), std::string::npos);
  }
  j = byte_level_tokenizer(vocab, json::array(), gpt2_pre());
  EXPECT_THROW(HuggingFaceTokenizer::from_json(j.dump(), R"({"eos_token": "<nope>"})"), UsageError);
  EXPECT_THROW(HuggingFaceTokenizer("/nonexistent/dir"), UsageError);
}

TEST(HfTokenizer, MalformedFilesAreRefusedNamingTheFile) {
  TokDir d;
  const json vocab = byte_vocab({"ll", "<|eos|>"});  // ll = 256, <|eos|> = 257
  auto file_with = [&](const std::function<void(json&)>& edit) {
    json j = byte_level_tokenizer(vocab, json{"l l"}, gpt2_pre());
    edit(j);
    return j.dump();
  };
  auto added = [](json id, const std::string& content) {
    return json::array({{{"id", id}, {"content", content}, {"special", true}}});
  };
  struct Case {
    std::string text;
    std::vector<std::string> expect;
  };
  const std::vector<Case> cases = {
      {"{", {"is not valid JSON"}},
      {R"({"model": 5})", {"has no \"model\" object"}},
      {file_with([](json& j) { j["model"]["vocab"] = json::object(); }), {"model.vocab is empty"}},
      {file_with([](json& j) { j["model"]["vocab"] = json::array(); }), {"model.vocab must be an object"}},
      {file_with([](json& j) { j["model"]["vocab"]["x"] = -1; }), {"model.vocab gives token 'x' the id -1"}},
      {file_with([](json& j) { j["model"]["vocab"]["x"] = "7"; }), {"model.vocab gives token 'x' the id \"7\""}},
      {file_with([](json& j) { j["model"]["vocab"]["x"] = 3; }), {"'x'", "the same id 3"}},
      {file_with([](json& j) { j["model"]["merges"] = json{"l l", "ll"}; }), {"model.merges[1] is '\"ll\"'", "\"a b\""}},
      {file_with([](json& j) { j["model"]["merges"] = json{"l l l"}; }), {"model.merges[0] is '\"l l l\"'"}},
      {file_with([](json& j) { j["model"]["merges"] = json{"l  l"}; }), {"model.merges[0]"}},
      {file_with([](json& j) { j["model"]["merges"] = json{"l "}; }), {"model.merges[0]"}},
      {file_with([](json& j) { j["model"]["merges"] = json::array({json::array({"l", "l", "l"})}); }), {"model.merges[0]"}},
      {file_with([](json& j) { j["model"]["merges"] = json::array({5}); }), {"model.merges[0] is '5'"}},
      {file_with([](json& j) { j["model"]["merges"] = "l l"; }), {"model.merges must be a list"}},
      {file_with([](json& j) { j["model"]["merges"] = json{"q z"}; }), {"merge 0", "uses 'qz'"}},
      {file_with([](json& j) { j["model"]["vocab"].erase(byte_level_char('\n')); }),
       {"model.vocab has no token for byte 0x0A", "ByteLevel"}},
      {file_with([&](json& j) { j["added_tokens"] = added(999, "<|eos|>"); }),
       {"added_tokens[0] '<|eos|>' has id 999, but model.vocab gives that token id 257"}},
      {file_with([&](json& j) { j["added_tokens"] = added(5, "<new>"); }),
       {"added_tokens[0] '<new>' has id 5, which model.vocab gives to"}},
      {file_with([&](json& j) { j["added_tokens"] = added(300, ""); }), {"added_tokens[0] has an empty \"content\""}},
      {file_with([&](json& j) { j["added_tokens"] = added(-3, "<x>"); }), {"added_tokens[0] '<x>' has id -3"}},
      {file_with([](json& j) { j["added_tokens"] = json::array({{{"content", "<x>"}}}); }), {"'<x>' has id null"}},
      {file_with([](json& j) { j["added_tokens"] = json::object(); }), {"added_tokens must be a list"}},
      {file_with([&](json& j) {
         json two = added(300, "<a>");
         two.push_back(added(300, "<b>")[0]);
         j["added_tokens"] = two;
       }),
       {"added_tokens[1] '<b>' has id 300, as has the added token '<a>'"}},
      {file_with([](json& j) {
         j["post_processor"] = {{"type", "RobertaProcessing"}, {"cls", {"<s>", 4000}}, {"sep", {"</s>", 257}}};
       }),
       {"post_processor adds token id 4000"}},
      {file_with([](json& j) { j["model"]["type"] = 5; }), {"unexpected JSON structure"}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string f = d.write("case" + std::to_string(i) + "/tokenizer.json", cases[i].text);
    auto want = cases[i].expect;
    want.push_back("HuggingFaceTokenizer file '" + f + "'");
    expect_refused([&] { (void)HuggingFaceTokenizer(std::filesystem::path(f).parent_path().string()); }, want,
                   "case " + std::to_string(i));
  }
  // HF skips "#version" lines among string merges, and so do we.
  auto t = HuggingFaceTokenizer::from_json(byte_level_tokenizer(vocab, json{"#version: 0.2", "l l"}, gpt2_pre()).dump());
  EXPECT_EQ(t->tokenize("ll"), (std::vector<TokenId>{256}));
}

TEST(HfTokenizer, PathsAndConfigFilesAreCheckedByName) {
  TokDir d;
  const std::string good = byte_level_tokenizer(byte_vocab({"<|eos|>"}), json::array(), gpt2_pre()).dump();
  const std::string root = d.dir.string();
  expect_refused([&] { (void)HuggingFaceTokenizer(root + "/missing"); }, {"'" + root + "/missing' does not exist"}, "missing");
  std::filesystem::create_directories(root + "/empty");
  expect_refused([&] { (void)HuggingFaceTokenizer(root + "/empty"); },
                 {"directory '" + root + "/empty' has no tokenizer.json"}, "empty dir");
  std::filesystem::create_directories(root + "/nested/tokenizer.json");
  expect_refused([&] { (void)HuggingFaceTokenizer(root + "/nested"); },
                 {"'" + root + "/nested/tokenizer.json' is a directory"}, "tokenizer.json is a directory");

  d.write("ok/tokenizer.json", good);
  d.write("ok/tokenizer_config.json", R"({"eos_token": "<|eos|>"})");
  EXPECT_EQ(HuggingFaceTokenizer(root + "/ok").eod(), 256);
  EXPECT_EQ(HuggingFaceTokenizer(root + "/ok/tokenizer.json").eod(), 256);

  d.write("badcfg/tokenizer.json", good);
  d.write("badcfg/tokenizer_config.json", R"({"eos_token": "<|eos|>",})");
  expect_refused([&] { (void)HuggingFaceTokenizer(root + "/badcfg"); },
                 {"'" + root + "/badcfg/tokenizer_config.json' is not valid JSON"}, "bad config");
  d.write("badeos/tokenizer.json", good);
  d.write("badeos/special_tokens_map.json", R"({"eos_token": 5})");
  expect_refused([&] { (void)HuggingFaceTokenizer(root + "/badeos"); },
                 {"'" + root + "/badeos/special_tokens_map.json'", "eos_token is '5'"}, "bad eos");
  d.write("unknown_eos/tokenizer.json", good);
  d.write("unknown_eos/tokenizer_config.json", R"({"eos_token": "</s>"})");
  expect_refused([&] { (void)HuggingFaceTokenizer(root + "/unknown_eos"); },
                 {root + "/unknown_eos/tokenizer.json", "eos_token '</s>' is not in the vocabulary"}, "unknown eos");
}

TEST(HfTokenizer, ConcurrentTokenizeGivesTheSameIds) {
  json vocab = byte_vocab({"ll", "he", "hell"});
  auto t = HuggingFaceTokenizer::from_json(byte_level_tokenizer(vocab, json{"l l", "h e", "he ll"}, gpt2_pre()).dump());
  const std::string text = "hello hello, hell is hello; shell hellish";
  const auto want = t->tokenize(text);
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      for (int k = 0; k < 200; ++k) ok[i] += t->tokenize(text) == want;
    });
  }
  for (auto& th : threads) th.join();
  for (int v : ok) EXPECT_EQ(v, 200);
}
