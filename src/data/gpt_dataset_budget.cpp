#include "data/gpt_dataset_budget.hpp"

#include <string>

#include "core/error.hpp"

namespace laoyao::data {

namespace {
void require_non_negative(int64_t value, const char* name) {
  if (value < 0) {
    throw UsageError(std::string(name) + " must be >= 0, got " + std::to_string(value));
  }
}
}  // namespace

SampleBudget train_valid_test_num_samples(const SampleBudgetParams& p) {
  require_non_negative(p.train_iters, "train_iters");
  require_non_negative(p.train_samples, "train_samples");
  require_non_negative(p.eval_iters, "eval_iters");
  require_non_negative(p.eval_interval, "eval_interval");
  require_non_negative(p.eval_global_batch_size, "eval_global_batch_size");
  if (p.global_batch_size < 1) {
    throw UsageError("global_batch_size must be >= 1, got " + std::to_string(p.global_batch_size));
  }
  const int64_t eval_gbs = p.eval_global_batch_size > 0 ? p.eval_global_batch_size
                                                        : p.global_batch_size;
  SampleBudget budget;
  budget.train = p.train_samples > 0 ? p.train_samples : p.train_iters * p.global_batch_size;
  const int64_t valid_iters =
      p.eval_interval > 0 ? (p.train_iters / p.eval_interval + 1) * p.eval_iters : 0;
  budget.valid = valid_iters * eval_gbs;
  budget.test = p.eval_iters * eval_gbs;
  return budget;
}

int64_t microbatch_first_sample(const MicroBatchLayout& layout, int64_t consumed_samples,
                                int64_t microbatch, int64_t dp_rank) {
  if (layout.micro_batch_size < 1 || layout.data_parallel_size < 1 ||
      layout.num_microbatches < 1) {
    throw UsageError("micro batch size, data-parallel size and number of micro-batches must be "
                     ">= 1");
  }
  if (microbatch < 0 || microbatch >= layout.num_microbatches) {
    throw Error("micro-batch " + std::to_string(microbatch) + " outside [0, " +
                std::to_string(layout.num_microbatches) + ")");
  }
  if (dp_rank < 0 || dp_rank >= layout.data_parallel_size) {
    throw Error("data-parallel rank " + std::to_string(dp_rank) + " outside [0, " +
                std::to_string(layout.data_parallel_size) + ")");
  }
  if (consumed_samples < 0) throw Error("negative consumed samples");
  const int64_t per_step = layout.micro_batch_size * layout.data_parallel_size;
  return consumed_samples + microbatch * per_step + dp_rank * layout.micro_batch_size;
}

std::vector<int64_t> microbatch_sample_indices(const MicroBatchLayout& layout, int64_t iteration,
                                               int64_t microbatch, int64_t dp_rank) {
  if (iteration < 1) throw Error("iterations count from 1, got " + std::to_string(iteration));
  const int64_t global_batch =
      layout.num_microbatches * layout.micro_batch_size * layout.data_parallel_size;
  const int64_t first =
      microbatch_first_sample(layout, (iteration - 1) * global_batch, microbatch, dp_rank);
  std::vector<int64_t> indices(static_cast<size_t>(layout.micro_batch_size));
  for (int64_t i = 0; i < layout.micro_batch_size; ++i) indices[i] = first + i;
  return indices;
}

}  // namespace laoyao::data
