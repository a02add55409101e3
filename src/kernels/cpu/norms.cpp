// LayerNorm (torch.nn.LayerNorm / apex FusedLayerNorm) and RMSNorm (torch.nn.RMSNorm) over the last
// dimension. Megatron computes the statistics in fp32; this reference accumulates each row's sums
// in double (cheap: one pass of C adds) and rounds mean/rstd to fp32 once, so its error stays at
// the fp32 rounding of the outputs. Variance is the biased one (divide by C), as torch's.
// --apply-layernorm-1p (zero_centered_gamma): the stored gamma is used as (1 + gamma); its gradient
// is the same as that of gamma.
#include <cmath>

#include "kernels/cpu/ops.hpp"

namespace laoyao::kernels::cpu {
namespace {

inline float effective_gamma(const float* gamma, int64_t c, bool zero_centered) {
  return zero_centered ? 1.0f + gamma[c] : gamma[c];
}

// dgamma[c] += sum_t dy[t,c] * xhat[t,c] (and dbeta[c] += sum_t dy[t,c]); xhat recomputed from the
// saved fp32 statistics (mean = nullptr for RMSNorm). Threads own whole columns: no races, and
// the result does not depend on the thread count.
void norm_param_grads(const float* dy, const float* x, const float* mean, const float* rstd, float* dgamma,
                      float* dbeta, int64_t T, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < C; ++c) {
    double dg = 0.0, db = 0.0;
    for (int64_t t = 0; t < T; ++t) {
      const float xhat = (x[t * C + c] - (mean ? mean[t] : 0.0f)) * rstd[t];
      dg += static_cast<double>(dy[t * C + c]) * xhat;
      db += dy[t * C + c];
    }
    if (dgamma) dgamma[c] += static_cast<float>(dg);
    if (dbeta) dbeta[c] += static_cast<float>(db);
  }
}

}  // namespace

void layernorm_forward(const float* x, const float* gamma, const float* beta, float* y, float* mean, float* rstd,
                       int64_t T, int64_t C, float eps, bool zero_centered_gamma) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* xr = x + t * C;
    double sum = 0.0;
    for (int64_t c = 0; c < C; ++c) sum += xr[c];
    const double m = sum / static_cast<double>(C);
    double sq = 0.0;  // two-pass variance: no cancellation for rows with a large mean
    for (int64_t c = 0; c < C; ++c) sq += (xr[c] - m) * (xr[c] - m);
    const float mf = static_cast<float>(m);
    const float rf = static_cast<float>(1.0 / std::sqrt(sq / static_cast<double>(C) + static_cast<double>(eps)));
    mean[t] = mf;
    rstd[t] = rf;
    float* yr = y + t * C;
    for (int64_t c = 0; c < C; ++c)
      yr[c] = (xr[c] - mf) * rf * effective_gamma(gamma, c, zero_centered_gamma) + beta[c];
  }
}

void layernorm_backward(const float* dy, const float* x, const float* gamma, const float* mean, const float* rstd,
                        float* dx, float* dgamma, float* dbeta, int64_t T, int64_t C, bool zero_centered_gamma) {
  // dx = rstd * (g*dy - mean(g*dy) - xhat * mean(g*dy*xhat)), per row.
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* xr = x + t * C;
    const float* dyr = dy + t * C;
    double s1 = 0.0, s2 = 0.0;
    for (int64_t c = 0; c < C; ++c) {
      const float xhat = (xr[c] - mean[t]) * rstd[t];
      const float dxhat = dyr[c] * effective_gamma(gamma, c, zero_centered_gamma);
      s1 += dxhat;
      s2 += static_cast<double>(dxhat) * xhat;
    }
    const float a = static_cast<float>(s1 / static_cast<double>(C));
    const float b = static_cast<float>(s2 / static_cast<double>(C));
    float* dxr = dx + t * C;
    for (int64_t c = 0; c < C; ++c) {
      const float xhat = (xr[c] - mean[t]) * rstd[t];
      const float dxhat = dyr[c] * effective_gamma(gamma, c, zero_centered_gamma);
      dxr[c] = rstd[t] * (dxhat - a - xhat * b);
    }
  }
  norm_param_grads(dy, x, mean, rstd, dgamma, dbeta, T, C);
}

void rmsnorm_forward(const float* x, const float* gamma, float* y, float* rstd, int64_t T, int64_t C, float eps,
                     bool zero_centered_gamma) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* xr = x + t * C;
    double sq = 0.0;
    for (int64_t c = 0; c < C; ++c) sq += static_cast<double>(xr[c]) * xr[c];
    const float rf = static_cast<float>(1.0 / std::sqrt(sq / static_cast<double>(C) + static_cast<double>(eps)));
    rstd[t] = rf;
    float* yr = y + t * C;
    for (int64_t c = 0; c < C; ++c) yr[c] = xr[c] * rf * effective_gamma(gamma, c, zero_centered_gamma);
  }
}

void rmsnorm_backward(const float* dy, const float* x, const float* gamma, const float* rstd, float* dx,
                      float* dgamma, int64_t T, int64_t C, bool zero_centered_gamma) {
  // dx = rstd * (g*dy - xhat * mean(g*dy*xhat)), per row.
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* xr = x + t * C;
    const float* dyr = dy + t * C;
    double s2 = 0.0;
    for (int64_t c = 0; c < C; ++c)
      s2 += static_cast<double>(dyr[c] * effective_gamma(gamma, c, zero_centered_gamma)) * (xr[c] * rstd[t]);
    const float b = static_cast<float>(s2 / static_cast<double>(C));
    float* dxr = dx + t * C;
    for (int64_t c = 0; c < C; ++c) {
      const float xhat = xr[c] * rstd[t];
      dxr[c] = rstd[t] * (dyr[c] * effective_gamma(gamma, c, zero_centered_gamma) - xhat * b);
    }
  }
  norm_param_grads(dy, x, nullptr, rstd, dgamma, nullptr, T, C);
}

}  // namespace laoyao::kernels::cpu
