// TMA tensor maps (CUtensorMap) for the kernels that load tiles with the Tensor Memory
// Accelerator. The driver's encoder is reached through the runtime's entry-point query, so that
// nothing links libcuda directly (the CPU-only build machines have no driver).
#pragma once
#include <cuda.h>

#include <cstdint>
#include <initializer_list>

namespace laoyao::kernels::cuda {

// A bf16 tensor of up to 5 dimensions, innermost first: dims[i] elements, strides[i] bytes
// between consecutive indices of dimension i + 1 (multiples of 16), loaded in boxes of box[i]
// elements (box[0] x 2 bytes = 128: each box row is one 128-byte swizzle row,
// CU_TENSOR_MAP_SWIZZLE_128B; the destination must be 1024-byte aligned). Elements outside the
// dims read as zero. Throws laoyao::Error naming what the driver refused.
CUtensorMap bf16_tensor_map(const void* base, std::initializer_list<uint64_t> dims,
                            std::initializer_list<uint64_t> strides, std::initializer_list<uint32_t> box);
// The same for a tensor of bytes (FP8 values; box[0] = 128).
CUtensorMap u8_tensor_map(const void* base, std::initializer_list<uint64_t> dims,
                          std::initializer_list<uint64_t> strides, std::initializer_list<uint32_t> box);
// The same for an fp32 tensor (box[0] = 32: 128-byte box rows).
CUtensorMap f32_tensor_map(const void* base, std::initializer_list<uint64_t> dims,
                           std::initializer_list<uint64_t> strides, std::initializer_list<uint32_t> box);

}  // namespace laoyao::kernels::cuda
