// Rotary position embeddings on the fused QKV rows, in place, for BF16 (Megatron-Core's
// RotaryEmbedding, non-interleaved rotate_half), as kernels/cpu/ops.hpp rope_forward_qkv /
// rope_backward_qkv: every q head and every group's k of token t is rotated by the angles of
// position t % s (Megatron's pretraining positions); v and the dims past rot_dim are untouched.
// The cos/sin table is the CPU's (kernels/cpu rope_table: Llama 3 scaling and all), uploaded once.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace laoyao::kernels::cuda {

struct RopeDeviceTable {
  const float* cos = nullptr;  // [max_positions, rot_dim / 2]
  const float* sin = nullptr;
  int64_t rot_dim = 0, max_positions = 0;
};

// Whether the 16-byte pack kernels serve this table (rope_pack.cuh: the rotated half a multiple of
// 8 values, cos and sin 16-byte aligned for their float4 reads); they also let
// qk_rmsnorm_forward/backward apply the rotation in the norm's pass.
inline bool rope_packable(const RopeDeviceTable& t) {
  return t.rot_dim > 0 && (t.rot_dim / 2) % 8 == 0 && reinterpret_cast<uintptr_t>(t.cos) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(t.sin) % 16 == 0;
}

// qkv[b*s, G*(H/G + 2)*D] in place. s <= table.max_positions (else laoyao::Error).
void rope_forward_qkv(__nv_bfloat16* qkv, const RopeDeviceTable& table, int64_t b, int64_t s, int64_t H, int64_t G,
                      int64_t D, cudaStream_t stream);
// The gradient's transpose rotation, in place on dqkv.
void rope_backward_qkv(__nv_bfloat16* dqkv, const RopeDeviceTable& table, int64_t b, int64_t s, int64_t H, int64_t G,
                       int64_t D, cudaStream_t stream);

}  // namespace laoyao::kernels::cuda
