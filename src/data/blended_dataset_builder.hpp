// Megatron-Core's BlendedMegatronDatasetBuilder for GPT with one distribution (config.blend +
// config.split, or mock data): which GptDataset / BlendedDataset each split gets and how many
// samples each one is built with.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "data/blended_dataset.hpp"
#include "data/gpt_dataset.hpp"
#include "data/low_level_dataset.hpp"

namespace laoyao::data {

// Samples requested per split (train, valid, test); nullopt is Megatron's None (one epoch, or
// an exhaustive blend), e.g. validation with --full-validation.
using SplitSizes = std::array<std::optional<int64_t>, kNumSplits>;
// One dataset per split; null where the split has zero width.
using SplitDatasets = std::array<std::shared_ptr<const SampleDataset>, kNumSplits>;

// `corpora[d]` is the low-level dataset of the d-th --data-path prefix; `weights` its weights
// (empty: no weights). Every corpus is split by `split` (see split_document_ranges).
//   * one corpus, no weights: a GptDataset per split with the requested sample count;
//   * with weights (even a single corpus): weights normalised, each corpus's GptDataset built
//     with ceil(ceil(n*w)*(1+surplus)) samples, and a BlendedDataset of sum_d ceil(n*w_d)
//     samples on top;
//   * several corpora, no weights: one-epoch GptDatasets blended by their lengths, with
//     min(n, total) samples (all of them, exhaustively, when n is nullopt).
// Throws laoyao::UsageError for a bad split, empty splits, or weights with a nullopt size.
SplitDatasets build_gpt_datasets(const std::vector<std::shared_ptr<const LowLevelDataset>>& corpora,
                                 const std::vector<double>& weights, std::string_view split,
                                 const SplitSizes& sizes, const GptDatasetConfig& config,
                                 double mid_level_dataset_surplus = kMidLevelDatasetSurplus);

// --train-data-path / --valid-data-path / --test-data-path (Megatron's blend_per_split): each
// split blends its own corpora (weights optional, as for one --data-path), taking every document
// of them; a split without paths gets no dataset.
struct SplitBlend {
  std::vector<std::shared_ptr<const LowLevelDataset>> corpora;
  std::vector<double> weights;  // empty: no weights
};
SplitDatasets build_gpt_datasets_per_split(const std::array<SplitBlend, kNumSplits>& blends, const SplitSizes& sizes,
                                           const GptDatasetConfig& config,
                                           double mid_level_dataset_surplus = kMidLevelDatasetSurplus);

// Mock data (--mock-data): one corpus, no weights, split forced to "1,1,1".
SplitDatasets build_mock_gpt_datasets(std::shared_ptr<const LowLevelDataset> mock_corpus,
                                      const SplitSizes& sizes, const GptDatasetConfig& config);

}  // namespace laoyao::data
