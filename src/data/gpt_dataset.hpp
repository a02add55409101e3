// Megatron-Core's GPTDataset (megatron/core/datasets/gpt_dataset.py + helpers.cpp): the
// document, sample and shuffle indices built exactly as Megatron builds them, so that sample i
// holds the same tokens as Megatron's sample i for the same corpus, split, seed, sequence
// length and sample count.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "data/gpt_dataset_split.hpp"
#include "data/low_level_dataset.hpp"
#include "data/numpy_random.hpp"

namespace laoyao::data {

// What GPTDataset.__getitem__ returns (no attention mask: the model applies the causal mask).
struct GptSample {
  std::vector<int64_t> tokens;        // [seq_length]
  std::vector<int64_t> labels;        // [seq_length], tokens shifted by one
  std::vector<float> loss_mask;       // [seq_length], 1 or 0
  std::vector<int64_t> position_ids;  // [seq_length]
  // [seq_length] with reset_attention_mask (and create_attention_mask), else empty: the first key
  // each query attends, the position after the last EOD before it. Megatron's mask, row by row: for
  // each EOD at e, attention_mask[e+1:, :e+1] is masked.
  std::vector<int32_t> key_start;
};

// A dataset of GPT samples: a GptDataset or a BlendedDataset of them (Megatron's
// "top-level dataset").
class SampleDataset {
 public:
  virtual ~SampleDataset() = default;
  virtual int64_t size() const = 0;  // len(dataset)
  // Sample `index` in [0, size()). Throws laoyao::Error when out of range.
  virtual GptSample get(int64_t index) const = 0;
};

// The GPTDatasetConfig fields that shape samples. Callers map their config onto it.
struct GptDatasetConfig {
  int64_t seq_length = 0;      // --seq-length (must be > 1, as helpers.cpp asserts)
  int64_t random_seed = 1234;  // --seed: numpy.random.RandomState(random_seed) per split
  int64_t eod_id = -1;         // tokenizer.eod
  // Megatron's _pad_token_id: tokenizer.pad, or -1 when the tokenizer has none (NullTokenizer:
  // -1) or, unless allow_ambiguous_pad_tokens, when it equals another special token. Pads only
  // appear in a final partial validation sample (and with add_extra_token_to_sequence off).
  int64_t pad_id = -1;
  bool reset_position_ids = false;    // --reset-position-ids: positions restart after each EOD
  // --reset-attention-mask: attention stays inside each document (samples carry key_start), when
  // the dataloader creates the attention mask at all (GPTDatasetConfig.create_attention_mask:
  // Megatron-LM's default; Bridge's skip_getting_attention_mask_from_dataset turns it off, and then
  // Megatron's attention is plain causal, reset_attention_mask or not).
  bool reset_attention_mask = false;
  bool create_attention_mask = true;
  bool eod_mask_loss = false;         // --eod-mask-loss: no loss where the input token is EOD
  // --no-drop-last-partial-validation-sequence turns this off (valid split only).
  bool drop_last_partial_validation_sequence = true;
  // Samples of seq_length+1 tokens overlapping by one (Megatron's default, true).
  bool add_extra_token_to_sequence = true;
};

// How many epochs a split needs for `num_samples` samples and whether the last one is shuffled
// on its own (GPTDataset._get_num_epochs and the "separate final epoch" 80% rule).
struct EpochPlan {
  int64_t tokens_per_epoch = 0;
  int64_t num_epochs = 1;
  bool separate_final_epoch = false;
  int64_t num_samples_sans_final_epoch = 0;  // meaningful when num_epochs > 1
};
// num_samples nullopt = Megatron's None (one epoch). Throws laoyao::UsageError when the split
// has no tokens to draw from.
EpochPlan plan_epochs(int64_t tokens_per_epoch, std::optional<int64_t> num_samples,
                      int64_t seq_length, bool add_extra_token);

// _build_document_index: documents [begin, end) tiled num_epochs times and shuffled in place
// with `rs`; with separate_final_epoch, the first num_epochs-1 epochs are shuffled together
// and then the last epoch on its own (same generator, in that order).
std::vector<int32_t> build_document_index(DocumentRange documents, int64_t num_epochs,
                                          RandomState& rs, bool separate_final_epoch);

// helpers.cpp build_sample_idx: rows (position in document_index, token offset), one more row
// than there are samples, flattened [row0.doc, row0.offset, row1.doc, ...]. `sizes[d]` is the
// length of document `first_document + d`. Throws laoyao::Error where Megatron's assert would
// fire (a keep-partial sample count that overshoots the documents).
std::vector<int64_t> build_sample_index(std::span<const int32_t> sizes, int64_t first_document,
                                        std::span<const int32_t> document_index,
                                        int64_t seq_length, int64_t num_epochs,
                                        int64_t tokens_per_epoch, bool drop_last_partial_sequence,
                                        bool add_extra_token);

// _build_shuffle_index: arange(num_samples) shuffled, then (if total_size > num_samples)
// arange(num_samples, total_size) shuffled on its own, continuing `rs`.
std::vector<int64_t> build_shuffle_index(int64_t num_samples, int64_t total_size,
                                         RandomState& rs);

class GptDataset final : public SampleDataset {
 public:
  // `documents` is the split's document range of `corpus` (see split_document_ranges);
  // `num_samples` the split's sample budget (nullopt: one epoch). Builds the three indices.
  GptDataset(std::shared_ptr<const LowLevelDataset> corpus, DocumentRange documents, Split split,
             std::optional<int64_t> num_samples, const GptDatasetConfig& config);

  int64_t size() const override { return static_cast<int64_t>(shuffle_index_.size()); }
  GptSample get(int64_t index) const override;
  // The seq_length + add_extra_token raw tokens of sample `index`, padded with pad_id
  // (GPTDataset._query_document_sample_shuffle_indices).
  std::vector<int64_t> text(int64_t index) const;

  const EpochPlan& epochs() const { return plan_; }
  const std::vector<int32_t>& document_index() const { return document_index_; }
  // Row `row` of the sample index: (position in document_index, token offset).
  int64_t sample_index_rows() const { return static_cast<int64_t>(sample_index_.size() / 2); }
  std::pair<int64_t, int64_t> sample_index(int64_t row) const;
  const std::vector<int64_t>& shuffle_index() const { return shuffle_index_; }
  Split split() const { return split_; }
  DocumentRange documents() const { return documents_; }
  std::optional<int64_t> num_samples() const { return num_samples_; }
  const GptDatasetConfig& config() const { return config_; }
  const LowLevelDataset& corpus() const { return *corpus_; }

 private:
  std::shared_ptr<const LowLevelDataset> corpus_;
  DocumentRange documents_;
  Split split_;
  std::optional<int64_t> num_samples_;
  GptDatasetConfig config_;
  EpochPlan plan_;
  std::vector<int32_t> document_index_;
  std::vector<int64_t> sample_index_;  // flattened pairs
  std::vector<int64_t> shuffle_index_;
};

}  // namespace laoyao::data
