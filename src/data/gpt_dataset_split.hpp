// Train/valid/test splits of a corpus, as Megatron-Core derives them from a split string
// ("969,30,1", "98,1,1", "1,1,1"): blended_megatron_dataset_config.py's
// parse_and_normalize_split and convert_split_vector_to_split_matrix, and
// BlendedMegatronDatasetBuilder._build_megatron_dataset_splits' document ranges.
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

namespace laoyao::data {

// numpy.sum of a float64 array: numpy's pairwise summation (plain loop below 8 elements,
// 8 interleaved accumulators up to 128, recursive halves above), starting from 0.0. The exact
// order matters because Megatron normalises split and blend weights by this sum.
double numpy_sum(std::span<const double> values);

// Megatron's utils.normalize: w / numpy.sum(w) in float64.
std::vector<double> normalize_weights(std::span<const double> weights);

enum class Split { kTrain = 0, kValid = 1, kTest = 2 };
constexpr int kNumSplits = 3;
// "train", "valid", "test" (Megatron's Split enum names).
const char* split_name(Split split);

// Documents [begin, end) of a low-level dataset.
struct DocumentRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const DocumentRange&) const = default;
};

// A split's share of [0, 1].
struct SplitBounds {
  double begin = 0.0;
  double end = 0.0;
  bool operator==(const SplitBounds&) const = default;
};

// parse_and_normalize_split: every run of digits and dots is a weight (so "98,1,1",
// "98 1 1" and "98/1/1" all work), missing trailing weights are 0, and the weights are divided
// by their numpy float64 sum. Throws laoyao::UsageError naming the string for more than three
// weights, a malformed number, a minus sign (Megatron would silently drop it) or an all-zero
// split.
std::array<double, kNumSplits> parse_split(std::string_view split);

// convert_split_vector_to_split_matrix: cumulative book-ends [(0,a), (a,a+b), (a+b,a+b+c)];
// a split of zero width is nullopt (Megatron builds no dataset for it).
std::array<std::optional<SplitBounds>, kNumSplits> split_matrix(
    const std::array<double, kNumSplits>& normalized);

// The document range of each split for a corpus of `num_documents` documents (for GPT:
// sequences): [int(round(lo*N)), int(round(hi*N))), with Python's round-half-to-even.
std::array<std::optional<DocumentRange>, kNumSplits> split_document_ranges(std::string_view split,
                                                                           int64_t num_documents);

}  // namespace laoyao::data
