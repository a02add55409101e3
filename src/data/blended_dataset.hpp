// Megatron-Core's dataset blending (`--data-path 0.3 a 0.7 b`): utils.get_blend_from_list,
// the per-dataset sample counts of BlendedMegatronDatasetBuilder
// (_get_size_per_split_per_dataset) and BlendedDataset with helpers.cpp's
// build_blending_indices / build_exhaustive_blending_indices.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "data/gpt_dataset.hpp"

namespace laoyao::data {

// A --data-path list: dataset prefixes with optional weights (empty = no weights).
struct Blend {
  std::vector<std::string> prefixes;
  std::vector<double> weights;
};

// get_blend_from_list: an odd number of items is a list of prefixes; an even number is
// "weight prefix weight prefix ..." when every weight parses as a number, otherwise a list of
// prefixes. Prefixes are stripped of surrounding whitespace. Throws laoyao::UsageError for an
// empty list, a list where only some weights parse (Megatron asserts or misreads those), or a
// weight that is not a positive finite number (Megatron's BlendedDataset asserts weights > 0).
Blend parse_blend(const std::vector<std::string>& items);
// The same for Bridge's dataset.data_path given as one whitespace-separated string.
Blend parse_blend(std::string_view whitespace_separated);

// _get_size_per_split_per_dataset for one split:
// int(ceil(ceil(target * w) * (1 + surplus))) for every normalised weight w.
// With surplus 0 these are the per-dataset targets whose sum is the blended size.
std::vector<int64_t> samples_per_dataset(std::span<const double> normalized_weights,
                                         int64_t target, double surplus);

// Megatron's default --mid-level-dataset-surplus.
inline constexpr double kMidLevelDatasetSurplus = 0.005;

// For blended sample i, the dataset it comes from and that dataset's sample index.
struct BlendingIndex {
  std::vector<int16_t> dataset_index;
  std::vector<int64_t> dataset_sample_index;
};

// helpers.cpp build_blending_indices: for each i, with x = max(i, 1) as a double, choose the
// first dataset with the largest error weights[d]*x - count[d] (ties go to the lower index).
BlendingIndex build_blending_indices(std::span<const double> weights, int64_t size);

// helpers.cpp build_exhaustive_blending_indices: exactly sizes[d] samples of dataset d, interleaved
// by the same error rule with weights sizes[d] / sum(sizes); a dataset leaves the draw once spent.
BlendingIndex build_exhaustive_blending_indices(std::span<const int64_t> sizes);

class BlendedDataset final : public SampleDataset {
 public:
  // BlendedDataset(datasets, weights, size): the positive weights are normalised (Megatron
  // normalises here even when the builder already did, so pass them as the builder has them)
  // and `size` samples are blended. Throws laoyao::UsageError when a dataset is asked for more
  // samples than it has (Megatron: raise mid_level_dataset_surplus).
  BlendedDataset(std::vector<std::shared_ptr<const SampleDataset>> datasets,
                 const std::vector<double>& weights, int64_t size);
  // BlendedDataset(datasets, counts, size=None): exactly counts[d] samples of dataset d.
  static BlendedDataset exhaustive(std::vector<std::shared_ptr<const SampleDataset>> datasets,
                                   const std::vector<int64_t>& counts);

  int64_t size() const override { return static_cast<int64_t>(index_.dataset_index.size()); }
  GptSample get(int64_t index) const override;

  int64_t num_datasets() const { return static_cast<int64_t>(datasets_.size()); }
  const SampleDataset& dataset(int64_t d) const { return *datasets_.at(static_cast<size_t>(d)); }
  // Normalised weights (empty for an exhaustive blend).
  const std::vector<double>& weights() const { return weights_; }
  const BlendingIndex& blending_index() const { return index_; }

 private:
  BlendedDataset(std::vector<std::shared_ptr<const SampleDataset>> datasets,
                 std::vector<double> weights, BlendingIndex index);
  void check_counts() const;

  std::vector<std::shared_ptr<const SampleDataset>> datasets_;
  std::vector<double> weights_;
  BlendingIndex index_;
};

}  // namespace laoyao::data
