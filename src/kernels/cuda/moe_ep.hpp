// Expert parallelism's row groups on the GPU. Rank `me` of P holds global experts me*El ..
// me*El+El-1 (El = E / P). The all-to-all delivers the rows for them source-major: source 0's rows
// for local expert 0, 1, ..., El-1, then source 1's, and so on (each source sends its rows grouped
// by expert, as its permutation ordered them). The grouped GEMMs take them in that order, as P x El
// groups whose group s * El + e uses local expert e's weights (grouped_gemm.hpp's RowGroups with
// Gw = El), so no reorder to expert-major order is needed (Megatron-Core's all-to-all dispatcher
// sorts the chunks; the rows each expert sees, and their order, are the same).
//
// counts: [P][E] int32 on the device, rank s's tokens for global expert g at counts[s * E + g].
//
// The all-gather dispatcher (Megatron's default, --moe-token-dispatcher-type allgather) needs no
// counts on the host: every rank gathers every rank's tokens and choices and keeps the pairs of its
// own experts (moe_ep_local_choices), which moe_permutation then sorts expert-major.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace laoyao::kernels::cuda {

// offsets[P * El + 1] of the source-major groups: offsets[s * El + e] = the rows delivered before
// source s's rows for local expert e. E <= kMoeMaxExperts, P divides E, 0 <= me < P.
void moe_ep_source_offsets(const int32_t* counts, int64_t P, int64_t E, int64_t me, int32_t* offsets,
                           cudaStream_t stream);

// The all-gather dispatcher's pairs here: of the gathered choices idx_g[n] (global expert ids,
// every rank's tokens x top-k, rank after rank), those of experts e0 .. e0 + El - 1 as local ids
// (idx_l[i] = idx_g[i] - e0), every other pair -1 (moe_permutation gives it no row);
// counts_l[El] = the pairs of each local expert (overwritten). 1 <= El <= kMoeMaxExperts.
void moe_ep_local_choices(const int32_t* idx_g, int64_t n, int64_t e0, int64_t El, int32_t* idx_l, int32_t* counts_l,
                          cudaStream_t stream);

// Whole experts under tensor parallelism (--expert-tensor-parallel-size 1): every TP rank routes
// the whole gathered sequence, and only its own sequence-parallel share's pairs go to the experts.
// Of the choices idx[T, k] (T = b s tokens, batch-major), those of positions rank * s / ranks ..
// (rank + 1) * s / ranks - 1 of each sequence are copied to idx_share, every other pair -1
// (moe_permutation gives it no row); counts[E] = the share's pairs of each expert (overwritten).
// ranks divides s, s divides T, E <= kMoeMaxExperts.
void moe_share_choices(const int32_t* idx, int64_t T, int64_t s, int64_t k, int64_t E, int64_t rank, int64_t ranks,
                       int32_t* idx_share, int32_t* counts, cudaStream_t stream);

}  // namespace laoyao::kernels::cuda
