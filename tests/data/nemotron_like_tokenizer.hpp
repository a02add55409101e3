// A Nemotron-like Hugging Face tokenizer for Megatron-LM's --sft tests: Qwen3's (build/test-vocabs)
// with Nemotron's chat markers <SPECIAL_10>, <SPECIAL_11>, <SPECIAL_12> and the pad <SPECIAL_233>
// added as special tokens after its own ids, and "<unk>" (a token of its vocabulary) named its
// unknown token, so the prompt formats' markers split the text as Nemotron's tokenizer does.
#pragma once
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>

#include "core/file_io.hpp"

namespace laoyao::test {

inline std::string test_vocab(const std::string& model) {
  const char* env = std::getenv("LAOYAO_TEST_VOCABS");
  return (env && *env ? std::string(env) : std::string(LAOYAO_SOURCE_DIR) + "/build/test-vocabs") + "/" + model;
}

// Written once per process under the temp folder; returns the folder.
inline std::string nemotron_like_tokenizer() {
  namespace fs = std::filesystem;
  const std::string dir = (fs::temp_directory_path() / ("laoyao_nemotron_tok_" + std::to_string(::getpid()))).string();
  if (fs::exists(dir + "/tokenizer_config.json")) return dir;
  fs::create_directories(dir);
  auto read = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  };
  nlohmann::ordered_json t = nlohmann::ordered_json::parse(read(test_vocab("qwen3") + "/tokenizer.json"));
  int64_t id = 0;
  for (const auto& a : t["added_tokens"]) id = std::max<int64_t>(id, a["id"].get<int64_t>() + 1);
  for (const char* name : {"<SPECIAL_10>", "<SPECIAL_11>", "<SPECIAL_12>", "<SPECIAL_233>"})
    t["added_tokens"].push_back({{"id", id++}, {"content", name}, {"single_word", false}, {"lstrip", false},
                                 {"rstrip", false}, {"normalized", false}, {"special", true}});
  write_file_atomic(dir + "/tokenizer.json", t.dump());
  nlohmann::ordered_json c = nlohmann::ordered_json::parse(read(test_vocab("qwen3") + "/tokenizer_config.json"));
  c["unk_token"] = "<unk>";
  // (transformers also reads the added tokens from added_tokens_decoder: tests/gpu/mlm_sft_check.py)
  for (const auto& a : t["added_tokens"])
    c["added_tokens_decoder"][std::to_string(a["id"].get<int64_t>())] = {
        {"content", a["content"]}, {"lstrip", a["lstrip"]},           {"normalized", a["normalized"]},
        {"rstrip", a["rstrip"]},   {"single_word", a["single_word"]}, {"special", a["special"]}};
  write_file_atomic(dir + "/tokenizer_config.json", c.dump());
  return dir;
}

}  // namespace laoyao::test
