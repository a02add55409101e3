#include "data/blended_dataset_builder.hpp"

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

SplitDatasets build_gpt_datasets(const std::vector<std::shared_ptr<const LowLevelDataset>>& corpora,
                                 const std::vector<double>& weights, std::string_view split,
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
      if (!sizes[s]) {
        throw UsageError(std::string("a weighted blend needs a sample count for the ") +
                         split_name(static_cast<Split>(s)) + " split");
      }
    }
  }
  SplitDatasets result;

  // A single prefix without a weight: the GptDatasets are the splits.
  if (corpora.size() == 1 && weights.empty()) {
    const auto ranges = split_document_ranges(split, corpora[0]->num_documents());
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
    const auto ranges = split_document_ranges(split, corpora[d]->num_documents());
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

SplitDatasets build_mock_gpt_datasets(std::shared_ptr<const LowLevelDataset> mock_corpus,
                                      const SplitSizes& sizes, const GptDatasetConfig& config) {
  return build_gpt_datasets({std::move(mock_corpus)}, {}, kMockSplit, sizes, config);
}

}  // namespace laoyao::data
