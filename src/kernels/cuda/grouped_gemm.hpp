// Grouped GEMMs of the routed experts (our own tensor-core kernels): the rows of the activations
// are grouped by expert, group g being rows [offsets[g], offsets[g + 1]) with offsets[G + 1] int32
// on the DEVICE (moe_permutation writes them; offsets[0] = 0, offsets[G] = rows). The host knows
// only the total rows, so the per-expert counts never travel to it (no synchronisation in the
// step). bf16 operands, fp32 accumulation; the weights of group g are the g-th [N, K] matrix of W
// (local_experts.g.linear_fc1/fc2.weight, one after another, as [out, in] like every linear).
// N and K must be multiples of 8 (16-byte rows); any group may be empty. The bf16 operands must be
// 16-byte aligned (the fp32 dW 8-byte). Arguments are checked on the host (laoyao::Error): G >= 1,
// 0 <= rows < 2^31, N and K non-negative multiples of 8. The offsets must be non-decreasing with
// offsets[G] = rows (the grids are sized from rows and G: ceil(rows / 128) + G row tiles for nt
// and nn, whose blocks find their group from the offsets; G x ceil(N / 128) x ceil(K / 128) tiles for
// wgrad). No host synchronisation, no allocation: every call is one kernel on `stream`.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace laoyao::kernels::cuda {

using bf16 = __nv_bfloat16;

// Forward of each expert's linear: Y[r, :] = X[r, :] @ W_g^T for r in group g.
// X [rows, K], W [G][N][K], Y [rows, N] (bf16, overwritten).
void grouped_gemm_nt(const bf16* X, const bf16* W, bf16* Y, const int32_t* offsets, int64_t G, int64_t rows,
                     int64_t N, int64_t K, cudaStream_t stream);
// Input gradient: dX[r, :] = dY[r, :] @ W_g. dY [rows, N], W [G][N][K], dX [rows, K] (bf16, overwritten).
void grouped_gemm_nn(const bf16* dY, const bf16* W, bf16* dX, const int32_t* offsets, int64_t G, int64_t rows,
                     int64_t N, int64_t K, cudaStream_t stream);
// Weight gradient: dW_g += dY_g^T @ X_g (fp32 main_grad, accumulated; an empty group adds nothing).
// dY [rows, N], X [rows, K], dW [G][N][K].
void grouped_gemm_wgrad(const bf16* dY, const bf16* X, float* dW, const int32_t* offsets, int64_t G, int64_t rows,
                        int64_t N, int64_t K, cudaStream_t stream);

}  // namespace laoyao::kernels::cuda
