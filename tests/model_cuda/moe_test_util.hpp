// Helpers of the GPU MoE tests (moe_model_cuda_test.cpp, moe_ep_layer_cuda_test.cpp): bf16 data,
// small MoE configs and one MoE layer's parameter offsets.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/rng.hpp"
#include "model/gpt_config.hpp"
#include "model/gpt_layout.hpp"
#include "model_cuda_test_util.hpp"

namespace laoyao::model::test {

namespace kc = laoyao::kernels::cuda;

inline std::vector<float> random_bf16(int64_t n, double scale, const std::string& stream) {
  Rng rng(5, stream);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = round_to_bf16(static_cast<float>(scale * rng.normal()));
  return v;
}

inline std::vector<kc::bf16> to_bf16(const std::vector<float>& v) {
  std::vector<kc::bf16> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = __float2bfloat16(v[i]);
  return out;
}

inline std::vector<float> from_bf16(const std::vector<kc::bf16>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = __bfloat162float(v[i]);
  return out;
}

// A model config whose layer `l` is MoE: E experts, top-k, the CPU layer's config to match.
inline GptConfig moe_config(GptConfig c, int64_t E, int64_t k, int64_t ffn, int64_t shared_ffn) {
  c.moe.num_experts = E, c.moe.topk = k, c.moe.ffn = ffn, c.moe.shared_ffn = shared_ffn;
  c.moe.layers.assign(static_cast<size_t>(c.num_layers), true);
  c.moe.aux_loss_coeff = 1e-2, c.moe.z_loss_coeff = 1e-3;
  c.add_bias_linear = false, c.add_qkv_bias = false;
  return c;
}

// One MoE layer's parameters at offsets of their own (the model's layout puts them the same way);
// n: the floats they take.
inline GptLayerOffsets place_layer(const GptConfig& c, int64_t& n) {
  const int64_t H = c.hidden, E = c.moe.num_experts, El = c.moe.local_experts(), F = c.moe.ffn,
                Fs = c.moe.shared_ffn;
  GptLayerOffsets W{};
  n = 0;
  auto place = [&](int64_t count) { return std::exchange(n, n + (count + 7) / 8 * 8); };
  W.router_w = place(E * H), W.experts_fc1 = place(El * c.fc1_rows(F) * H), W.experts_fc2 = place(El * H * F);
  W.shared_fc1 = Fs > 0 ? place(c.fc1_rows(Fs) * H) : -1;
  W.shared_fc2 = Fs > 0 ? place(H * Fs) : -1;
  W.expert_bias = c.moe.expert_bias ? place(E) : -1;
  return W;
}

// c with one layer, an MoE one (what CudaMoeLayers is built for in the layer tests).
inline GptConfig single_moe_layer(GptConfig c) {
  c.num_layers = 1;
  c.moe.layers = {true};
  return c;
}

}  // namespace laoyao::model::test
