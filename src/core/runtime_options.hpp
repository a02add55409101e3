// laoyao's own switches, the LAOYAO_* environment variables, read once (at the start of every
// command, cli.cpp) into one struct that the code reads instead of the environment. The defaults
// are the product's paths; the others exist to check one path against another (the tests run
// both), to pick the CPU backend where a GPU is visible, and to see where a step's time goes.
// Printed at the start of training and written into run_config.yaml (as comments: they are not
// part of the Megatron configuration).
#pragma once
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace laoyao {

struct RuntimeOptions {
  enum class Device { kAuto, kCpu, kCuda };
  enum class GroupedGemm { kAuto, kTma, kCpAsync, kPortable };

  Device device = Device::kAuto;  // LAOYAO_DEVICE: unset the GPU when it can train the model
  // LAOYAO_RENDEZVOUS_DIR: where CPU ranks meet (a Gloo file store); `laoyao launch` sets it.
  std::string rendezvous_dir;

  // The CUDA backend's paths (each =0 selects the plainer path, kept to check the fast one).
  bool cuda_graphs = true;        // LAOYAO_CUDA_GRAPHS: dropout-free steps replay a CUDA graph
  bool gemm_autotune = true;      // LAOYAO_GEMM_AUTOTUNE: time cuBLASLt's candidates, keep the fastest
  bool gelu_epilogue = true;      // LAOYAO_GELU_EPILOGUE: GeLU in cuBLASLt's GEMM epilogues
  bool bias_grad_in_norm = true;  // LAOYAO_BIAS_GRAD_IN_NORM: bias gradients summed by the norms' backward
  bool qkv_split = true;          // LAOYAO_QKV_SPLIT: split q/k/v rows for cuDNN with GQA and the QK norm
  bool ce_cluster = true;         // LAOYAO_CE_CLUSTER: the cross entropy's row in a cluster's shared memory
  int norm_rows_per_warp = 0;     // LAOYAO_NORM_ROWS_PER_WARP: 0 (auto) by size, else fixed (2 to 4096)
  // LAOYAO_GROUPED_GEMM: the experts' grouped GEMMs (kernels/cuda/grouped_gemm.hpp; auto: by the GPU)
  GroupedGemm grouped_gemm = GroupedGemm::kAuto;

  // Where the time goes, on stderr (CUDA events; graphs off while a model's phases are timed).
  bool step_phases = false;   // LAOYAO_STEP_PHASES: forward+backward, reduction, optimizer
  bool model_phases = false;  // LAOYAO_MODEL_PHASES: the model's ops by kind
  bool moe_phases = false;    // LAOYAO_MOE_PHASES: the MoE layers' phases
};

// Reads the variables through `getenv` (std::getenv by default). Unset or empty means the
// default; any other value outside what a variable accepts is a UsageError naming the variable,
// its value and what it accepts.
using GetEnvironment = std::function<const char*(const char*)>;
RuntimeOptions runtime_options_from_environment(const GetEnvironment& getenv = nullptr);

// (variable, value) for every switch, in the struct's order, values as the variable takes them
// (LAOYAO_DEVICE "auto" when unset, LAOYAO_RENDEZVOUS_DIR "" when unset).
std::vector<std::pair<std::string, std::string>> runtime_option_values(const RuntimeOptions& o);
// One line: "LAOYAO_DEVICE=auto LAOYAO_CUDA_GRAPHS=1 ...".
std::string describe_runtime_options(const RuntimeOptions& o);
// YAML comment lines for run_config.yaml.
std::string runtime_options_yaml_comment(const RuntimeOptions& o);

// The process's options: the defaults until set (cli.cpp sets them from the environment before a
// command runs; tests set the path they check).
const RuntimeOptions& runtime_options();
void set_runtime_options(const RuntimeOptions& o);

// Changes the options for a scope and restores the previous ones after it (tests):
// ScopedRuntimeOptions graphs_off([](RuntimeOptions& o) { o.cuda_graphs = false; });
class ScopedRuntimeOptions {
 public:
  template <class Change>
  explicit ScopedRuntimeOptions(Change change) : saved_(runtime_options()) {
    RuntimeOptions o = saved_;
    change(o);
    set_runtime_options(o);
  }
  ~ScopedRuntimeOptions() { set_runtime_options(saved_); }
  ScopedRuntimeOptions(const ScopedRuntimeOptions&) = delete;
  ScopedRuntimeOptions& operator=(const ScopedRuntimeOptions&) = delete;

 private:
  RuntimeOptions saved_;
};

}  // namespace laoyao
