// AdamW on fp32 main parameters (Megatron's Adam with decoupled weight decay, megatron-lm.md §4.1),
// global-norm gradient clipping (§4.4). Works on flat buffers; a per-element group table says
// which ranges get weight decay.
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

namespace laoyao::optim {

struct AdamWSettings {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
};

// A contiguous range of parameters with one weight-decay multiplier (0 for biases and 1-D params);
// embedding_or_output: the word embeddings or the output layer (Megatron-Core's
// is_embedding_or_output_parameter), which take --decoupled-lr's rate when it is set.
struct ParamRange {
  int64_t offset = 0, numel = 0;
  double wd_mult = 1.0;
  bool embedding_or_output = false;
};

class AdamW {
 public:
  // hold_moments false: the moments are not allocated (an engine holds them elsewhere, on a GPU);
  // allocate_moments() gives zeros when a checkpoint passes through the host.
  AdamW(int64_t num_params, std::vector<ParamRange> ranges, AdamWSettings s, bool hold_moments = true);
  // One step with learning rate `lr` and weight decay `wd` (times each range's multiplier):
  //   p *= 1 - lr*wd;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
  //   p -= (lr / (1-b1^t)) * m / (sqrt(v)/sqrt(1-b2^t) + eps)        (t counts steps from 1)
  // With decoupled_lr the embedding_or_output ranges take it in place of lr.
  void step(float* params, const float* grads, double lr, double wd, std::optional<double> decoupled_lr = {});
  int64_t steps() const { return step_; }
  const std::vector<ParamRange>& ranges() const { return ranges_; }
  std::vector<float>& exp_avg() { return m_; }
  std::vector<float>& exp_avg_sq() { return v_; }
  const std::vector<float>& exp_avg() const { return m_; }
  const std::vector<float>& exp_avg_sq() const { return v_; }
  void set_steps(int64_t t) { step_ = t; }
  int64_t num_params() const { return n_; }
  bool holds_moments() const { return static_cast<int64_t>(m_.size()) == n_; }
  void allocate_moments();  // zeros
  void free_moments();

 private:
  std::vector<ParamRange> ranges_;
  AdamWSettings s_;
  int64_t n_ = 0;
  std::vector<float> m_, v_;
  int64_t step_ = 0;
};

// L2 norm of the gradients (accumulated in double).
double grad_norm(const float* grads, int64_t n);
// Megatron's clip: coeff = max_norm / (norm + 1e-6), applied only when < 1. Returns the coefficient used.
double clip_grads(float* grads, int64_t n, double norm, double max_norm);

}  // namespace laoyao::optim
