// Megatron's SwiGLU (--swiglu) for BF16 activations, as kernels/cpu/ops.hpp swiglu_forward/backward:
// x[T, 2F] = [gate | linear] (chunk(2, -1) of linear_fc1's output), y = silu(gate) * linear.
// fp32 math, one rounding per output.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace laoyao::kernels::cuda {

// rows_end (device, optional, both functions): only rows below *rows_end (and T) are touched (T
// bounds them: the all-gather dispatcher's expert rows, which the device counts).
void swiglu_forward(const __nv_bfloat16* x, __nv_bfloat16* y, int64_t T, int64_t F, cudaStream_t stream,
                    const int32_t* rows_end = nullptr);
// dx[T, 2F] overwritten: dgate = dy * sig * (1 + gate * (1 - sig)) * linear, dlinear = dy * silu(gate).
void swiglu_backward(const __nv_bfloat16* x, const __nv_bfloat16* dy, __nv_bfloat16* dx, int64_t T, int64_t F,
                     cudaStream_t stream, const int32_t* rows_end = nullptr);

}  // namespace laoyao::kernels::cuda
