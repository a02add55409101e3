// Megatron-LM's --sft data (data/mlm_sft_dataset.hpp) against rows built by hand from the same
// tokenizer's ids of each turn's text: a Nemotron-like tokenizer (nemotron_like_tokenizer.hpp). Each prompt format's
// masking, the packing of a line's conversations (positions restarting, attention within each, the
// padding joining the last), the cut of a row that overflows, context parallelism's padding, the
// default format's loss on everything but the pad, and bad rows named by file and line.
#include "data/mlm_sft_dataset.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "core/file_io.hpp"
#include "nemotron_like_tokenizer.hpp"

using namespace laoyao;
using namespace laoyao::data;
using tokenizer::TokenId;
namespace fs = std::filesystem;

namespace {

std::string vocab(const std::string& model) { return test::test_vocab(model); }

// One tokenizer of each prompt format for the whole suite (Qwen3's vocabulary takes seconds to load).
struct Fixture {
  std::string tok_dir = test::nemotron_like_tokenizer();
  tokenizer::HuggingFaceTokenizer hf{tok_dir, tokenizer::HuggingFaceTokenizerOptions{{}, false}};
  std::map<std::string, std::shared_ptr<const MlmSftTokenizer>> formats;
  std::vector<TokenId> ids(const std::string& text) const { return hf.tokenize(text); }
  TokenId id(const std::string& token) const { return *hf.token_to_id(token); }
  std::shared_ptr<const MlmSftTokenizer> format(const std::string& name) {
    auto& t = formats[name];
    if (!t) t = std::make_shared<MlmSftTokenizer>(tok_dir, name);
    return t;
  }
  MlmSftDataset dataset(const std::string& lines, const std::string& name, int64_t seq, int64_t cp = 1,
                        int64_t samples = 4) {
    const std::string path = tok_dir + "/data.jsonl";
    write_file_atomic(path, lines);
    MlmSftConfig cfg;
    cfg.seq_length = seq, cfg.context_parallel_size = cp, cfg.num_samples = samples;
    return MlmSftDataset(path, 0, count_jsonl_lines(path), format(name), cfg);
  }
};

Fixture& fixture() {
  static Fixture f;
  return f;
}

// A row built by hand: pieces of text with whether their tokens are targets, conversations apart.
struct Expected {
  std::vector<TokenId> tokens, targets;  // kIgnore where masked
  std::vector<int64_t> positions, starts = {0};
  void add(const std::vector<TokenId>& ids, bool target) {
    for (TokenId t : ids) {
      positions.push_back(tokens.empty() || positions.size() == static_cast<size_t>(starts.back()) ? 0 : positions.back() + 1);
      tokens.push_back(t), targets.push_back(target ? t : MlmSftTokenizer::kIgnore);
    }
  }
  void end_conversation() { starts.push_back(static_cast<int64_t>(tokens.size())); }
};

const char* kTwoConversations =
    R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a river."},)"
    R"( {"role": "assistant", "content": "The Nile."}, {"role": "system", "content": "Be kind."},)"
    R"( {"role": "user", "content": "Say hi."}, {"role": "assistant", "content": " Hello there. "}]})"
    "\n";

// The sample a row of `seq` tokens makes of `e` (no cut): padded with `pad`, positions running on,
// the last conversation holding the padding; labels shifted, the loss where the label is a target.
void expect_sample(const GptSample& s, Expected e, int64_t seq, TokenId pad) {
  ASSERT_LE(static_cast<int64_t>(e.tokens.size()), seq);
  while (static_cast<int64_t>(e.tokens.size()) < seq + 1)
    e.positions.push_back(e.positions.back() + 1), e.tokens.push_back(pad), e.targets.push_back(pad);
  ASSERT_EQ(static_cast<int64_t>(s.tokens.size()), seq);
  for (int64_t k = 0; k < seq; ++k) {
    SCOPED_TRACE("token " + std::to_string(k));
    EXPECT_EQ(s.tokens[k], e.tokens[k]);
    EXPECT_EQ(s.position_ids[k], e.positions[k]);
    const TokenId target = e.targets[k + 1];
    const bool loss = target != pad && target != MlmSftTokenizer::kIgnore;
    EXPECT_EQ(s.loss_mask[k], loss ? 1.0f : 0.0f);
    if (loss) {
      EXPECT_EQ(s.labels[k], target);
    }
    int64_t start = 0;
    for (size_t d = 0; d + 1 < e.starts.size(); ++d)
      if (k >= e.starts[d]) start = e.starts[d];
    EXPECT_EQ(s.key_start[k], start);
  }
}

}  // namespace

// nemotron-h-aligned: system and user turns (the user's with the assistant header) masked, the
// assistant's stripped content and newline the targets; two conversations in one row.
TEST(MlmSftDataset, NemotronHAlignedMasksAllButTheAssistantsText) {
  Fixture& f = fixture();
  const MlmSftDataset ds = f.dataset(kTwoConversations, "nemotron-h-aligned", 64);
  Expected e;
  e.add(f.ids("<SPECIAL_10>System\nBe brief.\n"), false);
  e.add(f.ids("<SPECIAL_11>User\nName a river.\n<SPECIAL_11>Assistant\n"), false);
  e.add(f.ids("The Nile.\n"), true);
  e.end_conversation();
  e.add(f.ids("<SPECIAL_10>System\nBe kind.\n"), false);
  e.add(f.ids("<SPECIAL_11>User\nSay hi.\n<SPECIAL_11>Assistant\n"), false);
  e.add(f.ids("Hello there.\n"), true);
  e.end_conversation();
  expect_sample(ds.get(0), e, 64, f.id("<SPECIAL_233>"));
  EXPECT_EQ(ds.get(3).tokens, ds.get(0).tokens) << "samples past the split's lines wrap around";
  EXPECT_EQ(ds.size(), 4);
}

// nemotron-nano-v2: the assistant turn carries its header, whose three tokens are masked; its
// "<SPECIAL_12>" end is a target; the pad is the unknown token.
TEST(MlmSftDataset, NemotronNanoV2MasksTheAssistantsThreeTokenHeader) {
  Fixture& f = fixture();
  const MlmSftDataset ds = f.dataset(kTwoConversations, "nemotron-nano-v2", 80);
  const std::vector<TokenId> header = f.ids("<SPECIAL_11>Assistant\n");
  ASSERT_EQ(header.size(), 3u);
  Expected e;
  e.add(f.ids("<SPECIAL_10>System\nBe brief.\n"), false);
  e.add(f.ids("<SPECIAL_11>User\nName a river.\n"), false);
  e.add(header, false);
  e.add(f.ids("The Nile.\n<SPECIAL_12>\n"), true);
  e.end_conversation();
  e.add(f.ids("<SPECIAL_10>System\nBe kind.\n"), false);
  e.add(f.ids("<SPECIAL_11>User\nSay hi.\n"), false);
  e.add(header, false);
  e.add(f.ids("Hello there.\n<SPECIAL_12>\n"), true);
  e.end_conversation();
  expect_sample(ds.get(1), e, 80, f.id("<unk>"));
}

// A row that overflows is cut at seq_length tokens, its last token then the pad (so the last
// label is the pad, no loss); the cut conversation ends the row.
TEST(MlmSftDataset, AnOverflowingRowIsCutAndEndsWithThePad) {
  Fixture& f = fixture();
  const int64_t seq = 20;
  const GptSample s = f.dataset(kTwoConversations, "nemotron-h-aligned", seq).get(0);
  Expected e;
  e.add(f.ids("<SPECIAL_10>System\nBe brief.\n"), false);
  e.add(f.ids("<SPECIAL_11>User\nName a river.\n<SPECIAL_11>Assistant\n"), false);
  e.add(f.ids("The Nile.\n"), true);
  ASSERT_LT(static_cast<int64_t>(e.tokens.size()), seq + 1);  // the first fits; the second is cut
  const int64_t first = static_cast<int64_t>(e.tokens.size());
  e.end_conversation();
  e.add(f.ids("<SPECIAL_10>System\nBe kind.\n<SPECIAL_11>User\nSay hi.\n"), false);
  ASSERT_GT(static_cast<int64_t>(e.tokens.size()), seq);
  for (int64_t k = 0; k < seq; ++k) {
    EXPECT_EQ(s.tokens[k], e.tokens[k]) << k;
    EXPECT_EQ(s.key_start[k], k < first ? 0 : first) << k;
    EXPECT_EQ(s.position_ids[k], k < first ? k : k - first) << k;
  }
  EXPECT_EQ(s.labels[seq - 1], f.id("<SPECIAL_233>"));
  EXPECT_EQ(s.loss_mask[seq - 1], 0.0f);
}

// Context parallelism: each conversation padded to a multiple of 2 CP tokens, the padding's
// positions running on within the conversation it ends.
TEST(MlmSftDataset, ContextParallelismPadsEachConversation) {
  Fixture& f = fixture();
  const TokenId pad = f.id("<SPECIAL_233>");
  const GptSample s = f.dataset(kTwoConversations, "nemotron-h-aligned", 64, 4).get(0);
  const int64_t first = static_cast<int64_t>(f.ids("<SPECIAL_10>System\nBe brief.\n<SPECIAL_11>User\nName a river.\n"
                                                   "<SPECIAL_11>Assistant\nThe Nile.\n").size());
  const int64_t padded = (first + 7) / 8 * 8;
  ASSERT_GT(padded, first);
  for (int64_t k = first; k < padded; ++k) {
    EXPECT_EQ(s.tokens[k], pad) << k;
    EXPECT_EQ(s.position_ids[k], k) << k;
    EXPECT_EQ(s.key_start[k], 0) << k;
  }
  EXPECT_EQ(s.key_start[padded], padded);
  EXPECT_EQ(s.position_ids[padded], 0);
}

// default: the tokenizer's own chat template, every token a target except where the label is the
// pad (Qwen3's pad_token, <|endoftext|>).
TEST(MlmSftDataset, DefaultFormatCountsEveryLabelButThePad) {
  Fixture& f = fixture();
  const GptSample s = f.dataset(kTwoConversations, "default", 96).get(0);
  const TokenId pad = f.id("<|endoftext|>");
  int64_t counted = 0, real = 0;
  for (size_t k = 0; k < s.tokens.size(); ++k) {
    EXPECT_EQ(s.loss_mask[k], s.labels[k] == pad ? 0.0f : 1.0f) << k;
    counted += s.loss_mask[k] > 0, real += s.tokens[k] != pad;
  }
  EXPECT_EQ(counted, real - 1);  // every real token but the first is some token's label
  EXPECT_EQ(s.tokens[0], f.id("<|im_start|>"));
}

TEST(MlmSftDataset, BadRowsAndFormatsAreNamed) {
  Fixture& f = fixture();
  auto expect_named = [&](const std::string& lines, const std::string& part,
                          const std::string& format = "nemotron-h-aligned") {
    std::string message = "no error";
    try {
      (void)f.dataset(lines, format, 32).get(0);
    } catch (const UsageError& e) {
      message = e.what();
    }
    EXPECT_NE(message.find(part), std::string::npos) << message;
  };
  expect_named(std::string(kTwoConversations) + "{not json}\n", "data.jsonl:2: not a JSON line");
  expect_named("{\"text\": \"x\"}\n", "data.jsonl:1: needs a non-empty \"messages\" list");
  // (Checked turn by turn as Megatron-LM does: an empty answer after a user turn first breaks the
  // user turn's match, "Assistant\n" then "\n" merging into one token.)
  expect_named(R"({"messages": [{"role": "assistant", "content": ""}, {"role": "user", "content": "a"}]})" "\n",
               "an empty assistant turn");
  expect_named(R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": ""}]})" "\n",
               "turn 0 rendered alone is not the conversation's tokens");
  expect_named(R"({"messages": [{"role": "system", "content": "a"}, {"role": "assistant", "content": "b"}]})" "\n",
               "does not follow a user or tool turn");
  expect_named(R"({"messages": [{"role": "critic", "content": "a"}]})" "\n", "role 'critic'");
  expect_named(kTwoConversations, "unknown --sft-tokenizer-prompt-format 'chatml'", "chatml");
  // Qwen3's own tokenizer has neither <SPECIAL_233> nor an unknown token: no pad to use.
  EXPECT_THROW(MlmSftTokenizer(vocab("qwen3"), "nemotron-h-aligned"), UsageError);
}
