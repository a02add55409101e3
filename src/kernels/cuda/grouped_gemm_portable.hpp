// The grouped GEMMs' portable kernels (grouped_gemm_portable.cu: warp-level MMAs, sm_80 and later),
// behind grouped_gemm.hpp's functions, which check the arguments and dispatch to them where the
// Hopper-only kernels do not run (grouped_gemm_kernels()).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/grouped_gemm.hpp"

namespace laoyao::kernels::cuda {

// nt (C [rows][cols] = A [rows][red] @ B_w^T, B_w [cols][red]) or nn (B_w [red][cols]).
void grouped_rows_portable(bool nt, const bf16* A, const bf16* B, bf16* C, const RowGroups& g, int64_t cols,
                           int64_t red, cudaStream_t stream);
void grouped_wgrad_portable(const bf16* dY, const bf16* X, float* dW, const RowGroups& g, int64_t N, int64_t K,
                            bool accumulate, cudaStream_t stream);

}  // namespace laoyao::kernels::cuda
