// Expert parallelism's reorders on the GPU (Megatron-Core's sort_chunks_by_idxs in the all-to-all
// token dispatcher). Rank `me` of P holds global experts me*El .. me*El+El-1 (El = E / P). The
// all-to-all delivers the rows for them source-major: source 0's rows for local expert 0, 1, ...,
// El-1, then source 1's, and so on (each source sends its rows grouped by expert, as its
// permutation ordered them). The grouped GEMMs want them expert-major: local expert 0's rows from
// source 0, 1, ..., P-1, then expert 1's. These kernels map between the two orders and give the
// expert-major group offsets, from the counts every rank all-gathered on the device.
//
// counts: [P][E] int32 on the device, rank s's tokens for global expert g at counts[s * E + g].
// Rows are bf16 [rows][H] moved in 16-byte vectors: H a multiple of 8, buffers 16-byte aligned.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace laoyao::kernels::cuda {

// out = in reordered: source-major to expert-major when to_expert_major, else back. `rows` must be
// the total of this rank's chunks (sum over s, e of counts[s][me*El + e]; the host knows it after
// the count exchange). E <= kMoeMaxExperts, P divides E. in and out must not overlap.
void moe_ep_sort_chunks(const __nv_bfloat16* in, __nv_bfloat16* out, const int32_t* counts, int64_t P, int64_t E,
                        int64_t me, int64_t rows, int64_t H, bool to_expert_major, cudaStream_t stream);

// offsets[El + 1] of the expert-major rows (grouped_gemm.hpp's group offsets): offsets[e] = the
// rows of local experts before e, from every source.
void moe_ep_local_offsets(const int32_t* counts, int64_t P, int64_t E, int64_t me, int32_t* offsets,
                          cudaStream_t stream);

}  // namespace laoyao::kernels::cuda
