// Megatron-Core's OptimizerParamScheduler: learning rate and weight decay as functions of the
// number of samples consumed (megatron-lm.md §4.3, megatron-bridge.md §5). Steps are SAMPLES:
// warmup/decay lengths are iterations x global batch size, and the scheduler advances by the
// global batch size after each successful iteration (starting from step(0)).
#pragma once
#include <cstdint>
#include <string>

namespace laoyao::optim {

struct ParamSchedule {
  double max_lr = 0, min_lr = 0, init_lr = 0;  // init_lr: --lr-warmup-init
  double warmup_steps = 0;                     // samples (fractional with --lr-warmup-fraction)
  int64_t decay_steps = 0;                     // samples
  std::string decay_style = "linear";          // constant | linear | cosine | inverse-square-root | WSD
  std::string wsd_decay_style = "exponential"; // exponential | linear | cosine | minus_sqrt
  int64_t wsd_decay_steps = 0;                 // samples (WSD only)
  double start_wd = 0, end_wd = 0;
  int64_t wd_incr_steps = 0;                   // samples
  std::string wd_incr_style = "constant";      // constant | linear | cosine
};

// Learning rate after `n` samples (Megatron's get_lr). Iteration k (1-based) trains with
// lr_at(s, (k-1)*gbs); its log line prints lr_at(s, k*gbs).
double lr_at(const ParamSchedule& s, int64_t n);

// Weight decay after `n` samples (Megatron's get_wd); each parameter group multiplies it by its
// wd_mult (0 for biases and 1-D parameters).
double wd_at(const ParamSchedule& s, int64_t n);

}  // namespace laoyao::optim
