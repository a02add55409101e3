// The versions of the CUDA libraries this binary was compiled against (their headers' macros) and
// the ones the dynamic loader actually gave it (asked of each library at run time), as the
// libraries encode them; cli/doctor.hpp decodes and compares them.
#pragma once
#include <vector>

namespace laoyao::kernels::cuda {

struct LibraryVersionCodes {
  int cudart_compiled = 0, cudart_loaded = 0;  // 1000 * major + 10 * minor
  int driver = 0;                              // the newest CUDA the driver supports, same encoding
  long cublaslt_compiled = 0, cublaslt_loaded = 0;  // 10000 * major + 100 * minor + patch
  long cudnn_compiled = 0, cudnn_loaded = 0;        // cuDNN 9: 10000 * major + 100 * minor + patch
  int nccl_compiled = 0, nccl_loaded = 0;           // NCCL_VERSION_CODE
};

// Throws laoyao::Error when a library cannot say (every call is checked).
LibraryVersionCodes library_version_codes();

// The GPU architectures this binary holds device code for, as nvcc compiled it (its
// __CUDA_ARCH_LIST__: 10 * major + minor, times 10; 900 is sm_90 / sm_90a), ascending.
std::vector<int> compiled_cuda_architectures();

}  // namespace laoyao::kernels::cuda
