// Expert parallelism's chunk reorders (see moe_ep.hpp). Each block builds the two chunk tables in
// shared memory (at most kMoeMaxExperts chunks: P * El = E), then each warp copies whole rows,
// finding a row's chunk by binary search over the expert-major starts.
#include <algorithm>
#include <cstdint>
#include <string>

#include "core/error.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/moe.hpp"
#include "kernels/cuda/moe_ep.hpp"

namespace laoyao::kernels::cuda {
namespace {

constexpr int kSortThreads = 256;
constexpr int kSortWarps = kSortThreads / 32;
constexpr int kSortMaxBlocks = 1024;

__global__ void __launch_bounds__(kSortThreads)
moe_ep_sort_chunks_kernel(const uint4* __restrict__ in, uint4* __restrict__ out, const int32_t* __restrict__ counts,
                          int P, int E, int me, int64_t rows, int64_t Hv, bool to_expert_major) {
  __shared__ int64_t source_start[kMoeMaxExperts];      // chunk (s, e) at s * El + e
  __shared__ int64_t expert_start[kMoeMaxExperts + 1];  // chunk (e, s) at e * P + s
  const int El = E / P;
  if (threadIdx.x == 0) {  // at most 2 * 512 steps: cheaper than a parallel scan's launches
    int64_t at = 0;
    for (int s = 0; s < P; ++s)
      for (int e = 0; e < El; ++e) source_start[s * El + e] = at, at += counts[s * E + me * El + e];
    at = 0;
    for (int e = 0; e < El; ++e)
      for (int s = 0; s < P; ++s) expert_start[e * P + s] = at, at += counts[s * E + me * El + e];
    expert_start[E] = at;
  }
  __syncthreads();
  const int lane = threadIdx.x % 32;
  for (int64_t r = int64_t(blockIdx.x) * kSortWarps + threadIdx.x / 32; r < rows;
       r += int64_t(gridDim.x) * kSortWarps) {
    // The last chunk starting at or before r (empty chunks share their start with the next).
    int lo = 0, hi = E - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (expert_start[mid] <= r) lo = mid; else hi = mid - 1;
    }
    const int e = lo / P, s = lo % P;
    const int64_t src = source_start[s * El + e] + (r - expert_start[lo]);
    const uint4* from = in + (to_expert_major ? src : r) * Hv;
    uint4* to = out + (to_expert_major ? r : src) * Hv;
    for (int64_t v = lane; v < Hv; v += 32) to[v] = from[v];
  }
}

__global__ void moe_ep_local_offsets_kernel(const int32_t* __restrict__ counts, int P, int E, int me,
                                            int32_t* __restrict__ offsets) {
  const int El = E / P;
  int32_t at = 0;
  for (int e = 0; e < El; ++e) {
    offsets[e] = at;
    for (int s = 0; s < P; ++s) at += counts[s * E + me * El + e];
  }
  offsets[El] = at;
}

void check_ranks(const char* op, int64_t P, int64_t E, int64_t me) {
  if (P < 1 || E < 1 || E > kMoeMaxExperts || E % P != 0 || me < 0 || me >= P)
    throw Error(std::string(op) + ": " + std::to_string(E) + " experts (at most " + std::to_string(kMoeMaxExperts) +
                ") over " + std::to_string(P) + " ranks (rank " + std::to_string(me) + ")");
}

}  // namespace

void moe_ep_sort_chunks(const __nv_bfloat16* in, __nv_bfloat16* out, const int32_t* counts, int64_t P, int64_t E,
                        int64_t me, int64_t rows, int64_t H, bool to_expert_major, cudaStream_t stream) {
  check_ranks("moe_ep_sort_chunks", P, E, me);
  if (H < 8 || H % 8 != 0 || reinterpret_cast<uintptr_t>(in) % 16 != 0 || reinterpret_cast<uintptr_t>(out) % 16 != 0)
    throw Error("moe_ep_sort_chunks: rows of a multiple of 8 bf16 (got " + std::to_string(H) +
                ") in 16-byte aligned buffers");
  if (rows <= 0) return;
  const int64_t blocks = std::min<int64_t>((rows + kSortWarps - 1) / kSortWarps, kSortMaxBlocks);
  moe_ep_sort_chunks_kernel<<<unsigned(blocks), kSortThreads, 0, stream>>>(
      reinterpret_cast<const uint4*>(in), reinterpret_cast<uint4*>(out), counts, int(P), int(E), int(me), rows, H / 8,
      to_expert_major);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

void moe_ep_local_offsets(const int32_t* counts, int64_t P, int64_t E, int64_t me, int32_t* offsets,
                          cudaStream_t stream) {
  check_ranks("moe_ep_local_offsets", P, E, me);
  moe_ep_local_offsets_kernel<<<1, 1, 0, stream>>>(counts, int(P), int(E), int(me), offsets);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

}  // namespace laoyao::kernels::cuda
