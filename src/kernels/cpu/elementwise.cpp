// Elementwise helpers: residual adds, bias adds and bias gradients.
#include "kernels/cpu/ops.hpp"

namespace laoyao::kernels::cpu {

void add_inplace(float* y, const float* x, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void add_bias_inplace(float* y, const float* bias, int64_t T, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c) y[t * C + c] += bias[c];
}

// Column sums over tokens. Each thread owns whole columns (no races, deterministic for any thread
// count); the sum over tokens runs in double, then is rounded once and added to dbias.
void bias_grad_accumulate(const float* dy, float* dbias, int64_t T, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < C; ++c) {
    double acc = 0.0;
    for (int64_t t = 0; t < T; ++t) acc += dy[t * C + c];
    dbias[c] += static_cast<float>(acc);
  }
}

}  // namespace laoyao::kernels::cpu
