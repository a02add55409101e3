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
// FP8 (grouped_gemm.hpp's grouped_gemm_fp8_*): the nt rows kernels with 128 FP8 elements a stage
// (split: the split accumulator, 128-wide tiles; else 256-wide where cols % 256 == 0), and the
// wgrad kernel over the operands' transposes (ld: their row pitch).
void grouped_rows_tma_fp8(const uint8_t* A, Fp8Format fa, const uint8_t* B, bf16* C, const RowGroups& groups,
                          int64_t cols, int64_t red, const Fp8GroupScales& scales, bool split, cudaStream_t stream);
void grouped_wgrad_tma_fp8(const uint8_t* dYt, Fp8Format fdy, const uint8_t* Xt, int64_t ld, float* dW,
                           const RowGroups& groups, int64_t N, int64_t K, const Fp8GroupScales& scales,
                           bool accumulate, cudaStream_t stream);

}  // namespace laoyao::kernels::cuda
