// Expert parallelism's row groups (see moe_ep.hpp).
#include <algorithm>
#include <cstdint>
#include <string>

#include "core/error.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/moe.hpp"
#include "kernels/cuda/moe_ep.hpp"

namespace laoyao::kernels::cuda {
namespace {

// One thread: at most kMoeMaxExperts additions, cheaper than a scan's launches.
__global__ void moe_ep_source_offsets_kernel(const int32_t* __restrict__ counts, int P, int E, int me,
                                             int32_t* __restrict__ offsets) {
  const int El = E / P;
  int32_t at = 0;
  for (int s = 0; s < P; ++s)
    for (int e = 0; e < El; ++e) {
      offsets[s * El + e] = at;
      at += counts[s * E + me * El + e];
    }
  offsets[E] = at;
}

constexpr int kLocalThreads = 256;

// A block's pairs, counted in shared memory, then one atomic add per local expert.
__global__ void moe_ep_local_choices_kernel(const int32_t* __restrict__ idx_g, int64_t n, int e0, int El,
                                            int32_t* __restrict__ idx_l, int32_t* __restrict__ counts_l) {
  __shared__ int hist[kMoeMaxExperts];
  for (int e = threadIdx.x; e < El; e += blockDim.x) hist[e] = 0;
  __syncthreads();
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int e = idx_g[i] - e0;
    const bool here = e >= 0 && e < El;
    idx_l[i] = here ? e : -1;
    if (here) atomicAdd(&hist[e], 1);
  }
  __syncthreads();
  for (int e = threadIdx.x; e < El; e += blockDim.x)
    if (hist[e] > 0) atomicAdd(&counts_l[e], hist[e]);
}

// The same count for the pairs of one share of each sequence (moe_share_choices).
__global__ void moe_share_choices_kernel(const int32_t* __restrict__ idx, int64_t n, int k, int64_t s, int64_t first,
                                         int64_t width, int E, int32_t* __restrict__ idx_share,
                                         int32_t* __restrict__ counts) {
  __shared__ int hist[kMoeMaxExperts];
  for (int e = threadIdx.x; e < E; e += blockDim.x) hist[e] = 0;
  __syncthreads();
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t position = (i / k) % s;
    const bool mine = position >= first && position < first + width;
    const int e = idx[i];
    idx_share[i] = mine ? e : -1;
    if (mine && e >= 0) atomicAdd(&hist[e], 1);
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x)
    if (hist[e] > 0) atomicAdd(&counts[e], hist[e]);
}

}  // namespace

void moe_share_choices(const int32_t* idx, int64_t T, int64_t s, int64_t k, int64_t E, int64_t rank, int64_t ranks,
                       int32_t* idx_share, int32_t* counts, cudaStream_t stream) {
  const int64_t n = T * k;
  if (E < 1 || E > kMoeMaxExperts || k < 1 || s < 1 || T % s != 0 || ranks < 1 || s % ranks != 0 || rank < 0 ||
      rank >= ranks || n >= (int64_t{1} << 31))
    throw Error("moe_share_choices: " + std::to_string(E) + " experts (1 to " + std::to_string(kMoeMaxExperts) +
                "), " + std::to_string(T) + " tokens of sequences of " + std::to_string(s) + " (a multiple), top-" +
                std::to_string(k) + ", share " + std::to_string(rank) + " of " + std::to_string(ranks) +
                " (dividing the sequence)");
  LAOYAO_CUDA_CHECK(cudaMemsetAsync(counts, 0, sizeof(int32_t) * static_cast<size_t>(E), stream));
  if (n == 0) return;
  const int64_t blocks = std::min<int64_t>((n + kLocalThreads - 1) / kLocalThreads, 1024), width = s / ranks;
  moe_share_choices_kernel<<<unsigned(blocks), kLocalThreads, 0, stream>>>(idx, n, int(k), s, rank * width, width,
                                                                           int(E), idx_share, counts);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

void moe_ep_local_choices(const int32_t* idx_g, int64_t n, int64_t e0, int64_t El, int32_t* idx_l, int32_t* counts_l,
                          cudaStream_t stream) {
  if (El < 1 || El > kMoeMaxExperts || e0 < 0 || n < 0 || n >= (int64_t{1} << 31))
    throw Error("moe_ep_local_choices: " + std::to_string(El) + " local experts (1 to " +
                std::to_string(kMoeMaxExperts) + ") from expert " + std::to_string(e0) + ", " + std::to_string(n) +
                " pairs (fewer than 2^31)");
  LAOYAO_CUDA_CHECK(cudaMemsetAsync(counts_l, 0, sizeof(int32_t) * static_cast<size_t>(El), stream));
  if (n == 0) return;
  const int64_t blocks = std::min<int64_t>((n + kLocalThreads - 1) / kLocalThreads, 1024);
  moe_ep_local_choices_kernel<<<unsigned(blocks), kLocalThreads, 0, stream>>>(idx_g, n, int(e0), int(El), idx_l,
                                                                              counts_l);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

void moe_ep_source_offsets(const int32_t* counts, int64_t P, int64_t E, int64_t me, int32_t* offsets,
                           cudaStream_t stream) {
  if (P < 1 || E < 1 || E > kMoeMaxExperts || E % P != 0 || me < 0 || me >= P)
    throw Error("moe_ep_source_offsets: " + std::to_string(E) + " experts (at most " +
                std::to_string(kMoeMaxExperts) + ") over " + std::to_string(P) + " ranks (rank " + std::to_string(me) +
                ")");
  moe_ep_source_offsets_kernel<<<1, 1, 0, stream>>>(counts, int(P), int(E), int(me), offsets);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

}  // namespace laoyao::kernels::cuda
