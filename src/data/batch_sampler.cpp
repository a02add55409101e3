#include "data/batch_sampler.hpp"

#include <algorithm>
#include <random>
#include <string>
#include <utility>

#include "core/error.hpp"

namespace laoyao::data {

std::vector<int64_t> torch_randperm(int64_t n, uint64_t seed) {
  std::vector<int64_t> r(static_cast<size_t>(n > 0 ? n : 0));
  for (int64_t i = 0; i < n; ++i) r[static_cast<size_t>(i)] = i;
  std::mt19937 engine(static_cast<uint32_t>(seed));  // PyTorch's mt19937: init_with_uint32(seed)
  for (int64_t i = 0; i + 1 < n; ++i) {
    const int64_t z = static_cast<int64_t>(engine() % static_cast<uint64_t>(n - i));
    std::swap(r[static_cast<size_t>(i)], r[static_cast<size_t>(z + i)]);
  }
  return r;
}

std::vector<int64_t> BatchSampler::micro_batch(int64_t consumed, int64_t microbatch, int64_t dp_rank) const {
  const int64_t gbs = global_batch_size, dp = data_parallel_size, mbs = micro_batch_size;
  // An epoch's samples: whole global batches of the rows (drop_last), or the rows padded up to them.
  const int64_t per_epoch = drop_last ? rows / gbs * gbs : (rows + gbs - 1) / gbs * gbs;
  if (per_epoch <= 0)
    throw UsageError("the fine-tuning dataset has " + std::to_string(rows) + " rows, fewer than one global batch (" +
                     std::to_string(gbs) + "): Megatron-Bridge's batch sampler drops the incomplete batch");
  if (consumed % gbs != 0 || microbatch < 0 || microbatch * mbs * dp >= gbs || dp_rank < 0 || dp_rank >= dp)
    throw Error("BatchSampler: micro-batch " + std::to_string(microbatch) + " of rank " + std::to_string(dp_rank) +
                " after " + std::to_string(consumed) + " samples");
  const int64_t epoch = consumed / per_epoch, start = consumed % per_epoch;
  // The batch's rows left in the epoch: gbs, or fewer in the padded last batch (dealt interleaved
  // over those, each rank's share then filled with kPadRow).
  const int64_t in_batch = std::min(gbs, rows - start);
  std::lock_guard<std::mutex> lock(last_->mutex);
  if (last_->epoch != epoch) {
    last_->order = torch_randperm(rows, seed + static_cast<uint64_t>(epoch));
    last_->epoch = epoch;
  }
  std::vector<int64_t> out;
  for (int64_t k = 0; k < mbs; ++k) {  // this rank's positions r, r + dp, ... of the global batch, mbs at a time
    const int64_t position = dp_rank + dp * (microbatch * mbs + k);
    out.push_back(position < in_batch ? last_->order[static_cast<size_t>(start + position)] : kPadRow);
  }
  return out;
}

}  // namespace laoyao::data
