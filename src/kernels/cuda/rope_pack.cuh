// RoPE on one lane's 16-byte pack of a head row, for kernels that hold a head row across kLanes
// lanes of a warp, 8 values a lane (kernels/cuda/rope.cu, and qk_norm.cu where the rotation joins
// the QK norm in one pass). Megatron-Core's non-interleaved rotate_half: value i < half pairs with
// i + half, which lies half/8 packs away in another lane of the same group, fetched by a shuffle.
// Needs half % 8 == 0 (rope_packable, rope.hpp). Every lane of the group must call it (the
// shuffle), each with the same p; lanes past the rotated dims keep their values.
#pragma once
#include <cuda_runtime.h>

#include "kernels/cuda/rope.hpp"

namespace laoyao::kernels::cuda {

// v[8]: this lane's values (fp32) of a row at position p; lane: its pack index in the row; mask:
// the group's lanes in the warp. Forward: x1 c - x2 s, x2 c + x1 s; backward (the transpose):
// d1 c + d2 s, d2 c - d1 s.
template <int kLanes, bool kBackward>
__device__ __forceinline__ void rope_pack(float (&v)[8], int lane, unsigned mask, const RopeDeviceTable& t, int64_t p) {
  const int half = int(t.rot_dim / 2), hp = half / 8;  // hp: packs per half
  const bool first = lane < hp, second = !first && lane < 2 * hp;
  const int partner = first ? lane + hp : second ? lane - hp : lane;
  float w[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) w[e] = __shfl_sync(mask, v[e], partner, kLanes);
  if (!first && !second) return;
  const int i0 = (first ? lane : lane - hp) * 8;
  const float4* c4 = reinterpret_cast<const float4*>(t.cos + p * half + i0);
  const float4* s4 = reinterpret_cast<const float4*>(t.sin + p * half + i0);
  const float4 ca = c4[0], cb = c4[1], sa = s4[0], sb = s4[1];
  const float c[8] = {ca.x, ca.y, ca.z, ca.w, cb.x, cb.y, cb.z, cb.w};
  const float s[8] = {sa.x, sa.y, sa.z, sa.w, sb.x, sb.y, sb.z, sb.w};
  const float sign = (first != kBackward) ? -1.0f : 1.0f;
#pragma unroll
  for (int e = 0; e < 8; ++e) v[e] = v[e] * c[e] + sign * w[e] * s[e];
}

// The mask of the kLanes-lane group that `lane_in_warp` belongs to.
template <int kLanes>
__device__ __forceinline__ unsigned group_mask(int lane_in_warp) {
  if constexpr (kLanes == 32) {
    return 0xffffffffu;
  } else {
    return ((1u << kLanes) - 1u) << (lane_in_warp / kLanes * kLanes);
  }
}

}  // namespace laoyao::kernels::cuda
