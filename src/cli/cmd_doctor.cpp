// laoyao doctor [--seed N] [--no-gpu]
// Checks that this machine really works before a long run: executes a cuBLASLt GEMM, an attention
// forward and backward, a fused kernel and (with two or more GPUs) an NCCL all-reduce on every
// visible GPU, compares each with a CPU reference, prints the library versions compiled against and
// loaded. Exit 0 only when every check passes; 1 otherwise, and when there is no GPU to check; 2 on
// a bad option. --no-gpu checks what a machine without a GPU can (doctor_host.cpp).
#include <cstdio>
#include <random>
#include <string>

#include "cli/cli.hpp"
#include "cli/doctor.hpp"
#include "core/device.hpp"
#include "core/error.hpp"
#include "core/text.hpp"

namespace laoyao::cli {
namespace {

void print_help() {
  std::printf(
      "usage: laoyao doctor [--seed N] [--no-gpu]\n"
      "\n"
      "Executes, on every visible GPU, and compares with a CPU reference on fresh random inputs:\n"
      "  - a bf16 GEMM 4096x4096x4096 through cuBLASLt (TFLOP/s; sampled outputs vs fp64 dot products)\n"
      "  - a bf16 GEMM with the bias epilogue on a GPT-2 linear shape (every output vs the CPU op)\n"
      "  - causal attention forward and backward, head dims 64 (GQA) and 128 (the flash kernels\n"
      "    training uses), and the simple reference kernel\n"
      "  - the fused bias + GeLU kernel, forward and backward\n"
      "and, with two or more GPUs, an NCCL all-reduce across all of them (checked exactly). It also\n"
      "prints the driver, the CUDA runtime and the cuBLASLt, cuDNN and NCCL versions this binary was\n"
      "compiled against and the ones it loaded, flagging a major.minor difference.\n"
      "\n"
      "options:\n"
      "  --seed N   the seed of the random inputs (default: a fresh one, printed, so a failure can\n"
      "             be repeated with the same inputs)\n"
      "  --no-gpu   what a machine without a GPU can check of this build (a container's build stage):\n"
      "             the CPU backend's GEMM and causal attention against fp64 loops, the FP8 casts,\n"
      "             and in a CUDA build the CUDA runtime, cuBLASLt, cuDNN and NCCL loaded against the\n"
      "             versions compiled against (a major.minor difference fails)\n"
      "\n"
      "exit status: 0 every check passed; 1 a check failed, or no GPU (or no CUDA backend) to check\n"
      "(without --no-gpu);\n"
      "2 a bad option.\n");
}

uint64_t parse_seed(const std::string& text) {
  size_t used = 0;
  unsigned long long v = 0;
  try {
    v = std::stoull(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || text[0] == '-')
    throw UsageError("--seed takes a non-negative integer, got '" + text + "'");
  return v;
}

}  // namespace

int cmd_doctor(const Args& args) {
  doctor::Options options;
  bool seed_given = false, no_gpu = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "-h" || a == "--help") {
      print_help();
      return 0;
    }
    if (a == "--seed" || a.rfind("--seed=", 0) == 0) {
      std::string value;
      if (a == "--seed") {
        if (i + 1 >= args.size()) throw UsageError("--seed needs a value");
        value = args[++i];
      } else {
        value = a.substr(7);
      }
      options.seed = parse_seed(value);
      seed_given = true;
      continue;
    }
    if (a == "--no-gpu") {
      no_gpu = true;
      continue;
    }
    throw UsageError("unknown option '" + a + "'" + did_you_mean(a, {"--seed", "--no-gpu", "--help"}) +
                     "; `laoyao doctor` takes --seed N, --no-gpu and --help");
  }
  if (!seed_given) options.seed = (uint64_t(std::random_device{}()) << 32) ^ std::random_device{}();
  if (no_gpu) return doctor::run_host_checks(options);

  if (!cuda_backend_built()) {
    std::printf("%s\n", doctor::no_gpu_line(false, "").c_str());
    return 1;
  }
#ifdef LAOYAO_HAVE_CUDA
  return doctor::run_gpu_checks(options);
#else
  return 1;  // unreachable: cuda_backend_built() is true only in CUDA builds
#endif
}

}  // namespace laoyao::cli
