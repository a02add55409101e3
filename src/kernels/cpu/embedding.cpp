// Embedding lookup (word or position table) and its gradient scatter-add.
#include <algorithm>
#include <cstring>
#include <string>

#include "core/error.hpp"
#include "kernels/cpu/ops.hpp"

namespace laoyao::kernels::cpu {

void embedding_forward(const int64_t* ids, const float* table, float* y, int64_t T, int64_t C, int64_t rows,
                       bool accumulate) {
  // Every id is checked before anything is written: a bad batch leaves y untouched.
  for (int64_t t = 0; t < T; ++t)
    if (ids[t] < 0 || ids[t] >= rows)
      throw Error("embedding: id " + std::to_string(ids[t]) + " at token " + std::to_string(t) +
                  " is outside the table's rows [0, " + std::to_string(rows) + ")");
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* row = table + ids[t] * C;
    float* out = y + t * C;
    if (accumulate) {
      for (int64_t c = 0; c < C; ++c) out[c] += row[c];
    } else {
      std::memcpy(out, row, sizeof(float) * C);
    }
  }
}

// dtable[ids[t]] += dy[t] (ids already checked by the forward). Repeated ids add into one row, so
// threads split the columns, not the tokens: no races, and tokens are added in order (deterministic).
void embedding_backward(const int64_t* ids, const float* dy, float* dtable, int64_t T, int64_t C) {
  constexpr int64_t kBlock = 64;
  const int64_t blocks = (C + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t c0 = blk * kBlock, c1 = std::min(C, c0 + kBlock);
    for (int64_t t = 0; t < T; ++t) {
      float* row = dtable + ids[t] * C;
      const float* g = dy + t * C;
      for (int64_t c = c0; c < c1; ++c) row[c] += g[c];
    }
  }
}

}  // namespace laoyao::kernels::cpu
