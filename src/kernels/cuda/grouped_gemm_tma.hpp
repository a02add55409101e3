// The TMA-fed grouped GEMM kernels (grouped_gemm_tma.cu), behind grouped_gemm.hpp's functions,
// which check the arguments, finish the problems no kernel needs (no rows, no output columns, an
// empty reduction) and pick them: here rows, columns and the reduction are all at least 1. Same
// operands as there; `cols` / `red` are the output columns and the reduction (nt: N, K; nn: K, N);
// `wide` takes 128 x 256 block tiles instead of 128 x 128, `persistent` (with wide, where the
// epilogues are bulk stores) one block an SM walking them.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/grouped_gemm.hpp"

namespace laoyao::kernels::cuda {

void grouped_rows_tma(bool nt, const bf16* A, const bf16* B, bf16* C, const RowGroups& groups, int64_t cols,
                      int64_t red, bool wide, cudaStream_t stream);
void grouped_wgrad_tma(const bf16* dY, const bf16* X, float* dW, const RowGroups& groups, int64_t N, int64_t K,
                       bool accumulate, cudaStream_t stream);

}  // namespace laoyao::kernels::cuda
