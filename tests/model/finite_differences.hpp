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

}  // namespace laoyao::model::test
