// Element-wise kernels of the training step (see elementwise.hpp): grid-stride loops, fp32 math.
#include <cstdint>

#include "kernels/cuda/chunk_reduce.hpp"
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
                                            DropoutSpec drop, const bf16* bias, int64_t N) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float b = __bfloat162float(branch[i]);
    if (bias) b += __bfloat162float(bias[i % N]);
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

// partial[chunk][0][col] = sum of dy[rows of chunk, col], rows in order, in add_chunk_partials'
// layout (row 1 unused); one thread per column.
__global__ void column_partial_kernel(const bf16* dy, float* partial, int64_t T, int64_t N) {
  const int64_t col = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t chunk = blockIdx.y;
  if (col >= N) return;
  const int64_t r0 = chunk * kRowsPerChunk, r1 = r0 + kRowsPerChunk < T ? r0 + kRowsPerChunk : T;
  float s = 0.0f;
  for (int64_t r = r0; r < r1; ++r) s += __bfloat162float(dy[r * N + col]);
  partial[chunk * 2 * N + col] = s;
}

// The same with 16-byte loads (N % 8 == 0, dy 16-byte aligned): one thread per 8 columns, chunks
// of kVecRowsPerChunk rows (more chunks in flight for narrow N: at GPT-2's 768 columns the scalar
// kernel above ran 192 blocks at 1.3 TB/s).
constexpr int64_t kVecRowsPerChunk = 64;
constexpr int kVecThreads = 64;

__global__ void column_partial_vec_kernel(const bf16* __restrict__ dy, float* __restrict__ partial, int64_t T,
                                          int64_t N) {
  const int64_t packs = N / 8, p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (p >= packs) return;
  const int64_t chunk = blockIdx.y, r0 = chunk * kVecRowsPerChunk;
  const int64_t r1 = r0 + kVecRowsPerChunk < T ? r0 + kVecRowsPerChunk : T;
  const uint4* src = reinterpret_cast<const uint4*>(dy) + p;
  float s[8] = {};
#pragma unroll 8
  for (int64_t r = r0; r < r1; ++r) {
    const uint4 v = __ldg(src + r * packs);
    const __nv_bfloat162* e = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __bfloat1622float2(e[i]);
      s[2 * i] += f.x;
      s[2 * i + 1] += f.y;
    }
  }
  float4* out = reinterpret_cast<float4*>(partial + chunk * 2 * N + p * 8);
  out[0] = make_float4(s[0], s[1], s[2], s[3]);
  out[1] = make_float4(s[4], s[5], s[6], s[7]);
}

}  // namespace

void residual_dropout_add(const bf16* branch, const bf16* residual, bf16* out, int64_t n, const DropoutSpec& drop,
                          cudaStream_t stream, const bf16* bias, int64_t N) {
  if (n <= 0) return;
  if (bias && (N <= 0 || n % N != 0)) throw Error("residual_dropout_add: a bias of " + std::to_string(N) +
                                                  " columns over " + std::to_string(n) + " elements");
  residual_dropout_add_kernel<<<blocks_for(n), kThreads, 0, stream>>>(branch, residual, out, n, drop, bias, N);
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
  if (n <= 0 || s == 1.0f) return;  // x * 1 is x: no pass over the buffer
  scale_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, s, n);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

size_t bias_grad_scratch_floats(int64_t T, int64_t N) {
  const int64_t scalar = (T + kRowsPerChunk - 1) / kRowsPerChunk * 2 * N;
  const int64_t vec = (T + kVecRowsPerChunk - 1) / kVecRowsPerChunk * 2 * N;
  return static_cast<size_t>(scalar > vec ? scalar : vec);
}

void bias_grad(const bf16* dy, float* db, float* scratch, int64_t T, int64_t N, cudaStream_t stream) {
  if (T <= 0 || N <= 0) return;
  if (N % 8 == 0 && reinterpret_cast<uintptr_t>(dy) % 16 == 0 && reinterpret_cast<uintptr_t>(scratch) % 16 == 0) {
    const int64_t chunks = (T + kVecRowsPerChunk - 1) / kVecRowsPerChunk;
    if (chunks > 65535) throw Error("bias_grad: too many row chunks for grid.y");
    const dim3 grid(static_cast<unsigned>((N / 8 + kVecThreads - 1) / kVecThreads), static_cast<unsigned>(chunks));
    column_partial_vec_kernel<<<grid, kVecThreads, 0, stream>>>(dy, scratch, T, N);
    LAOYAO_CUDA_CHECK(cudaGetLastError());
    add_chunk_partials(scratch, db, nullptr, chunks, N, stream);
    return;
  }
  const int64_t chunks = (T + kRowsPerChunk - 1) / kRowsPerChunk;
  const dim3 grid(static_cast<unsigned>((N + kThreads - 1) / kThreads), static_cast<unsigned>(chunks));
  column_partial_kernel<<<grid, kThreads, 0, stream>>>(dy, scratch, T, N);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
  add_chunk_partials(scratch, db, nullptr, chunks, N, stream);
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
