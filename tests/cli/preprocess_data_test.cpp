// `laoyao preprocess-data` run as a user runs it: a JSON-lines file of fortunes (Debian's
// `fortunes` package), the built binary, then the .bin/.idx read back with laoyao's reader and
// compared with tokenizing the same text directly; byte-exact output for a hand-computed case;
// bad input (a bad line, a malformed tokenizer file) gives exit status 2, the line number or file
// name, and no files.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "run_binary.hpp"
#include "core/file_io.hpp"
#include "data/indexed_dataset.hpp"
#include "data/tokenizer/byte_level.hpp"
#include "data/tokenizer/gpt2_bpe_tokenizer.hpp"
#include "data/tokenizer/hf_tokenizer.hpp"

using namespace laoyao;
using laoyao::test::count_entries;
using laoyao::test::fresh_dir;
using laoyao::test::run_laoyao;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string vocab_dir() {
  const char* env = std::getenv("LAOYAO_TEST_VOCABS");
  return env && *env ? std::string(env) : std::string(LAOYAO_SOURCE_DIR) + "/build/test-vocabs";
}

bool have(const std::string& path, const std::string& how) {
  if (fs::exists(path)) return true;
  ADD_FAILURE() << path << " is missing: " << how;
  return false;
}

const char* kFetch = "run scripts/fetch_test_vocabs.sh";
const char* kFortunesFile = "/usr/share/games/fortunes/fortunes";

// The fortunes of Debian's `fortunes` package (entries separated by "%" lines).
std::vector<std::string> fortunes() {
  std::vector<std::string> out;
  std::string text = read_file(kFortunesFile), cur;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    std::string line = text.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
    pos = nl == std::string::npos ? text.size() : nl + 1;
    if (line == "%") {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += line + "\n";
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

// "#<i>" (built by appending: GCC 12 warns falsely on "#" + std::to_string(i)).
std::string title_of(size_t i) {
  std::string t = "#";
  t += std::to_string(i);
  return t;
}

void write_lines(const std::string& path, const std::vector<json>& objs) {
  std::ofstream f(path, std::ios::binary);
  for (const auto& o : objs) f << o.dump() << "\n";
}

}  // namespace

TEST(PreprocessData, Gpt2FortunesEqualDirectTokenizationInOrder) {
  const std::string v = vocab_dir() + "/gpt2/vocab.json", m = vocab_dir() + "/gpt2/merges.txt";
  if (!have(v, kFetch) || !have(kFortunesFile, "apt-get install fortunes")) return;
  const auto texts = fortunes();
  ASSERT_GT(texts.size(), 300u);
  // Documents: fortunes, one empty text, and one list of sentences (one sequence each).
  std::vector<json> lines;
  for (size_t i = 0; i < 300; ++i) lines.push_back({{"text", texts[i]}, {"id", i}});
  lines.insert(lines.begin() + 5, json{{"text", ""}});
  lines.insert(lines.begin() + 9, json{{"text", json::array({texts[400], "", texts[401]})}});
  const std::string dir = fresh_dir("preprocess_gpt2");
  write_lines(dir + "/in.jsonl", lines);
  auto r = run_laoyao({"preprocess-data", "--input", "in.jsonl", "--output-prefix", "out/fortunes",
                       "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", v, "--merge-file", m,
                       "--append-eod", "--workers", "3", "--log-interval", "100"},
                      dir, "");
  // The output directory must exist; make it and run again.
  EXPECT_EQ(r.status, 2) << r.output;
  fs::create_directories(dir + "/out");
  r = run_laoyao({"preprocess-data", "--input", "in.jsonl", "--output-prefix", "out/fortunes", "--tokenizer-type",
                  "GPT2BPETokenizer", "--vocab-file", v, "--merge-file", m, "--append-eod", "--workers", "3",
                  "--log-interval", "100"},
                 dir);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("Processed 100 documents ("), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("docs/s"), std::string::npos);
  EXPECT_NE(r.output.find("MB/s"), std::string::npos);

  data::IndexedDataset ds(dir + "/out/fortunes_text_document");
  EXPECT_EQ(ds.dtype(), data::TokenDType::kUInt16);
  auto tok = tokenizer::GPT2BPETokenizer(v, m);
  std::vector<int64_t> want_doc_indices{0};
  int64_t seq = 0;
  for (const auto& line : lines) {
    std::vector<std::string> sentences;
    if (line["text"].is_array()) {
      for (const auto& s : line["text"]) sentences.push_back(s.get<std::string>());
    } else {
      sentences.push_back(line["text"].get<std::string>());
    }
    std::vector<std::vector<int64_t>> want;
    for (const auto& s : sentences) {
      auto ids = tok.tokenize(s);
      if (!ids.empty()) want.push_back(ids);
    }
    if (!want.empty()) want.back().push_back(50256);  // --append-eod
    for (const auto& w : want) {
      ASSERT_LT(seq, ds.sequence_count());
      EXPECT_EQ(ds.sequence(seq), w) << "sequence " << seq;
      ++seq;
    }
    want_doc_indices.push_back(seq);  // an empty document repeats the previous entry
  }
  EXPECT_EQ(ds.sequence_count(), seq);
  EXPECT_EQ(ds.document_indices(), want_doc_indices);
  EXPECT_EQ(want_doc_indices[6], want_doc_indices[5]);

  // One worker writes the same bytes as three.
  r = run_laoyao({"preprocess-data", "--input", "in.jsonl", "--output-prefix", "out/one", "--tokenizer-type",
                  "GPT2BPETokenizer", "--vocab-file", v, "--merge-file", m, "--append-eod", "--workers=1"},
                 dir);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(read_file(dir + "/out/one_text_document.bin"), read_file(dir + "/out/fortunes_text_document.bin"));
  EXPECT_EQ(read_file(dir + "/out/one_text_document.idx"), read_file(dir + "/out/fortunes_text_document.idx"));
  EXPECT_EQ(count_entries(dir + "/out"), 4u) << "temporary files left behind";
}

TEST(PreprocessData, WritesTheBytesMegatronWrites) {
  const std::string dir = fresh_dir("preprocess_bytes");
  write_lines(dir + "/in.jsonl", {json{{"text", "1 2 3"}}, json{{"text", json::array({"4", "5 6"})}}});
  auto r = run_laoyao({"preprocess-data", "--input", "in.jsonl", "--output-prefix", "p", "--tokenizer-type",
                       "NullTokenizer", "--vocab-size", "100", "--append-eod", "--workers", "2"},
                      dir);
  ASSERT_EQ(r.status, 0) << r.output;
  // Sequences [1 2 3 99], [4], [5 6 99] (eod = V-1 = 99) as uint16; documents [0, 1, 3].
  const std::string bin("\x01\x00\x02\x00\x03\x00\x63\x00\x04\x00\x05\x00\x06\x00\x63\x00", 16);
  const std::string idx(
      "MMIDIDX\x00\x00"
      "\x01\x00\x00\x00\x00\x00\x00\x00"  // version
      "\x08"                              // uint16
      "\x03\x00\x00\x00\x00\x00\x00\x00"  // 3 sequences
      "\x03\x00\x00\x00\x00\x00\x00\x00"  // 3 document indices
      "\x04\x00\x00\x00\x01\x00\x00\x00\x03\x00\x00\x00"
      "\x00\x00\x00\x00\x00\x00\x00\x00\x08\x00\x00\x00\x00\x00\x00\x00\x0A\x00\x00\x00\x00\x00\x00\x00"
      "\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x03\x00\x00\x00\x00\x00\x00\x00",
      34 + 12 + 24 + 24);
  EXPECT_EQ(read_file(dir + "/p_text_document.bin"), bin);
  EXPECT_EQ(read_file(dir + "/p_text_document.idx"), idx);
}

TEST(PreprocessData, LargeVocabulariesUseInt32) {
  const std::string dir = fresh_dir("preprocess_int32");
  write_lines(dir + "/in.jsonl", {json{{"text", "69998 0"}}});
  auto r = run_laoyao({"preprocess-data", "--input", "in.jsonl", "--output-prefix", "p", "--tokenizer-type",
                       "NullTokenizer", "--vocab-size", "70000", "--append-eod"},
                      dir);
  ASSERT_EQ(r.status, 0) << r.output;
  data::IndexedDataset ds(dir + "/p_text_document");
  EXPECT_EQ(ds.dtype(), data::TokenDType::kInt32);
  EXPECT_EQ(ds.sequence(0), (std::vector<int64_t>{69998, 0, 69999}));
}

TEST(PreprocessData, HuggingFaceTokenizerAndSeveralKeys) {
  const std::string qwen = vocab_dir() + "/qwen3";
  if (!have(qwen + "/tokenizer.json", kFetch) || !have(kFortunesFile, "apt-get install fortunes")) return;
  const auto texts = fortunes();
  std::vector<json> lines;
  for (size_t i = 0; i < 40; ++i) lines.push_back({{"title", title_of(i)}, {"text", texts[i]}});
  const std::string dir = fresh_dir("preprocess_hf");
  write_lines(dir + "/in.jsonl", lines);
  auto r = run_laoyao({"preprocess-data", "--input", "in.jsonl", "--output-prefix", "q", "--tokenizer-type",
                       "HuggingFaceTokenizer", "--tokenizer-model", qwen, "--json-keys", "text", "title",
                       "--append-eod", "--workers", "2"},
                      dir);
  ASSERT_EQ(r.status, 0) << r.output;
  tokenizer::HuggingFaceTokenizer tok(qwen);
  data::IndexedDataset text(dir + "/q_text_document"), title(dir + "/q_title_document");
  EXPECT_EQ(text.dtype(), data::TokenDType::kInt32);  // vocab 151669 >= 65500
  ASSERT_EQ(text.sequence_count(), 40);
  ASSERT_EQ(title.sequence_count(), 40);
  for (size_t i = 0; i < 40; ++i) {
    auto want = tok.tokenize(texts[i]);
    want.push_back(151645);
    EXPECT_EQ(text.sequence(static_cast<int64_t>(i)), want);
    auto want_title = tok.tokenize(title_of(i));
    want_title.push_back(151645);
    EXPECT_EQ(title.sequence(static_cast<int64_t>(i)), want_title);
  }
}

TEST(PreprocessData, BadLinesStopWithTheLineNumberAndWriteNothing) {
  struct Case {
    std::string third_line, expect;
  };
  for (const Case& c : std::vector<Case>{{"{\"text\": \"1 2\",}", "line 3: not valid JSON"},
                                         {"", "line 3: not valid JSON"},
                                         {"[1, 2]", "line 3: expected a JSON object"},
                                         {"{\"txt\": \"1\"}", "line 3: no key \"text\""},
                                         {"{\"text\": 5}", "line 3: \"text\" is a number"},
                                         {"{\"text\": \"1 x\"}", "line 3: \"text\": NullTokenizer: 'x'"},
                                         {"{\"text\": \"70000\"}", "line 3: indexed dataset"}}) {
    const std::string dir = fresh_dir("preprocess_bad");
    {
      std::ofstream f(dir + "/in.jsonl", std::ios::binary);
      f << "{\"text\": \"1 2\"}\n{\"text\": \"3\"}\n" << c.third_line << "\n{\"text\": \"4\"}\n";
    }
    auto r = run_laoyao({"preprocess-data", "--input", "in.jsonl", "--output-prefix", "p", "--tokenizer-type",
                         "NullTokenizer", "--vocab-size", "100", "--workers", "2"},
                        dir);
    EXPECT_EQ(r.status, 2) << c.third_line << "\n" << r.output;
    EXPECT_NE(r.output.find(c.expect), std::string::npos) << r.output;
    EXPECT_EQ(count_entries(dir), 1u) << "files written for a bad input: " << c.third_line;
  }
}

TEST(PreprocessData, BadArgumentsAreRefusedByName) {
  const std::string dir = fresh_dir("preprocess_args");
  write_lines(dir + "/in.jsonl", {json{{"text", "1"}}});
  const std::vector<std::string> base{"preprocess-data", "--input", "in.jsonl", "--output-prefix", "p",
                                      "--tokenizer-type", "NullTokenizer", "--vocab-size", "10"};
  auto with = [&](std::vector<std::string> extra) {
    auto a = base;
    a.insert(a.end(), extra.begin(), extra.end());
    return run_laoyao(a, dir);
  };
  auto r = with({"--split-sentences"});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("--split-sentences is a preprocess_data.py option laoyao does not support"), std::string::npos)
      << r.output;
  r = with({"--apend-eod"});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("did you mean --append-eod"), std::string::npos) << r.output;
  r = with({"--workers", "0"});
  EXPECT_EQ(r.status, 2);
  r = run_laoyao({"preprocess-data", "--input", "missing.jsonl", "--output-prefix", "p", "--tokenizer-type",
                  "NullTokenizer", "--vocab-size", "10"},
                 dir);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("missing.jsonl"), std::string::npos) << r.output;
  r = run_laoyao({"preprocess-data", "--input", "in.jsonl", "--output-prefix", "p", "--tokenizer-type", "NullTokenizer"},
                 dir);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("--vocab-size"), std::string::npos) << r.output;
  EXPECT_EQ(count_entries(dir), 1u);
  r = run_laoyao({"preprocess-data", "--help"}, dir);
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(r.output.find("--json-keys"), std::string::npos);
}

TEST(PreprocessData, MalformedTokenizerFilesStopWithTheFileNameAndWriteNothing) {
  const std::string dir = fresh_dir("preprocess_bad_tokenizer");
  write_lines(dir + "/in.jsonl", {json{{"text", "hello world"}}, json{{"text", "more text"}}});
  // A GPT-2 byte-level vocabulary of the 256 byte characters, "ll" and the end-of-document token.
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[tokenizer::byte_level_char(static_cast<unsigned char>(b))] = b;
  vocab["ll"] = 256;
  vocab["<|endoftext|>"] = 257;
  fs::create_directories(dir + "/tok/empty_vocab");
  fs::create_directories(dir + "/tok/no_json");
  fs::create_directories(dir + "/out");
  auto write = [&](const std::string& rel, const std::string& text) {
    std::ofstream(dir + "/" + rel, std::ios::binary) << text;
    return dir + "/" + rel;
  };
  const std::string v = write("tok/vocab.json", vocab.dump());
  std::string random(3000, '\0');
  for (size_t i = 0; i < random.size(); ++i) random[i] = static_cast<char>((i * 2654435761u) >> 13);
  const std::string hf_empty = write(
      "tok/empty_vocab/tokenizer.json",
      R"({"model": {"type": "BPE", "vocab": {}, "merges": []}, "added_tokens": [{"id": 0, "content": "<eos>"}],
          "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true}})");
  write("tok/empty_vocab/tokenizer_config.json", R"({"eos_token": "<eos>"})");

  struct Case {
    std::vector<std::string> tokenizer_args;
    std::vector<std::string> expect;
  };
  const std::vector<Case> cases = {
      {{"--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", v, "--merge-file",
        write("tok/one_field.txt", "#version: 0.2\nl l\nll\n")},
       {"merge file '" + dir + "/tok/one_field.txt' line 3", "has 1 field"}},
      {{"--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", v, "--merge-file",
        write("tok/four_fields.txt", "#version: 0.2\nl l l l\n")},
       {"merge file '" + dir + "/tok/four_fields.txt' line 2", "has 4 fields"}},
      {{"--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", v, "--merge-file", write("tok/random.txt", random)},
       {"merge file '" + dir + "/tok/random.txt' line "}},
      {{"--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", dir + "/tok", "--merge-file",
        write("tok/ok.txt", "#version: 0.2\nl l\n")},
       {"--vocab-file", "'" + dir + "/tok' is a directory"}},
      {{"--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", dir + "/tok/empty_vocab"},
       {"HuggingFaceTokenizer file '" + hf_empty + "'", "model.vocab is empty"}},
      {{"--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", dir + "/tok/no_json"},
       {"directory '" + dir + "/tok/no_json' has no tokenizer.json"}},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args{"preprocess-data", "--input", "in.jsonl", "--output-prefix", "out/p", "--append-eod"};
    args.insert(args.end(), c.tokenizer_args.begin(), c.tokenizer_args.end());
    auto r = run_laoyao(args, dir);
    EXPECT_EQ(r.status, 2) << c.expect[0] << "\n" << r.output;
    for (const auto& e : c.expect) EXPECT_NE(r.output.find(e), std::string::npos) << "lacks '" << e << "':\n" << r.output;
    EXPECT_EQ(r.output.find("Done"), std::string::npos) << r.output;
    EXPECT_EQ(count_entries(dir + "/out"), 0u) << "files written for a bad tokenizer: " << c.expect[0];
  }
  // The same command with a good merges file works (the fixture itself is sound).
  auto r = run_laoyao({"preprocess-data", "--input", "in.jsonl", "--output-prefix", "out/p", "--append-eod",
                       "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", v, "--merge-file", dir + "/tok/ok.txt"},
                      dir);
  ASSERT_EQ(r.status, 0) << r.output;
  data::IndexedDataset ds(dir + "/out/p_text_document");
  EXPECT_EQ(ds.sequence(0).back(), 257);
}
