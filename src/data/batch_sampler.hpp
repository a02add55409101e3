// Megatron-Bridge's MegatronPretrainingBatchSampler (data/samplers.py; dataloader_type "batch", what
// its fine-tuning recipes use): every epoch a permutation of the dataset's rows, torch.randperm(rows)
// from torch.Generator().manual_seed(seed + epoch); each global batch dealt to the data-parallel
// ranks interleaved (rank r takes its positions r, r + dp, ...), then cut into its micro-batches.
// Training drops the rows past the last whole global batch (drop_last); validation and test keep
// them, Bridge's pad_samples_to_global_batch_size: the last, partial batch is dealt the same way
// and each rank's share filled to gbs / dp with kPadRow, so an epoch spans whole global batches.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace laoyao::data {

// torch.randperm(n, generator=torch.Generator().manual_seed(seed)) on the CPU: PyTorch's mt19937
// (seeded with the seed's low 32 bits) drawn once per position, i from 0: swap i with
// i + random() % (n - i) (randperm_cpu in ATen's TensorFactories.cpp).
std::vector<int64_t> torch_randperm(int64_t n, uint64_t seed);

// The index Bridge's sampler pads with (-1): its SFT datasets serve the last row, with no loss.
inline constexpr int64_t kPadRow = -1;

struct BatchSampler {
  int64_t rows = 0;  // the dataset's
  int64_t micro_batch_size = 1, data_parallel_size = 1, global_batch_size = 1;
  uint64_t seed = 0;  // Bridge's sampler seed: dataset.seed
  bool drop_last = true;  // training's; false: validation's and test's padding (above)
  // The rows of micro-batch `microbatch` of rank `dp_rank` in the global batch that starts after
  // `consumed` samples (a multiple of the global batch size); kPadRow for padding.
  std::vector<int64_t> micro_batch(int64_t consumed, int64_t microbatch, int64_t dp_rank) const;

  // The last epoch's order, drawn once for all of its micro-batches (copies share it; left to its
  // default by the brace-initialisation above).
  struct EpochOrder {
    std::mutex mutex;
    int64_t epoch = -1;
    std::vector<int64_t> order;
  };
  std::shared_ptr<EpochOrder> last_ = std::make_shared<EpochOrder>();
};

}  // namespace laoyao::data
