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

void roll_mtp_inputs_cp(MtpLayerInputs& out, const MtpLayerInputs& whole, int64_t b, int64_t s, int64_t cp_rank,
                        int64_t cp_size, int64_t k) {
  const int64_t S = s * cp_size;
  MtpLayerInputs rolled_whole;
  roll_mtp_inputs(rolled_whole, b, S, whole.tokens.data(), whole.positions.data(), whole.labels.data(),
                  whole.mask.empty() ? nullptr : whole.mask.data(), k);
  auto take = [&](const auto& from, auto& to) {
    to.resize(static_cast<size_t>(b * s));
    for (int64_t r = 0; r < b; ++r)
      for (int64_t i = 0; i < s; ++i)
        to[static_cast<size_t>(r * s + i)] = from[static_cast<size_t>(r * S + cp_place(i, s, cp_rank, cp_size))];
  };
  take(rolled_whole.tokens, out.tokens), take(rolled_whole.positions, out.positions);
  take(rolled_whole.labels, out.labels), take(rolled_whole.mask, out.mask);
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

double mtp_loss_weight(const MtpLossScale& scale, double scaling_factor, int64_t num_layers, double tokens) {
  const double factor = scaling_factor / static_cast<double>(std::max<int64_t>(num_layers, 1));
  return scale.per_token ? factor * tokens : factor * scale.per_microbatch;
}

double mtp_tokens(const float* mask, int64_t T) {
  if (!mask) return static_cast<double>(T);
  double n = 0;
  for (int64_t t = 0; t < T; ++t) n += mask[t];
  return n;
}

}  // namespace laoyao::model
