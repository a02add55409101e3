// Column offsets inside one token's row of Megatron-Core's fused QKV projection:
// [G groups x (H/G query heads x D, k (D), v (D))]; MHA (G = H) is q0 k0 v0 q1 k1 v1 ...
// Shared by the attention, RoPE and QK-norm ops.
#pragma once
#include <cstdint>
#include <string>

#include "core/error.hpp"

namespace laoyao::kernels::cpu {

struct QkvLayout {
  int64_t H, G, D;
  int64_t Q;    // query heads per group
  int64_t row;  // width of one token's row

  // `what` names the op in the error for a shape Megatron would not build.
  QkvLayout(const char* what, int64_t H_, int64_t G_, int64_t D_) : H(H_), G(G_), D(D_) {
    if (H <= 0 || G <= 0 || D <= 0 || H % G != 0)
      throw Error(std::string(what) + ": num_attention_heads (" + std::to_string(H) +
                  ") must be a positive multiple of num_query_groups (" + std::to_string(G) + "), head dim " +
                  std::to_string(D) + " positive");
    Q = H / G;
    row = G * (Q + 2) * D;
  }
  // Slot j of group g: q head g*Q + j for j < Q, the group's k for j == Q, its v for j == Q + 1.
  int64_t col(int64_t g, int64_t j) const { return (g * (Q + 2) + j) * D; }
  int64_t group_of(int64_t h) const { return h / Q; }
  int64_t q(int64_t h) const { return col(group_of(h), h % Q); }
  int64_t k(int64_t g) const { return col(g, Q); }
  int64_t v(int64_t g) const { return col(g, Q + 1); }
};

}  // namespace laoyao::kernels::cpu
