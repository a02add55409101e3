// Chunk partials added in a fixed order (see chunk_reduce.hpp). Block (kTile columns, kRows thread
// rows): thread row y adds chunks y, y + kRows, ... into kAcc accumulators taken in turn (kAcc
// loads in flight), the block then adds its thread rows in order. Narrow outputs (a head dim of
// QK-norm weights: two blocks) with hundreds of chunks are the case to serve: few blocks, so each
// thread keeps many loads in flight.
#include "kernels/cuda/chunk_reduce.hpp"
#include "kernels/cuda/cuda_check.hpp"

namespace laoyao::kernels::cuda {
namespace {

constexpr int kTile = 32;  // columns per block (one warp wide: coalesced rows)
constexpr int kRows = 32;  // thread rows per block
constexpr int kAcc = 8;    // accumulators (loads in flight) per thread

template <int kOuts>
__global__ void __launch_bounds__(kTile * kRows)
    add_chunk_partials_kernel(const float* __restrict__ partial, float* __restrict__ out0, float* __restrict__ out1,
                              float* __restrict__ out2, int64_t chunks, int64_t C) {
  __shared__ float sums[kOuts][kRows][kTile];
  const int64_t c = int64_t(blockIdx.x) * kTile + threadIdx.x;
  float* const outs[3] = {out0, out1, out2};
  for (int which = 0; which < kOuts; ++which) {
    float acc[kAcc] = {};
    if (c < C && outs[which]) {  // a null output's row is not read
      int64_t k = threadIdx.y;
      for (; k + (kAcc - 1) * kRows < chunks; k += kAcc * kRows)
#pragma unroll
        for (int j = 0; j < kAcc; ++j) acc[j] += partial[((k + j * kRows) * kOuts + which) * C + c];
#pragma unroll
      for (int j = 0; j < kAcc; ++j)  // the last, partial round
        if (k + j * kRows < chunks) acc[j] += partial[((k + j * kRows) * kOuts + which) * C + c];
    }
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < kAcc; ++j) s += acc[j];
    sums[which][threadIdx.y][threadIdx.x] = s;
  }
  __syncthreads();
  if (threadIdx.y >= kOuts || c >= C) return;
  float* out = outs[threadIdx.y];
  if (!out) return;
  float s = 0.0f;
  for (int y = 0; y < kRows; ++y) s += sums[threadIdx.y][y][threadIdx.x];  // fixed order
  out[c] += s;
}

}  // namespace

void add_chunk_partials(const float* partial, float* out0, float* out1, int64_t chunks, int64_t C,
                        cudaStream_t stream) {
  if (chunks <= 0 || C <= 0 || (!out0 && !out1)) return;
  add_chunk_partials_kernel<2><<<unsigned((C + kTile - 1) / kTile), dim3(kTile, kRows), 0, stream>>>(
      partial, out0, out1, nullptr, chunks, C);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

void add_chunk_partials3(const float* partial, float* out0, float* out1, float* out2, int64_t chunks, int64_t C,
                         cudaStream_t stream) {
  if (chunks <= 0 || C <= 0 || (!out0 && !out1 && !out2)) return;
  add_chunk_partials_kernel<3><<<unsigned((C + kTile - 1) / kTile), dim3(kTile, kRows), 0, stream>>>(
      partial, out0, out1, out2, chunks, C);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

}  // namespace laoyao::kernels::cuda
