// laoyao checkpoint import-hf HF_DIR OUT_DIR
// laoyao checkpoint export-hf CKPT OUT_DIR [--dtype bf16|fp32] [--max-shard-size SIZE] [--adapters]
// Checkpoint conversions. import-hf: a Hugging Face model folder into a folder that
// --pretrained-checkpoint (checkpoint.pretrained_checkpoint) reads, with the model's Megatron-LM
// flags and Bridge overrides beside it (train/hf_import.hpp); export-hf: a laoyao checkpoint or an
// imported folder back into a Hugging Face folder (train/hf_export.hpp).
#include <chrono>
#include <cstdio>
#include <string>

#include "cli/cli.hpp"
#include "core/error.hpp"
#include "core/text.hpp"
#include "train/hf_export.hpp"
#include "train/hf_import.hpp"

namespace laoyao::cli {
namespace {

void print_help() {
  std::string archs;
  for (const auto& a : train::hf_architecture_names()) archs += (archs.empty() ? "" : ", ") + a;
  std::printf(
      "usage: laoyao checkpoint import-hf HF_DIR OUT_DIR\n"
      "       laoyao checkpoint export-hf CKPT OUT_DIR [--dtype bf16|fp32] [--max-shard-size SIZE] [--adapters]\n"
      "\n"
      "import-hf  converts a Hugging Face model folder (config.json, *.safetensors with or without\n"
      "           model.safetensors.index.json, F32/BF16/F16) into OUT_DIR, a new folder holding:\n"
      "             model.safetensors     the weights under Megatron-Core's names, in the source's\n"
      "                                   dtype, bit for bit (QKV interleaved per query group,\n"
      "                                   linear_fc1 as [gate; up], as Megatron-Bridge maps them)\n"
      "             model_flags.txt       the model's Megatron-LM flags, with --pretrained-checkpoint\n"
      "                                   OUT_DIR: `laoyao pretrain-gpt $(cat OUT_DIR/model_flags.txt) ...`\n"
      "             model_overrides.txt   the same as Megatron-Bridge overrides (model.*,\n"
      "                                   checkpoint.pretrained_checkpoint) for run-recipe\n"
      "             tokenizer files       copied (with tokenizer.json the flags name OUT_DIR as a\n"
      "                                   HuggingFaceTokenizer)\n"
      "           Architectures: %s.\n"
      "\n"
      "export-hf  writes a laoyao checkpoint (a --save folder or one of its iter_NNNNNNN folders,\n"
      "           saved at any TP/DP/EP size) or an import-hf folder as a new Hugging Face folder:\n"
      "           config.json (an imported folder's own), the weights under Hugging Face's names in\n"
      "           safetensors files of at most --max-shard-size (default 5GB; several: with\n"
      "           model.safetensors.index.json), and the run's tokenizer files. --dtype: bf16 (the\n"
      "           fp32 main weights rounded to nearest even) or fp32; default: the run's. A LoRA run's\n"
      "           checkpoint (the adapters alone) is written merged into its base\n"
      "           (checkpoint.pretrained_checkpoint), or with --adapters as PEFT's own files\n"
      "           (adapter_model.safetensors, adapter_config.json).\n",
      archs.c_str());
}

// "import-hf: 120 of 291 tensors, 6.20 GB, 1.84 GB/s" on stderr as a long conversion goes.
train::HfProgress progress_line(const char* what) {
  return [what](int64_t done, int64_t total, uint64_t bytes, double seconds) {
    const double gb = static_cast<double>(bytes) / 1e9;
    std::fprintf(stderr, "%s: %lld of %lld tensors, %.2f GB, %.2f GB/s\n", what, static_cast<long long>(done),
                 static_cast<long long>(total), gb, seconds > 0 ? gb / seconds : 0.0);
  };
}

// "3.2 s, 1.84 GB/s": a conversion's time and rate.
std::string rate(uint64_t bytes, std::chrono::steady_clock::time_point start) {
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f s, %.2f GB/s", s, s > 0 ? static_cast<double>(bytes) / 1e9 / s : 0.0);
  return buf;
}

int import_hf(const Args& args) {
  if (args.size() != 2)
    throw UsageError("import-hf takes HF_DIR OUT_DIR (" + std::to_string(args.size()) + " arguments given)");
  const auto start = std::chrono::steady_clock::now();
  const train::HfImportResult r = train::import_hf(args[0], args[1], progress_line("import-hf"));
  std::printf("imported %s: %lld tensors, %.3f GB into %s (%s)\n", r.model.arch_name.c_str(),
              static_cast<long long>(r.tensors), static_cast<double>(r.bytes) / 1e9, args[1].c_str(),
              rate(r.bytes, start).c_str());
  if (r.tokenizer.empty())
    std::printf("no tokenizer files beside the weights: give the run a --tokenizer-type of its own\n");
  std::printf("model flags: %s\n", r.flags.c_str());
  return 0;
}

// "5GB", "200MB", "4096": bytes (decimal units, as transformers' max_shard_size).
uint64_t parse_size(const std::string& text) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  const std::string unit = text.substr(used);
  const double scale = unit == "GB" ? 1e9 : unit == "MB" ? 1e6 : unit == "KB" ? 1e3 : unit.empty() ? 1 : -1;
  if (used == 0 || scale < 0 || !(value * scale >= 1))
    throw UsageError("--max-shard-size '" + text + "': expected a size such as 5GB, 200MB or 4096 (bytes)");
  return static_cast<uint64_t>(value * scale);
}

int export_hf(const Args& args) {
  std::vector<std::string> paths;
  train::HfExportOptions options;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--adapters") {
      options.adapters = true;
    } else if (a == "--dtype" || a == "--max-shard-size") {
      if (i + 1 >= args.size()) throw UsageError(a + " needs a value");
      if (a == "--dtype") options.dtype = args[++i];
      else options.max_shard_bytes = parse_size(args[++i]);
    } else if (a.rfind("--", 0) == 0) {
      throw UsageError("export-hf: unknown option '" + a + "'" + did_you_mean(a, {"--dtype", "--max-shard-size", "--adapters"}));
    } else {
      paths.push_back(a);
    }
  }
  if (paths.size() != 2)
    throw UsageError("export-hf takes CKPT OUT_DIR (" + std::to_string(paths.size()) + " paths given)");
  const auto start = std::chrono::steady_clock::now();
  const train::HfExportResult r = train::export_hf(paths[0], paths[1], options, progress_line("export-hf"));
  std::printf("exported %s (%s): %lld tensors, %.3f GB in %zu file%s into %s (%s)\n", r.model.arch_name.c_str(),
              r.dtype.c_str(), static_cast<long long>(r.tensors), static_cast<double>(r.bytes) / 1e9, r.files.size(),
              r.files.size() == 1 ? "" : "s", paths[1].c_str(), rate(r.bytes, start).c_str());
  return 0;
}

}  // namespace

int cmd_checkpoint(const Args& args) {
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    print_help();
    return args.empty() ? 2 : 0;
  }
  const Args rest(args.begin() + 1, args.end());
  if (!rest.empty() && (rest[0] == "--help" || rest[0] == "-h")) {
    print_help();
    return 0;
  }
  if (args[0] == "import-hf") return import_hf(rest);
  if (args[0] == "export-hf") return export_hf(rest);
  throw UsageError("unknown checkpoint command '" + args[0] + "'" + did_you_mean(args[0], {"import-hf", "export-hf"}) +
                   " (known: import-hf, export-hf)");
}

}  // namespace laoyao::cli
