// The second half of the deterministic parameter-gradient reductions of the norm kernels
// (layernorm.cu, qk_norm.cu): their first kernel writes one partial row pair per chunk of tokens,
// partial[chunk][2][C]; this adds the chunks into two fp32 gradients in a fixed order (so the sum
// has the same bits every run), spread over enough threads that the chunk count does not
// serialise it.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace laoyao::kernels::cuda {

// out0[c] += sum over chunks of partial[chunk][0][c]; out1[c] likewise from [1][c]. Either output
// may be null (its sums are skipped).
void add_chunk_partials(const float* partial, float* out0, float* out1, int64_t chunks, int64_t C,
                        cudaStream_t stream);

}  // namespace laoyao::kernels::cuda
