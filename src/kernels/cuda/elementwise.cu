// Element-wise kernels of the training step (see elementwise.hpp): grid-stride loops, fp32 math.
#include <cstdint>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/elementwise.hpp"

namespace laoyao::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;
constexpr int kThreads = 256;

unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 65536 ? (b > 0 ? b : 1) : 65536);
}

__global__ void residual_dropout_add_kernel(const bf16* branch, const bf16* residual, bf16* out, int64_t n,
                                            DropoutSpec drop) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float b = __bfloat162float(branch[i]);
    if (drop.p > 0) b *= dropout_factor(drop, static_cast<uint64_t>(i));
    out[i] = __float2bfloat16(__bfloat162float(residual[i]) + b);
  }
}

__global__ void dropout_kernel(const bf16* x, bf16* y, int64_t n, DropoutSpec drop) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = __float2bfloat16(__bfloat162float(x[i]) * dropout_factor(drop, static_cast<uint64_t>(i)));
}

__global__ void scale_kernel(float* x, float s, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] *= s;
}

__global__ void add_kernel(bf16* acc, const bf16* x, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    acc[i] = __float2bfloat16(__bfloat162float(acc[i]) + __bfloat162float(x[i]));
}

__global__ void cast_kernel(const float* x, bf16* y, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = __float2bfloat16(x[i]);
}

__global__ void round_bf16_kernel(float* x, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = __bfloat162float(__float2bfloat16(x[i]));
}

constexpr int64_t kRowsPerChunk = 256;

// partial[chunk, col] = sum of dy[rows of chunk, col], rows in order; one thread per column.
__global__ void column_partial_kernel(const bf16* dy, float* partial, int64_t T, int64_t N) {
  const int64_t col = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t chunk = blockIdx.y;
  if (col >= N) return;
  const int64_t r0 = chunk * kRowsPerChunk, r1 = r0 + kRowsPerChunk < T ? r0 + kRowsPerChunk : T;
  float s = 0.0f;
  for (int64_t r = r0; r < r1; ++r) s += __bfloat162float(dy[r * N + col]);
  partial[chunk * N + col] = s;
}

__global__ void column_reduce_kernel(const float* partial, float* db, int64_t chunks, int64_t N) {
  const int64_t col = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col >= N) return;
  float s = 0.0f;
  for (int64_t c = 0; c < chunks; ++c) s += partial[c * N + col];
  db[col] += s;
}

}  // namespace

void residual_dropout_add(const bf16* branch, const bf16* residual, bf16* out, int64_t n, const DropoutSpec& drop,
                          cudaStream_t stream) {
  if (n <= 0) return;
  residual_dropout_add_kernel<<<blocks_for(n), kThreads, 0, stream>>>(branch, residual, out, n, drop);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

void dropout_apply(const bf16* x, bf16* y, int64_t n, const DropoutSpec& drop, cudaStream_t stream) {
  if (n <= 0) return;
  if (drop.p <= 0) {
    if (x != y) LAOYAO_CUDA_CHECK(cudaMemcpyAsync(y, x, sizeof(bf16) * n, cudaMemcpyDeviceToDevice, stream));
    return;
  }
  dropout_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, y, n, drop);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

void add_inplace(bf16* acc, const bf16* x, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  add_kernel<<<blocks_for(n), kThreads, 0, stream>>>(acc, x, n);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

void scale_inplace(float* x, float s, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  scale_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, s, n);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

size_t bias_grad_scratch_floats(int64_t T, int64_t N) {
  return static_cast<size_t>((T + kRowsPerChunk - 1) / kRowsPerChunk * N);
}

void bias_grad(const bf16* dy, float* db, float* scratch, int64_t T, int64_t N, cudaStream_t stream) {
  if (T <= 0 || N <= 0) return;
  const int64_t chunks = (T + kRowsPerChunk - 1) / kRowsPerChunk;
  const dim3 grid(static_cast<unsigned>((N + kThreads - 1) / kThreads), static_cast<unsigned>(chunks));
  column_partial_kernel<<<grid, kThreads, 0, stream>>>(dy, scratch, T, N);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
  column_reduce_kernel<<<static_cast<unsigned>((N + kThreads - 1) / kThreads), kThreads, 0, stream>>>(scratch, db,
                                                                                                   chunks, N);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

void cast_to_bf16(const float* x, bf16* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  cast_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, y, n);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

void round_to_bf16_inplace(float* x, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  round_bf16_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, n);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

}  // namespace laoyao::kernels::cuda
