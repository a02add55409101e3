#include "kernels/cuda/tensor_map.hpp"

#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <cstdio>
#include <string>

#include "core/error.hpp"
#include "kernels/cuda/cuda_check.hpp"

namespace laoyao::kernels::cuda {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    LAOYAO_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &found));
    if (found != cudaDriverEntryPointSuccess || !f)
      throw Error("the CUDA driver has no cuTensorMapEncodeTiled (TMA needs a driver for CUDA 12.0 or later)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

CUtensorMap tensor_map(CUtensorMapDataType type, const char* type_name, const void* base,
                       std::initializer_list<uint64_t> dims, std::initializer_list<uint64_t> strides,
                       std::initializer_list<uint32_t> box) {
  const size_t rank = dims.size();
  if (rank < 1 || rank > 5 || strides.size() != rank - 1 || box.size() != rank)
    throw Error(std::string(type_name) + "_tensor_map: " + std::to_string(rank) + " dims need " +
                std::to_string(rank - 1) + " strides and as many box sizes");
  cuuint64_t d[5], s[4];
  cuuint32_t b[5], e[5];
  size_t i = 0;
  for (uint64_t v : dims) d[i++] = v;
  i = 0;
  for (uint64_t v : strides) s[i++] = v;
  i = 0;
  for (uint32_t v : box) e[i] = 1, b[i++] = v;
  CUtensorMap map{};
  const CUresult r = encoder()(&map, type, cuuint32_t(rank), const_cast<void*>(base), d, s,
                               b, e, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::string what = "cuTensorMapEncodeTiled refused a " + std::string(type_name) + " map (error " +
                       std::to_string(int(r)) + "): dims";
    for (size_t k = 0; k < rank; ++k) {
      what += k ? "x" : " ";
      what += std::to_string(d[k]);
    }
    what += ", byte strides";
    for (size_t k = 0; k + 1 < rank; ++k) {
      what += k ? "," : " ";
      what += std::to_string(s[k]);
    }
    what += ", box";
    for (size_t k = 0; k < rank; ++k) {
      what += k ? "x" : " ";
      what += std::to_string(b[k]);
    }
    char base_hex[32];
    std::snprintf(base_hex, sizeof base_hex, "%p", base);
    throw Error(what + ", base " + base_hex);
  }
  return map;
}

}  // namespace

CUtensorMap bf16_tensor_map(const void* base, std::initializer_list<uint64_t> dims,
                            std::initializer_list<uint64_t> strides, std::initializer_list<uint32_t> box) {
  return tensor_map(CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, "bf16", base, dims, strides, box);
}

CUtensorMap u8_tensor_map(const void* base, std::initializer_list<uint64_t> dims,
                          std::initializer_list<uint64_t> strides, std::initializer_list<uint32_t> box) {
  return tensor_map(CU_TENSOR_MAP_DATA_TYPE_UINT8, "u8", base, dims, strides, box);
}

CUtensorMap f32_tensor_map(const void* base, std::initializer_list<uint64_t> dims,
                           std::initializer_list<uint64_t> strides, std::initializer_list<uint32_t> box) {
  return tensor_map(CU_TENSOR_MAP_DATA_TYPE_FLOAT32, "f32", base, dims, strides, box);
}

}  // namespace laoyao::kernels::cuda
