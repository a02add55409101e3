// FP8 casts on the GPU as Transformer Engine's per-tensor scaled casts run them (the reference is
// core/fp8_scaling.hpp; docs/reference/fp8-facts.md §2-4): a bf16 tensor times a device scale, cast
// with saturation to E4M3 or E5M2 (round to nearest even, CUDA's satfinite conversion), its amax
// (max |x| of the unscaled values, NaNs passed over) max-ed into a device float, and scale_inv =
// 1 / scale written beside the values for the GEMM that reads them. The transposed copy serves
// Hopper's FP8 GEMMs, which take TN operands only; and the scale updates of both recipes.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/fp8.hpp"
#include "kernels/cuda/grouped_gemm.hpp"

namespace laoyao::kernels::cuda {

// q[i] = fp8(x[i] * *scale); *scale_inv = 1 / *scale; *amax = max(*amax, max |x|) (amax null:
// not recorded).
void fp8_cast(const __nv_bfloat16* x, int64_t n, const float* scale, Fp8Format f, uint8_t* q, float* scale_inv,
              float* amax, cudaStream_t stream);
// The same cast of x [rows, cols] into q [rows, cols] and its transpose qt [cols, rows] (either
// may be null).
void fp8_cast_transpose(const __nv_bfloat16* x, int64_t rows, int64_t cols, const float* scale, Fp8Format f,
                        uint8_t* q, uint8_t* qt, float* scale_inv, float* amax, cudaStream_t stream);
// Per-matrix scaling slots of the casts below: matrix w's scale, scale_inv and amax at index w
// times each one's stride (scale_inv, amax null: not written).
struct Fp8Slots {
  const float* scale = nullptr;
  int64_t scale_stride = 1;
  float* scale_inv = nullptr;
  int64_t inv_stride = 1;
  float* amax = nullptr;
  int64_t amax_stride = 1;
};
// A batch of matrices each with its own scale (the experts' weights): x [batch][rows][cols] into q
// [batch][rows][cols] and qt [batch][cols][rows] (either may be null; both null: the amaxes alone).
void fp8_batched_cast_transpose(const __nv_bfloat16* x, int64_t batch, int64_t rows, int64_t cols, const Fp8Slots& slots,
                                Fp8Format f, uint8_t* q, uint8_t* qt, cudaStream_t stream);
// The routed experts' rows (grouped_gemm.hpp's RowGroups; Transformer Engine's GroupedLinear casts
// each GEMM's input with its own quantizer): x [first + rows][cols], a row of group g cast with
// scale[(g % Gw) * stride] into q [first + rows][cols] and the transpose qt [cols][ld] (column r;
// ld >= first + rows), either null to skip. Rows past offsets[G] (a bound's slack) are no group's:
// q's are left, qt's columns written 0 (the FP8 wgrad's last partial step reads them), as are its
// columns from first rounded down to 16 up to first (its first step's box starts there). Every
// matrix w < Gw gets its scale_inv, 1 / its scale; its amax is max-ed with its groups' rows' max |x|.
void fp8_grouped_cast_transpose(const __nv_bfloat16* x, int64_t cols, const RowGroups& groups, const Fp8Slots& slots,
                                Fp8Format f, uint8_t* q, uint8_t* qt, int64_t ld, cudaStream_t stream);
// The amaxes alone (current scaling's first pass over the experts' rows).
void fp8_grouped_amax(const __nv_bfloat16* x, int64_t cols, const RowGroups& groups, float* amax, int64_t stride,
                      cudaStream_t stream);
// *amax = max(*amax, max |x|): current scaling's first pass.
void fp8_amax(const __nv_bfloat16* x, int64_t n, float* amax, cudaStream_t stream);
// Current scaling: *scale = current_scaling_scale(*amax, f) (core/fp8_scaling.hpp); of n tensors,
// amax[i * amax_stride] to scale[i * scale_stride].
void fp8_current_scale(const float* amax, Fp8Format f, float* scale, cudaStream_t stream);
void fp8_current_scales(const float* amax, int64_t amax_stride, int64_t n, Fp8Format f, float* scale,
                        int64_t scale_stride, cudaStream_t stream);
// Delayed scaling's update of n tensors (DelayedScaling::update): history [len][n] (row 0 this
// pass's amaxes), scale [n], fp8_max [n] each tensor's format's largest value.
void fp8_delayed_update(float* history, float* scale, const float* fp8_max, int64_t n, int64_t len, bool max_algo,
                        int margin, cudaStream_t stream);

}  // namespace laoyao::kernels::cuda
