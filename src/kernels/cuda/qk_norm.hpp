// QK layernorm with RMSNorm (Megatron --qk-layernorm, Qwen3) on the fused QKV rows, for BF16, as
// kernels/cpu/ops.hpp qk_rmsnorm_forward / qk_rmsnorm_backward: every q head and every group's k
// of a token is RMS-normalised over its own D (= kv_channels) values, q heads sharing the weight
// q_gamma[D] and all k sharing k_gamma[D]; applied after the QKV projection and before RoPE.
// bf16 in and out, fp32 statistics and math, rstd[T, H + G] saved in fp32 in the CPU's layout
// (rstd[t*(H+G) + h] for q head h, rstd[t*(H+G) + H + g] for group g's k).
// Rows are Megatron-Core's grouped layout: per token, G groups of [q (H/G heads x D), k (D), v (D)].
// D must be a multiple of 8 up to 256 (16-byte loads, one row per warp or part of a warp) and the
// activation pointers 16-byte aligned; anything else is refused with laoyao::Error.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/qkv_rows.hpp"
#include "kernels/cuda/rope.hpp"

namespace laoyao::kernels::cuda {

// out[T, row] receives the normalised q and k and a copy of v (complete fused rows, ready for RoPE
// in place and attention). Out of place because the backward needs the un-normalised qkv; out ==
// qkv is allowed only when no backward follows. zero_centered_gamma: the weights are used as
// (1 + gamma). H must be a positive multiple of G. With `rope` (T = b * s rows, rope_packable), q
// and k are also rotated by RoPE (rope_forward_qkv) before their one rounding: the norm and the
// rotation in one pass. A table the pack path cannot serve is refused (laoyao::Error). With
// out_layout Split, out holds the same rows in QkvRows::Split (cuDNN's GQA reads; out != qkv).
void qk_rmsnorm_forward(const __nv_bfloat16* qkv, const __nv_bfloat16* q_gamma, const __nv_bfloat16* k_gamma,
                        __nv_bfloat16* out, float* rstd, int64_t T, int64_t H, int64_t G, int64_t D, float eps,
                        bool zero_centered_gamma, cudaStream_t stream, const RopeDeviceTable* rope = nullptr,
                        int64_t s = 0, QkvRows out_layout = QkvRows::Fused);

// Floats of scratch qk_rmsnorm_backward needs (per-chunk partial sums of the two weight gradients).
size_t qk_rmsnorm_backward_scratch_floats(int64_t T, int64_t H, int64_t G, int64_t D);

// dqkv[T, row] overwritten: q/k slots get the RMSNorm input gradient, v slots dout's v (passed
// through); dqkv may be dout (in place). qkv and rstd are the forward's input and statistics.
// dq_gamma[D], dk_gamma[D] (fp32 main grads, either may be null) are accumulated (+=) without
// atomics: each chunk of tokens writes its partial sums to `scratch`, then one small kernel adds the
// chunks in a fixed order, so the result is bitwise reproducible run to run. With `rope` (as the
// forward's), dout is the gradient of the rotated output: its q and k are rotated back first
// (rope_backward_qkv) in the same pass. With dout_layout Split, dout is read in QkvRows::Split
// (dqkv is always fused; dqkv != dout).
void qk_rmsnorm_backward(const __nv_bfloat16* dout, const __nv_bfloat16* qkv, const __nv_bfloat16* q_gamma,
                         const __nv_bfloat16* k_gamma, const float* rstd, __nv_bfloat16* dqkv, float* dq_gamma,
                         float* dk_gamma, float* scratch, int64_t T, int64_t H, int64_t G, int64_t D,
                         bool zero_centered_gamma, cudaStream_t stream, const RopeDeviceTable* rope = nullptr,
                         int64_t s = 0, QkvRows dout_layout = QkvRows::Fused);

}  // namespace laoyao::kernels::cuda
