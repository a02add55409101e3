// Optimizer kernels (see optimizer.hpp).
#include <cstdint>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/optimizer.hpp"

namespace laoyao::kernels::cuda {
namespace {

constexpr int kThreads = 256;

__device__ double block_sum_double(double v, double* sh) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  v = lane < int(blockDim.x >> 5) ? sh[lane] : 0.0;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Each block reduces a fixed, contiguous slice (the slices depend only on n), so the sum's order
// is the same every run.
template <bool kZeros>
__global__ void partial_kernel(const float* x, const uint8_t* counted, int64_t n, double* partial) {
  __shared__ double sh[32];
  const int64_t per = (n + gridDim.x - 1) / gridDim.x;
  const int64_t lo = per * blockIdx.x, hi = lo + per < n ? lo + per : n;
  double acc = 0;
  for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    if (counted && !counted[i]) continue;
    const float v = x[i];
    acc += kZeros ? (v == 0.0f ? 1.0 : 0.0) : static_cast<double>(v) * v;
  }
  acc = block_sum_double(acc, sh);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

__global__ void finish_kernel(const double* partial, int count, double* out) {
  __shared__ double sh[32];
  double acc = 0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partial[i];
  acc = block_sum_double(acc, sh);
  if (threadIdx.x == 0) out[0] = acc;
}

__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, __nv_bfloat16* pb, const uint8_t* decay,
                             int64_t n, AdamWStep s) {
  const float decay_on = static_cast<float>(1.0 - s.lr * s.wd), decay_off = 1.0f;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float gi = g[i];
    if (s.grad_scale < 1.0f) gi *= s.grad_scale;
    float pi = p[i] * (decay[i] ? decay_on : decay_off);
    const float mi = s.beta1 * m[i] + (1.0f - s.beta1) * gi;
    const float vi = s.beta2 * v[i] + (1.0f - s.beta2) * gi * gi;
    const double denom = sqrt(static_cast<double>(vi)) / s.bc2_sqrt + s.eps;
    pi = static_cast<float>(pi - s.step_size * mi / denom);
    m[i] = mi, v[i] = vi, p[i] = pi;
    pb[i] = __float2bfloat16(pi);
  }
}

__global__ void masked_loss_kernel(const float* loss, const float* mask, int64_t T, double* acc) {
  __shared__ double sh[32];
  double s = 0, c = 0;
  for (int64_t t = threadIdx.x; t < T; t += blockDim.x) {
    s += static_cast<double>(loss[t]) * mask[t];
    c += mask[t];
  }
  s = block_sum_double(s, sh);
  c = block_sum_double(c, sh);
  if (threadIdx.x == 0) acc[0] += s, acc[1] += c;
}

template <bool kZeros>
void reduce(const float* x, const uint8_t* counted, int64_t n, double* scratch, double* out, cudaStream_t stream) {
  partial_kernel<kZeros><<<kReduceBlocks, kThreads, 0, stream>>>(x, counted, n, scratch);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
  finish_kernel<<<1, kThreads, 0, stream>>>(scratch, kReduceBlocks, out);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void sum_squares(const float* x, int64_t n, double* scratch, double* out, cudaStream_t stream,
                 const uint8_t* counted) {
  reduce<false>(x, counted, n, scratch, out, stream);
}

void count_zeros(const float* x, int64_t n, double* scratch, double* out, cudaStream_t stream,
                 const uint8_t* counted) {
  reduce<true>(x, counted, n, scratch, out, stream);
}

void adamw_step(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, __nv_bfloat16* param_bf16,
                const uint8_t* decay, int64_t n, const AdamWStep& s, cudaStream_t stream) {
  if (n <= 0) return;
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  adamw_kernel<<<static_cast<unsigned>(blocks < 8192 ? blocks : 8192), kThreads, 0, stream>>>(
      param, grad, exp_avg, exp_avg_sq, param_bf16, decay, n, s);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

void masked_loss_sum(const float* loss, const float* mask, int64_t T, double* acc, cudaStream_t stream) {
  masked_loss_kernel<<<1, 1024, 0, stream>>>(loss, mask, T, acc);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

}  // namespace laoyao::kernels::cuda
