// A simple, exact causal self-attention forward and backward for BF16 inputs: fp32 scores, fp32
// softmax, fp32 accumulation, results rounded to bf16 once. It is the GPU cross-check for faster
// attention paths (and what `laoyao doctor` executes), not a fast path: no tensor cores, one block
// per query (or key) row, O(s) shared memory per block.
//
// Layouts are those of kernels/cpu/ops.hpp (Megatron-Core's fused QKV, GQA read in place):
//   qkv [b*s, G*(H/G + 2)*D]   per token, G groups of [q (H/G heads x D), k (D), v (D)]
//   ctx [b*s, H*D]             heads concatenated
//   lse [b, H, s]              fp32 log-sum-exp of each query's scaled scores, saved for backward
// Tested for head dims 64 and 128; any D <= 256 works.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace laoyao::kernels::cuda {

struct AttentionShape {
  int64_t b = 0, s = 0;  // batch, sequence length
  int64_t H = 0, G = 0;  // attention heads, query groups (H % G == 0)
  int64_t D = 0;         // head dim
  float scale = 0.0f;    // score scale, usually 1/sqrt(D)
  // Device [b*s] or null: the first key each query attends (documents of a packed sequence,
  // --reset-attention-mask; kernels/cpu/ops.hpp). Within a sequence it must not decrease and
  // key_start[i] <= i (what the dataset makes); null is plain causal attention.
  const int32_t* key_start = nullptr;
  // The value and context head dim where it differs from D (multi-latent attention: query and key
  // dqk + dr, value dv); 0: D. Only cuDNN's attention over separate rows (qkv_rows.hpp) takes it.
  int64_t Dv = 0;
  int64_t dv() const { return Dv > 0 ? Dv : D; }
};

// ctx and lse overwritten. Throws laoyao::Error on an unsupported shape or a failed launch.
void attention_reference_forward(const __nv_bfloat16* qkv, __nv_bfloat16* ctx, float* lse, const AttentionShape& shape,
                                 cudaStream_t stream);

// dqkv [b*s, G*(H/G + 2)*D] overwritten with the gradients of q, k and v given dctx; ctx and lse are
// the forward's outputs. delta [b, H, s] is caller-owned fp32 scratch (rowsum(dctx * ctx)), so the
// backward allocates nothing.
void attention_reference_backward(const __nv_bfloat16* qkv, const __nv_bfloat16* ctx, const __nv_bfloat16* dctx,
                                  const float* lse, float* delta, __nv_bfloat16* dqkv, const AttentionShape& shape,
                                  cudaStream_t stream);

}  // namespace laoyao::kernels::cuda
