// FP8 scaling as Transformer Engine does it for Megatron's recipes (docs/reference/fp8-facts.md §2-5):
// a tensor is cast to FP8 as x * scale, and a GEMM of FP8 operands dequantizes with each operand's
// scale_inv = 1 / scale (the scale the cast used). Where the scale comes from:
//   delayed ("--fp8-recipe delayed", Megatron's default): per tensor, a history of the amaxes
//     (max |x| of the unscaled values) its casts recorded, updated after each pass (each
//     micro-batch's forward, each backward) from the amaxes reduced over Megatron's amax group;
//   current ("tensorwise", Float8CurrentScaling): from the tensor's own amax at its cast;
//   blockwise (Float8BlockScaling): each block of the tensor (1 x 128 or 128 x 128 values) from
//     its own amax at its cast, a power of two.
// The CPU backend's FP8 simulation, and the reference the CUDA path is checked against.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/fp8.hpp"

namespace laoyao {

// --fp8-amax-compute-algo: the amax a scale is computed from.
enum class AmaxComputeAlgo { MostRecent, Max };

// --fp8-format: hybrid (E4M3 in the forward, E5M2 for the gradients) or e4m3 (E4M3 everywhere);
// fp8_format_of gives a tensor's format under it.
enum class Fp8Formats { Hybrid, E4M3 };
Fp8Format fp8_format_of(Fp8Formats formats, bool gradient);

// --fp8-recipe: delayed (DelayedScaling), tensorwise (Float8CurrentScaling) or blockwise
// (Float8BlockScaling). Megatron's mxfp8 and custom are refused by name where the flags are read.
enum class Fp8ScalingRecipe { Delayed, Tensorwise, Blockwise };

// TE's DelayedScalingRecipeState for n tensors: scale[n] (1 at first), amax_history [len][n] (0 at
// first), row 0 the amaxes of the pass being recorded; each tensor's format gives its fp8_max.
class DelayedScaling {
 public:
  DelayedScaling(std::vector<Fp8Format> formats, int64_t history_len, AmaxComputeAlgo algo, int margin);

  int64_t size() const { return static_cast<int64_t>(formats_.size()); }
  float scale(int64_t i) const { return scale_[static_cast<size_t>(i)]; }
  // history(r, i): row r of tensor i's history (row 0: this pass's amax so far; len - 1 the newest
  // completed one).
  float history(int64_t row, int64_t i) const { return history_[static_cast<size_t>(row * size() + i)]; }
  int64_t history_len() const { return len_; }

  // A cast of tensor i records its amax into row 0 (the max with what this pass recorded).
  void record_amax(int64_t i, float amax);
  // Row 0, the pass's amaxes: what Megatron reduces with MAX over its amax group before update().
  float* pass_amaxes() { return history_.data(); }
  // TE's update after the reduction (delayed_scaling.cu's kernel), per tensor: the pass's amax
  // (row 0) if not 0 rolls the history (row r takes row r + 1, the last row the amax, row 0 starts
  // over at 0) and gives the amax the scale uses (most_recent: it; max: the largest of the window
  // before the roll and it); a tensor not cast this pass (0) keeps its history, and under max its
  // scale too. scale = fp8_max * 2^-margin / amax when that amax is finite and > 0 (FLT_MAX if
  // that overflows), else the old scale.
  void update();

 private:
  std::vector<Fp8Format> formats_;
  int64_t len_;
  AmaxComputeAlgo algo_;
  int margin_;
  std::vector<float> scale_, history_;
};

// Float8CurrentScaling's scale from a tensor's amax (recipe_common.cuh): amax below eps becomes eps;
// an amax that is infinite, NaN or 0 gives 1; else fp8_max / amax in fp32 (FLT_MAX if infinite),
// rounded down to a power of two when pow2 (NVTE_FP8_CURRENT_SCALING_POWER_2_SCALES).
float current_scaling_scale(float amax, Fp8Format f, float eps = 0.0f, bool pow2 = false);

// Float8BlockScaling's block edge: 1 x 128 blocks for inputs and output gradients, 128 x 128 for weights.
constexpr int64_t kFp8Block = 128;

// Float8BlockScaling's cast of x[rows][cols] in blocks of br x bc values (1 x 128: 128 of a row's
// consecutive values; 128 x 1: 128 consecutive rows of a column; 128 x 128), each block by the
// scale its own amax gives (current_scaling_scale with eps 0 and, as the recipe's default, pow2);
// a block at an edge over the values it holds. q[rows][cols] the FP8 bytes; scale_inv (nullable)
// [ceil(rows / br)][ceil(cols / bc)] each block's 1 / scale.
void fp8_block_quantize(const float* x, int64_t rows, int64_t cols, int64_t br, int64_t bc, Fp8Format f, bool pow2,
                        uint8_t* q, float* scale_inv);
// The same cast's FP8 values times their block's scale_inv, in fp32 (exact: the scales are powers
// of two): the operand a block-scaled GEMM multiplies, which the CPU backend's GEMMs take.
void fp8_block_quantize_dequantized(const float* x, int64_t rows, int64_t cols, int64_t br, int64_t bc, Fp8Format f,
                                    bool pow2, float* out);

// max |x[i]| over the n values as the cast kernels take it (fmaxf: a NaN is passed over, an
// infinity is the amax).
float fp8_amax(const float* x, int64_t n);
// q[i] = x[i] * scale (fp32) cast to the format (core/fp8.hpp: round to nearest even, saturating).
void fp8_quantize(const float* x, int64_t n, float scale, Fp8Format f, uint8_t* q);
// The same cast's FP8 values as floats (exact), unscaled: what the CPU backend's FP8 GEMMs multiply.
void fp8_quantize_values(const float* x, int64_t n, float scale, Fp8Format f, float* q);
// q's values times scale_inv, in fp32: what the GEMM reads.
void fp8_dequantize(const uint8_t* q, int64_t n, float scale_inv, Fp8Format f, float* x);

// The FP8 GEMM as cuBLASLt computes it (TN: both operands k-contiguous): d[m, n] = scale_inv_a *
// scale_inv_b * sum_k a[m, k] b[n, k] over the FP8 values, accumulated in fp32, plus beta * d.
void fp8_gemm_tn(const uint8_t* a, Fp8Format fa, float scale_inv_a, const uint8_t* b, Fp8Format fb,
                 float scale_inv_b, float* d, int64_t m, int64_t n, int64_t k, float beta = 0.0f);

}  // namespace laoyao
