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

// One element's term of the sum: its square, or 1 if it is zero.
template <bool kZeros>
__device__ __forceinline__ double reduction_term(float v) {
  return kZeros ? (v == 0.0f ? 1.0 : 0.0) : static_cast<double>(v) * v;
}

template <bool kZeros>
__device__ __forceinline__ double pack_terms(float4 v, uchar4 c) {
  return (c.x ? reduction_term<kZeros>(v.x) : 0.0) + (c.y ? reduction_term<kZeros>(v.y) : 0.0) +
         (c.z ? reduction_term<kZeros>(v.z) : 0.0) + (c.w ? reduction_term<kZeros>(v.w) : 0.0);
}

// Each block reduces a fixed, contiguous slice (the slices depend only on n, and for the 16-byte
// kernel below on the buffers' alignment), so the sum's order is the same every run.
template <bool kZeros>
__global__ void partial_kernel(const float* x, const uint8_t* counted, int64_t n, double* partial) {
  __shared__ double sh[32];
  const int64_t per = (n + gridDim.x - 1) / gridDim.x;
  const int64_t lo = per * blockIdx.x, hi = lo + per < n ? lo + per : n;
  double acc = 0;
  for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    if (counted && !counted[i]) continue;
    acc += reduction_term<kZeros>(x[i]);
  }
  acc = block_sum_double(acc, sh);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

constexpr int kPacksInFlight = 4;

// partial_kernel with 16-byte loads (x 16-byte and counted 4-byte aligned): block b sums a fixed
// slice of the n / 4 packs, kPacksInFlight loads in flight per thread (the scalar kernel, one load
// at a time, read 1.5B gradients at 2.9 TB/s); the last block adds the n % 4 elements left.
template <bool kZeros>
__global__ void partial_vec_kernel(const float4* __restrict__ x, const uchar4* __restrict__ counted, int64_t packs,
                                   const float* __restrict__ rest, const uint8_t* __restrict__ rest_counted,
                                   int rest_n, double* partial) {
  __shared__ double sh[32];
  const int64_t per = (packs + gridDim.x - 1) / gridDim.x;
  const int64_t lo = per * blockIdx.x, hi = lo + per < packs ? lo + per : packs;
  const uchar4 all = make_uchar4(1, 1, 1, 1);
  double acc[kPacksInFlight] = {};
  int64_t i = lo + threadIdx.x;
  for (; i + (kPacksInFlight - 1) * int64_t(blockDim.x) < hi; i += kPacksInFlight * int64_t(blockDim.x)) {
    float4 v[kPacksInFlight];
    uchar4 c[kPacksInFlight];
#pragma unroll
    for (int j = 0; j < kPacksInFlight; ++j) {
      v[j] = x[i + j * int64_t(blockDim.x)];
      c[j] = counted ? counted[i + j * int64_t(blockDim.x)] : all;
    }
#pragma unroll
    for (int j = 0; j < kPacksInFlight; ++j) acc[j] += pack_terms<kZeros>(v[j], c[j]);
  }
  for (; i < hi; i += blockDim.x) acc[0] += pack_terms<kZeros>(x[i], counted ? counted[i] : all);
  if (blockIdx.x == gridDim.x - 1 && int(threadIdx.x) < rest_n && (!rest_counted || rest_counted[threadIdx.x]))
    acc[0] += reduction_term<kZeros>(rest[threadIdx.x]);
  double sum = 0;
#pragma unroll
  for (int j = 0; j < kPacksInFlight; ++j) sum += acc[j];
  sum = block_sum_double(sum, sh);
  if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

__global__ void finish_kernel(const double* partial, int count, double* out) {
  __shared__ double sh[32];
  double acc = 0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partial[i];
  acc = block_sum_double(acc, sh);
  if (threadIdx.x == 0) out[0] = acc;
}

// One element's AdamW update (see adamw_step): fp32 moments, the step in double as the CPU's.
__device__ __forceinline__ void adamw_one(float& p, float g, float& m, float& v, uint8_t decay, const AdamWStep& s,
                                          float decay_on) {
  if (s.grad_scale < 1.0f) g *= s.grad_scale;
  p *= decay ? decay_on : 1.0f;
  m = s.beta1 * m + (1.0f - s.beta1) * g;
  v = s.beta2 * v + (1.0f - s.beta2) * g * g;
  const double denom = sqrt(static_cast<double>(v)) / s.bc2_sqrt + s.eps;
  p = static_cast<float>(p - s.step_size * m / denom);
}

// Elements [lo, hi) one at a time (the unaligned ends, or everything when the buffers' alignments
// differ).
__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, __nv_bfloat16* pb, const uint8_t* decay,
                             int64_t lo, int64_t hi, AdamWStep s) {
  const float decay_on = static_cast<float>(1.0 - s.lr * s.wd);
  for (int64_t i = lo + int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < hi; i += int64_t(gridDim.x) * blockDim.x) {
    float pi = p[i], mi = m[i], vi = v[i];
    adamw_one(pi, g[i], mi, vi, decay[i], s, decay_on);
    m[i] = mi, v[i] = vi, p[i] = pi;
    pb[i] = __float2bfloat16(pi);
  }
}

// Groups of four elements from 16-byte aligned fp32 buffers (8-byte bf16, 4-byte flags): the step
// reads 17 and writes 14 bytes an element, so it is bound by memory, and wide accesses keep more
// of them in flight than scalar ones.
__global__ void adamw_vec4_kernel(float4* p, const float4* g, float4* m, float4* v, uint2* pb, const uchar4* decay,
                                  int64_t groups, AdamWStep s) {
  const float decay_on = static_cast<float>(1.0 - s.lr * s.wd);
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < groups; i += int64_t(gridDim.x) * blockDim.x) {
    float4 pi = p[i], mi = m[i], vi = v[i];
    const float4 gi = g[i];
    const uchar4 d = decay[i];
    adamw_one(pi.x, gi.x, mi.x, vi.x, d.x, s, decay_on);
    adamw_one(pi.y, gi.y, mi.y, vi.y, d.y, s, decay_on);
    adamw_one(pi.z, gi.z, mi.z, vi.z, d.z, s, decay_on);
    adamw_one(pi.w, gi.w, mi.w, vi.w, d.w, s, decay_on);
    p[i] = pi, m[i] = mi, v[i] = vi;
    const __nv_bfloat162 lo = __floats2bfloat162_rn(pi.x, pi.y), hi = __floats2bfloat162_rn(pi.z, pi.w);
    pb[i] = make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
  }
}

// One block's sums of loss * mask and of mask (valid in thread 0).
__device__ void masked_sums(const float* loss, const float* mask, int64_t T, double& s, double& c) {
  __shared__ double sh[32];
  s = 0, c = 0;
  for (int64_t t = threadIdx.x; t < T; t += blockDim.x) {
    s += static_cast<double>(loss[t]) * mask[t];
    c += mask[t];
  }
  s = block_sum_double(s, sh);
  c = block_sum_double(c, sh);
}

__global__ void masked_loss_kernel(const float* loss, const float* mask, int64_t T, double* acc) {
  double s, c;
  masked_sums(loss, mask, T, s, c);
  if (threadIdx.x == 0) acc[0] += s, acc[1] += c;
}

template <bool kZeros>
void reduce(const float* x, const uint8_t* counted, int64_t n, double* scratch, double* out, cudaStream_t stream) {
  const bool vec = reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(counted) % 4 == 0;
  if (vec) {
    const int64_t packs = n / 4, done = packs * 4;
    partial_vec_kernel<kZeros><<<kReduceBlocks, kThreads, 0, stream>>>(
        reinterpret_cast<const float4*>(x), reinterpret_cast<const uchar4*>(counted), packs, x + done,
        counted ? counted + done : nullptr, static_cast<int>(n - done), scratch);
  } else {
    partial_kernel<kZeros><<<kReduceBlocks, kThreads, 0, stream>>>(x, counted, n, scratch);
  }
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
  auto scalar = [&](int64_t lo, int64_t hi) {
    if (hi <= lo) return;
    const int64_t blocks = (hi - lo + kThreads - 1) / kThreads;
    adamw_kernel<<<static_cast<unsigned>(blocks < 8192 ? blocks : 8192), kThreads, 0, stream>>>(
        param, grad, exp_avg, exp_avg_sq, param_bf16, decay, lo, hi, s);
    LAOYAO_CUDA_CHECK(cudaGetLastError());
  };
  // The first element from which every buffer is aligned for four-element groups (a shard of the
  // distributed optimizer may start anywhere); none when the buffers disagree.
  auto misalign = [](const void* ptr, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes; };
  const int64_t head = static_cast<int64_t>((16 - misalign(param, 16)) % 16 / sizeof(float));
  const bool aligned = head < n && misalign(param + head, 16) == 0 && misalign(grad + head, 16) == 0 &&
                       misalign(exp_avg + head, 16) == 0 && misalign(exp_avg_sq + head, 16) == 0 &&
                       misalign(param_bf16 + head, 8) == 0 && misalign(decay + head, 4) == 0;
  if (!aligned) return scalar(0, n);
  const int64_t groups = (n - head) / 4, tail = head + 4 * groups;
  scalar(0, head);
  if (groups > 0) {
    const int64_t blocks = (groups + kThreads - 1) / kThreads;
    adamw_vec4_kernel<<<static_cast<unsigned>(blocks < 8192 ? blocks : 8192), kThreads, 0, stream>>>(
        reinterpret_cast<float4*>(param + head), reinterpret_cast<const float4*>(grad + head),
        reinterpret_cast<float4*>(exp_avg + head), reinterpret_cast<float4*>(exp_avg_sq + head),
        reinterpret_cast<uint2*>(param_bf16 + head), reinterpret_cast<const uchar4*>(decay + head), groups, s);
    LAOYAO_CUDA_CHECK(cudaGetLastError());
  }
  scalar(tail, n);
}

__global__ void masked_mean_kernel(const float* loss, const float* mask, int64_t T, double scale, double* acc) {
  double s, c;
  masked_sums(loss, mask, T, s, c);
  if (threadIdx.x == 0 && c > 0) acc[0] += scale * (s / c);
}

void masked_mean_accumulate(const float* loss, const float* mask, int64_t T, double scale, double* acc,
                            cudaStream_t stream) {
  masked_mean_kernel<<<1, 1024, 0, stream>>>(loss, mask, T, scale, acc);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

void masked_loss_sum(const float* loss, const float* mask, int64_t T, double* acc, cudaStream_t stream) {
  masked_loss_kernel<<<1, 1024, 0, stream>>>(loss, mask, T, acc);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

}  // namespace laoyao::kernels::cuda
