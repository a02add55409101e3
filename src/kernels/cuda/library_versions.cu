// Compiled-against and loaded versions of cudart, cuBLASLt, cuDNN and NCCL (see library_versions.hpp).
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/library_versions.hpp"

namespace laoyao::kernels::cuda {

LibraryVersionCodes library_version_codes() {
  LibraryVersionCodes v;
  v.cudart_compiled = CUDART_VERSION;
  LAOYAO_CUDA_CHECK(cudaRuntimeGetVersion(&v.cudart_loaded));
  LAOYAO_CUDA_CHECK(cudaDriverGetVersion(&v.driver));
  v.cublaslt_compiled = CUBLAS_VERSION;
  v.cublaslt_loaded = static_cast<long>(cublasLtGetVersion());
  v.cudnn_compiled = CUDNN_VERSION;
  v.cudnn_loaded = static_cast<long>(cudnnGetVersion());
  v.nccl_compiled = NCCL_VERSION_CODE;
  LAOYAO_CUDA_CHECK(ncclGetVersion(&v.nccl_loaded));
  return v;
}

std::vector<int> compiled_cuda_architectures() { return {__CUDA_ARCH_LIST__}; }

}  // namespace laoyao::kernels::cuda
