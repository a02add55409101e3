#include "data/batch_rampup.hpp"

#include <algorithm>

namespace laoyao::data {

std::string BatchRampup::problem() const {
  if (start <= 0) return "the start batch size must be positive, got " + std::to_string(start);
  if (increment <= 0) return "the batch size increment must be positive, got " + std::to_string(increment);
  // Megatron asserts samples >= 0, then divides by samples / increments: 0 fails there.
  if (samples <= 0) return "the ramp-up samples must be positive, got " + std::to_string(samples);
  const int64_t diff = global_batch_size - start;
  if (diff < 0)
    return "the start batch size (" + std::to_string(start) + ") must not exceed the global batch size (" +
           std::to_string(global_batch_size) + ")";
  if (diff % increment != 0)
    return "the global batch size minus the start batch size (" + std::to_string(diff) +
           ") must be a multiple of the increment (" + std::to_string(increment) + ")";
  if (diff == 0)  // Megatron divides the ramp's samples by zero increments
    return "the start batch size equals the global batch size (" + std::to_string(start) + "): nothing to ramp";
  if (decrease_if_needed && start < micro_times_dp)
    return "the start batch size (" + std::to_string(start) + ") is less than one micro-batch on every data-parallel rank (" +
           std::to_string(micro_times_dp) + ")";
  return "";
}

int64_t BatchRampup::current(int64_t consumed) const {
  if (!ramps() || consumed > samples) return global_batch_size;
  // int(consumed / (samples / increments)), in double as Python computes it.
  const double per_increment = static_cast<double>(samples) / static_cast<double>((global_batch_size - start) / increment);
  const auto steps = static_cast<int64_t>(static_cast<double>(consumed) / per_increment);
  return std::min(start + steps * increment, global_batch_size);
}

int64_t BatchRampup::running(int64_t consumed) const {
  const int64_t b = current(consumed);
  return decrease_if_needed ? b / micro_times_dp * micro_times_dp : b;
}

int64_t rampup_train_iters(const BatchRampup& r, int64_t train_samples) {
  int64_t iterations = 0, consumed = 0;
  while (consumed <= r.samples) {  // the ramp, counted with the current (not running) batch size
    consumed += r.current(consumed);
    ++iterations;
  }
  // Python's floor division: a train_samples inside the ramp takes iterations off again.
  const int64_t left = train_samples - consumed;
  return iterations + (left >= 0 ? left / r.global_batch_size : -((-left + r.global_batch_size - 1) / r.global_batch_size));
}

int64_t rampup_indivisible_batch(const BatchRampup& r) {
  if (r.decrease_if_needed) return 0;
  for (int64_t consumed = 0;; consumed += r.running(consumed)) {
    const int64_t b = r.current(consumed);
    if (b % r.micro_times_dp != 0) return b;
    if (consumed > r.samples) return 0;
  }
}

}  // namespace laoyao::data
