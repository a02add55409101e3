// laoyao checkpoint import-hf HF_DIR OUT_DIR
// Checkpoint conversions. import-hf: a Hugging Face model folder into a folder that
// --pretrained-checkpoint (checkpoint.pretrained_checkpoint) reads, with the model's Megatron-LM
// flags and Bridge overrides beside it (train/hf_import.hpp).
#include <cstdio>
#include <string>

#include "cli/cli.hpp"
#include "core/error.hpp"
#include "core/text.hpp"
#include "train/hf_import.hpp"

namespace laoyao::cli {
namespace {

void print_help() {
  std::string archs;
  for (const auto& a : train::hf_architecture_names()) archs += (archs.empty() ? "" : ", ") + a;
  std::printf(
      "usage: laoyao checkpoint import-hf HF_DIR OUT_DIR\n"
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
      "           Architectures: %s.\n",
      archs.c_str());
}

int import_hf(const Args& args) {
  if (args.size() != 2)
    throw UsageError("import-hf takes HF_DIR OUT_DIR (" + std::to_string(args.size()) + " arguments given)");
  const train::HfImportResult r = train::import_hf(args[0], args[1], [](int64_t done, int64_t total, uint64_t bytes) {
    std::fprintf(stderr, "import-hf: %lld of %lld tensors, %.2f GB\n", static_cast<long long>(done),
                 static_cast<long long>(total), static_cast<double>(bytes) / 1e9);
  });
  std::printf("imported %s: %lld tensors, %.3f GB into %s\n", r.model.arch_name.c_str(),
              static_cast<long long>(r.tensors), static_cast<double>(r.bytes) / 1e9, args[1].c_str());
  if (r.tokenizer.empty())
    std::printf("no tokenizer files beside the weights: give the run a --tokenizer-type of its own\n");
  std::printf("model flags: %s\n", r.flags.c_str());
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
  throw UsageError("unknown checkpoint command '" + args[0] + "'" + did_you_mean(args[0], {"import-hf"}) +
                   " (known: import-hf)");
}

}  // namespace laoyao::cli
