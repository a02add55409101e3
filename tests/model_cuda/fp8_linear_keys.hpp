// The FP8 linears' keys (the CPU backend's and CudaFp8Linears::download_scaling's): each FP8 layer's
// dense linears (multi-latent attention's projections among them) or shared expert's, each MTP
// layer's eh_proj, and each routed expert's linear_fc1 and linear_fc2 (the experts' weights one
// after another), flagged; and whether an MoE layer's routing comes before the linear. Of a
// tensor-parallel rank's model too (tp_local_config's): the same linears in the same order.
#pragma once

#include <cstdint>
#include <vector>

#include "model/gpt_config.hpp"
#include "model/gpt_layout.hpp"

namespace laoyao::model::test {

struct Fp8Key {
  int64_t w;
  bool expert, after_routing;
};

inline std::vector<Fp8Key> fp8_linear_keys(const GptConfig& c) {
  const GptParameterLayout P = build_gpt_parameters(c);
  std::vector<Fp8Key> keys;
  const int64_t H = c.hidden, F = c.moe.ffn;
  bool routed = false;  // (an MoE layer's routing before this layer's linears)
  for (int64_t l = 0; l < c.layer_count(); ++l) {
    const GptLayerOffsets& L = P.layers[static_cast<size_t>(l)];
    if (c.fp8->layer_in_fp8(l, c.num_layers)) {
      for (const int64_t w : {L.qkv_w, L.q_proj_w, L.q_down_w, L.q_up_w, L.kv_down_w, L.kv_up_w, L.proj_w, L.fc1_w,
                              L.fc2_w, L.shared_fc1, L.shared_fc2})
        if (w >= 0) keys.push_back({w, false, routed});
      for (int64_t e = 0; L.experts_fc1 >= 0 && e < c.moe.local_experts(); ++e) {
        keys.push_back({L.experts_fc1 + e * c.fc1_rows(F) * H, true, routed});
        keys.push_back({L.experts_fc2 + e * H * F, true, routed});
      }
    }
    routed = routed || c.is_moe_layer(l);
  }
  for (const MtpOffsets& M : P.mtp) keys.push_back({M.eh_proj, false, routed});
  return keys;
}

}  // namespace laoyao::model::test
