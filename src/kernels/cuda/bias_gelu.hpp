// Megatron's fused bias + GeLU (megatron/core/fusions/fused_bias_gelu.py, the tanh form; or
// F.gelu's erf form) for BF16 activations: the add, the GeLU and its backward are done in fp32
// registers, one read and one write of each bf16 tensor, no intermediate in memory.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace laoyao::kernels::cuda {

// y[T, F] = gelu_tanh(x[T, F] + bias[F]), where
//   gelu_tanh(u) = u * 0.5 * (1 + tanh(0.79788456 * u * (1 + 0.044715 * u^2))).
// erf: the exact GeLU instead, u * 0.5 * (1 + erf(u / sqrt(2))) (F.gelu: Megatron without the
// bias-GeLU fusion, e.g. Bridge's vanilla GPT recipe).
void bias_gelu_forward(const __nv_bfloat16* x, const __nv_bfloat16* bias, __nv_bfloat16* y, int64_t T, int64_t F,
                       cudaStream_t stream, bool erf = false);

// dx[T, F] = dy * gelu'(x + bias) (Megatron's bias_gelu_back for tanh); dx overwritten. The bias
// gradient is the column sum of dx, left to the caller's reduction.
void bias_gelu_backward(const __nv_bfloat16* dy, const __nv_bfloat16* x, const __nv_bfloat16* bias,
                        __nv_bfloat16* dx, int64_t T, int64_t F, cudaStream_t stream, bool erf = false);

}  // namespace laoyao::kernels::cuda
