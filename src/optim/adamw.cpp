#include "optim/adamw.hpp"

#include <cmath>

#include "core/error.hpp"

namespace laoyao::optim {

AdamW::AdamW(int64_t num_params, std::vector<ParamRange> ranges, AdamWSettings s, bool hold_moments)
    : ranges_(std::move(ranges)), s_(s), n_(num_params) {
  if (hold_moments) allocate_moments();
  int64_t covered = 0;
  for (const auto& r : ranges_) {
    if (r.offset != covered || r.numel <= 0) throw Error("AdamW: parameter ranges must tile the buffer in order");
    covered += r.numel;
  }
  if (covered != num_params) throw Error("AdamW: parameter ranges do not cover the buffer");
}

void AdamW::allocate_moments() {
  m_.assign(static_cast<size_t>(n_), 0.0f);
  v_.assign(static_cast<size_t>(n_), 0.0f);
}

void AdamW::free_moments() {
  std::vector<float>().swap(m_);
  std::vector<float>().swap(v_);
}

void AdamW::step(float* params, const float* grads, double lr, double wd, std::optional<double> decoupled_lr) {
  if (!holds_moments()) throw Error("AdamW::step: the moments are not held on the host");
  ++step_;
  const double bc1 = 1.0 - std::pow(s_.beta1, static_cast<double>(step_));
  const double bc2 = 1.0 - std::pow(s_.beta2, static_cast<double>(step_));
  const double bc2_sqrt = std::sqrt(bc2);
  const float b1 = static_cast<float>(s_.beta1), b2 = static_cast<float>(s_.beta2);
  for (const auto& r : ranges_) {
    const double range_lr = r.embedding_or_output && decoupled_lr ? *decoupled_lr : lr;
    const double step_size = range_lr / bc1;
    const float decay = static_cast<float>(1.0 - range_lr * wd * r.wd_mult);
    float* p = params + r.offset;
    const float* g = grads + r.offset;
    float* m = m_.data() + r.offset;
    float* v = v_.data() + r.offset;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < r.numel; ++i) {
      p[i] *= decay;
      m[i] = b1 * m[i] + (1.0f - b1) * g[i];
      v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
      const double denom = std::sqrt(static_cast<double>(v[i])) / bc2_sqrt + s_.eps;
      p[i] = static_cast<float>(p[i] - step_size * m[i] / denom);
    }
  }
}

double grad_norm(const float* grads, int64_t n) {
  double sum = 0;
#pragma omp parallel for reduction(+ : sum) schedule(static)
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(grads[i]) * grads[i];
  return std::sqrt(sum);
}

double clip_grads(float* grads, int64_t n, double norm, double max_norm) {
  if (max_norm <= 0) return 1.0;
  double coeff = max_norm / (norm + 1e-6);
  if (coeff >= 1.0) return 1.0;
  const float c = static_cast<float>(coeff);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) grads[i] *= c;
  return coeff;
}

}  // namespace laoyao::optim
