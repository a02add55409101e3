// SentencePiece .model parsing and encoding on hand-built models (the protobuf is written here
// field by field from sentencepiece_model.proto): BPE merge order by score, unused pieces,
// user-defined symbols, unigram Viterbi, unknowns and byte fallback, Megatron's three flavours.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.hpp"
#include "data/tokenizer/sentencepiece_tokenizer.hpp"

using namespace laoyao;
using namespace laoyao::tokenizer;

namespace {

const std::string kWs = "\xE2\x96\x81";  // ▁

struct Pb {
  std::string out;
  void varint(uint64_t v) {
    while (v >= 0x80) {
      out.push_back(static_cast<char>((v & 0x7F) | 0x80));
      v >>= 7;
    }
    out.push_back(static_cast<char>(v));
  }
  void tag(int field, int wire) { varint(static_cast<uint64_t>(field) << 3 | static_cast<uint64_t>(wire)); }
  void bytes(int field, const std::string& s) {
    tag(field, 2);
    varint(s.size());
    out += s;
  }
  void f32(int field, float f) {
    tag(field, 5);
    char b[4];
    std::memcpy(b, &f, 4);
    out.append(b, 4);
  }
  void u(int field, int64_t v) {
    tag(field, 0);
    varint(static_cast<uint64_t>(v));
  }
};

struct P {
  std::string piece;
  float score;
  int type;
};

std::string model(const std::vector<P>& pieces, int model_type, bool byte_fallback = false,
                  bool remove_extra_ws = true) {
  Pb m;
  for (const auto& p : pieces) {
    Pb sp;
    sp.bytes(1, p.piece);
    sp.f32(2, p.score);
    if (p.type != 1) sp.u(3, p.type);
    m.bytes(1, sp.out);
  }
  Pb trainer;
  trainer.u(3, model_type);
  trainer.u(4, static_cast<int64_t>(pieces.size()));
  if (byte_fallback) trainer.u(35, 1);
  trainer.u(43, -1);  // pad_id = -1 (a negative int32 is a 10-byte varint)
  m.bytes(2, trainer.out);
  Pb norm;
  norm.bytes(1, "identity");
  norm.u(4, remove_extra_ws ? 1 : 0);
  m.bytes(3, norm.out);
  return m.out;
}

std::vector<P> base() {
  return {{"<unk>", 0, 2}, {"<s>", 0, 3}, {"</s>", 0, 3}, {kWs, -1, 1}, {"a", -2, 1}, {"b", -2, 1}, {"c", -2, 1}};
}

// `pieces` followed by the 256 byte pieces <0x00>..<0xFF> a byte_fallback model has.
std::vector<P> with_byte_pieces(std::vector<P> pieces) {
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    pieces.push_back({name, 0, 6});
  }
  return pieces;
}

// Loading the model from a file must fail with a UsageError naming the file and each fragment.
void expect_refused(const std::string& bytes, const std::vector<std::string>& fragments, const std::string& label) {
  const auto path = std::filesystem::temp_directory_path() / ("laoyao_spm_" + std::to_string(::getpid()) + ".model");
  std::ofstream(path, std::ios::binary) << bytes;
  try {
    SentencePieceTokenizer t(path.string());
    ADD_FAILURE() << label << ": accepted";
  } catch (const UsageError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path.string()), std::string::npos) << label << ": " << msg;
    for (const auto& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << label << ": '" << msg << "' lacks '" << f << "'";
  }
  std::filesystem::remove(path);
}

}  // namespace

TEST(SentencePieceModel, ParsesPiecesAndSpecs) {
  auto t = SentencePieceTokenizer::from_bytes(model(base(), 2));
  const auto& m = t->model();
  ASSERT_EQ(m.pieces.size(), 7u);
  EXPECT_EQ(m.pieces[0].type, SentencePieceModelProto::kUnknown);
  EXPECT_EQ(m.pieces[4].piece, "a");
  EXPECT_FLOAT_EQ(m.pieces[4].score, -2.0f);
  EXPECT_EQ(m.model_type, SentencePieceModelProto::kBpe);
  EXPECT_EQ(m.pad_id, -1);
  EXPECT_EQ(m.eos_id, 2);
  EXPECT_EQ(m.normalizer_name, "identity");
  EXPECT_TRUE(m.add_dummy_prefix);
  EXPECT_EQ(t->vocab_size(), 7);
  EXPECT_EQ(t->eod(), 2);
  EXPECT_EQ(t->name(), "GPTSentencePieceTokenizer");
}

TEST(SentencePieceModel, CorruptModelsAreUsageErrors) {
  const std::string good = model(base(), 2);
  EXPECT_THROW(SentencePieceTokenizer::from_bytes(good.substr(0, good.size() - 3)), UsageError);
  EXPECT_THROW(SentencePieceTokenizer::from_bytes(""), UsageError);
  EXPECT_THROW(SentencePieceTokenizer::from_bytes("\x0A\xFF\xFF\xFF\xFF\x0F"), UsageError);  // length past end
  EXPECT_THROW(SentencePieceTokenizer::from_bytes(model(base(), 3)), UsageError);           // WORD model
  auto no_unk = base();
  no_unk[0].type = 1;
  EXPECT_THROW(SentencePieceTokenizer::from_bytes(model(no_unk, 2)), UsageError);
  auto dup = base();
  dup.push_back({"a", -3, 1});
  EXPECT_THROW(SentencePieceTokenizer::from_bytes(model(dup, 2)), UsageError);
  EXPECT_THROW(SentencePieceTokenizer("/nonexistent/tokenizer.model"), UsageError);
}

TEST(SentencePieceModel, PiecesSentencePieceWouldRefuseAreRefusedByIndex) {
  auto with = [](size_t at, P piece, bool byte_fallback = false) {
    auto p = byte_fallback ? with_byte_pieces(base()) : base();
    p.insert(p.begin() + static_cast<std::ptrdiff_t>(at), piece);
    return model(p, 2, byte_fallback);
  };
  expect_refused(with(4, {"", 0, 1}), {"piece 4 is empty"}, "empty");
  expect_refused(with(5, {std::string("a\0b", 3), 0, 1}), {"piece 5", "contains a NUL byte"}, "NUL");
  expect_refused(with(5, {std::string(8000, 'x'), 0, 1}), {"piece 5 is 8000 bytes long"}, "too long");
  expect_refused(with(6, {"\xC3\x28", 0, 1}), {"piece 6", "not valid UTF-8"}, "invalid UTF-8");
  expect_refused(with(3, {"q", 0, 9}), {"piece 3 'q' has type 9"}, "bad type");
  expect_refused(with(7, {"<0x7a>", 0, 6}, true), {"byte piece '<0x7a>' is not of the form <0xNN>"}, "lowercase byte");
  expect_refused(with(7, {"<0x100>", 0, 6}, true), {"byte piece '<0x100>'"}, "long byte");
  auto missing = with_byte_pieces(base());
  missing.erase(missing.begin() + 7 + 0x41);
  expect_refused(model(missing, 2, true), {"no byte piece <0x41>"}, "missing byte");
  expect_refused("", {"no pieces"}, "empty file");
  // A directory is not a model file.
  const auto dir = std::filesystem::temp_directory_path() / ("laoyao_spm_dir_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  try {
    SentencePieceTokenizer t(dir.string());
    ADD_FAILURE() << "a directory was accepted as a model";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("'" + dir.string() + "' is a directory"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

TEST(SentencePieceBpe, HighestScoringPairMergesFirst) {
  auto p = base();
  p.push_back({"ab", -1.0f, 1});   // 7
  p.push_back({"bc", -0.5f, 1});   // 8
  auto t = SentencePieceTokenizer::from_bytes(model(p, 2));
  EXPECT_EQ(t->encode_as_pieces("abc"), (std::vector<std::string>{kWs, "a", "bc"}));
  EXPECT_EQ(t->encode_as_ids("abc"), (std::vector<TokenId>{3, 4, 8}));
  p[7].score = -0.1f;
  auto u = SentencePieceTokenizer::from_bytes(model(p, 2));
  EXPECT_EQ(u->encode_as_pieces("abc"), (std::vector<std::string>{kWs, "ab", "c"}));
}

TEST(SentencePieceBpe, TiesGoToTheLeftmostPair) {
  auto p = base();
  p.push_back({"aa", -1.0f, 1});
  auto t = SentencePieceTokenizer::from_bytes(model(p, 2));
  EXPECT_EQ(t->encode_as_pieces("aaa"), (std::vector<std::string>{kWs, "aa", "a"}));
}

TEST(SentencePieceBpe, UnusedPiecesAreSplitBackUnlessMergedFurther) {
  auto p = base();
  p.push_back({"bc", -0.5f, 5});   // 7, UNUSED
  p.push_back({"abc", -0.1f, 1});  // 8
  auto t = SentencePieceTokenizer::from_bytes(model(p, 2));
  EXPECT_EQ(t->encode_as_ids("bc"), (std::vector<TokenId>{3, 5, 6}));
  EXPECT_EQ(t->encode_as_ids("abc"), (std::vector<TokenId>{3, 8}));
}

TEST(SentencePieceBpe, UserDefinedSymbolsStayWhole) {
  auto p = base();
  p.push_back({"<u>", 0, 4});
  p.push_back({"<", -1, 1});
  auto t = SentencePieceTokenizer::from_bytes(model(p, 2));
  EXPECT_EQ(t->encode_as_pieces("a<u>b"), (std::vector<std::string>{kWs, "a", "<u>", "b"}));
}

TEST(SentencePieceBpe, UnknownsMergeOrFallBackToBytes) {
  auto t = SentencePieceTokenizer::from_bytes(model(base(), 2));
  // "xy" are two unknown symbols, reported as one <unk>.
  EXPECT_EQ(t->encode_as_ids("axyb"), (std::vector<TokenId>{3, 4, 0, 5}));
  auto p = with_byte_pieces(base());  // <0xNN> has id 7 + NN
  auto f = SentencePieceTokenizer::from_bytes(model(p, 2, /*byte_fallback=*/true));
  EXPECT_EQ(f->encode_as_ids("axyb"), (std::vector<TokenId>{3, 4, 7 + 'x', 7 + 'y', 5}));
  EXPECT_EQ(f->decode_ids(std::vector<TokenId>{3, 4, 7 + 'x', 5}), "axb");
  // A byte piece in a model without byte_fallback is refused, as SentencePiece does.
  EXPECT_THROW(SentencePieceTokenizer::from_bytes(model(p, 2, false)), UsageError);
}

TEST(SentencePieceNormalizer, WhitespaceHandling) {
  auto t = SentencePieceTokenizer::from_bytes(model(base(), 2));
  EXPECT_EQ(t->encode_as_pieces("  a   b  "), (std::vector<std::string>{kWs, "a", kWs, "b"}));
  EXPECT_TRUE(t->encode_as_ids("   ").empty());
  EXPECT_TRUE(t->encode_as_ids("").empty());
  auto keep = SentencePieceTokenizer::from_bytes(model(base(), 2, false, /*remove_extra_ws=*/false));
  EXPECT_EQ(keep->encode_as_pieces(" a  b"), (std::vector<std::string>{kWs, kWs, "a", kWs, kWs, "b"}));
  EXPECT_EQ(keep->decode_ids(keep->encode_as_ids(" a  b")), " a  b");
}

TEST(SentencePieceUnigram, ViterbiPicksTheBestScoringSegmentation) {
  auto p = base();
  p.push_back({"ab", -3.0f, 1});                 // 7
  p.push_back({kWs + "a", -2.5f, 1});            // 8
  p.push_back({kWs + "ab", -10.0f, 1});          // 9
  auto t = SentencePieceTokenizer::from_bytes(model(p, 1));
  // ▁ab: [▁ab] -10, [▁a b] -4.5, [▁ ab] -4, [▁ a b] -5.
  EXPECT_EQ(t->encode_as_ids("ab"), (std::vector<TokenId>{3, 7}));
  p[9].score = -3.9f;
  EXPECT_EQ(SentencePieceTokenizer::from_bytes(model(p, 1))->encode_as_ids("ab"), (std::vector<TokenId>{9}));
  // Unknown characters (min score - 10 each) merge into one <unk>.
  EXPECT_EQ(t->encode_as_ids("axyb"), (std::vector<TokenId>{8, 0, 5}));
  EXPECT_EQ(t->decode_ids(std::vector<TokenId>{8, 0, 5}), "a \xE2\x81\x87 b");
}

TEST(SentencePieceFlavors, MegatronLlama2AndGpt) {
  auto p = base();
  p.push_back({"<EOD>", 0, 4});  // present: keeps its id
  const std::string m = model(p, 2);
  auto megatron = SentencePieceTokenizer::from_bytes(m, SentencePieceFlavor::kMegatron, 2);
  EXPECT_EQ(megatron->name(), "SentencePieceTokenizer");
  // <CLS> 8, <SEP> 9, <EOD> 7 (existing), <MASK> 10, <PAD> 11 (pad_id -1), <s> 1, </s> 2,
  // <extra_id_0> 12, <extra_id_1> 13.
  EXPECT_EQ(megatron->vocab_size(), 14);
  EXPECT_EQ(megatron->eod(), 7);
  EXPECT_EQ(megatron->tokenize("a<SEP>b</s>"), (std::vector<TokenId>{3, 4, 9, 3, 5, 2}));
  EXPECT_EQ(megatron->tokenize("<MASK>"), (std::vector<TokenId>{10}));
  auto llama = SentencePieceTokenizer::from_bytes(m, SentencePieceFlavor::kLlama2);
  EXPECT_EQ(llama->tokenize("ab"), (std::vector<TokenId>{1, 3, 4, 5}));
  EXPECT_EQ(llama->eod(), 2);
  EXPECT_EQ(llama->vocab_size(), 8);
  auto gpt = SentencePieceTokenizer::from_bytes(m, SentencePieceFlavor::kGPT);
  EXPECT_EQ(gpt->tokenize("ab"), (std::vector<TokenId>{3, 4, 5}));
  EXPECT_EQ(gpt->detokenize(gpt->tokenize("ab ba")), "ab ba");
}
