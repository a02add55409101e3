#include "data/blended_dataset.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>
#include <optional>
#include <set>

#include "core/error.hpp"

namespace laoyao::data {

namespace {

std::string_view strip(std::string_view s) {
  const auto is_space = [](char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
  };
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

// Python's float(text) for the forms a weight takes ("0.3", "30", "1e-2", " 7 ", "+2").
std::optional<double> parse_python_float(std::string_view text) {
  text = strip(text);
  if (!text.empty() && text.front() == '+') text.remove_prefix(1);
  if (text.empty()) return std::nullopt;
  double value = 0.0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : " ") + item;
  return out;
}

}  // namespace

Blend parse_blend(const std::vector<std::string>& items) {
  if (items.empty()) throw UsageError("data path: no dataset prefix given");
  Blend blend;
  std::vector<std::string> raw_prefixes = items;
  if (items.size() % 2 == 0) {
    std::vector<std::optional<double>> weights;
    for (size_t i = 0; i < items.size(); i += 2) weights.push_back(parse_python_float(items[i]));
    const auto parsed = std::count_if(weights.begin(), weights.end(),
                                      [](const auto& w) { return w.has_value(); });
    if (parsed == static_cast<long>(weights.size())) {
      raw_prefixes.clear();
      for (size_t i = 0; i < items.size(); i += 2) {
        const double w = *weights[i / 2];
        if (!(w > 0.0) || !std::isfinite(w)) {
          throw UsageError("data path \"" + join(items) + "\": weight \"" + items[i] +
                           "\" must be a positive number");
        }
        blend.weights.push_back(w);
        raw_prefixes.push_back(items[i + 1]);
      }
    } else if (parsed > 0) {
      throw UsageError("data path \"" + join(items) +
                       "\": give either a weight before every prefix (\"0.3 a 0.7 b\") or none "
                       "(\"a b\")");
    }
  }
  for (const auto& prefix : raw_prefixes) blend.prefixes.emplace_back(strip(prefix));
  return blend;
}

Blend parse_blend(std::string_view text) {
  std::vector<std::string> items;
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
    size_t j = i;
    while (j < text.size() && !std::isspace(static_cast<unsigned char>(text[j]))) ++j;
    if (j > i) items.emplace_back(text.substr(i, j - i));
    i = j;
  }
  return parse_blend(items);
}

std::vector<int64_t> samples_per_dataset(std::span<const double> normalized_weights,
                                         int64_t target, double surplus) {
  if (target < 0) throw Error("samples_per_dataset: negative target");
  std::vector<int64_t> sizes;
  for (double w : normalized_weights) {
    const double per_dataset = std::ceil(static_cast<double>(target) * w);
    sizes.push_back(static_cast<int64_t>(std::ceil(per_dataset * (1.0 + surplus))));
  }
  return sizes;
}

BlendingIndex build_blending_indices(std::span<const double> weights, int64_t size) {
  if (weights.empty() || weights.size() >= 32767) {
    throw Error("build_blending_indices: need 1 to 32766 datasets");
  }
  if (size < 0) throw Error("build_blending_indices: negative size");
  const size_t n = weights.size();
  std::vector<int64_t> current(n, 0);
  BlendingIndex index;
  index.dataset_index.resize(static_cast<size_t>(size));
  index.dataset_sample_index.resize(static_cast<size_t>(size));
  for (int64_t i = 0; i < size; ++i) {
    const double x = std::max(static_cast<double>(i), 1.0);
    size_t best = 0;
    double best_error = weights[0] * x - static_cast<double>(current[0]);
    for (size_t d = 1; d < n; ++d) {
      const double error = weights[d] * x - static_cast<double>(current[d]);
      if (error > best_error) {
        best_error = error;
        best = d;
      }
    }
    index.dataset_index[i] = static_cast<int16_t>(best);
    index.dataset_sample_index[i] = current[best];
    ++current[best];
  }
  return index;
}

BlendingIndex build_exhaustive_blending_indices(std::span<const int64_t> sizes) {
  if (sizes.empty() || sizes.size() >= 32767) {
    throw Error("build_exhaustive_blending_indices: need 1 to 32766 datasets");
  }
  int64_t total = 0;
  for (int64_t s : sizes) {
    // Megatron asserts positive weights; a zero size would never leave the draw.
    if (s <= 0) throw Error("build_exhaustive_blending_indices: sizes must be positive");
    total += s;
  }
  std::vector<double> weights;
  for (int64_t s : sizes) weights.push_back(static_cast<double>(s) / static_cast<double>(total));
  std::vector<int64_t> counts(sizes.size(), 0);
  std::set<int32_t> unspent;  // iterated in ascending order, as helpers.cpp's std::set
  for (size_t d = 0; d < sizes.size(); ++d) unspent.insert(static_cast<int32_t>(d));

  BlendingIndex index;
  index.dataset_index.reserve(static_cast<size_t>(total));
  index.dataset_sample_index.reserve(static_cast<size_t>(total));
  int64_t i = 0;
  while (!unspent.empty()) {
    const double x = std::max(static_cast<double>(i), 1.0);
    int32_t best = -1;
    double best_error = std::numeric_limits<double>::lowest();
    for (int32_t d : unspent) {
      const double error = weights[d] * x - static_cast<double>(counts[d]);
      if (error > best_error) {
        best = d;
        best_error = error;
      }
    }
    index.dataset_index.push_back(static_cast<int16_t>(best));
    index.dataset_sample_index.push_back(counts[best]);
    ++counts[best];
    if (counts[best] == sizes[best]) unspent.erase(best);
    ++i;
  }
  return index;
}

BlendedDataset::BlendedDataset(std::vector<std::shared_ptr<const SampleDataset>> datasets,
                               std::vector<double> weights, BlendingIndex index)
    : datasets_(std::move(datasets)), weights_(std::move(weights)), index_(std::move(index)) {
  check_counts();
}

namespace {
std::vector<double> checked_normalized(
    const std::vector<std::shared_ptr<const SampleDataset>>& datasets,
    const std::vector<double>& weights) {
  if (datasets.empty() || datasets.size() != weights.size()) {
    throw Error("BlendedDataset: need as many weights as datasets (at least one)");
  }
  for (const auto& d : datasets) {
    if (!d) throw Error("BlendedDataset: missing dataset");
  }
  for (double w : weights) {
    if (!(w > 0.0) || !std::isfinite(w)) {
      throw UsageError("blend weights must be positive numbers");
    }
  }
  return normalize_weights(weights);
}
}  // namespace

BlendedDataset::BlendedDataset(std::vector<std::shared_ptr<const SampleDataset>> datasets,
                               const std::vector<double>& weights, int64_t size)
    : datasets_(std::move(datasets)) {
  weights_ = checked_normalized(datasets_, weights);
  index_ = build_blending_indices(weights_, size);
  check_counts();
}

BlendedDataset BlendedDataset::exhaustive(
    std::vector<std::shared_ptr<const SampleDataset>> datasets, const std::vector<int64_t>& counts) {
  if (datasets.empty() || datasets.size() != counts.size()) {
    throw Error("BlendedDataset: need as many sample counts as datasets (at least one)");
  }
  BlendingIndex index = build_exhaustive_blending_indices(counts);
  return BlendedDataset(std::move(datasets), {}, std::move(index));
}

void BlendedDataset::check_counts() const {
  std::vector<int64_t> used(datasets_.size(), 0);
  for (int16_t d : index_.dataset_index) ++used[static_cast<size_t>(d)];
  for (size_t d = 0; d < datasets_.size(); ++d) {
    if (used[d] > datasets_[d]->size()) {
      throw UsageError("the blend asks dataset " + std::to_string(d) + " for " +
                       std::to_string(used[d]) + " samples but it has " +
                       std::to_string(datasets_[d]->size()) +
                       "; raise mid_level_dataset_surplus (--mid-level-dataset-surplus)");
    }
  }
}

GptSample BlendedDataset::get(int64_t index) const {
  if (index < 0 || index >= size()) {
    throw Error("blended dataset: sample " + std::to_string(index) + " out of range [0, " +
                std::to_string(size()) + ")");
  }
  const auto d = static_cast<size_t>(index_.dataset_index[static_cast<size_t>(index)]);
  return datasets_[d]->get(index_.dataset_sample_index[static_cast<size_t>(index)]);
}

}  // namespace laoyao::data
