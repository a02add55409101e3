// Megatron-Core's tensor-parallel layers on CPU ranks (see tensor_parallel.hpp).
#include "model/tensor_parallel.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.hpp"
#include "kernels/cpu/ops.hpp"

namespace laoyao::model::tp {
namespace {

void sum_over(dist::ProcessGroup* group, float* data, size_t n) {
  if (group && group->size() > 1) group->all_reduce_sum(data, n);
}

}  // namespace

Shard shard_of(int64_t n, int64_t rank, int64_t ranks) {
  if (ranks <= 0 || rank < 0 || rank >= ranks || n % ranks != 0)
    throw Error("tensor-parallel shard: a dimension of " + std::to_string(n) + " does not split over " +
                std::to_string(ranks) + " ranks (rank " + std::to_string(rank) + ")");
  return {rank * (n / ranks), n / ranks};
}

std::vector<float> shard_rows(const float* m, int64_t rows, int64_t cols, Shard s) {
  if (s.start < 0 || s.start + s.size > rows) throw Error("shard_rows: rows outside the matrix");
  return std::vector<float>(m + s.start * cols, m + (s.start + s.size) * cols);
}

std::vector<float> shard_cols(const float* m, int64_t rows, int64_t cols, Shard s) {
  if (s.start < 0 || s.start + s.size > cols) throw Error("shard_cols: columns outside the matrix");
  std::vector<float> out(static_cast<size_t>(rows * s.size));
  for (int64_t r = 0; r < rows; ++r)
    std::copy(m + r * cols + s.start, m + r * cols + s.start + s.size, out.begin() + r * s.size);
  return out;
}

void column_parallel_forward(const float* x, const float* w_local, const float* b_local, float* y_local, int64_t T,
                             int64_t K, int64_t n_local) {
  kernels::cpu::linear_forward(x, w_local, b_local, y_local, T, K, n_local);
}

void column_parallel_backward(const float* x, const float* w_local, const float* dy_local, float* dx, float* dw_local,
                              float* db_local, int64_t T, int64_t K, int64_t n_local, dist::ProcessGroup* group) {
  kernels::cpu::linear_backward(x, w_local, dy_local, dx, dw_local, db_local, T, K, n_local);
  if (dx) sum_over(group, dx, static_cast<size_t>(T * K));  // every rank's share of d(input)
}

void row_parallel_forward(const float* x_local, const float* w_local, const float* b, float* y, int64_t T,
                          int64_t k_local, int64_t N, dist::ProcessGroup* group) {
  kernels::cpu::linear_forward(x_local, w_local, nullptr, y, T, k_local, N);
  sum_over(group, y, static_cast<size_t>(T * N));
  if (b)  // after the sum: the bias once, not once per rank
    for (int64_t t = 0; t < T; ++t)
      for (int64_t n = 0; n < N; ++n) y[t * N + n] += b[n];
}

void row_parallel_backward(const float* x_local, const float* w_local, const float* dy, float* dx_local,
                           float* dw_local, float* db, int64_t T, int64_t k_local, int64_t N) {
  kernels::cpu::linear_backward(x_local, w_local, dy, dx_local, dw_local, db, T, k_local, N);
}

void vocab_parallel_embedding_forward(const int64_t* ids, const float* table_local, float* y, int64_t T, int64_t C,
                                      Shard vocab, dist::ProcessGroup* group) {
  for (int64_t t = 0; t < T; ++t) {
    const int64_t row = ids[t] - vocab.start;
    float* out = y + t * C;
    if (row >= 0 && row < vocab.size)
      std::copy(table_local + row * C, table_local + (row + 1) * C, out);
    else
      std::fill(out, out + C, 0.0f);
  }
  sum_over(group, y, static_cast<size_t>(T * C));
}

void vocab_parallel_embedding_backward(const int64_t* ids, const float* dy, float* dtable_local, int64_t T, int64_t C,
                                       Shard vocab) {
  for (int64_t t = 0; t < T; ++t) {
    const int64_t row = ids[t] - vocab.start;
    if (row < 0 || row >= vocab.size) continue;
    for (int64_t c = 0; c < C; ++c) dtable_local[row * C + c] += dy[t * C + c];
  }
}

void vocab_parallel_cross_entropy_forward(const float* logits_local, const int64_t* targets, float* loss, float* stats,
                                          int64_t T, Shard vocab, dist::ProcessGroup* group) {
  const int64_t V = vocab.size;
  float* zmax = stats;
  float* sumexp = stats + T;
  for (int64_t t = 0; t < T; ++t) zmax[t] = *std::max_element(logits_local + t * V, logits_local + (t + 1) * V);
  if (group && group->size() > 1) group->all_reduce_max(zmax, static_cast<size_t>(T));
  float* pred = loss;  // the target's shifted logit first, then the loss in its place
  for (int64_t t = 0; t < T; ++t) {
    const float* z = logits_local + t * V;
    double s = 0.0;
    for (int64_t j = 0; j < V; ++j) s += std::exp(double(z[j]) - zmax[t]);
    sumexp[t] = static_cast<float>(s);
    const int64_t j = targets[t] - vocab.start;
    pred[t] = j >= 0 && j < V ? z[j] - zmax[t] : 0.0f;  // the target's shard only
  }
  sum_over(group, pred, static_cast<size_t>(T));
  sum_over(group, sumexp, static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) loss[t] = std::log(sumexp[t]) - pred[t];
}

void vocab_parallel_cross_entropy_backward(float* logits_local, const int64_t* targets, const float* stats,
                                           const float* dloss, int64_t T, Shard vocab) {
  const int64_t V = vocab.size;
  for (int64_t t = 0; t < T; ++t) {
    float* z = logits_local + t * V;
    const float m = stats[t], inv = 1.0f / stats[T + t];
    for (int64_t j = 0; j < V; ++j) z[j] = std::exp(z[j] - m) * inv * dloss[t];
    const int64_t j = targets[t] - vocab.start;
    if (j >= 0 && j < V) z[j] -= dloss[t];
  }
}

void sequence_slice(const float* full, float* local, int64_t b, int64_t s, int64_t C, int64_t rank, int64_t ranks) {
  const int64_t n = s / ranks;
  for (int64_t bi = 0; bi < b; ++bi)
    std::copy(full + (bi * s + rank * n) * C, full + (bi * s + (rank + 1) * n) * C, local + bi * n * C);
}

// Gloo on CPU ranks has no all-gather or reduce-scatter here: both are an all-reduce of full-size
// buffers (each rank's rows, zeros elsewhere), the volume of the tensor-parallel all-reduce.
void sequence_gather(const float* local, float* full, int64_t b, int64_t s, int64_t C, dist::ProcessGroup* group) {
  const int64_t ranks = group ? group->size() : 1, rank = group ? group->rank() : 0, n = s / ranks;
  std::fill(full, full + b * s * C, 0.0f);
  for (int64_t bi = 0; bi < b; ++bi)
    std::copy(local + bi * n * C, local + (bi + 1) * n * C, full + (bi * s + rank * n) * C);
  sum_over(group, full, static_cast<size_t>(b * s * C));
}

void sequence_reduce_scatter(float* full, float* local, int64_t b, int64_t s, int64_t C, dist::ProcessGroup* group) {
  sum_over(group, full, static_cast<size_t>(b * s * C));
  sequence_slice(full, local, b, s, C, group ? group->rank() : 0, group ? group->size() : 1);
}

}  // namespace laoyao::model::tp
