// How many samples a run asks of each split, and which dataset indices each micro-batch of
// each data-parallel rank reads: Megatron's training.py::get_train_valid_test_num_samples
// (Bridge's version for an unset eval_interval) and MegatronPretrainingSampler's order.
#pragma once
#include <cstdint>
#include <vector>

namespace laoyao::data {

struct SampleBudgetParams {
  int64_t train_iters = 0;
  // --train-samples: when > 0 it is the train budget instead of train_iters * global_batch_size
  // (train_iters must then be train_samples // global_batch_size, as Megatron derives it).
  int64_t train_samples = 0;
  int64_t global_batch_size = 0;
  int64_t eval_iters = 0;
  int64_t eval_interval = 0;           // 0: unset (no validation during training)
  int64_t eval_global_batch_size = 0;  // 0: global_batch_size
};

struct SampleBudget {
  int64_t train = 0;
  int64_t valid = 0;
  int64_t test = 0;
  bool operator==(const SampleBudget&) const = default;
};

// train = train_samples or train_iters * gbs;
// valid = (train_iters // eval_interval + 1) * eval_iters * eval_gbs, or 0 without eval_interval;
// test  = eval_iters * eval_gbs.
// Throws laoyao::UsageError for negative values or a global batch size < 1.
SampleBudget train_valid_test_num_samples(const SampleBudgetParams& params);

struct MicroBatchLayout {
  int64_t micro_batch_size = 1;
  int64_t data_parallel_size = 1;
  int64_t num_microbatches = 1;  // global_batch_size / (micro_batch_size * data_parallel_size)
};

// MegatronPretrainingSampler: indices are consumed in order, micro_batch_size *
// data_parallel_size at a time, and data-parallel rank r takes [r*mbs, (r+1)*mbs) of them.
// The first dataset index that rank `dp_rank` reads in micro-batch `microbatch` (0-based) once
// `consumed_samples` samples have been used (validation continues from its own count).
int64_t microbatch_first_sample(const MicroBatchLayout& layout, int64_t consumed_samples,
                                int64_t microbatch, int64_t dp_rank);

// Training iteration `iteration` (1-based, no batch-size ramp-up): the mbs dataset indices
// ((k-1)*M + m)*mbs*dp + r*mbs + [0, mbs).
std::vector<int64_t> microbatch_sample_indices(const MicroBatchLayout& layout, int64_t iteration,
                                               int64_t microbatch, int64_t dp_rank);

}  // namespace laoyao::data
