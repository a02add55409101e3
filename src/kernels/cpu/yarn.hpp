// YaRN's rotary frequencies, as Megatron-Core's YarnRotaryEmbedding (--position-embedding-type
// yarn): between the original context's frequencies (inv_freq_extra) and those interpolated by
// scaling_factor (inv_freq_inter), chosen per dimension by a linear ramp over the dimensions whose
// wavelength falls between beta_fast and beta_slow rotations in original_max_position_embeddings;
// cos and sin scaled by the concentration factor (the "attention factor" or mscale).
#pragma once
#include <cmath>
#include <cstdint>

namespace laoyao::kernels::cpu {

struct YarnParams {
  double scaling_factor = 1.0;                      // --rotary-scaling-factor
  int64_t original_max_position_embeddings = 4096;  // --yarn-original-max-position-embeddings
  double beta_fast = 32.0;                          // --yarn-beta-fast
  double beta_slow = 1.0;                           // --yarn-beta-slow
  double mscale = 1.0;                              // --mscale
  double mscale_all_dim = 0.0;                      // --mscale-all-dim
  bool correction_range_round_to_int = true;        // --[no-]yarn-correction-range-round-to-int
};

// Megatron's _yarn_get_concentration_factor: get_mscale(s, mscale) / get_mscale(s, mscale_all_dim),
// get_mscale(s, m) = 1 for s <= 1, else 0.1 * m * ln(s) + 1 (in double, as Python computes it).
inline double yarn_concentration_factor(const YarnParams& y) {
  auto get_mscale = [&](double m) { return y.scaling_factor <= 1.0 ? 1.0 : 0.1 * m * std::log(y.scaling_factor) + 1.0; };
  return get_mscale(y.mscale) / get_mscale(y.mscale_all_dim);
}

}  // namespace laoyao::kernels::cpu
