// Causal self-attention the way Megatron-Core's unfused DotProductAttention computes it
// (--attention-backend unfused): S = scale * Q K^T and O = P V as batched cuBLASLt GEMMs (tensor
// cores), a softmax kernel in fp32 between them (bf16 probabilities, the future masked out), and
// attention dropout on the probabilities that multiply V. It keeps the s x s probabilities for
// backward, so memory grows with s^2: the simple fast path until a fused (flash) kernel lands, and
// the one that reproduces the CPU model's attention dropout bit for bit.
//
// Layouts: qkv [b*s, G*(H/G + 2)*D] and ctx [b*s, H*D] as kernels/cpu/ops.hpp (Megatron's fused
// QKV, GQA groups read in place); everything else is caller-owned scratch described below.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/attention_reference.hpp"
#include "kernels/cuda/dropout_rng.cuh"
#include "kernels/cuda/gemm_cublaslt.hpp"

namespace laoyao::kernels::cuda {

// What one attention call keeps between forward and backward (saved), and scratch.
struct UnfusedAttentionBuffers {
  __nv_bfloat16* q = nullptr;       // [b, H, s, D] saved (K and V expanded to all H heads)
  __nv_bfloat16* k = nullptr;       // [b, H, s, D] saved
  __nv_bfloat16* v = nullptr;       // [b, H, s, D] saved
  __nv_bfloat16* probs = nullptr;   // [b, H, s, s] saved: softmax output, zero above the diagonal
  __nv_bfloat16* probs_dropped = nullptr;  // [b, H, s, s] saved with attention dropout, else nullptr
};

// Per-call scratch, shared by every layer: fp32 scores/dP [b, H, s, s] and a [b, H, s, D] bf16 tile.
struct UnfusedAttentionScratch {
  float* scores = nullptr;
  __nv_bfloat16* heads = nullptr;   // ctx (forward) or dctx (backward) in [b, H, s, D] order
  __nv_bfloat16* dq = nullptr;      // [b, H, s, D]
  __nv_bfloat16* dk = nullptr;      // [b, H, s, D]
  __nv_bfloat16* dv = nullptr;      // [b, H, s, D]
};

// Element counts of those buffers for a shape.
int64_t attention_heads_elems(const AttentionShape& a);  // b*H*s*D
int64_t attention_probs_elems(const AttentionShape& a);  // b*H*s*s

// ctx overwritten. `drop` is the attention dropout of the probabilities (p == 0: none; then
// buffers.probs_dropped may be null). The mask of element (batch, head, i, j) is drawn at index
// ((batch*H + head)*s + i)*s + j, as the CPU model draws it.
void attention_unfused_forward(CublasLtGemm& gemm, const __nv_bfloat16* qkv, __nv_bfloat16* ctx,
                               const UnfusedAttentionBuffers& saved, const UnfusedAttentionScratch& scratch,
                               const AttentionShape& shape, const DropoutSpec& drop, cudaStream_t stream);

// dqkv overwritten from dctx. saved.probs is overwritten with dS (it is dead afterwards).
void attention_unfused_backward(CublasLtGemm& gemm, const __nv_bfloat16* dctx, __nv_bfloat16* dqkv,
                                const UnfusedAttentionBuffers& saved, const UnfusedAttentionScratch& scratch,
                                const AttentionShape& shape, const DropoutSpec& drop, cudaStream_t stream);

}  // namespace laoyao::kernels::cuda
