#include "data/gpt_dataset_split.hpp"

#include <charconv>
#include <cmath>
#include <string>
#include <vector>

#include "core/error.hpp"

namespace laoyao::data {

double numpy_sum(std::span<const double> a) {
  const size_t n = a.size();
  if (n < 8) {
    double res = 0.0;
    for (double v : a) res += v;
    return res;
  }
  if (n <= 128) {
    double r[8];
    for (int j = 0; j < 8; ++j) r[j] = a[j];
    size_t i = 8;
    for (; i < n - (n % 8); i += 8) {
      for (int j = 0; j < 8; ++j) r[j] += a[i + j];
    }
    double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) res += a[i];
    return res;
  }
  size_t n2 = n / 2;
  n2 -= n2 % 8;
  return numpy_sum(a.subspan(0, n2)) + numpy_sum(a.subspan(n2));
}

std::vector<double> normalize_weights(std::span<const double> weights) {
  const double sum = numpy_sum(weights);
  std::vector<double> out(weights.begin(), weights.end());
  for (double& w : out) w /= sum;
  return out;
}

const char* split_name(Split split) {
  switch (split) {
    case Split::kTrain: return "train";
    case Split::kValid: return "valid";
    case Split::kTest: return "test";
  }
  return "?";
}

namespace {

[[noreturn]] void bad_split(std::string_view split, const std::string& why) {
  throw UsageError("split \"" + std::string(split) + "\": " + why +
                   "; expected up to three non-negative weights for train,valid,test, "
                   "e.g. \"969,30,1\"");
}

}  // namespace

std::array<double, kNumSplits> parse_split(std::string_view split) {
  if (split.find('-') != std::string_view::npos) bad_split(split, "weights must not be negative");
  // re.findall(r"[.0-9]+", split), then float() of each match.
  std::vector<double> weights;
  size_t i = 0;
  while (i < split.size()) {
    const auto is_num_char = [](char c) { return c == '.' || (c >= '0' && c <= '9'); };
    if (!is_num_char(split[i])) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < split.size() && is_num_char(split[j])) ++j;
    const std::string_view token = split.substr(i, j - i);
    double value = 0.0;
    const auto [end, ec] = std::from_chars(token.data(), token.data() + token.size(), value);
    if (ec != std::errc() || end != token.data() + token.size()) {
      std::string why = "\"";  // (built piecewise: GCC 12 -Wrestrict false positive)
      why.append(token);
      why += "\" is not a number";
      bad_split(split, why);
    }
    weights.push_back(value);
    i = j;
  }
  if (weights.size() > kNumSplits) {
    bad_split(split, std::to_string(weights.size()) + " weights given");
  }
  weights.resize(kNumSplits, 0.0);
  double sum = 0.0;
  for (double w : weights) sum += w;
  if (!(sum > 0.0) || !std::isfinite(sum)) bad_split(split, "the weights must have a positive sum");
  const std::vector<double> normalized = normalize_weights(weights);
  return {normalized[0], normalized[1], normalized[2]};
}

std::array<std::optional<SplitBounds>, kNumSplits> split_matrix(
    const std::array<double, kNumSplits>& normalized) {
  std::array<std::optional<SplitBounds>, kNumSplits> matrix;
  double begin = 0.0;  // Python's running sum starts from the int 0: 0 + a == a exactly
  for (int s = 0; s < kNumSplits; ++s) {
    const double end = begin + normalized[s];
    if (end > begin) matrix[s] = SplitBounds{begin, end};
    begin = end;
  }
  return matrix;
}

std::array<std::optional<DocumentRange>, kNumSplits> split_document_ranges(std::string_view split,
                                                                           int64_t num_documents) {
  if (num_documents < 0) throw Error("split_document_ranges: negative document count");
  const auto matrix = split_matrix(parse_split(split));
  const double n = static_cast<double>(num_documents);
  std::array<std::optional<DocumentRange>, kNumSplits> ranges;
  for (int s = 0; s < kNumSplits; ++s) {
    if (!matrix[s]) continue;
    // int(round(x)): std::nearbyint under the default rounding mode rounds halves to even.
    ranges[s] = DocumentRange{static_cast<int64_t>(std::nearbyint(matrix[s]->begin * n)),
                              static_cast<int64_t>(std::nearbyint(matrix[s]->end * n))};
  }
  return ranges;
}

}  // namespace laoyao::data
