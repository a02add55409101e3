// These GPU tests take laoyao's LAOYAO_* switches from the environment as `laoyao` does
// (scripts/gpu_check.sh's grouped part runs them under LAOYAO_GROUPED_GEMM=cp_async).
#include "core/runtime_options.hpp"

static const bool kFromEnvironment = (laoyao::set_runtime_options(laoyao::runtime_options_from_environment()), true);
