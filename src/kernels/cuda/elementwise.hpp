// Memory-bound pieces of the BF16 training step: residual adds with hidden dropout, dropout on its
// own, bias gradients (column sums into fp32 main_grad), casts. Math in fp32, one rounding to bf16
// per output, the same semantics as the CPU model (model/gpt_model.cpp).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/dropout_rng.cuh"

namespace laoyao::kernels::cuda {

// out[i] = bf16(residual[i] + (branch[i] + bias[i % N]) * mask(i)) over n elements (mask from
// `drop`, none when drop.p == 0; the bias of rows of N, none when null; the sum in fp32). out may
// alias branch or residual.
void residual_dropout_add(const __nv_bfloat16* branch, const __nv_bfloat16* residual, __nv_bfloat16* out, int64_t n,
                          const DropoutSpec& drop, cudaStream_t stream, const __nv_bfloat16* bias = nullptr,
                          int64_t N = 0);

// y[i] = bf16(x[i] * mask(i)); y may alias x. Forward dropout and its backward are the same op.
void dropout_apply(const __nv_bfloat16* x, __nv_bfloat16* y, int64_t n, const DropoutSpec& drop, cudaStream_t stream);

// acc[i] = bf16(acc[i] + x[i]).
void add_inplace(__nv_bfloat16* acc, const __nv_bfloat16* x, int64_t n, cudaStream_t stream);

// x[i] *= s (fp32): gradients that no collective averages (an expert's, with no other rank
// holding it) take the data-parallel scale here.
void scale_inplace(float* x, float s, int64_t n, cudaStream_t stream);

// db[N] += column sums of dy[T, N] (fp32). Fixed summation order (row chunks, then chunks in order),
// so the result is the same every run. scratch: bias_grad_scratch_floats(T, N) floats. With N % 8
// == 0 and dy and scratch 16-byte aligned, 16-byte loads (GPT-2's biases); else one column a thread.
size_t bias_grad_scratch_floats(int64_t T, int64_t N);
void bias_grad(const __nv_bfloat16* dy, float* db, float* scratch, int64_t T, int64_t N, cudaStream_t stream);

// y[i] = bf16(x[i]) (round to nearest even).
void cast_to_bf16(const float* x, __nv_bfloat16* y, int64_t n, cudaStream_t stream);

// x[i] = float(bf16(x[i])): fp32 values kept at bf16 precision (an MoE router's logits when
// Megatron would compute them in bf16, --moe-router-dtype unset).
void round_to_bf16_inplace(float* x, int64_t n, cudaStream_t stream);

}  // namespace laoyao::kernels::cuda
