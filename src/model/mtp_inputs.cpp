#include "model/mtp_inputs.hpp"

#include <algorithm>

namespace laoyao::model {

namespace {

template <class T>
void rolled(std::vector<T>& out, const T* in, T fill, int64_t b, int64_t s, int64_t shift) {
  out.assign(static_cast<size_t>(b * s), 0);
  for (int64_t r = 0; r < b; ++r)
    for (int64_t i = 0; i + shift < s; ++i) out[static_cast<size_t>(r * s + i)] = in ? in[r * s + i + shift] : fill;
}

double mask_sum(const MtpLayerInputs& in) {
  double count = 0;
  for (float x : in.mask) count += x;
  return std::max(count, 1.0);
}

}  // namespace

void roll_mtp_inputs(MtpLayerInputs& out, int64_t b, int64_t s, const int64_t* tokens, const int64_t* positions,
                     const int64_t* labels, const float* mask, int64_t k) {
  const int64_t shift = k + 1;
  rolled<int64_t>(out.tokens, tokens, 0, b, s, shift);
  rolled<int64_t>(out.positions, positions, 0, b, s, shift);
  rolled<int64_t>(out.labels, labels, 0, b, s, shift);
  rolled<float>(out.mask, mask, 1.0f, b, s, shift);
  out.losses.assign(static_cast<size_t>(b * s), 0.0f);
}

double mtp_masked_mean(const MtpLayerInputs& in) {
  double sum = 0;
  for (size_t t = 0; t < in.mask.size(); ++t) sum += static_cast<double>(in.losses[t]) * in.mask[t];
  return sum / mask_sum(in);
}

void set_mtp_loss_weights(MtpLayerInputs& in, double weight) {
  const double scale = weight / mask_sum(in);
  in.dloss.resize(in.mask.size());
  for (size_t t = 0; t < in.mask.size(); ++t) in.dloss[t] = static_cast<float>(in.mask[t] * scale);
}

double mtp_loss_weight(const MtpLossScale& scale, double factor, double tokens) {
  return scale.per_token ? factor * tokens : factor * scale.per_microbatch;
}

double mtp_tokens(const float* mask, int64_t T) {
  if (!mask) return static_cast<double>(T);
  double n = 0;
  for (int64_t t = 0; t < T; ++t) n += mask[t];
  return n;
}

}  // namespace laoyao::model
