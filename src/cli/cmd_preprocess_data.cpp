// laoyao preprocess-data --input x.jsonl --output-prefix P --tokenizer-type T [tokenizer args]
//                        [--json-keys text ...] [--append-eod] [--workers N] [--log-interval N]
// Megatron's tools/preprocess_data.py: every line of the input is a JSON object; the value of
// each --json-keys key (a string, or a list of strings) is tokenized and written as one document
// of P_<key>_document.{bin,idx}, in input order, dtype chosen from the vocab size as Megatron's
// DType.optimal_dtype does. What Megatron's Encoder.encode does per line is reproduced exactly:
//   - a list value gives one sequence per non-empty element, a string one sequence;
//   - --append-eod appends the tokenizer's eod to a non-empty document (in its last sequence);
//   - an empty document adds no sequence but still closes a document (document_indices repeats).
// Malformed input (bad JSON, a missing key, a value that is not text) stops the run with the
// line number and exit status 2, and nothing is written (the builders write temporary files).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cli/cli.hpp"
#include "core/error.hpp"
#include "core/text.hpp"
#include "data/indexed_dataset.hpp"
#include "data/tokenizer/tokenizer_factory.hpp"

namespace laoyao::cli {
namespace {

namespace fs = std::filesystem;
using tokenizer::TokenId;

struct Options {
  std::string input, output_prefix;
  std::vector<std::string> json_keys{"text"};
  tokenizer::TokenizerSpec tok;
  bool append_eod = false;
  int workers = 1;
  int64_t log_interval = 1000;
};

void print_help() {
  std::printf(
      "usage: laoyao preprocess-data --input FILE.jsonl --output-prefix PREFIX\n"
      "                              --tokenizer-type TYPE [tokenizer arguments] [options]\n"
      "\n"
      "Tokenizes a JSON-lines file into Megatron indexed datasets PREFIX_<key>_document.bin/.idx\n"
      "(the files Megatron-LM's tools/preprocess_data.py writes, byte for byte); train on them\n"
      "with --data-path PREFIX_text_document.\n"
      "\n"
      "input and output:\n"
      "  --input FILE              one JSON object per line\n"
      "  --json-keys KEY [KEY...]  keys to tokenize, one output dataset each (default: text); a\n"
      "                            value is a string or a list of strings (one sequence each)\n"
      "  --output-prefix PREFIX    output path without suffix (its directory must exist)\n"
      "  --append-eod              append the tokenizer's end-of-document id to each document\n"
      "\n"
      "tokenizer (as Megatron's):\n"
      "  --tokenizer-type TYPE     %s\n"
      "  --vocab-file F --merge-file F   GPT2BPETokenizer: GPT-2's vocab.json and merges.txt\n"
      "  --tokenizer-model PATH    HuggingFaceTokenizer: tokenizer.json or its directory;\n"
      "                            SentencePiece types: the .model file\n"
      "  --vocab-size V            NullTokenizer (the text is space-separated ids; eod = V-1)\n"
      "  --null-tokenizer-eod-id N NullTokenizer's eod instead of V-1\n"
      "\n"
      "runtime:\n"
      "  --workers N               tokenizer threads (default 1); output order is input order\n"
      "  --log-interval N          progress line on stderr every N documents (default 1000)\n"
      "  --partitions N, --keep-sequential-samples, --lang L\n"
      "                            accepted; they do not change the output (Megatron merges\n"
      "                            partitions back in order; --lang only affects sentence splitting)\n"
      "\n"
      "not supported (refused): --split-sentences, --keep-newlines, --find-optimal-num-workers,\n"
      "--workers-to-check, --max-documents, --performance-dir, the tiktoken arguments.\n",
      join(tokenizer::supported_tokenizer_types(), ", ").c_str());
}

int64_t parse_int(const std::string& flag, const std::string& v, int64_t min) {
  size_t pos = 0;
  int64_t x = 0;
  try {
    x = std::stoll(v, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  if (pos != v.size() || v.empty()) throw UsageError(flag + " expects an integer, got '" + v + "'");
  if (x < min) throw UsageError(flag + " must be >= " + std::to_string(min) + ", got " + v);
  return x;
}

Options parse(const Args& args) {
  static const std::vector<std::string> kValueFlags = {
      "--input", "--output-prefix", "--tokenizer-type", "--tokenizer-model", "--vocab-file", "--merge-file",
      "--vocab-size", "--null-tokenizer-eod-id", "--workers", "--log-interval", "--partitions", "--lang",
      "--vocab-extra-ids"};
  static const std::vector<std::string> kSwitches = {"--append-eod", "--keep-sequential-samples"};
  static const std::vector<std::string> kRefused = {
      "--split-sentences", "--keep-newlines", "--find-optimal-num-workers", "--workers-to-check",
      "--max-documents", "--performance-dir", "--tiktoken-pattern", "--tiktoken-num-special-tokens",
      "--tiktoken-special-tokens"};
  std::vector<std::string> all = kValueFlags;
  all.insert(all.end(), kSwitches.begin(), kSwitches.end());
  all.insert(all.end(), kRefused.begin(), kRefused.end());
  all.push_back("--json-keys");

  Options o;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string flag = args[i];
    std::optional<std::string> inline_value;
    if (auto eq = flag.find('='); starts_with(flag, "--") && eq != std::string::npos) {
      inline_value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
    }
    if (std::find(kRefused.begin(), kRefused.end(), flag) != kRefused.end()) {
      throw UsageError(flag + " is a preprocess_data.py option laoyao does not support" +
                       (flag == "--split-sentences" || flag == "--keep-newlines"
                            ? std::string(" (sentence splitting needs NLTK's punkt models; split the text "
                                          "before, and give each document's sentences as a JSON list)")
                            : std::string()));
    }
    if (flag == "--json-keys") {
      o.json_keys.clear();
      if (inline_value) o.json_keys.push_back(*inline_value);
      while (i + 1 < args.size() && !starts_with(args[i + 1], "--")) o.json_keys.push_back(args[++i]);
      if (o.json_keys.empty()) throw UsageError("--json-keys needs at least one key");
      continue;
    }
    if (std::find(kSwitches.begin(), kSwitches.end(), flag) != kSwitches.end()) {
      if (inline_value) throw UsageError(flag + " takes no value");
      if (flag == "--append-eod") o.append_eod = true;
      continue;
    }
    if (std::find(kValueFlags.begin(), kValueFlags.end(), flag) == kValueFlags.end()) {
      throw UsageError("unknown argument '" + args[i] + "'" + did_you_mean(flag, all) +
                       "; `laoyao preprocess-data --help` lists them");
    }
    std::string v;
    if (inline_value) {
      v = *inline_value;
    } else {
      if (i + 1 >= args.size()) throw UsageError(flag + " needs a value");
      v = args[++i];
    }
    if (flag == "--input") o.input = v;
    else if (flag == "--output-prefix") o.output_prefix = v;
    else if (flag == "--tokenizer-type") o.tok.type = v;
    else if (flag == "--tokenizer-model") o.tok.model = v;
    else if (flag == "--vocab-file") o.tok.vocab_file = v;
    else if (flag == "--merge-file") o.tok.merge_file = v;
    else if (flag == "--vocab-size") o.tok.vocab_size = parse_int(flag, v, 1);
    else if (flag == "--null-tokenizer-eod-id") o.tok.null_eod_id = parse_int(flag, v, 0);
    else if (flag == "--workers") o.workers = static_cast<int>(parse_int(flag, v, 1));
    else if (flag == "--log-interval") o.log_interval = parse_int(flag, v, 1);
    else if (flag == "--partitions") parse_int(flag, v, 1);
    else if (flag == "--vocab-extra-ids") {
      if (parse_int(flag, v, 0) != 0) {
        throw UsageError("--vocab-extra-ids: preprocess_data.py always tokenizes with 0 extra ids");
      }
    }
    // --lang: only read by sentence splitting.
  }
  if (o.input.empty()) throw UsageError("--input is required (a JSON-lines file)");
  if (o.output_prefix.empty()) throw UsageError("--output-prefix is required");
  if (o.tok.type.empty()) {
    throw UsageError("--tokenizer-type is required (" + join(tokenizer::supported_tokenizer_types(), ", ") + ")");
  }
  if (o.workers > 256) throw UsageError("--workers must be at most 256, got " + std::to_string(o.workers));
  return o;
}

// One input line, tokenized: per key, the ids of the document and its sequence lengths.
struct Encoded {
  std::vector<std::vector<int64_t>> ids, lengths;  // [key]
  std::string error;                               // set when the line is bad
};

Encoded encode_line(const std::string& line, const Options& o, const tokenizer::Tokenizer& tok) {
  Encoded e;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& ex) {
    std::string what = ex.what();
    // nlohmann's messages start "[json.exception.parse_error.101] parse error at line 1, ...".
    if (auto p = what.find("] "); p != std::string::npos) what = what.substr(p + 2);
    e.error = "not valid JSON: " + what;
    return e;
  }
  if (!j.is_object()) {
    e.error = "expected a JSON object, got " + std::string(j.type_name());
    return e;
  }
  for (const auto& key : o.json_keys) {
    auto it = j.find(key);
    if (it == j.end()) {
      e.error = "no key \"" + key + "\" (--json-keys)";
      return e;
    }
    std::vector<std::string> sentences;
    if (it->is_string()) {
      sentences.push_back(it->get<std::string>());
    } else if (it->is_array()) {
      for (const auto& s : *it) {
        if (!s.is_string()) {
          e.error = "\"" + key + "\" is a list with a " + std::string(s.type_name()) + " in it (expected strings)";
          return e;
        }
        sentences.push_back(s.get<std::string>());
      }
    } else {
      e.error = "\"" + key + "\" is a " + std::string(it->type_name()) + " (expected a string or a list of strings)";
      return e;
    }
    std::vector<int64_t> doc, lens;
    try {
      for (const auto& s : sentences) {
        std::vector<TokenId> ids = tok.tokenize(s);
        if (ids.empty()) continue;
        doc.insert(doc.end(), ids.begin(), ids.end());
        lens.push_back(static_cast<int64_t>(ids.size()));
      }
    } catch (const Error& ex) {
      e.error = "\"" + key + "\": " + ex.what();
      return e;
    }
    if (!doc.empty() && o.append_eod) {
      doc.push_back(tok.eod());
      lens.back() += 1;
    }
    e.ids.push_back(std::move(doc));
    e.lengths.push_back(std::move(lens));
  }
  return e;
}

std::string output_prefix_for(const Options& o, const std::string& key) {
  return o.output_prefix + "_" + key + "_document";
}

}  // namespace

int cmd_preprocess_data(const Args& args) {
  for (const auto& a : args) {
    if (a == "--help" || a == "-h") {
      print_help();
      return 0;
    }
  }
  const Options o = parse(args);
  std::ifstream in(o.input, std::ios::binary);
  if (!in || fs::is_directory(o.input)) throw UsageError("cannot read --input '" + o.input + "'");
  const fs::path out_dir = fs::path(o.output_prefix).parent_path();
  if (!out_dir.empty() && !fs::is_directory(out_dir)) {
    throw UsageError("the directory of --output-prefix, '" + out_dir.string() + "', does not exist");
  }
  const auto tok = tokenizer::make_tokenizer(o.tok);
  if (o.append_eod && tok->eod() < 0) {
    throw UsageError("--append-eod: tokenizer " + tok->name() +
                     " has no end-of-document token (for HuggingFaceTokenizer, eos_token comes from "
                     "tokenizer_config.json next to tokenizer.json)");
  }
  const data::TokenDType dtype = data::optimal_dtype(tok->vocab_size());
  std::vector<std::unique_ptr<data::IndexedDatasetBuilder>> builders;
  for (const auto& key : o.json_keys) {
    builders.push_back(std::make_unique<data::IndexedDatasetBuilder>(output_prefix_for(o, key), dtype));
  }
  std::printf("Opening %s\ntokenizer %s: vocab size %lld, eod %lld; dtype %s; %d worker%s\n", o.input.c_str(),
              tok->name().c_str(), static_cast<long long>(tok->vocab_size()), static_cast<long long>(tok->eod()),
              data::dtype_name(dtype), o.workers, o.workers == 1 ? "" : "s");
  std::fflush(stdout);

  // Batches of lines are tokenized by the workers in parallel, then written in input order.
  constexpr size_t kBatchLines = 2048;
  const auto start = std::chrono::steady_clock::now();
  int64_t docs = 0, line_no = 0, next_log = o.log_interval;
  uint64_t bytes = 0;
  auto progress = [&](bool final) {
    const double secs = std::max(1e-9, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    std::fprintf(stderr, "%s %lld documents (%.1f docs/s, %.2f MB/s).\n", final ? "Done:" : "Processed",
                 static_cast<long long>(docs), static_cast<double>(docs) / secs,
                 static_cast<double>(bytes) / secs / 1024.0 / 1024.0);
  };
  std::vector<std::string> lines;
  std::vector<Encoded> results;
  while (true) {
    lines.clear();
    std::string line;
    while (lines.size() < kBatchLines && std::getline(in, line)) lines.push_back(std::move(line));
    if (lines.empty()) break;
    results.assign(lines.size(), Encoded{});
    const int n_threads = std::min<int>(o.workers, static_cast<int>(lines.size()));
    std::atomic<size_t> next{0};
    auto work = [&] {
      for (size_t k; (k = next.fetch_add(1)) < lines.size();) {
        try {
          results[k] = encode_line(lines[k], o, *tok);
        } catch (const std::exception& ex) {
          results[k].error = ex.what();
        }
      }
    };
    std::vector<std::thread> threads;
    for (int t = 1; t < n_threads; ++t) threads.emplace_back(work);
    work();
    for (auto& t : threads) t.join();
    for (size_t k = 0; k < lines.size(); ++k) {
      ++line_no;
      if (!results[k].error.empty()) {
        for (auto& b : builders) b->abandon();
        throw UsageError("--input '" + o.input + "' line " + std::to_string(line_no) + ": " + results[k].error);
      }
      try {
        for (size_t key = 0; key < builders.size(); ++key) {
          builders[key]->add_document(results[k].ids[key], results[k].lengths[key]);
        }
      } catch (const UsageError& ex) {  // an id the dtype cannot hold (e.g. NullTokenizer input)
        for (auto& b : builders) b->abandon();
        throw UsageError("--input '" + o.input + "' line " + std::to_string(line_no) + ": " + ex.what());
      }
      bytes += lines[k].size() + 1;
      ++docs;
      if (docs >= next_log) {
        progress(false);
        next_log += o.log_interval;
      }
    }
  }
  if (in.bad()) {
    for (auto& b : builders) b->abandon();
    throw UsageError("error reading --input '" + o.input + "'");
  }
  for (auto& b : builders) b->finalize();
  progress(true);
  for (const auto& key : o.json_keys) {
    const std::string p = output_prefix_for(o, key);
    std::printf("wrote %s.bin and %s.idx\n", p.c_str(), p.c_str());
  }
  return 0;
}

}  // namespace laoyao::cli
