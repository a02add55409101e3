// Causal flash attention for BF16 (FlashAttention-2's algorithm, our kernels): tensor-core MMA
// (mma.sync m16n8k16, fp32 accumulation), online softmax in fp32, no s x s matrix in memory. Reads
// q, k, v in place from Megatron-Core's fused QKV rows (GQA groups included) and writes ctx in
// [b*s, H*D]; the backward writes dqkv in the same fused layout. Deterministic: dQ and dK/dV come
// from separate kernels, each summing in a fixed order (no atomics); a group's heads are summed in
// head order. Attention dropout draws the CPU model's mask element by element (dropout_rng.cuh),
// so it matches the CPU and the unfused path bit for bit in which probabilities are dropped.
//
// Head dims 64 and 128 (attention_flash_supports); any sequence length. shape.key_start confines
// each query to its document (--reset-attention-mask); tiles wholly outside a document are skipped.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/attention_reference.hpp"
#include "kernels/cuda/dropout_rng.cuh"

namespace laoyao::kernels::cuda {

bool attention_flash_supports(const AttentionShape& shape);

// ctx [b*s, H*D] and lse [b, H, s] (natural log of each query's softmax denominator, scaled
// scores) overwritten.
void attention_flash_forward(const __nv_bfloat16* qkv, __nv_bfloat16* ctx, float* lse, const AttentionShape& shape,
                             const DropoutSpec& drop, cudaStream_t stream);

// dqkv overwritten. delta [b, H, s] is fp32 scratch (rowsum(dctx * ctx)).
void attention_flash_backward(const __nv_bfloat16* qkv, const __nv_bfloat16* ctx, const __nv_bfloat16* dctx,
                              const float* lse, float* delta, __nv_bfloat16* dqkv, const AttentionShape& shape,
                              const DropoutSpec& drop, cudaStream_t stream);

}  // namespace laoyao::kernels::cuda
