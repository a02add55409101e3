// Cross entropy over all V (padded) logits, as Megatron's vocab_parallel_cross_entropy at TP = 1:
// z = logits - max; loss = log(sum exp z) - z[target]; grad = (exp(z)/sum - onehot) * dloss.
// Padded vocabulary columns are not masked (they enter the max and the sum like any other).
// The sum of exponentials accumulates in double (V is large; this keeps the reference's error at
// the rounding of exp), and lse = max + log(sum) is saved in fp32 for backward.
#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.hpp"
#include "kernels/cpu/ops.hpp"

namespace laoyao::kernels::cpu {
namespace {

void check_targets(const int64_t* targets, int64_t T, int64_t V) {
  for (int64_t t = 0; t < T; ++t)
    if (targets[t] < 0 || targets[t] >= V)
      throw Error("cross entropy: target " + std::to_string(targets[t]) + " at token " + std::to_string(t) +
                  " is outside the vocabulary [0, " + std::to_string(V) + ")");
}

}  // namespace

void cross_entropy_forward(const float* logits, const int64_t* targets, float* loss, float* lse, int64_t T,
                           int64_t V) {
  check_targets(targets, T, V);
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* z = logits + t * V;
    const float m = *std::max_element(z, z + V);
    double sum = 0.0;
    for (int64_t j = 0; j < V; ++j) sum += std::exp(z[j] - m);
    const double log_sum = std::log(sum);
    // loss = log(sumexp) - (z[target] - max), the max-subtracted form Megatron computes.
    loss[t] = static_cast<float>(log_sum - static_cast<double>(z[targets[t]] - m));
    lse[t] = static_cast<float>(static_cast<double>(m) + log_sum);
  }
}

void cross_entropy_backward(float* logits, const int64_t* targets, const float* lse, const float* dloss, int64_t T,
                            int64_t V) {
  check_targets(targets, T, V);
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    float* z = logits + t * V;
    const float g = dloss[t];
    for (int64_t j = 0; j < V; ++j) z[j] = std::exp(z[j] - lse[t]) * g;
    z[targets[t]] -= g;
  }
}

}  // namespace laoyao::kernels::cpu
