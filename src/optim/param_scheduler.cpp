#include "optim/param_scheduler.hpp"

#include <algorithm>
#include <cmath>

#include "core/error.hpp"

namespace laoyao::optim {

double lr_at(const ParamSchedule& s, int64_t n) {
  const double pi = std::acos(-1.0);
  const double nd = static_cast<double>(n);
  if (s.warmup_steps > 0 && nd <= s.warmup_steps) return s.init_lr + (s.max_lr - s.init_lr) * nd / s.warmup_steps;
  if (s.decay_style == "constant") return s.max_lr;
  if (n > s.decay_steps) return s.min_lr;
  if (s.decay_style == "inverse-square-root") {
    double warm = std::max(s.warmup_steps, 1.0);
    double num = static_cast<double>(std::max<int64_t>(n, 1));
    return std::max(s.min_lr, s.max_lr * std::sqrt(warm) / std::sqrt(num));
  }
  double done = nd - s.warmup_steps;
  double span = static_cast<double>(s.decay_steps) - s.warmup_steps;
  double ratio = done / span;
  double coeff;
  if (s.decay_style == "linear") {
    coeff = 1.0 - ratio;
  } else if (s.decay_style == "cosine") {
    coeff = 0.5 * (std::cos(pi * ratio) + 1.0);
  } else if (s.decay_style == "WSD") {
    int64_t anneal_start = s.decay_steps - s.wsd_decay_steps;
    if (n <= anneal_start) {
      coeff = 1.0;
    } else {
      double q = static_cast<double>(n - anneal_start) / static_cast<double>(s.wsd_decay_steps);
      if (s.wsd_decay_style == "linear") coeff = 1.0 - q;
      else if (s.wsd_decay_style == "cosine") coeff = 0.5 * (std::cos(pi * q) + 1.0);
      else if (s.wsd_decay_style == "exponential") coeff = 2.0 * std::pow(0.5, q) - 1.0;
      else if (s.wsd_decay_style == "minus_sqrt") coeff = 1.0 - std::sqrt(q);
      else throw Error("unknown WSD decay style " + s.wsd_decay_style);
    }
  } else {
    throw Error("unknown learning-rate decay style " + s.decay_style);
  }
  return s.min_lr + coeff * (s.max_lr - s.min_lr);
}

double wd_at(const ParamSchedule& s, int64_t n) {
  if (n > s.wd_incr_steps) return s.end_wd;
  if (s.wd_incr_style == "constant") return s.end_wd;
  double ratio = static_cast<double>(n) / static_cast<double>(s.wd_incr_steps);
  double coeff;
  if (s.wd_incr_style == "linear") coeff = ratio;
  else if (s.wd_incr_style == "cosine") coeff = 0.5 * (std::cos(std::acos(-1.0) * (1.0 - ratio)) + 1.0);
  else throw Error("unknown weight-decay increment style " + s.wd_incr_style);
  return s.start_wd + coeff * (s.end_wd - s.start_wd);
}

}  // namespace laoyao::optim
