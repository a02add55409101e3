// The second half of the deterministic parameter-gradient reductions of the norm kernels
// (layernorm.cu, qk_norm.cu): their first kernel writes a few partial rows per chunk of tokens,
// partial[chunk][rows][C]; this adds the chunks into fp32 gradients in a fixed order (so the sum
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

// The same over partial[chunk][3][C]: out2 from row [2] (a norm's backward that also sums the dx it
// writes, layernorm.hpp's dx_colsum).
void add_chunk_partials3(const float* partial, float* out0, float* out1, float* out2, int64_t chunks, int64_t C,
                         cudaStream_t stream);

}  // namespace laoyao::kernels::cuda
