// Grouped GEMMs of the routed experts (our own tensor-core kernels): the rows of the activations
// are grouped, group g being rows [offsets[g], offsets[g + 1]) with offsets[G + 1] int32 on the
// DEVICE (moe_permutation writes them; offsets[G] - offsets[0] <= rows: the rows may be a bound, the
// all-gather dispatcher's, whose count only the device knows; offsets[0] = first, 0 unless
// the groups are a later part of a longer grouping, whose rows before them are not touched). The
// host knows the total rows and the first (RowGroups), never the per-expert counts (no
// synchronisation in the step). bf16
// operands, fp32 accumulation. W holds Gw [N, K] matrices (local_experts.w.linear_fc1/fc2.weight,
// one after another, as [out, in] like every linear) and group g uses matrix g % Gw: one group per
// expert (G = Gw), or under expert parallelism one per (source rank, local expert) in the order
// the all-to-all delivers them (source-major: G = ranks x Gw), so that no reorder is needed.
// N and K must be multiples of 8 (16-byte rows); any group may be empty. The bf16 operands must be
// 16-byte aligned (the fp32 dW 8-byte). Arguments are checked on the host (laoyao::Error): Gw >= 1
// dividing G, first >= 0, rows >= 0, first + rows < 2^31, N and K non-negative multiples of 8.
// Not checked (the host cannot see them): the offsets must be non-decreasing and offsets[0] must
// equal first (the TMA kernels read the row operands as first + rows rows from their base: a wrong
// first reads zeros or past the operand). The grids are sized from rows and G: ceil(rows / 128) + G
// row tiles for nt and nn, whose blocks find their group from the offsets; Gw x ceil(N / 128) x
// ceil(K / 128) tiles for wgrad. No host synchronisation, no allocation: every call is one kernel
// on `stream`.
// Three sets of kernels do the work: on Hopper TMA-fed wgmma ones (grouped_gemm_tma.cu), the
// default, with 128 x 256 tiles where the output's columns are a multiple of 256, and cp.async-fed
// wgmma ones (grouped_gemm.cu, LAOYAO_GROUPED_GEMM=cp_async, core/runtime_options.hpp); elsewhere
// (Blackwell) portable warp-level MMA ones (grouped_gemm_portable.cu, LAOYAO_GROUPED_GEMM=portable
// on any GPU); `scripts/gpu_check.sh run grouped` tests and times each.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/fp8.hpp"

namespace laoyao::kernels::cuda {

using bf16 = __nv_bfloat16;

// The row groups of one call.
struct RowGroups {
  const int32_t* offsets = nullptr;  // [groups + 1], on the device
  int64_t groups = 0;                // G
  int64_t weights = 0;               // Gw: group g uses weight matrix g % Gw
  int64_t rows = 0;                  // offsets[G] - offsets[0], known to the host
  int64_t first = 0;                 // offsets[0], known to the host: the operands hold first + rows rows
};

// The kernels the calls on the current device take (LAOYAO_GROUPED_GEMM, auto: by its compute
// capability); a UsageError for Hopper-only kernels asked for on another GPU.
enum class GroupedGemmKernels { kTma, kCpAsync, kPortable };
GroupedGemmKernels grouped_gemm_kernels();
const char* grouped_gemm_kernels_name(GroupedGemmKernels k);

// Forward of each expert's linear: Y[r, :] = X[r, :] @ W_{g % Gw}^T for r in group g.
// X [first + rows, K], W [Gw][N][K], Y [first + rows, N] (bf16; the groups' rows overwritten).
void grouped_gemm_nt(const bf16* X, const bf16* W, bf16* Y, const RowGroups& groups, int64_t N, int64_t K,
                     cudaStream_t stream);
// Input gradient: dX[r, :] = dY[r, :] @ W_{g % Gw}. dY [first + rows, N], W [Gw][N][K], dX
// [first + rows, K] (bf16; the groups' rows overwritten).
void grouped_gemm_nn(const bf16* dY, const bf16* W, bf16* dX, const RowGroups& groups, int64_t N, int64_t K,
                     cudaStream_t stream);
// Weight gradient: dW_w += sum over the groups g with g % Gw == w of dY_g^T @ X_g (fp32 main_grad;
// the groups' rows summed in group order). accumulate = false writes the sum instead (the first
// micro-batch of a step: the gradient is neither zeroed before nor read), zeros for a matrix none
// of whose groups has rows; accumulating, such a matrix is left as it is.
// dY [first + rows, N], X [first + rows, K], dW [Gw][N][K]. The TMA kernels zero dY's rows past a
// group's end in the reduction's last partial step (the next group's rows, read with the tile),
// not X's: those X rows must be finite (0 x inf would leak NaN into this group's dW).
void grouped_gemm_wgrad(const bf16* dY, const bf16* X, float* dW, const RowGroups& groups, int64_t N, int64_t K,
                        bool accumulate, cudaStream_t stream);

// ---- FP8 (Transformer Engine's GroupedLinear under fp8_autocast, one quantizer per GEMM, i.e. per
// weight matrix): FP8 operands (fp8_cast.hpp's grouped casts) with one scale_inv per weight
// matrix, group g's at index g % Gw, `stride` floats apart; fp32 accumulation; the output times
// the two operands' scale_invs. Hopper only (TMA-fed wgmma kernels, whatever LAOYAO_GROUPED_GEMM
// picks for bf16; a UsageError elsewhere); N and K multiples of 16 (Megatron's FP8 condition);
// other checks as above.
// Whether the current device runs them (Hopper).
bool grouped_gemm_fp8_supported();
struct Fp8GroupScales {
  const float* a = nullptr;  // the first operand's scale_invs (X, dY)
  const float* b = nullptr;  // the second's (W, X)
  int64_t a_stride = 1, b_stride = 1;
};
// Y[r, :] = X[r, :] @ W_{g % Gw}^T: X [first + rows, K] in format fx, W [Gw][N][K] E4M3, Y bf16
// [first + rows, N]. The forward (X E4M3, split_accumulator false: the forward's fast accumulation)
// and the input gradient as dX = dY @ W, given the weights' transposes [Gw][K][N] as W (dY E4M3 or
// E5M2, split_accumulator true, as Transformer Engine's backward GEMMs).
void grouped_gemm_fp8_nt(const uint8_t* X, Fp8Format fx, const uint8_t* W, bf16* Y, const RowGroups& groups, int64_t N,
                         int64_t K, const Fp8GroupScales& scales, bool split_accumulator, cudaStream_t stream);
// Weight gradient, as grouped_gemm_wgrad with the split accumulator, from the operands' transposes
// (Hopper's FP8 GEMMs read both operands reduction-contiguous): dYt [N][ld] in format fdy, Xt
// [K][ld] E4M3, a group's rows being their columns (ld >= first + rows, a multiple of 16). A
// group's steps start at its first row rounded down to 16 (TMA's innermost coordinates are 16-byte
// multiples), dY^T's columns outside the group zeroed in shared memory; Xt's columns read beside
// them must be finite: from first rounded down to 16, the other groups', and offsets[G] .. first +
// rows (fp8_grouped_cast_transpose writes those zero).
void grouped_gemm_fp8_wgrad(const uint8_t* dYt, Fp8Format fdy, const uint8_t* Xt, int64_t ld, float* dW,
                            const RowGroups& groups, int64_t N, int64_t K, const Fp8GroupScales& scales,
                            bool accumulate, cudaStream_t stream);

}  // namespace laoyao::kernels::cuda
