// Megatron-Core's tensor-parallel layers on CPU ranks (megatron-lm.md §8.1), as functions over a
// rank's shards and its tensor-parallel group (dist::ProcessGroup: Gloo on CPU ranks). fp32, the
// kernels::cpu ops inside; a group of one rank (or nullptr) is the unsharded layer.
//   ColumnParallelLinear: w's output rows split [N/t, K]; input replicated; the input gradient is
//     summed over the group (the forward's "copy to tensor-parallel region").
//   RowParallelLinear: w's input columns split [N, K/t]; the partial outputs are summed over the
//     group, then the replicated bias is added.
//   VocabParallelEmbedding: the table's rows (vocabulary) split; out-of-shard ids look up zeros and
//     the outputs are summed over the group.
//   Vocab-parallel cross entropy: each rank holds its vocabulary shard of the logits; three
//     all-reduces (max, target logit, sum of exponentials) give every rank every token's loss.
// Megatron's QKV layout splits by query groups, which are contiguous rows: shard_rows serves it.
#pragma once
#include <cstdint>
#include <vector>

#include "dist/process_group.hpp"

namespace laoyao::model::tp {

// Rank r of t holds [r*n/t, (r+1)*n/t) of a dimension of n (n must be a multiple of t).
struct Shard {
  int64_t start, size;
};
Shard shard_of(int64_t n, int64_t rank, int64_t ranks);

// Rows [start, start+size) of a row-major [rows, cols] matrix, or its columns.
std::vector<float> shard_rows(const float* m, int64_t rows, int64_t cols, Shard s);
std::vector<float> shard_cols(const float* m, int64_t rows, int64_t cols, Shard s);

// y_local[T, N/t] = x[T, K] @ w_local^T (+ b_local).
void column_parallel_forward(const float* x, const float* w_local, const float* b_local, float* y_local, int64_t T,
                             int64_t K, int64_t n_local);
// dx[T, K] = sum over the group of dy_local @ w_local (overwritten; nullptr to skip);
// dw_local += dy_local^T x; db_local += column sums of dy_local (nullptr to skip).
void column_parallel_backward(const float* x, const float* w_local, const float* dy_local, float* dx, float* dw_local,
                              float* db_local, int64_t T, int64_t K, int64_t n_local, dist::ProcessGroup* group);

// y[T, N] = sum over the group of x_local[T, K/t] @ w_local^T, then + b (replicated; nullptr: none).
void row_parallel_forward(const float* x_local, const float* w_local, const float* b, float* y, int64_t T,
                          int64_t k_local, int64_t N, dist::ProcessGroup* group);
// dy replicated: dx_local = dy @ w_local (overwritten); dw_local += dy^T x_local; db += column sums
// of dy (the same on every rank; nullptr to skip).
void row_parallel_backward(const float* x_local, const float* w_local, const float* dy, float* dx_local,
                           float* dw_local, float* db, int64_t T, int64_t k_local, int64_t N);

// y[T, C] = table[ids] with table_local holding rows [vocab.start, vocab.start + vocab.size).
void vocab_parallel_embedding_forward(const int64_t* ids, const float* table_local, float* y, int64_t T, int64_t C,
                                      Shard vocab, dist::ProcessGroup* group);
// dtable_local += dy at this shard's rows (no communication).
void vocab_parallel_embedding_backward(const int64_t* ids, const float* dy, float* dtable_local, int64_t T, int64_t C,
                                       Shard vocab);

// loss[t] = log(sum_j exp(z_tj)) - z_t,target over the whole vocabulary, each rank holding the
// logits of its shard, logits_local [T, vocab.size]. stats [2T] (the maximum and the sum of
// exponentials after it) are saved for the backward.
void vocab_parallel_cross_entropy_forward(const float* logits_local, const int64_t* targets, float* loss, float* stats,
                                          int64_t T, Shard vocab, dist::ProcessGroup* group);
// Overwrites logits_local with (softmax - onehot) * dloss over this shard (no communication).
void vocab_parallel_cross_entropy_backward(float* logits_local, const int64_t* targets, const float* stats,
                                           const float* dloss, int64_t T, Shard vocab);

// ---- Sequence parallelism (--sequence-parallel): outside the tensor-parallel regions each rank
// holds positions [r*s/t, (r+1)*s/t) of every sequence; tokens are batch-major (token b*s + pos),
// so a rank's tokens are b runs of s/t rows. local is [b*s/t, C], full [b*s, C].
void sequence_slice(const float* full, float* local, int64_t b, int64_t s, int64_t C, int64_t rank, int64_t ranks);
// full = every rank's local rows in place (all-gather along the sequence).
void sequence_gather(const float* local, float* full, int64_t b, int64_t s, int64_t C, dist::ProcessGroup* group);
// local = this rank's rows of the sum over the group of each rank's full (reduce-scatter along
// the sequence); full is clobbered.
void sequence_reduce_scatter(float* full, float* local, int64_t b, int64_t s, int64_t C, dist::ProcessGroup* group);

}  // namespace laoyao::model::tp
