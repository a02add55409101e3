#include "model/rotary.hpp"

namespace laoyao::model {

kernels::cpu::RopeTable rotary_table(const GptConfig& c) {
  kernels::cpu::RopeParams p;
  p.rotary_base = c.rotary_base;
  p.rotary_percent = c.rotary_percent;
  p.rope_scaling = c.rope_scaling;
  p.rope_scaling_factor = c.rope_scaling_factor;
  p.seq_len_interpolation_factor = c.seq_len_interpolation_factor;
  p.yarn = c.yarn;
  // Multi-latent attention rotates only each head's qk_pos_emb_head_dim values (and the shared key's).
  return kernels::cpu::rope_table(c.mla ? c.mla->qk_pos_emb_head_dim : c.kv_channels, c.max_positions, p);
}

}  // namespace laoyao::model
