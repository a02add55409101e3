// The whole model's backward against central differences of its forward: for 3 random elements
// of every parameter tensor, d(objective)/d(weight) from the fp32 forward (objective summed in
// double) against the gradient backward() accumulated. Shared by the dense and MoE model tests.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "model/gpt_model.hpp"

namespace laoyao::model::test {

// `objective` runs the forward at the current weights; `analytic` is the gradient of the same
// objective that backward() produced at those weights (the trained parameters', from the table's
// trainable_offset on: a frozen base has none, and is not checked). eps: the step (smaller where a
// router's top k could flip within it: the objective is only piecewise smooth there).
inline void expect_gradients_match_finite_differences(GptModel& m, const std::vector<float>& analytic,
                                                      const std::function<double()>& objective, std::mt19937& rng,
                                                      float eps = 1e-2f) {
  ASSERT_EQ(static_cast<int64_t>(analytic.size()), m.table().trainable());
  for (const auto& p : m.table().specs) {
    if (p.frozen) continue;
    std::uniform_int_distribution<int64_t> pick(0, p.numel - 1);
    for (int k = 0; k < 3; ++k) {
      const int64_t i = p.offset + pick(rng);
      const float keep = m.weights()[i];
      m.weights()[i] = keep + eps;
      const double up = objective();
      m.weights()[i] = keep - eps;
      const double down = objective();
      m.weights()[i] = keep;
      const double fd = (up - down) / (2.0 * eps);
      EXPECT_NEAR(analytic[i - m.table().trainable_offset], fd, 3e-3 + 2e-2 * std::abs(fd))
          << p.name << "[" << i - p.offset << "]";
    }
  }
}

// Where a whole-model check starts: the model's parameters initialised (seed 7) with the norm
// weights and biases moved off their defaults (so their gradients are exercised), and a micro-batch
// of b random sequences of s tokens and labels, with loss weights r in [0.5, 1.5).
struct GradientCheckBatch {
  int64_t b = 2, s = 5;
  std::vector<int64_t> tokens, labels, positions;
  std::vector<float> r, losses;
  MicroBatch micro_batch() const { return {b, s, tokens.data(), labels.data(), positions.data()}; }
  // sum_t r_t * loss_t of a forward with `key`.
  double weighted_loss(GptModel& m, const DropoutKey& key) {
    m.forward(micro_batch(), key, losses.data());
    double L = 0;
    for (size_t t = 0; t < r.size(); ++t) L += static_cast<double>(r[t]) * losses[t];
    return L;
  }
};

inline GradientCheckBatch prepare_gradient_check(GptModel& m, std::mt19937& rng) {
  init_parameters(m.table(), m.weights(), 7, false);
  std::normal_distribution<float> N(0.0f, 0.3f);
  for (const auto& p : m.table().specs)
    if (p.init != Init::Normal && !p.buffer)
      for (int64_t i = 0; i < p.numel; ++i) m.weights()[p.offset + i] += N(rng);
  GradientCheckBatch g;
  const int64_t T = g.b * g.s;
  g.tokens.resize(T), g.labels.resize(T), g.positions.resize(T), g.r.resize(T), g.losses.resize(T);
  std::uniform_int_distribution<int64_t> tok(0, m.config().vocab - 1);
  for (int64_t t = 0; t < T; ++t) g.tokens[t] = tok(rng), g.labels[t] = tok(rng), g.positions[t] = t % g.s;
  for (auto& x : g.r) x = std::uniform_real_distribution<float>(0.5f, 1.5f)(rng);
  return g;
}

}  // namespace laoyao::model::test
