// Causal self-attention on Megatron-Core's fused QKV layout (core attention of DotProductAttention:
// baddbmm with alpha = scale, causal masked_fill(-10000), softmax, P @ V), with GQA read in place.
// Per (batch, head) the two GEMMs go through OpenBLAS sgemm with leading dimensions that stride over
// the fused row, so q/k/v/ctx are never copied. These sgemm calls run inside OpenMP regions;
// OpenBLAS (pthread build) is safe to call concurrently and runs these small GEMMs on the calling
// thread.
//
// Masking: Megatron fills masked scores with -10000.0 and runs the softmax over all s keys. In fp32
// exp(-10000 - max) is exactly 0 whenever the row's max score exceeds about -9900 (always, for any
// trainable model), so this reference takes the softmax over keys j <= i only and stores exact zeros
// above the diagonal; that is the same result without the sentinel. Keys before a query's
// key_start (another document, --reset-attention-mask) are masked the same way.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/qkv_layout.hpp"

namespace laoyao::kernels::cpu {
namespace {

// Query i of a sequence attends keys [first_key(i), i].
void check_key_start(const int32_t* key_start, int64_t b, int64_t s) {
  if (!key_start) return;
  for (int64_t t = 0; t < b * s; ++t)
    if (key_start[t] < 0 || key_start[t] > t % s)
      throw Error("attention: key_start[" + std::to_string(t) + "] = " + std::to_string(key_start[t]) +
                  " is outside [0, " + std::to_string(t % s) + "] (a query's first key is at or before it)");
}

}  // namespace

void attention_forward(const float* qkv, float* ctx, float* probs, int64_t b, int64_t s, int64_t H, int64_t G,
                       int64_t D, float scale, const float* dropout_mask, const int32_t* key_start) {
  const QkvLayout L("attention", H, G, D);
  if (b == 0 || s == 0) return;
  check_key_start(key_start, b, s);
  const int64_t HD = H * D;
#pragma omp parallel
  {
  std::vector<float> dropped(dropout_mask ? s * s : 0);
#pragma omp for schedule(static)
  for (int64_t bh = 0; bh < b * H; ++bh) {
    const int64_t bi = bh / H, h = bh % H, g = L.group_of(h);
    const float* base = qkv + bi * s * L.row;
    float* P = probs + bh * s * s;
    // S = scale * Q K^T (the scale in the GEMM's alpha, as baddbmm's).
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, s, s, D, scale, base + L.q(h), L.row, base + L.k(g),
                L.row, 0.0f, P, s);
    for (int64_t i = 0; i < s; ++i) {
      float* p = P + i * s;
      const int64_t j0 = key_start ? key_start[bi * s + i] : 0;
      float m = p[j0];
      for (int64_t j = j0 + 1; j <= i; ++j) m = std::max(m, p[j]);
      double sum = 0.0;  // the row sum in double: cheap, exact enough to leave only exp's rounding
      for (int64_t j = j0; j <= i; ++j) {
        p[j] = std::exp(p[j] - m);
        sum += p[j];
      }
      const float inv = static_cast<float>(1.0 / sum);
      for (int64_t j = j0; j <= i; ++j) p[j] *= inv;
      for (int64_t j = 0; j < j0; ++j) p[j] = 0.0f;     // other documents' keys: zero probability
      for (int64_t j = i + 1; j < s; ++j) p[j] = 0.0f;  // future keys: exactly zero probability
    }
    // Attention dropout acts on the probabilities that multiply V; the saved probs stay undropped.
    const float* PV = P;
    if (dropout_mask) {
      const float* mask = dropout_mask + bh * s * s;
      for (int64_t i = 0; i < s * s; ++i) dropped[i] = P[i] * mask[i];
      PV = dropped.data();
    }
    // ctx[:, h*D:(h+1)*D] = P V
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s, D, s, 1.0f, PV, s, base + L.v(g), L.row, 0.0f,
                ctx + bi * s * HD + h * D, HD);
  }
  }
}

void attention_backward(const float* qkv, const float* probs, const float* dctx, float* dqkv, int64_t b, int64_t s,
                        int64_t H, int64_t G, int64_t D, float scale, const float* dropout_mask,
                        const int32_t* key_start) {
  const QkvLayout L("attention", H, G, D);
  if (b == 0 || s == 0) return;
  check_key_start(key_start, b, s);
  const int64_t HD = H * D;
  // One work item per (batch, query group): the group's heads all add into the same dk/dv, so they
  // are summed by one thread, in head order (deterministic for any thread count).
#pragma omp parallel
  {
    std::vector<float> dS(s * s), dropped(dropout_mask ? s * s : 0);
#pragma omp for schedule(static)
    for (int64_t bg = 0; bg < b * G; ++bg) {
      const int64_t bi = bg / G, g = bg % G;
      const float* base = qkv + bi * s * L.row;
      float* dbase = dqkv + bi * s * L.row;
      for (int64_t i = 0; i < L.Q; ++i) {
        const int64_t h = g * L.Q + i;
        const float* P = probs + (bi * H + h) * s * s;
        const float* dC = dctx + bi * s * HD + h * D;
        // The group's first head overwrites dk/dv (beta 0), the others add.
        const float beta = i == 0 ? 0.0f : 1.0f;
        const float* mask = dropout_mask ? dropout_mask + (bi * H + h) * s * s : nullptr;
        const float* PV = P;  // the probabilities V was multiplied by (after dropout)
        if (mask) {
          for (int64_t e = 0; e < s * s; ++e) dropped[e] = P[e] * mask[e];
          PV = dropped.data();
        }
        // dV (+)= P^T dC
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, s, D, s, 1.0f, PV, s, dC, HD, beta, dbase + L.v(g),
                    L.row);
        // dP = dC V^T, then softmax backward dS = P * (dP - rowsum(P * dP)). Masked entries have
        // P = 0 and get dS = 0.
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, s, s, D, 1.0f, dC, HD, base + L.v(g), L.row, 0.0f,
                    dS.data(), s);
        if (mask)  // through the dropout: d(P) = d(P * mask) * mask
          for (int64_t e = 0; e < s * s; ++e) dS[e] *= mask[e];
        for (int64_t r = 0; r < s; ++r) {
          const float* p = P + r * s;
          float* d = dS.data() + r * s;
          const int64_t j0 = key_start ? key_start[bi * s + r] : 0;
          double dot = 0.0;
          for (int64_t j = j0; j <= r; ++j) dot += static_cast<double>(p[j]) * d[j];
          const float dotf = static_cast<float>(dot);
          for (int64_t j = j0; j <= r; ++j) d[j] = p[j] * (d[j] - dotf);
          for (int64_t j = 0; j < j0; ++j) d[j] = 0.0f;
          for (int64_t j = r + 1; j < s; ++j) d[j] = 0.0f;
        }
        // dQ = scale * dS K (overwrite); dK (+)= scale * dS^T Q
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s, D, s, scale, dS.data(), s, base + L.k(g), L.row,
                    0.0f, dbase + L.q(h), L.row);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, s, D, s, scale, dS.data(), s, base + L.q(h), L.row,
                    beta, dbase + L.k(g), L.row);
      }
    }
  }
}

}  // namespace laoyao::kernels::cpu
