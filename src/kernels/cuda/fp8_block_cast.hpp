// FP8 block scaling's casts on the GPU (Transformer Engine's Float8BlockScaling; docs/fp8.md "Block
// scaling", docs/reference/fp8-blockwise-facts.md). The reference is core/fp8_scaling.hpp's
// fp8_block_quantize: each block of a bf16 tensor cast by the power of two at or below
// fp8_max / its amax (1 for a block of zeros), the FP8 bytes and each block's scale_inv written in
// the layouts cuBLASLt's block-scaled GEMMs read (GemmScale::Vec128, Blk128 in gemm_cublaslt.hpp):
//   1 x 128 blocks of an [M, K] operand (K contiguous): scale_inv[ceil(K / 128)][round_up(M, 4)];
//   128 x 128 blocks: scale_inv[ceil(M / 128)][round_up(ceil(K / 128), 4)].
// (The padding entries are not written.)
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/fp8.hpp"

namespace laoyao::kernels::cuda {

// The scale_inv tensor's leading dimension for an operand of `outer` rows in 1 x 128 blocks, or of
// ceil(cols / 128) block columns in 128 x 128 blocks: round_up(n, 4).
inline int64_t fp8_block_scale_ld(int64_t n) { return (n + 3) / 4 * 4; }

// What a block cast writes (each part nullable): q [rows][cols] with its scale_inv, and x's
// transpose qt [cols][rows] with its scale_inv_t.
struct Fp8BlockOut {
  uint8_t* q = nullptr;
  float* scale_inv = nullptr;
  uint8_t* qt = nullptr;
  float* scale_inv_t = nullptr;
};

// 1 x 128 blocks, both directions from x [rows][cols] in one pass: q's blocks along each row
// (scale_inv[(c / 128) * round_up(rows, 4) + r]), and qt = x^T in blocks along each column of x,
// i.e. 128 consecutive rows (scale_inv_t[(r / 128) * round_up(cols, 4) + c]): the input's and the
// output gradient's forward / data-gradient operand and their weight-gradient operand.
void fp8_block_cast_1d(const __nv_bfloat16* x, int64_t rows, int64_t cols, Fp8Format f, const Fp8BlockOut& out,
                       cudaStream_t stream);

// 128 x 128 blocks (the weight): one scale a block for q and for qt, its exact transpose;
// scale_inv[(r / 128) * round_up(ceil(cols / 128), 4) + c / 128] and
// scale_inv_t[(c / 128) * round_up(ceil(rows / 128), 4) + r / 128].
void fp8_block_cast_2d(const __nv_bfloat16* x, int64_t rows, int64_t cols, Fp8Format f, const Fp8BlockOut& out,
                       cudaStream_t stream);

}  // namespace laoyao::kernels::cuda
