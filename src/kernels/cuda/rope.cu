// RoPE on the fused QKV rows (see rope.hpp): one thread per (token, q/k slot, rotated pair).
#include <string>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/rope.hpp"

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
