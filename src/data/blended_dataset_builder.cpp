#include "data/blended_dataset_builder.hpp"

#include <functional>

#include "core/error.hpp"
#include "data/mock_dataset.hpp"

namespace laoyao::data {

namespace {

// _build_megatron_dataset_splits: one GptDataset per non-empty split of one corpus.
std::array<std::shared_ptr<const GptDataset>, kNumSplits> build_splits(
    const std::shared_ptr<const LowLevelDataset>& corpus,
    const std::array<std::optional<DocumentRange>, kNumSplits>& ranges, const SplitSizes& sizes,
    const GptDatasetConfig& config) {
  std::array<std::shared_ptr<const GptDataset>, kNumSplits> out;
  for (int s = 0; s < kNumSplits; ++s) {
    if (!ranges[s]) continue;
    out[s] = std::make_shared<const GptDataset>(corpus, *ranges[s], static_cast<Split>(s), sizes[s],
                                                config);
  }
  return out;
}

}  // namespace

namespace {

// The document ranges each split takes from a corpus of `num_documents`.
using RangesOf = std::function<std::array<std::optional<DocumentRange>, kNumSplits>(int64_t num_documents)>;

SplitDatasets build_from_ranges(const std::vector<std::shared_ptr<const LowLevelDataset>>& corpora,
                                const std::vector<double>& weights, const RangesOf& ranges_of,
                                const SplitSizes& sizes, const GptDatasetConfig& config,
                                double mid_level_dataset_surplus) {
  if (corpora.empty()) throw UsageError("no dataset given (--data-path or --mock-data)");
  for (const auto& c : corpora) {
    if (!c) throw Error("build_gpt_datasets: missing corpus");
  }
  if (!weights.empty() && weights.size() != corpora.size()) {
    throw UsageError("blend prefixes and weights must be equal in number");
  }
  if (!weights.empty()) {
    for (int s = 0; s < kNumSplits; ++s) {
      if (!sizes[s] && ranges_of(corpora[0]->num_documents())[s]) {
        throw UsageError(std::string("a weighted blend needs a sample count for the ") +
                         split_name(static_cast<Split>(s)) + " split");
      }
    }
  }
  SplitDatasets result;

  // A single prefix without a weight: the GptDatasets are the splits.
  if (corpora.size() == 1 && weights.empty()) {
    const auto ranges = ranges_of(corpora[0]->num_documents());
    const auto built = build_splits(corpora[0], ranges, sizes, config);
    for (int s = 0; s < kNumSplits; ++s) result[s] = built[s];
    return result;
  }

  const size_t n = corpora.size();
  std::vector<double> normalized;
  std::array<std::vector<int64_t>, kNumSplits> targets;  // per split, per dataset
  SplitSizes none;
  std::vector<SplitSizes> build_sizes(n, none);  // per dataset, per split
  if (!weights.empty()) {
    normalized = normalize_weights(weights);
    for (int s = 0; s < kNumSplits; ++s) {
      if (!sizes[s]) continue;  // a split this blend does not build
      targets[s] = samples_per_dataset(normalized, *sizes[s], 0.0);
      const std::vector<int64_t> buffered =
          samples_per_dataset(normalized, *sizes[s], mid_level_dataset_surplus);
      for (size_t d = 0; d < n; ++d) build_sizes[d][s] = buffered[d];
    }
  }

  // Every corpus gets the same split matrix, applied to its own document count.
  std::vector<std::array<std::shared_ptr<const GptDataset>, kNumSplits>> per_corpus;
  std::array<bool, kNumSplits> present{};
  for (size_t d = 0; d < n; ++d) {
    const auto ranges = ranges_of(corpora[d]->num_documents());
    for (int s = 0; s < kNumSplits; ++s) present[s] = ranges[s].has_value();
    per_corpus.push_back(build_splits(corpora[d], ranges, build_sizes[d], config));
  }

  for (int s = 0; s < kNumSplits; ++s) {
    if (!present[s]) continue;
    std::vector<std::shared_ptr<const SampleDataset>> parts;
    for (size_t d = 0; d < n; ++d) parts.push_back(per_corpus[d][s]);
    if (!weights.empty()) {
      int64_t size = 0;
      for (int64_t t : targets[s]) size += t;
      // BlendedDataset normalises the (already normalised) weights once more, as Megatron does.
      result[s] = std::make_shared<const BlendedDataset>(std::move(parts), normalized, size);
    } else {
      std::vector<int64_t> lengths;
      int64_t total = 0;
      for (const auto& p : parts) {
        lengths.push_back(p->size());
        total += p->size();
      }
      if (sizes[s]) {
        std::vector<double> length_weights(lengths.begin(), lengths.end());
        result[s] = std::make_shared<const BlendedDataset>(std::move(parts), length_weights,
                                                           std::min(*sizes[s], total));
      } else {
        result[s] = std::make_shared<const BlendedDataset>(
            BlendedDataset::exhaustive(std::move(parts), lengths));
      }
    }
  }
  return result;
}

}  // namespace

SplitDatasets build_gpt_datasets(const std::vector<std::shared_ptr<const LowLevelDataset>>& corpora,
                                 const std::vector<double>& weights, std::string_view split,
                                 const SplitSizes& sizes, const GptDatasetConfig& config,
                                 double mid_level_dataset_surplus) {
  const std::string split_str(split);
  return build_from_ranges(
      corpora, weights, [&](int64_t n) { return split_document_ranges(split_str, n); }, sizes, config,
      mid_level_dataset_surplus);
}

SplitDatasets build_gpt_datasets_per_split(const std::array<SplitBlend, kNumSplits>& blends, const SplitSizes& sizes,
                                           const GptDatasetConfig& config, double mid_level_dataset_surplus) {
  SplitDatasets result;
  for (int s = 0; s < kNumSplits; ++s) {
    if (blends[s].corpora.empty()) continue;  // no paths for this split: no dataset
    // Megatron spoofs the split matrix: split s takes every document of its own corpora.
    auto only_s = [s](int64_t n) {
      std::array<std::optional<DocumentRange>, kNumSplits> r;
      r[s] = DocumentRange{0, n};
      return r;
    };
    SplitSizes one;
    one[s] = sizes[s];
    // One prefix is a plain GPTDataset of the split's size even with a weight (Megatron's
    // blend_per_split branch); only several prefixes are blended.
    const std::vector<double> weights = blends[s].corpora.size() == 1 ? std::vector<double>{} : blends[s].weights;
    result[s] = build_from_ranges(blends[s].corpora, weights, only_s, one, config, mid_level_dataset_surplus)[s];
  }
  return result;
}

SplitDatasets build_mock_gpt_datasets(std::shared_ptr<const LowLevelDataset> mock_corpus,
                                      const SplitSizes& sizes, const GptDatasetConfig& config) {
  return build_gpt_datasets({std::move(mock_corpus)}, {}, kMockSplit, sizes, config);
}

}  // namespace laoyao::data
