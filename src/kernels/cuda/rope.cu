// RoPE on the fused QKV rows (see rope.hpp). Memory-bound: where the rotated half is a multiple of
// 8 values, D <= 256 and the rows are 16-byte aligned, each q or k head row is held by a group of
// lanes, 16 bytes a lane (rope_pack.cuh), and only the rotated packs are written back; otherwise
// one thread per (token, q/k slot, rotated pair). Same fp32 arithmetic on both paths.
#include <cstdint>
#include <string>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/rope.hpp"
#include "kernels/cuda/rope_pack.cuh"

namespace laoyao::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;
constexpr int kThreads = 256;

// Forward: out[i] = x[i] cos - x[i+half] sin, out[i+half] = x[i+half] cos + x[i] sin.
// Backward (the transpose): dx[i] = dy[i] cos + dy[i+half] sin, dx[i+half] = dy[i+half] cos - dy[i] sin.
template <bool kBackward>
__global__ void rope_kernel(bf16* __restrict__ qkv, const float* __restrict__ cos_t, const float* __restrict__ sin_t,
                            int64_t T, int64_t s, int64_t Q, int64_t G, int64_t D, int64_t half) {
  const int64_t slots = G * (Q + 1);  // per token: each group's Q q heads and its k
  const int64_t n = T * slots * half;
  const int64_t row = G * (Q + 2) * D;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = e % half, slot = (e / half) % slots, t = e / (half * slots);
    const int64_t g = slot / (Q + 1), j = slot % (Q + 1);  // j < Q: q head g*Q + j; j == Q: the group's k
    bf16* x = qkv + t * row + (g * (Q + 2) + j) * D;
    const int64_t p = t % s;
    const float c = cos_t[p * half + i], sn = sin_t[p * half + i];
    const float x1 = __bfloat162float(x[i]), x2 = __bfloat162float(x[i + half]);
    if (!kBackward) {
      x[i] = __float2bfloat16(x1 * c - x2 * sn);
      x[i + half] = __float2bfloat16(x2 * c + x1 * sn);
    } else {
      x[i] = __float2bfloat16(x1 * c + x2 * sn);
      x[i + half] = __float2bfloat16(x2 * c - x1 * sn);
    }
  }
}

struct alignas(16) Pack8 {
  bf16 v[8];
};

constexpr int kMaxPackD = 256;  // 32 lanes x 8 values

// One q or k head row per kLanes lanes: rows = T * G * (Q + 1), row r is token r / (G (Q+1)), slot
// j = r % (G (Q+1)) of the q/k slots (group j / (Q+1), its q heads then its k).
template <int kLanes, bool kBackward>
__global__ void __launch_bounds__(kThreads)
    rope_pack_kernel(bf16* __restrict__ qkv, RopeDeviceTable t, int64_t rows, int64_t s, int Q, int G, int D) {
  const int lane = threadIdx.x % kLanes, packs = D / 8;
  const int64_t r = int64_t(blockIdx.x) * (kThreads / kLanes) + threadIdx.x / kLanes;
  if (r >= rows) return;  // the whole group leaves together
  const int qk = G * (Q + 1);
  const int64_t tok = r / qk;
  const int j = int(r - tok * qk), g = j / (Q + 1);
  Pack8* row = reinterpret_cast<Pack8*>(qkv + (tok * G * (Q + 2) + g * (Q + 2) + (j - g * (Q + 1))) * D);
  const bool live = lane < packs;
  float v[8] = {};
  if (live) {
    const Pack8 x = row[lane];
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = __bfloat162float(x.v[e]);
  }
  rope_pack<kLanes, kBackward>(v, lane, group_mask<kLanes>(int(threadIdx.x & 31)), t, tok % s);
  if (!live || lane >= int(t.rot_dim / 8)) return;  // the dims past rot_dim stay as they are
  Pack8 y;
#pragma unroll
  for (int e = 0; e < 8; ++e) y.v[e] = __float2bfloat16(v[e]);
  row[lane] = y;
}

template <int kLanes, bool kBackward>
void launch_pack(bf16* qkv, const RopeDeviceTable& tb, int64_t rows, int64_t s, int Q, int G, int D,
                 cudaStream_t stream) {
  constexpr int per_block = kThreads / kLanes;
  const int64_t blocks = (rows + per_block - 1) / per_block;
  if (blocks > int64_t(0x7fffffff)) throw Error("rope: too many rows for one launch");
  rope_pack_kernel<kLanes, kBackward><<<unsigned(blocks), kThreads, 0, stream>>>(qkv, tb, rows, s, Q, G, D);
}

template <bool kBackward>
void launch(bf16* qkv, const RopeDeviceTable& tb, int64_t b, int64_t s, int64_t H, int64_t G, int64_t D,
            cudaStream_t stream) {
  if (b <= 0 || s <= 0) return;
  if (H <= 0 || G <= 0 || H % G != 0 || tb.rot_dim <= 0 || tb.rot_dim > D || tb.rot_dim % 2 != 0)
    throw Error("rope: unsupported shape H=" + std::to_string(H) + " G=" + std::to_string(G) +
                " D=" + std::to_string(D) + " rot_dim=" + std::to_string(tb.rot_dim));
  if (s > tb.max_positions)
    throw Error("rope: sequence length " + std::to_string(s) + " beyond the table's " +
                std::to_string(tb.max_positions) + " positions");
  if (rope_packable(tb) && D % 8 == 0 && D <= kMaxPackD && reinterpret_cast<uintptr_t>(qkv) % 16 == 0) {
    const int64_t rows = b * s * (H + G);
    const int Q = int(H / G), g = int(G), d = int(D);
    int lanes = 1;
    while (lanes < D / 8) lanes *= 2;
    switch (lanes) {
      case 1: launch_pack<1, kBackward>(qkv, tb, rows, s, Q, g, d, stream); break;
      case 2: launch_pack<2, kBackward>(qkv, tb, rows, s, Q, g, d, stream); break;
      case 4: launch_pack<4, kBackward>(qkv, tb, rows, s, Q, g, d, stream); break;
      case 8: launch_pack<8, kBackward>(qkv, tb, rows, s, Q, g, d, stream); break;
      case 16: launch_pack<16, kBackward>(qkv, tb, rows, s, Q, g, d, stream); break;
      default: launch_pack<32, kBackward>(qkv, tb, rows, s, Q, g, d, stream); break;
    }
    LAOYAO_CUDA_CHECK(cudaGetLastError());
    return;
  }
  const int64_t half = tb.rot_dim / 2, n = b * s * G * (H / G + 1) * half;
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  rope_kernel<kBackward><<<unsigned(blocks < 65536 ? blocks : 65536), kThreads, 0, stream>>>(
      qkv, tb.cos, tb.sin, b * s, s, H / G, G, D, half);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void rope_forward_qkv(bf16* qkv, const RopeDeviceTable& table, int64_t b, int64_t s, int64_t H, int64_t G, int64_t D,
                      cudaStream_t stream) {
  launch<false>(qkv, table, b, s, H, G, D, stream);
}

void rope_backward_qkv(bf16* dqkv, const RopeDeviceTable& table, int64_t b, int64_t s, int64_t H, int64_t G, int64_t D,
                       cudaStream_t stream) {
  launch<true>(dqkv, table, b, s, H, G, D, stream);
}

}  // namespace laoyao::kernels::cuda
