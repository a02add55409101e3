// The optimizer side of the BF16 step on flat fp32 buffers (Megatron's main params / main_grad /
// Adam state): global gradient norm, zero count, AdamW with clipping folded in, the bf16 copy of
// the updated weights, and the masked loss sum. Same formulas and the same fp32/fp64 split as
// optim/adamw.cpp, so a GPU step and a CPU step from the same state agree to rounding.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace laoyao::kernels::cuda {

// Doubles of scratch the reductions below need.
constexpr int kReduceBlocks = 1024;

// out[0] = sum of x[i]^2 in double (fixed order: kReduceBlocks partials, then one pass). scratch
// holds kReduceBlocks doubles. out is device memory. With `counted` (n flags), only the elements
// flagged 1 (tensor parallelism: a replicated parameter is counted on one rank of the group).
void sum_squares(const float* x, int64_t n, double* scratch, double* out, cudaStream_t stream,
                 const uint8_t* counted = nullptr);
// out[0] = number of x[i] == 0 (as a double). scratch: kReduceBlocks doubles. `counted` as above.
void count_zeros(const float* x, int64_t n, double* scratch, double* out, cudaStream_t stream,
                 const uint8_t* counted = nullptr);

struct AdamWStep {
  float beta1 = 0.9f, beta2 = 0.999f;
  double eps = 1e-8;
  double lr = 0, wd = 0;
  double step_size = 0;   // lr / (1 - beta1^t)
  double bc2_sqrt = 1;    // sqrt(1 - beta2^t)
  float grad_scale = 1;   // the clipping coefficient (1 when not clipping)
};

// For every i: g = grad[i] * grad_scale (when < 1), p *= float(1 - lr*wd*decay[i]) (decay 0 or 1),
// m, v updated in fp32, p -= step_size * m / (sqrt(v)/bc2_sqrt + eps) in double, then
// param_bf16[i] = bf16(p). grad is left unscaled (it is zeroed before the next step anyway).
void adamw_step(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, __nv_bfloat16* param_bf16,
                const uint8_t* decay, int64_t n, const AdamWStep& s, cudaStream_t stream);

// acc[0] += sum_t loss[t] * mask[t], acc[1] += sum_t mask[t] (double; one block, fixed order).
void masked_loss_sum(const float* loss, const float* mask, int64_t T, double* acc, cudaStream_t stream);
// acc[0] += scale * sum(loss * mask) / sum(mask) (nothing for an empty mask): one forward's masked
// mean, summed over forwards (multi-token prediction's logged losses, as GptModel sums them).
void masked_mean_accumulate(const float* loss, const float* mask, int64_t T, double scale, double* acc,
                            cudaStream_t stream);

}  // namespace laoyao::kernels::cuda
