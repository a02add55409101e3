// Batch-size ramp-up (--rampup-batch-size START INCREMENT SAMPLES): Megatron-Core's
// RampupBatchsizeNumMicroBatchesCalculator and Megatron-LM's update_train_iters. Over
// (global_batch_size - START) / INCREMENT steps, the global batch grows from START by INCREMENT
// every SAMPLES / steps consumed samples; past SAMPLES it is the global batch size. Pure functions
// of the consumed samples, so a resumed run picks up its batch size from its checkpoint's count.
#pragma once
#include <cstdint>
#include <string>

namespace laoyao::data {

struct BatchRampup {
  int64_t start = 0, increment = 0, samples = 0;  // the flag's three integers; start 0: no ramp-up
  int64_t global_batch_size = 0;                  // the batch after the ramp
  int64_t micro_times_dp = 1;                     // micro-batch size x data-parallel size
  bool decrease_if_needed = false;                // --decrease-batch-size-if-needed

  // The empty string, or what is wrong (Megatron's assertions, in words): start, increment and
  // samples > 0, START <= the global batch size, their difference a positive multiple of INCREMENT;
  // with decrease_if_needed, START at least one micro-batch on every data-parallel rank.
  std::string problem() const;
  bool ramps() const { return start > 0; }
  // The global batch size after `consumed` samples (Megatron's current_global_batch_size; without
  // ramp-up, the global batch size).
  int64_t current(int64_t consumed) const;
  // The batch an iteration trains on: current(), rounded down to whole micro-batches over the
  // data-parallel ranks with decrease_if_needed (Megatron's current_running_global_batch_size).
  int64_t running(int64_t consumed) const;
};

// Iterations to train on train_samples (update_train_iters with ramp-up): iterations through the
// ramp until more than `samples` are consumed, then the whole global batches left.
int64_t rampup_train_iters(const BatchRampup& r, int64_t train_samples);

// The first batch size on the ramp that is not whole micro-batches over the data-parallel ranks
// (Megatron asserts at that iteration unless decrease_if_needed), or 0 when there is none.
int64_t rampup_indivisible_batch(const BatchRampup& r);

}  // namespace laoyao::data
