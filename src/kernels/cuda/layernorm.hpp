// LayerNorm over the last dimension for BF16 activations (Megatron --bf16 with
// --normalization LayerNorm): bf16 x, gamma, beta and y; statistics and all arithmetic in fp32;
// mean/rstd [T] saved in fp32 for backward, as torch/apex save them. Variance is the biased one
// (divide by C). Same semantics as kernels/cpu/ops.hpp layernorm_forward/backward.
// zero_centered_gamma (--apply-layernorm-1p): the stored gamma is used as (1 + gamma).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace laoyao::kernels::cuda {

// y[T, C] = (x - mean) * rstd * gamma + beta; mean[T], rstd[T] written.
void layernorm_forward(const __nv_bfloat16* x, const __nv_bfloat16* gamma, const __nv_bfloat16* beta,
                       __nv_bfloat16* y, float* mean, float* rstd, int64_t T, int64_t C, float eps,
                       bool zero_centered_gamma, cudaStream_t stream);

// Floats of scratch layernorm_backward needs (per-chunk partial sums of dgamma, dbeta and dx_colsum).
size_t layernorm_backward_scratch_floats(int64_t T, int64_t C);

// dx[T, C] overwritten (bf16); dgamma[C], dbeta[C] (fp32, as Megatron's main_grad) accumulated (+=).
// The parameter gradients are reduced without atomics: fixed-size row chunks write partial sums to
// `scratch` (layernorm_backward_scratch_floats(T, C) floats), then add_chunk_partials adds the chunks in a fixed order,
// so the result is bitwise reproducible run to run. accumulate_dx: dx += the gradient instead (the
// residual stream's gradient, summed in place); needs C % 8 == 0, 16-byte aligned rows, C <= 4096.
// dx_colsum (optional, fp32 [C]) += the column sums of the bf16 dx written (after accumulate_dx):
// the gradient of a bias whose output's gradient is that dx (GPT's projection and fc2 biases take
// the residual stream's gradient), summed by the fused kernel while the rows are in registers
// instead of read again by bias_grad; in the same fixed order every run.
void layernorm_backward(const __nv_bfloat16* dy, const __nv_bfloat16* x, const __nv_bfloat16* gamma,
                        const float* mean, const float* rstd, __nv_bfloat16* dx, float* dgamma, float* dbeta,
                        float* scratch, int64_t T, int64_t C, bool zero_centered_gamma, cudaStream_t stream,
                        bool accumulate_dx = false, float* dx_colsum = nullptr);

// RMSNorm (--normalization RMSNorm): y = x * rstd * gamma, rstd = 1/sqrt(mean(x^2) + eps), as
// kernels/cpu/ops.hpp rmsnorm_forward/backward; dgamma accumulated (+=) without atomics. The
// warp-per-row kernels only: C % 8 == 0, 16-byte aligned rows, C <= 4096 (else laoyao::Error).
void rmsnorm_forward(const __nv_bfloat16* x, const __nv_bfloat16* gamma, __nv_bfloat16* y, float* rstd, int64_t T,
                     int64_t C, float eps, bool zero_centered_gamma, cudaStream_t stream);
void rmsnorm_backward(const __nv_bfloat16* dy, const __nv_bfloat16* x, const __nv_bfloat16* gamma, const float* rstd,
                      __nv_bfloat16* dx, float* dgamma, float* scratch, int64_t T, int64_t C, bool zero_centered_gamma,
                      cudaStream_t stream, bool accumulate_dx = false, float* dx_colsum = nullptr);

}  // namespace laoyao::kernels::cuda
