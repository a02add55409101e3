// Status checks for every CUDA runtime, cuBLASLt, cuDNN and NCCL call. A failing call throws
// laoyao::Error naming the call as written, where it was made and the library's own words:
//   cudaMalloc(&ptr, bytes) failed at kernels/cuda/device_buffer.hpp:31: cudaErrorMemoryAllocation
//   (out of memory)
// One overload per library status type, so a single macro checks them all:
//   LAOYAO_CUDA_CHECK(cudaMemcpyAsync(...));
//   LAOYAO_CUDA_CHECK(cublasLtMatmul(...));
// Kernel launches report through the runtime: LAOYAO_CUDA_CHECK(cudaGetLastError()) after them.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <nccl.h>

#include <string>
#include <string_view>

#include "core/error.hpp"

namespace laoyao::kernels::cuda {

// __FILE__ is absolute under CMake; keep the part from "src/" on so messages stay short.
inline std::string_view short_source_path(std::string_view file) {
  const auto at = file.rfind("/src/");
  return at == std::string_view::npos ? file : file.substr(at + 5);
}

[[noreturn]] inline void throw_call_error(const char* call, const char* file, int line, const std::string& what) {
  throw Error(std::string(call) + " failed at " + std::string(short_source_path(file)) + ":" +
              std::to_string(line) + ": " + what);
}

inline void check_status(cudaError_t st, const char* call, const char* file, int line) {
  if (st == cudaSuccess) return;
  (void)cudaGetLastError();  // clear a non-sticky error so that later calls are not blamed for it
  throw_call_error(call, file, line, std::string(cudaGetErrorName(st)) + " (" + cudaGetErrorString(st) + ")");
}

inline void check_status(cublasStatus_t st, const char* call, const char* file, int line) {
  if (st == CUBLAS_STATUS_SUCCESS) return;
  throw_call_error(call, file, line, std::string(cublasLtGetStatusString(st)) + " (cublasStatus " +
                                         std::to_string(static_cast<int>(st)) + ")");
}

inline void check_status(cudnnStatus_t st, const char* call, const char* file, int line) {
  if (st == CUDNN_STATUS_SUCCESS) return;
  throw_call_error(call, file, line, std::string(cudnnGetErrorString(st)) + " (cudnnStatus " +
                                         std::to_string(static_cast<int>(st)) + ")");
}

inline void check_status(ncclResult_t st, const char* call, const char* file, int line) {
  if (st == ncclSuccess) return;
  // ncclGetLastError(nullptr) holds NCCL's detailed message for the most recent failure.
  const char* detail = ncclGetLastError(nullptr);
  std::string what = std::string(ncclGetErrorString(st)) + " (ncclResult " + std::to_string(static_cast<int>(st)) + ")";
  if (detail && *detail) what += ": " + std::string(detail);
  throw_call_error(call, file, line, what);
}

}  // namespace laoyao::kernels::cuda

#define LAOYAO_CUDA_CHECK(call) ::laoyao::kernels::cuda::check_status((call), #call, __FILE__, __LINE__)
