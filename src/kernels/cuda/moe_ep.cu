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

// The pairs a rule keeps, renumbered (-1 for the others), counted in shared memory per bucket, then
// one atomic add per bucket: keep(i, e) gives pair i's bucket, or -1 to drop it.
template <class Keep>
__global__ void keep_and_count_kernel(const int32_t* __restrict__ idx, int64_t n, int buckets, Keep keep,
                                      int32_t* __restrict__ kept, int32_t* __restrict__ counts) {
  __shared__ int hist[kMoeMaxExperts];
  for (int e = threadIdx.x; e < buckets; e += blockDim.x) hist[e] = 0;
  __syncthreads();
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int e = keep(i, idx[i]);
    kept[i] = e;
    if (e >= 0) atomicAdd(&hist[e], 1);
  }
  __syncthreads();
  for (int e = threadIdx.x; e < buckets; e += blockDim.x)
    if (hist[e] > 0) atomicAdd(&counts[e], hist[e]);
}

// This rank's experts e0 .. e0 + El - 1, numbered from 0 (moe_ep_local_choices).
struct LocalExperts {
  int e0, El;
  __device__ int operator()(int64_t, int32_t global) const {
    const int e = global - e0;
    return e >= 0 && e < El ? e : -1;
  }
};

// The pairs of positions first .. first + width - 1 of each sequence of s tokens, k pairs a token
// (moe_share_choices).
struct ShareOfSequence {
  int k;
  int64_t s, first, width;
  __device__ int operator()(int64_t i, int32_t e) const {
    const int64_t position = (i / k) % s;
    return position >= first && position < first + width ? e : -1;
  }
};

template <class Keep>
void keep_and_count(const int32_t* idx, int64_t n, int64_t buckets, Keep keep, int32_t* kept, int32_t* counts,
                    cudaStream_t stream) {
  LAOYAO_CUDA_CHECK(cudaMemsetAsync(counts, 0, sizeof(int32_t) * static_cast<size_t>(buckets), stream));
  if (n == 0) return;
  const int64_t blocks = std::min<int64_t>((n + kLocalThreads - 1) / kLocalThreads, 1024);
  keep_and_count_kernel<<<unsigned(blocks), kLocalThreads, 0, stream>>>(idx, n, int(buckets), keep, kept, counts);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
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
  const int64_t width = s / ranks;
  keep_and_count(idx, n, E, ShareOfSequence{int(k), s, rank * width, width}, idx_share, counts, stream);
}

void moe_ep_local_choices(const int32_t* idx_g, int64_t n, int64_t e0, int64_t El, int32_t* idx_l, int32_t* counts_l,
                          cudaStream_t stream) {
  if (El < 1 || El > kMoeMaxExperts || e0 < 0 || n < 0 || n >= (int64_t{1} << 31))
    throw Error("moe_ep_local_choices: " + std::to_string(El) + " local experts (1 to " +
                std::to_string(kMoeMaxExperts) + ") from expert " + std::to_string(e0) + ", " + std::to_string(n) +
                " pairs (fewer than 2^31)");
  keep_and_count(idx_g, n, El, LocalExperts{int(e0), int(El)}, idx_l, counts_l, stream);
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
