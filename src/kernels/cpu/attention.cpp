// Causal self-attention (core attention of DotProductAttention: baddbmm with alpha = scale, causal
// masked_fill(-10000), softmax, P @ V) on Megatron-Core's fused QKV layout, with GQA read in place,
// or on separate q, k, v buffers whose head dims may differ (MLA's query and key of 192, value 128).
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

// Query t attends keys [key_start[t], its place]: its place i = t % s, or under context
// parallelism key_end[t].
void check_key_start(const int32_t* key_start, const int32_t* key_end, int64_t b, int64_t s) {
  if (!key_start) return;
  for (int64_t t = 0; t < b * s; ++t) {
    const int64_t place = key_end ? key_end[t] : t % s;
    if (key_start[t] < 0 || key_start[t] > place)
      throw Error("attention: key_start[" + std::to_string(t) + "] = " + std::to_string(key_start[t]) +
                  " is outside [0, " + std::to_string(place) + "] (a query's first key is at or before it)");
  }
}

// Where the heads live: q head h at q + row * q_ld + q_col(h), its group's k and v likewise, each
// token's ctx at ctx + row * H * Dv + h * Dv. The fused QKV rows (one buffer, QkvLayout's columns)
// and separate q, k, v buffers (MLA's, heads of unequal q/k and v dims) are two views of one kernel.
struct HeadsView {
  int64_t H, G, Dqk, Dv;
  int64_t q_ld, k_ld, v_ld;
  int64_t Q() const { return H / G; }
  // fused: QkvLayout's columns; separate (G == H): head-major.
  const QkvLayout* fused = nullptr;
  int64_t q_col(int64_t h) const { return fused ? fused->q(h) : h * Dqk; }
  int64_t k_col(int64_t g) const { return fused ? fused->k(g) : g * Dqk; }
  int64_t v_col(int64_t g) const { return fused ? fused->v(g) : g * Dv; }
};

// Queries: s rows per sequence; keys and values: sk rows (sk == s unless a context-parallel rank's
// queries meet the whole sequence's keys); query i sees keys [key_start[i] (0), key_end[i] (i)].
struct KeyRange {
  int64_t sk;
  const int32_t* key_start;
  const int32_t* key_end;
  int64_t first(int64_t t) const { return key_start ? key_start[t] : 0; }
  int64_t last(int64_t t, int64_t i) const { return key_end ? key_end[t] : i; }
};

void attention_forward_view(const float* q, const float* k, const float* v, const HeadsView& V, float* ctx,
                            float* probs, int64_t b, int64_t s, float scale, const float* dropout_mask,
                            const KeyRange& keys) {
  if (b == 0 || s == 0) return;
  check_key_start(keys.key_start, keys.key_end, b, s);
  const int64_t H = V.H, HD = H * V.Dv, sk = keys.sk;
#pragma omp parallel
  {
  std::vector<float> dropped(dropout_mask ? s * sk : 0);
#pragma omp for schedule(static)
  for (int64_t bh = 0; bh < b * H; ++bh) {
    const int64_t bi = bh / H, h = bh % H, g = h / V.Q();
    float* P = probs + bh * s * sk;
    // S = scale * Q K^T (the scale in the GEMM's alpha, as baddbmm's).
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, s, sk, V.Dqk, scale, q + bi * s * V.q_ld + V.q_col(h), V.q_ld,
                k + bi * sk * V.k_ld + V.k_col(g), V.k_ld, 0.0f, P, sk);
    for (int64_t i = 0; i < s; ++i) {
      float* p = P + i * sk;
      const int64_t j0 = keys.first(bi * s + i), j1 = keys.last(bi * s + i, i);
      float m = p[j0];
      for (int64_t j = j0 + 1; j <= j1; ++j) m = std::max(m, p[j]);
      double sum = 0.0;  // the row sum in double: cheap, exact enough to leave only exp's rounding
      for (int64_t j = j0; j <= j1; ++j) {
        p[j] = std::exp(p[j] - m);
        sum += p[j];
      }
      const float inv = static_cast<float>(1.0 / sum);
      for (int64_t j = j0; j <= j1; ++j) p[j] *= inv;
      for (int64_t j = 0; j < j0; ++j) p[j] = 0.0f;       // other documents' keys: zero probability
      for (int64_t j = j1 + 1; j < sk; ++j) p[j] = 0.0f;  // future keys: exactly zero probability
    }
    // Attention dropout acts on the probabilities that multiply V; the saved probs stay undropped.
    const float* PV = P;
    if (dropout_mask) {
      const float* mask = dropout_mask + bh * s * sk;
      for (int64_t i = 0; i < s * sk; ++i) dropped[i] = P[i] * mask[i];
      PV = dropped.data();
    }
    // ctx[:, h*Dv:(h+1)*Dv] = P V
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s, V.Dv, sk, 1.0f, PV, sk,
                v + bi * sk * V.v_ld + V.v_col(g), V.v_ld, 0.0f, ctx + bi * s * HD + h * V.Dv, HD);
  }
  }
}

// dq, dk, dv: the gradients' buffers, in the view's layout (the fused one: all three one buffer,
// unless the keys are another rank's rows too: context parallelism).
void attention_backward_view(const float* q, const float* k, const float* v, const HeadsView& V, const float* probs,
                             const float* dctx, float* dq, float* dk, float* dv, int64_t b, int64_t s, float scale,
                             const float* dropout_mask, const KeyRange& keys) {
  if (b == 0 || s == 0) return;
  check_key_start(keys.key_start, keys.key_end, b, s);
  const int64_t H = V.H, G = V.G, HD = H * V.Dv, Dqk = V.Dqk, Dv = V.Dv, sk = keys.sk;
  // One work item per (batch, query group): the group's heads all add into the same dk/dv, so they
  // are summed by one thread, in head order (deterministic for any thread count).
#pragma omp parallel
  {
    std::vector<float> dS(s * sk), dropped(dropout_mask ? s * sk : 0);
#pragma omp for schedule(static)
    for (int64_t bg = 0; bg < b * G; ++bg) {
      const int64_t bi = bg / G, g = bg % G;
      const float* kg = k + bi * sk * V.k_ld + V.k_col(g);
      const float* vg = v + bi * sk * V.v_ld + V.v_col(g);
      float* dkg = dk + bi * sk * V.k_ld + V.k_col(g);
      float* dvg = dv + bi * sk * V.v_ld + V.v_col(g);
      for (int64_t i = 0; i < V.Q(); ++i) {
        const int64_t h = g * V.Q() + i;
        const float* P = probs + (bi * H + h) * s * sk;
        const float* dC = dctx + bi * s * HD + h * Dv;
        // The group's first head overwrites dk/dv (beta 0), the others add.
        const float beta = i == 0 ? 0.0f : 1.0f;
        const float* mask = dropout_mask ? dropout_mask + (bi * H + h) * s * sk : nullptr;
        const float* PV = P;  // the probabilities V was multiplied by (after dropout)
        if (mask) {
          for (int64_t e = 0; e < s * sk; ++e) dropped[e] = P[e] * mask[e];
          PV = dropped.data();
        }
        // dV (+)= P^T dC
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, sk, Dv, s, 1.0f, PV, sk, dC, HD, beta, dvg, V.v_ld);
        // dP = dC V^T, then softmax backward dS = P * (dP - rowsum(P * dP)). Masked entries have
        // P = 0 and get dS = 0.
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, s, sk, Dv, 1.0f, dC, HD, vg, V.v_ld, 0.0f, dS.data(), sk);
        if (mask)  // through the dropout: d(P) = d(P * mask) * mask
          for (int64_t e = 0; e < s * sk; ++e) dS[e] *= mask[e];
        for (int64_t r = 0; r < s; ++r) {
          const float* p = P + r * sk;
          float* d = dS.data() + r * sk;
          const int64_t j0 = keys.first(bi * s + r), j1 = keys.last(bi * s + r, r);
          double dot = 0.0;
          for (int64_t j = j0; j <= j1; ++j) dot += static_cast<double>(p[j]) * d[j];
          const float dotf = static_cast<float>(dot);
          for (int64_t j = j0; j <= j1; ++j) d[j] = p[j] * (d[j] - dotf);
          for (int64_t j = 0; j < j0; ++j) d[j] = 0.0f;
          for (int64_t j = j1 + 1; j < sk; ++j) d[j] = 0.0f;
        }
        // dQ = scale * dS K (overwrite); dK (+)= scale * dS^T Q
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s, Dqk, sk, scale, dS.data(), sk, kg, V.k_ld, 0.0f,
                    dq + bi * s * V.q_ld + V.q_col(h), V.q_ld);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, sk, Dqk, s, scale, dS.data(), sk,
                    q + bi * s * V.q_ld + V.q_col(h), V.q_ld, beta, dkg, V.k_ld);
      }
    }
  }
}

HeadsView fused_view(const QkvLayout& L) { return {L.H, L.G, L.D, L.D, L.row, L.row, L.row, &L}; }

HeadsView separate_view(const char* what, int64_t H, int64_t Dqk, int64_t Dv) {
  if (H <= 0 || Dqk <= 0 || Dv <= 0)
    throw Error(std::string(what) + ": heads (" + std::to_string(H) + "), q/k head dim (" + std::to_string(Dqk) +
                ") and v head dim (" + std::to_string(Dv) + ") must be positive");
  return {H, H, Dqk, Dv, H * Dqk, H * Dqk, H * Dv, nullptr};
}

// Each query's place in the whole sequence of sk keys.
void check_query_positions(const int32_t* query_positions, int64_t b, int64_t s, int64_t sk) {
  for (int64_t t = 0; t < b * s; ++t)
    if (query_positions[t] < 0 || query_positions[t] >= sk)
      throw Error("context_parallel_attention: query " + std::to_string(t) + " at position " +
                  std::to_string(query_positions[t]) + " outside the sequence of " + std::to_string(sk));
}

}  // namespace

void attention_forward(const float* qkv, float* ctx, float* probs, int64_t b, int64_t s, int64_t H, int64_t G,
                       int64_t D, float scale, const float* dropout_mask, const int32_t* key_start) {
  const QkvLayout L("attention", H, G, D);
  attention_forward_view(qkv, qkv, qkv, fused_view(L), ctx, probs, b, s, scale, dropout_mask, {s, key_start, nullptr});
}

void attention_backward(const float* qkv, const float* probs, const float* dctx, float* dqkv, int64_t b, int64_t s,
                        int64_t H, int64_t G, int64_t D, float scale, const float* dropout_mask,
                        const int32_t* key_start) {
  const QkvLayout L("attention", H, G, D);
  attention_backward_view(qkv, qkv, qkv, fused_view(L), probs, dctx, dqkv, dqkv, dqkv, b, s, scale, dropout_mask,
                          {s, key_start, nullptr});
}

void separate_attention_forward(const float* q, const float* k, const float* v, float* ctx, float* probs, int64_t b,
                                int64_t s, int64_t H, int64_t Dqk, int64_t Dv, float scale, const float* dropout_mask,
                                const int32_t* key_start) {
  attention_forward_view(q, k, v, separate_view("separate_attention_forward", H, Dqk, Dv), ctx, probs, b, s, scale,
                         dropout_mask, {s, key_start, nullptr});
}

void separate_attention_backward(const float* q, const float* k, const float* v, const float* probs, const float* dctx,
                                 float* dq, float* dk, float* dv, int64_t b, int64_t s, int64_t H, int64_t Dqk,
                                 int64_t Dv, float scale, const float* dropout_mask, const int32_t* key_start) {
  attention_backward_view(q, k, v, separate_view("separate_attention_backward", H, Dqk, Dv), probs, dctx, dq, dk, dv,
                          b, s, scale, dropout_mask, {s, key_start, nullptr});
}

void context_parallel_attention_forward(const float* qkv, const float* qkv_full, float* ctx, float* probs, int64_t b,
                                        int64_t s, int64_t sk, int64_t H, int64_t G, int64_t D, float scale,
                                        const int32_t* query_positions, const float* dropout_mask,
                                        const int32_t* key_start) {
  const QkvLayout L("context_parallel_attention", H, G, D);
  check_query_positions(query_positions, b, s, sk);
  attention_forward_view(qkv, qkv_full, qkv_full, fused_view(L), ctx, probs, b, s, scale, dropout_mask,
                         {sk, key_start, query_positions});
}

void context_parallel_attention_backward(const float* qkv, const float* qkv_full, const float* probs,
                                         const float* dctx, float* dqkv, float* dqkv_full, int64_t b, int64_t s,
                                         int64_t sk, int64_t H, int64_t G, int64_t D, float scale,
                                         const int32_t* query_positions, const float* dropout_mask,
                                         const int32_t* key_start) {
  const QkvLayout L("context_parallel_attention", H, G, D);
  std::fill(dqkv, dqkv + b * s * L.row, 0.0f);  // (k and v slots: written to dqkv_full)
  std::fill(dqkv_full, dqkv_full + b * sk * L.row, 0.0f);  // (q slots: written to dqkv)
  attention_backward_view(qkv, qkv_full, qkv_full, fused_view(L), probs, dctx, dqkv, dqkv_full, dqkv_full, b, s,
                          scale, dropout_mask, {sk, key_start, query_positions});
}

void context_parallel_separate_attention_forward(const float* q, const float* k_full, const float* v_full, float* ctx,
                                                 float* probs, int64_t b, int64_t s, int64_t sk, int64_t H,
                                                 int64_t Dqk, int64_t Dv, float scale, const int32_t* query_positions,
                                                 const float* dropout_mask, const int32_t* key_start) {
  check_query_positions(query_positions, b, s, sk);
  attention_forward_view(q, k_full, v_full, separate_view("context_parallel_separate_attention", H, Dqk, Dv), ctx,
                         probs, b, s, scale, dropout_mask, {sk, key_start, query_positions});
}

void context_parallel_separate_attention_backward(const float* q, const float* k_full, const float* v_full,
                                                  const float* probs, const float* dctx, float* dq, float* dk_full,
                                                  float* dv_full, int64_t b, int64_t s, int64_t sk, int64_t H,
                                                  int64_t Dqk, int64_t Dv, float scale, const int32_t* query_positions,
                                                  const float* dropout_mask, const int32_t* key_start) {
  check_query_positions(query_positions, b, s, sk);  // (one key and value per head: each overwritten once)
  attention_backward_view(q, k_full, v_full, separate_view("context_parallel_separate_attention", H, Dqk, Dv), probs,
                          dctx, dq, dk_full, dv_full, b, s, scale, dropout_mask, {sk, key_start, query_positions});
}

}  // namespace laoyao::kernels::cpu
