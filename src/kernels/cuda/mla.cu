// Multi-latent attention's query, key and value (see mla.hpp). Memory-bound and small beside the
// up projections' GEMMs: one block per token (grid-stride), threads over its heads' values.
#include <algorithm>
#include <string>

#include "core/error.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/mla.hpp"

namespace laoyao::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;
constexpr int kThreads = 128;

__device__ inline float ld(const bf16* p, int64_t i) { return __bfloat162float(p[i]); }

// Output j of MLA's interleaved RoPE of x (dr values): the pair (x[2i], x[2i+1]) rotated into
// out[i] and out[i + half]; products rounded before the sum, as the CPU op.
__device__ inline float rope_out(const bf16* x, int64_t j, const float* c, const float* s, int64_t half) {
  if (j < half) return __fsub_rn(__fmul_rn(ld(x, 2 * j), c[j]), __fmul_rn(ld(x, 2 * j + 1), s[j]));
  if (j < 2 * half) {
    const int64_t i = j - half;
    return __fadd_rn(__fmul_rn(ld(x, 2 * i + 1), c[i]), __fmul_rn(ld(x, 2 * i), s[i]));
  }
  return ld(x, j);
}

// Input j's gradient given the output gradient (a = dout[i], b = dout[i + half] of the pair i = j / 2).
__device__ inline float rope_grad(float a, float b, int64_t j, const float* c, const float* s) {
  const int64_t i = j / 2;
  return j % 2 == 0 ? __fadd_rn(__fmul_rn(a, c[i]), __fmul_rn(b, s[i]))
                    : __fsub_rn(__fmul_rn(b, c[i]), __fmul_rn(a, s[i]));
}

__global__ void mla_forward_kernel(const bf16* __restrict__ q, const bf16* __restrict__ kv,
                                   const bf16* __restrict__ k_pe, int64_t k_pe_ld, RopeDeviceTable table,
                                   bf16* __restrict__ query, bf16* __restrict__ key, bf16* __restrict__ value,
                                   MlaDims d) {
  const int64_t T = d.b * d.s, dq = d.dqk + d.dr, half = table.rot_dim / 2;
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    const float *c = table.cos + (t % d.s) * half, *s = table.sin + (t % d.s) * half;  // (position t % s)
    for (int64_t e = threadIdx.x; e < d.H * dq; e += blockDim.x) {
      const int64_t h = e / dq, j = e % dq;
      const bf16* qh = q + (t * d.H + h) * dq;
      const bf16* kvh = kv + (t * d.H + h) * (d.dqk + d.dv);
      const int64_t o = t * d.H * dq + e;
      if (j < d.dqk) {
        query[o] = qh[j];
        key[o] = kvh[j];
      } else {
        query[o] = __float2bfloat16(rope_out(qh + d.dqk, j - d.dqk, c, s, half));
        key[o] = __float2bfloat16(rope_out(k_pe + t * k_pe_ld, j - d.dqk, c, s, half));  // shared by every head
      }
    }
    for (int64_t e = threadIdx.x; e < d.H * d.dv; e += blockDim.x) {
      const int64_t h = e / d.dv, j = e % d.dv;
      value[t * d.H * d.dv + e] = kv[(t * d.H + h) * (d.dqk + d.dv) + d.dqk + j];
    }
  }
}

__global__ void mla_backward_kernel(const bf16* __restrict__ dquery, const bf16* __restrict__ dkey,
                                    const bf16* __restrict__ dvalue, RopeDeviceTable table, bf16* __restrict__ dq_out,
                                    bf16* __restrict__ dkv, bf16* __restrict__ dk_pe, int64_t dk_pe_ld, MlaDims d) {
  const int64_t T = d.b * d.s, dq = d.dqk + d.dr, half = table.rot_dim / 2;
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    const float *c = table.cos + (t % d.s) * half, *s = table.sin + (t % d.s) * half;  // (position t % s)
    for (int64_t e = threadIdx.x; e < d.H * dq; e += blockDim.x) {
      const int64_t h = e / dq, j = e % dq;
      const bf16* g = dquery + (t * d.H + h) * dq;
      float x;
      if (j < d.dqk)
        x = ld(g, j);
      else if (j - d.dqk < 2 * half)
        x = rope_grad(ld(g, d.dqk + (j - d.dqk) / 2), ld(g, d.dqk + (j - d.dqk) / 2 + half), j - d.dqk, c, s);
      else
        x = ld(g, j);
      dq_out[t * d.H * dq + e] = __float2bfloat16(x);
    }
    const int64_t kv_row = d.dqk + d.dv;
    for (int64_t e = threadIdx.x; e < d.H * kv_row; e += blockDim.x) {
      const int64_t h = e / kv_row, j = e % kv_row;
      dkv[t * d.H * kv_row + e] =
          j < d.dqk ? dkey[(t * d.H + h) * dq + j] : dvalue[(t * d.H + h) * d.dv + (j - d.dqk)];
    }
    // The shared key served every head: its gradient is the heads' sum (fp32), rotated back.
    for (int64_t j = threadIdx.x; j < d.dr; j += blockDim.x) {
      auto head_sum = [&](int64_t col) {
        float acc = 0.0f;
        for (int64_t h = 0; h < d.H; ++h) acc += ld(dkey, (t * d.H + h) * dq + d.dqk + col);
        return acc;
      };
      const float x = j < 2 * half ? rope_grad(head_sum(j / 2), head_sum(j / 2 + half), j, c, s) : head_sum(j);
      dk_pe[t * dk_pe_ld + j] = __float2bfloat16(x);
    }
  }
}

void check(const char* what, const RopeDeviceTable& table, const MlaDims& d) {
  if (d.b <= 0 || d.s <= 0 || d.H <= 0 || d.dqk <= 0 || d.dr <= 0 || d.dv <= 0)
    throw Error(std::string(what) + ": every dimension must be positive");
  if (table.rot_dim > d.dr || table.rot_dim % 2 != 0 || !table.cos || !table.sin)
    throw Error(std::string(what) + ": the rotary table rotates " + std::to_string(table.rot_dim) +
                " dims but qk_pos_emb_head_dim is " + std::to_string(d.dr));
  if (d.s > table.max_positions)
    throw Error(std::string(what) + ": sequence length " + std::to_string(d.s) + " beyond the table's " +
                std::to_string(table.max_positions) + " positions");
}

int grid(const MlaDims& d) { return static_cast<int>(std::min<int64_t>(d.b * d.s, 65535)); }

}  // namespace

void mla_prepare_forward(const bf16* q, const bf16* kv, const bf16* k_pe, int64_t k_pe_ld, const RopeDeviceTable& table,
                         bf16* query, bf16* key, bf16* value, const MlaDims& d, cudaStream_t stream) {
  check("mla_prepare_forward", table, d);
  mla_forward_kernel<<<grid(d), kThreads, 0, stream>>>(q, kv, k_pe, k_pe_ld, table, query, key, value, d);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

void mla_prepare_backward(const bf16* dquery, const bf16* dkey, const bf16* dvalue, const RopeDeviceTable& table,
                          bf16* dq, bf16* dkv, bf16* dk_pe, int64_t dk_pe_ld, const MlaDims& d, cudaStream_t stream) {
  check("mla_prepare_backward", table, d);
  mla_backward_kernel<<<grid(d), kThreads, 0, stream>>>(dquery, dkey, dvalue, table, dq, dkv, dk_pe, dk_pe_ld, d);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

}  // namespace laoyao::kernels::cuda
