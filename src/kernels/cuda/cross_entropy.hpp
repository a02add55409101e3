// Cross entropy over all V (padded) vocabulary logits for BF16 logits, as Megatron's
// vocab_parallel_cross_entropy at TP = 1 (padded columns are not masked, like the CPU reference
// kernels/cpu/ops.hpp cross_entropy_forward/backward). Arithmetic in fp32.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace laoyao::kernels::cuda {

// loss[t] = log(sum_j exp(z_j - max)) - (z[target[t]] - max) and lse[t] = max + log(sum ...), fp32,
// from logits[T, V] (bf16). A target outside [0, V) cannot throw from the device: its loss is NaN,
// so the bad batch shows in the reported loss instead of reading out of bounds.
void cross_entropy_forward(const __nv_bfloat16* logits, const int64_t* targets, float* loss, float* lse, int64_t T,
                           int64_t V, cudaStream_t stream);

// The training form: the loss and, in the same kernel, its gradient written over the logits
// (what cross_entropy_forward then cross_entropy_backward compute). The per-token loss gradients
// dloss are known before the forward (the loss mask over the token count), so nothing waits for
// the loss. Rows of V % 8 == 0 elements up to 409600 are held in the shared memory of a cluster of
// blocks: one read of the logits and one write (LAOYAO_CE_CLUSTER=0: one block a row, reading the
// row twice); other rows are read 16 bytes at a time (V % 8 == 0) or one element at a time.
void cross_entropy_forward_backward(__nv_bfloat16* logits, const int64_t* targets, const float* dloss, float* loss,
                                    float* lse, int64_t T, int64_t V, cudaStream_t stream);
// The blocks of the cluster that holds a row of V logits in cross_entropy_forward_backward (16-byte
// aligned logits), or 0 where one block a row reads it twice.
int cross_entropy_cluster_blocks(int64_t V);

// In place: logits[t][j] = bf16((exp(z_j - lse[t]) - [j == target[t]]) * dloss[t]), computed in fp32
// and rounded once (Megatron writes the gradient into the logits' buffer too). An out-of-range
// target gets no one-hot term. A vocabulary shard's logits hold columns [v0, v0 + V) (lse: the
// whole vocabulary's).
void cross_entropy_backward(__nv_bfloat16* logits, const int64_t* targets, const float* lse, const float* dloss,
                            int64_t T, int64_t V, cudaStream_t stream, int64_t v0 = 0);

// Vocabulary-parallel cross entropy (Megatron's vocab_parallel_cross_entropy, TP > 1), each rank
// holding columns [v0, v0 + V) of the logits: the shard's statistics stats[2T] (its own lse, then
// the target logit where the target is in the shard, else 0) ...
void cross_entropy_shard_stats(const __nv_bfloat16* logits, const int64_t* targets, float* stats, int64_t T,
                               int64_t V, int64_t v0, cudaStream_t stream);
// ... gathered from every rank ([ranks][2T], all-gather order) give every token's loss and the
// whole vocabulary's lse (for cross_entropy_backward). V_total: the whole padded vocabulary (a
// target outside it: NaN loss).
void cross_entropy_combine_shards(const float* gathered, const int64_t* targets, float* loss, float* lse, int64_t T,
                                  int64_t V_total, int ranks, cudaStream_t stream);

}  // namespace laoyao::kernels::cuda
