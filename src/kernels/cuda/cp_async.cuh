// Device helpers the tensor-core kernels share (attention_flash.cu, grouped_gemm.cu): 16-byte
// asynchronous global -> shared copies (cp.async, Ampere and later) and packing two floats into
// a bf16 pair.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

namespace laoyao::kernels::cuda {

// 16-byte asynchronous copy global -> shared; an invalid source is not read and zero-fills.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N of this thread's committed copy groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Two floats as a bf16 pair in one register: .x (the lower address, the lower column) = lo.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

}  // namespace laoyao::kernels::cuda
