// QK layernorm with RMSNorm (Megatron --qk-layernorm, Qwen3): SelfAttention's q_layernorm and
// k_layernorm are built with hidden_size = kv_channels and eps = layernorm_epsilon, and applied
// in get_query_key_value_tensors to query [s, b, heads, D] and key [s, b, groups, D] right after the
// QKV split (before RoPE): every head is normalised over its own D values, all heads sharing one
// weight vector. Statistics as rmsnorm_forward (norms.cpp): the sum of squares in double, rstd
// rounded to fp32 once, y = x * rstd * gamma in fp32.
#include <cmath>
#include <cstring>
#include <string>

#include "core/error.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/qkv_layout.hpp"

namespace laoyao::kernels::cpu {
namespace {

// Index of a q/k slot's statistic in rstd[t, H + G]: q heads first, then each group's k.
int64_t stat(const QkvLayout& L, int64_t g, int64_t j) { return j < L.Q ? g * L.Q + j : L.H + g; }

inline float effective(const float* gamma, int64_t d, bool zero_centered) {
  return zero_centered ? 1.0f + gamma[d] : gamma[d];
}

}  // namespace

void qk_rmsnorm_forward(const float* qkv, const float* q_gamma, const float* k_gamma, float* out, float* rstd,
                        int64_t T, int64_t H, int64_t G, int64_t D, float eps, bool zero_centered_gamma) {
  const QkvLayout L("qk_rmsnorm_forward", H, G, D);
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* xr = qkv + t * L.row;
    float* yr = out + t * L.row;
    for (int64_t g = 0; g < G; ++g) {
      for (int64_t j = 0; j <= L.Q; ++j) {
        const float* x = xr + L.col(g, j);
        float* y = yr + L.col(g, j);
        const float* gamma = j < L.Q ? q_gamma : k_gamma;
        double sq = 0.0;
        for (int64_t d = 0; d < D; ++d) sq += static_cast<double>(x[d]) * x[d];
        const float rf = static_cast<float>(1.0 / std::sqrt(sq / static_cast<double>(D) + static_cast<double>(eps)));
        rstd[t * (H + G) + stat(L, g, j)] = rf;
        for (int64_t d = 0; d < D; ++d) y[d] = x[d] * rf * effective(gamma, d, zero_centered_gamma);
      }
      if (out != qkv)  // v passes through
        std::memcpy(yr + L.col(g, L.Q + 1), xr + L.col(g, L.Q + 1), sizeof(float) * D);
    }
  }
}

void qk_rmsnorm_backward(const float* dout, const float* qkv, const float* q_gamma, const float* k_gamma,
                         const float* rstd, float* dqkv, float* dq_gamma, float* dk_gamma, int64_t T, int64_t H,
                         int64_t G, int64_t D, bool zero_centered_gamma) {
  const QkvLayout L("qk_rmsnorm_backward", H, G, D);
  // Weight gradients first, while dout is intact (dqkv may be dout): dgamma[d] += sum over tokens
  // and the heads sharing the weight of dy * xhat. Threads own whole columns d: no races, and the
  // sums do not depend on the thread count.
#pragma omp parallel for schedule(static)
  for (int64_t d = 0; d < D; ++d) {
    double dq = 0.0, dk = 0.0;
    for (int64_t t = 0; t < T; ++t) {
      const float* x = qkv + t * L.row;
      const float* dy = dout + t * L.row;
      const float* r = rstd + t * (H + G);
      for (int64_t g = 0; g < G; ++g)
        for (int64_t j = 0; j <= L.Q; ++j) {
          const int64_t c = L.col(g, j) + d;
          const double v = static_cast<double>(dy[c]) * (x[c] * r[stat(L, g, j)]);
          (j < L.Q ? dq : dk) += v;
        }
    }
    if (dq_gamma) dq_gamma[d] += static_cast<float>(dq);
    if (dk_gamma) dk_gamma[d] += static_cast<float>(dk);
  }
  // dx = rstd * (g*dy - xhat * mean(g*dy*xhat)) per head; each value is read before it is written,
  // so dqkv may alias dout.
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* xr = qkv + t * L.row;
    const float* dyr = dout + t * L.row;
    float* dxr = dqkv + t * L.row;
    for (int64_t g = 0; g < G; ++g) {
      for (int64_t j = 0; j <= L.Q; ++j) {
        const float* x = xr + L.col(g, j);
        const float* dy = dyr + L.col(g, j);
        float* dx = dxr + L.col(g, j);
        const float* gamma = j < L.Q ? q_gamma : k_gamma;
        const float r = rstd[t * (H + G) + stat(L, g, j)];
        double s2 = 0.0;
        for (int64_t d = 0; d < D; ++d)
          s2 += static_cast<double>(dy[d] * effective(gamma, d, zero_centered_gamma)) * (x[d] * r);
        const float b = static_cast<float>(s2 / static_cast<double>(D));
        for (int64_t d = 0; d < D; ++d) {
          const float xhat = x[d] * r;
          dx[d] = r * (dy[d] * effective(gamma, d, zero_centered_gamma) - xhat * b);
        }
      }
      if (dqkv != dout)  // v's gradient passes through
        std::memcpy(dxr + L.col(g, L.Q + 1), dyr + L.col(g, L.Q + 1), sizeof(float) * D);
    }
  }
}

}  // namespace laoyao::kernels::cpu
