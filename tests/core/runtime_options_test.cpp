// LAOYAO_* switches: read once from the environment into RuntimeOptions, every variable and its
// values, bad values refused by name, and what is printed and written into run_config.yaml.
#include "core/runtime_options.hpp"

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "core/error.hpp"

namespace laoyao {
namespace {

RuntimeOptions from(const std::map<std::string, std::string>& env) {
  return runtime_options_from_environment([&](const char* name) -> const char* {
    const auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

std::string refusal(const std::map<std::string, std::string>& env) {
  try {
    from(env);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(RuntimeOptions, UnsetOrEmptyVariablesGiveTheProductsPaths) {
  for (const std::string empty : {"", "(unset)"}) {
    std::map<std::string, std::string> env;
    if (empty.empty())
      for (const auto& [name, value] : runtime_option_values(RuntimeOptions{})) env[name] = "";
    const RuntimeOptions o = from(env);
    EXPECT_EQ(o.device, RuntimeOptions::Device::kAuto);
    EXPECT_TRUE(o.cuda_graphs && o.gemm_autotune && o.gelu_epilogue && o.bias_grad_in_norm && o.qkv_split &&
                o.ce_cluster);
    EXPECT_EQ(o.norm_rows_per_warp, 0);
    EXPECT_EQ(o.grouped_gemm, RuntimeOptions::GroupedGemm::kAuto);
    EXPECT_FALSE(o.step_phases || o.model_phases || o.moe_phases);
    EXPECT_EQ(o.rendezvous_dir, "");
  }
}

TEST(RuntimeOptions, EveryVariableSetsItsField) {
  const RuntimeOptions o = from({{"LAOYAO_DEVICE", "cpu"},
                                 {"LAOYAO_RENDEZVOUS_DIR", "/shared/rdv"},
                                 {"LAOYAO_CUDA_GRAPHS", "0"},
                                 {"LAOYAO_GEMM_AUTOTUNE", "0"},
                                 {"LAOYAO_GELU_EPILOGUE", "0"},
                                 {"LAOYAO_BIAS_GRAD_IN_NORM", "0"},
                                 {"LAOYAO_QKV_SPLIT", "0"},
                                 {"LAOYAO_CE_CLUSTER", "0"},
                                 {"LAOYAO_NORM_ROWS_PER_WARP", "16"},
                                 {"LAOYAO_GROUPED_GEMM", "cp_async"},
                                 {"LAOYAO_STEP_PHASES", "1"},
                                 {"LAOYAO_MODEL_PHASES", "1"},
                                 {"LAOYAO_MOE_PHASES", "1"}});
  EXPECT_EQ(o.device, RuntimeOptions::Device::kCpu);
  EXPECT_EQ(o.rendezvous_dir, "/shared/rdv");
  EXPECT_FALSE(o.cuda_graphs || o.gemm_autotune || o.gelu_epilogue || o.bias_grad_in_norm || o.qkv_split ||
               o.ce_cluster);
  EXPECT_EQ(o.norm_rows_per_warp, 16);
  EXPECT_EQ(o.grouped_gemm, RuntimeOptions::GroupedGemm::kCpAsync);
  EXPECT_TRUE(o.step_phases && o.model_phases && o.moe_phases);
  EXPECT_EQ(from({{"LAOYAO_DEVICE", "cuda"}}).device, RuntimeOptions::Device::kCuda);
  // Every variable the options print is one the reader knows: each value printed reads back.
  const auto printed = runtime_option_values(o);
  const std::map<std::string, std::string> env(printed.begin(), printed.end());
  EXPECT_EQ(runtime_option_values(from(env)), printed);
  const auto defaults = runtime_option_values(RuntimeOptions{});
  EXPECT_EQ(runtime_option_values(from({defaults.begin(), defaults.end()})), defaults) << "auto reads back";
}

TEST(RuntimeOptions, BadValuesAreRefusedNamingTheVariableAndWhatItAccepts) {
  EXPECT_EQ(refusal({{"LAOYAO_DEVICE", "tpu"}}),
            "environment variable LAOYAO_DEVICE='tpu': accepted values are auto, cpu or cuda (unset or empty: the "
            "default)");
  EXPECT_EQ(refusal({{"LAOYAO_BIAS_GRAD_IN_NORM", "yes"}}),
            "environment variable LAOYAO_BIAS_GRAD_IN_NORM='yes': accepted values are 0 or 1 (unset or empty: the "
            "default)");
  for (const char* name : {"LAOYAO_CUDA_GRAPHS", "LAOYAO_GEMM_AUTOTUNE", "LAOYAO_GELU_EPILOGUE", "LAOYAO_QKV_SPLIT",
                           "LAOYAO_CE_CLUSTER", "LAOYAO_STEP_PHASES", "LAOYAO_MODEL_PHASES", "LAOYAO_MOE_PHASES"})
    EXPECT_NE(refusal({{name, "true"}}).find(std::string(name) + "='true': accepted values are 0 or 1"),
              std::string::npos)
        << name;
  // The experiments' values that went: refused, with what remains.
  EXPECT_NE(refusal({{"LAOYAO_GROUPED_GEMM", "tma128"}}).find("accepted values are auto, tma, cp_async or portable"),
            std::string::npos);
  EXPECT_EQ(from({{"LAOYAO_GROUPED_GEMM", "portable"}}).grouped_gemm, RuntimeOptions::GroupedGemm::kPortable);
  for (const char* rows : {"1", "4097", "8x", "-2"})
    EXPECT_NE(refusal({{"LAOYAO_NORM_ROWS_PER_WARP", rows}}).find("integers from 2 to 4096"), std::string::npos)
        << rows;
}

TEST(RuntimeOptions, PrintedOnOneLineAndAsYamlComments) {
  RuntimeOptions o;
  o.cuda_graphs = false;
  const std::string line = describe_runtime_options(o);
  EXPECT_EQ(line.rfind("LAOYAO_DEVICE=auto LAOYAO_CUDA_GRAPHS=0 LAOYAO_GEMM_AUTOTUNE=1 ", 0), 0u) << line;
  EXPECT_EQ(line.find("LAOYAO_RENDEZVOUS_DIR"), std::string::npos) << "unset: not printed";
  EXPECT_NE(line.find("LAOYAO_NORM_ROWS_PER_WARP=auto LAOYAO_GROUPED_GEMM=auto"), std::string::npos) << line;
  const std::string yaml = runtime_options_yaml_comment(o);
  size_t lines = 0;
  for (size_t at = 0; (at = yaml.find('\n', at)) != std::string::npos; ++at) ++lines;
  EXPECT_EQ(lines, runtime_option_values(o).size() + 1);
  for (size_t at = 0; at < yaml.size(); at = yaml.find('\n', at) + 1) EXPECT_EQ(yaml[at], '#') << yaml;
  EXPECT_NE(yaml.find("#   LAOYAO_CUDA_GRAPHS: 0\n"), std::string::npos) << yaml;
}

TEST(RuntimeOptions, ScopedOptionsAreRestoredAfterTheScope) {
  const RuntimeOptions before = runtime_options();
  {
    const ScopedRuntimeOptions off([](RuntimeOptions& o) { o.gemm_autotune = false; });
    EXPECT_FALSE(runtime_options().gemm_autotune);
    EXPECT_EQ(runtime_options().cuda_graphs, before.cuda_graphs) << "only what the scope changes";
  }
  EXPECT_EQ(runtime_option_values(runtime_options()), runtime_option_values(before));
}

}  // namespace
}  // namespace laoyao
