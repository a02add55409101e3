#include "core/runtime_options.hpp"

#include <cstdlib>
#include <initializer_list>

#include "core/error.hpp"

namespace laoyao {
namespace {

// A function's static, so that a static initializer of another file (a test binary's reading of the
// environment) finds it constructed.
RuntimeOptions& options() {
  static RuntimeOptions o;
  return o;
}

// The index of the variable's value among `choices` (unset or empty: `unset`); anything else is
// refused by name.
int choice(const GetEnvironment& env, const char* name, std::initializer_list<const char*> choices, int unset) {
  const char* v = env(name);
  if (!v || !*v) return unset;
  std::string accepted;
  int i = 0;
  for (const char* c : choices) {
    if (std::string(v) == c) return i;
    accepted += (i == 0 ? "" : i + 1 == static_cast<int>(choices.size()) ? " or " : ", ") + std::string(c);
    ++i;
  }
  throw UsageError(std::string("environment variable ") + name + "='" + v + "': accepted values are " + accepted +
                   " (unset or empty: the default)");
}

bool on_off(const GetEnvironment& env, const char* name, bool unset) {
  return choice(env, name, {"0", "1"}, unset ? 1 : 0) == 1;
}

const char* flag(bool b) { return b ? "1" : "0"; }

}  // namespace

RuntimeOptions runtime_options_from_environment(const GetEnvironment& getenv_in) {
  const GetEnvironment env =
      getenv_in ? getenv_in : GetEnvironment([](const char* n) -> const char* { return std::getenv(n); });
  RuntimeOptions o;
  o.device = static_cast<RuntimeOptions::Device>(choice(env, "LAOYAO_DEVICE", {"auto", "cpu", "cuda"}, 0));
  if (const char* v = env("LAOYAO_RENDEZVOUS_DIR")) o.rendezvous_dir = v;
  o.cuda_graphs = on_off(env, "LAOYAO_CUDA_GRAPHS", o.cuda_graphs);
  o.gemm_autotune = on_off(env, "LAOYAO_GEMM_AUTOTUNE", o.gemm_autotune);
  o.gelu_epilogue = on_off(env, "LAOYAO_GELU_EPILOGUE", o.gelu_epilogue);
  o.bias_grad_in_norm = on_off(env, "LAOYAO_BIAS_GRAD_IN_NORM", o.bias_grad_in_norm);
  o.qkv_split = on_off(env, "LAOYAO_QKV_SPLIT", o.qkv_split);
  o.ce_cluster = on_off(env, "LAOYAO_CE_CLUSTER", o.ce_cluster);
  if (const char* v = env("LAOYAO_NORM_ROWS_PER_WARP"); v && *v && std::string(v) != "auto") {
    char* end = nullptr;
    const long long n = std::strtoll(v, &end, 10);
    // At least 2: the fused norm backward's scratch is sized for it.
    if (*end != '\0' || n < 2 || n > 4096)
      throw UsageError(std::string("environment variable LAOYAO_NORM_ROWS_PER_WARP='") + v +
                       "': accepted values are integers from 2 to 4096, or auto (unset or empty too: chosen by "
                       "size)");
    o.norm_rows_per_warp = static_cast<int>(n);
  }
  o.grouped_gemm = static_cast<RuntimeOptions::GroupedGemm>(choice(env, "LAOYAO_GROUPED_GEMM", {"auto", "tma", "cp_async", "portable"}, 0));
  o.step_phases = on_off(env, "LAOYAO_STEP_PHASES", o.step_phases);
  o.model_phases = on_off(env, "LAOYAO_MODEL_PHASES", o.model_phases);
  o.moe_phases = on_off(env, "LAOYAO_MOE_PHASES", o.moe_phases);
  return o;
}

std::vector<std::pair<std::string, std::string>> runtime_option_values(const RuntimeOptions& o) {
  static const char* const kDevices[] = {"auto", "cpu", "cuda"};
  static const char* const kGrouped[] = {"auto", "tma", "cp_async", "portable"};
  return {
      {"LAOYAO_DEVICE", kDevices[static_cast<int>(o.device)]},
      {"LAOYAO_RENDEZVOUS_DIR", o.rendezvous_dir},
      {"LAOYAO_CUDA_GRAPHS", flag(o.cuda_graphs)},
      {"LAOYAO_GEMM_AUTOTUNE", flag(o.gemm_autotune)},
      {"LAOYAO_GELU_EPILOGUE", flag(o.gelu_epilogue)},
      {"LAOYAO_BIAS_GRAD_IN_NORM", flag(o.bias_grad_in_norm)},
      {"LAOYAO_QKV_SPLIT", flag(o.qkv_split)},
      {"LAOYAO_CE_CLUSTER", flag(o.ce_cluster)},
      {"LAOYAO_NORM_ROWS_PER_WARP", o.norm_rows_per_warp ? std::to_string(o.norm_rows_per_warp) : "auto"},
      {"LAOYAO_GROUPED_GEMM", kGrouped[static_cast<int>(o.grouped_gemm)]},
      {"LAOYAO_STEP_PHASES", flag(o.step_phases)},
      {"LAOYAO_MODEL_PHASES", flag(o.model_phases)},
      {"LAOYAO_MOE_PHASES", flag(o.moe_phases)},
  };
}

std::string describe_runtime_options(const RuntimeOptions& o) {
  std::string s;
  for (const auto& [name, value] : runtime_option_values(o)) {
    if (name == "LAOYAO_RENDEZVOUS_DIR" && value.empty()) continue;  // one rank, or GPU ranks: none
    s += (s.empty() ? "" : " ") + name + "=" + value;
  }
  return s;
}

std::string runtime_options_yaml_comment(const RuntimeOptions& o) {
  std::string s = "# laoyao's runtime options (LAOYAO_* environment variables; not Megatron configuration):\n";
  for (const auto& [name, value] : runtime_option_values(o)) s += "#   " + name + ": " + value + "\n";
  return s;
}

const RuntimeOptions& runtime_options() { return options(); }
void set_runtime_options(const RuntimeOptions& o) { options() = o; }

}  // namespace laoyao
