// The data a run reads: the train/valid/test datasets Megatron's builder would make for the
// config (mock corpus or indexed .bin/.idx prefixes with a blend), and the micro-batches each
// iteration takes from them, in MegatronPretrainingSampler's order.
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "config/config_container.hpp"
#include "data/batch_sampler.hpp"
#include "data/blended_dataset_builder.hpp"
#include "data/gpt_dataset_budget.hpp"

namespace laoyao::train {

struct RunData {
  data::SplitDatasets datasets;  // train, valid, test (null: no samples requested)
  data::SampleBudget budget;
  data::MicroBatchLayout train_layout, eval_layout;
  int64_t seq_length = 0;
  int64_t vocab = 0;  // padded vocabulary: every token id the model reads must be below it
  // Fine-tuning with dataloader_type "batch" (Bridge's recipes): each split's rows in
  // MegatronPretrainingBatchSampler's order (validation and test padded to whole global batches and
  // read cyclically); else MegatronPretrainingSampler's, in sequence.
  std::array<std::optional<data::BatchSampler>, 3> batch_samplers;
};

RunData build_run_data(const config::ConfigContainer& c, const config::Derived& d);

// Samples stacked into one micro-batch, token t = row*seq + position.
struct MicroBatchData {
  int64_t b = 0, s = 0;
  std::vector<int64_t> sample_indices;
  std::vector<int64_t> tokens, labels, positions;
  std::vector<float> loss_mask;
  std::vector<int32_t> key_start;  // each query's first key (--reset-attention-mask), else empty
  // A context-parallel rank's packed documents: each token's place in its whole row (key_start then
  // in those places too); empty otherwise (Megatron's two chunks of the row, or no CP).
  std::vector<int32_t> cp_places;
  // The first micro-batch of a step or of an evaluation's iteration (Megatron's is_first_microbatch:
  // FP8 linear layers cast their weights again).
  bool is_first_microbatch = true;
  const int32_t* key_start_or_null() const { return key_start.empty() ? nullptr : key_start.data(); }
  const int32_t* cp_places_or_null() const { return cp_places.empty() ? nullptr : cp_places.data(); }
};

// Token ids at or above `vocab` (> 0) are a UsageError naming the sample and the id: the data was
// tokenized with another vocabulary than the run's tokenizer.
MicroBatchData load_micro_batch(const data::SampleDataset& ds, const std::vector<int64_t>& indices, int64_t vocab = 0);

// Context parallelism: rank cp_rank's chunks of each sequence of mb (Megatron's
// get_batch_on_this_cp_rank: the sequence in 2 cp_size chunks, this rank's chunks cp_rank and
// 2 cp_size - 1 - cp_rank, in that order). With packed documents (key_start), each document is
// split so (Megatron's THD partition, thd_get_partitioned_indices), the rank's chunks in document
// order, and cp_places says where each token was. A UsageError when a sequence or a document does
// not split so (naming dataset.pad_seq_to_mult, which pads each packed example to a multiple).
MicroBatchData context_parallel_chunks(const MicroBatchData& mb, int64_t cp_rank, int64_t cp_size);

// Dataset indices of training micro-batch `microbatch` (0-based) of the iteration that starts after
// `consumed` training samples, (MegatronPretrainingSampler starts at the
// consumed-sample count, so a resumed run with another batch size reads on from where it was), or
// on data-parallel rank `dp_rank`.
std::vector<int64_t> train_sample_indices(const RunData& d, int64_t consumed, int64_t microbatch, int64_t dp_rank = 0);
// Dataset indices of an evaluation micro-batch of `split` (1 validation, 2 test) once `consumed`
// samples of that split were read (data::kPadRow for the batch sampler's padding).
std::vector<int64_t> eval_sample_indices(const RunData& d, int split, int64_t consumed, int64_t microbatch,
                                         int64_t dp_rank = 0);
// Samples one evaluation round (eval_iters iterations of eval micro-batches) reads.
int64_t eval_round_samples(const RunData& d, int64_t eval_iters);

// Where a run starts reading: 0 for a new run, a checkpoint's counters for a resumed one.
struct DataPosition {
  int64_t iteration = 0;
  int64_t consumed_train = 0, consumed_valid = 0;
  std::string state_file;  // the train_state.json they came from ("" for a new run)
};

// Refuses (UsageError), before training, a run its datasets cannot serve to the end: a resumed
// position at or past the end of the training split (Megatron's sampler asserts "no samples left to
// consume"), or evaluations that would read past the end of the validation or test split (Megatron
// stops there with a StopIteration, after training). Names the counts and the settings behind them.
void check_data_covers_run(const RunData& d, const config::ConfigContainer& c, int64_t train_iters,
                           const DataPosition& from);

}  // namespace laoyao::train
