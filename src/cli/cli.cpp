#include "cli/cli.hpp"

#include <cstdio>
#include <exception>
#include <string>

#include "core/error.hpp"
#include "core/runtime_options.hpp"
#include "core/text.hpp"

namespace laoyao::cli {
namespace {

struct Subcommand {
  const char* name;
  int (*run)(const Args&);
  const char* summary;
};

const Subcommand kSubcommands[] = {
    {"pretrain-gpt", cmd_pretrain_gpt, "train from Megatron-LM pretrain_gpt.py flags"},
    {"run-recipe", cmd_run_recipe,
     "train from a Megatron-Bridge recipe: --recipe NAME [--config-file F.yaml] [a.b=v ...]"},
    {"recipes", cmd_recipes, "list the recipes; `recipes show NAME [a.b=v ...]` prints one as YAML"},
    {"convert-args", cmd_convert_args,
     "print the run-recipe command (and YAML) equal to a set of Megatron-LM flags"},
    {"compare-logs", cmd_compare_logs,
     "per-iteration loss diff of two training logs, with a BF16-tolerance verdict"},
    {"data-samples", cmd_data_samples,
     "print, as JSON lines, the samples and token ids a run with those flags feeds the model"},
    {"preprocess-data", cmd_preprocess_data, "tokenize a JSON-lines file into a Megatron .bin/.idx dataset"},
    {"doctor", cmd_doctor, "run a GEMM, attention, a fused kernel and an all-reduce on every GPU; check them"},
    {"checkpoint", cmd_checkpoint, "Hugging Face checkpoints in and out: `checkpoint import-hf HF_DIR OUT` / `export-hf CKPT OUT`"},
    {"launch", cmd_launch, "start N ranks of a command on this node (torchrun): --nproc-per-node N -- laoyao ..."},
};

void print_usage(std::FILE* out) {
  std::fprintf(out, "usage: laoyao <command> [arguments]\n\ncommands:\n");
  for (const auto& s : kSubcommands) std::fprintf(out, "  %-14s %s\n", s.name, s.summary);
  std::fprintf(out, "\n`laoyao <command> --help` describes one command.\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    print_usage(stderr);
    return 2;
  }
  std::string name = argv[1];
  if (name == "-h" || name == "--help" || name == "help") {
    print_usage(stdout);
    return 0;
  }
  Args args(argv + 2, argv + argc);
  std::vector<std::string> names;
  for (const auto& s : kSubcommands) {
    names.emplace_back(s.name);
    if (name != s.name) continue;
    try {
      // laoyao's LAOYAO_* switches, read once: a bad value stops every command.
      set_runtime_options(runtime_options_from_environment());
      return s.run(args);
    } catch (const UsageError& e) {
      std::fprintf(stderr, "laoyao %s: error: %s\n", s.name, e.what());
      return 2;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "laoyao %s: failed: %s\n", s.name, e.what());
      return 1;
    }
  }
  std::fprintf(stderr, "laoyao: error: unknown command '%s'%s; run `laoyao --help` for the list\n",
               name.c_str(), did_you_mean(name, names).c_str());
  return 2;
}

}  // namespace laoyao::cli
