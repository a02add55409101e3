// Megatron-Core MoE layer, CPU reference (moe.hpp says what each op means in Megatron).
// Row-wise ops (routing, scores, losses' gradients, permute/unpermute) run one token per OpenMP
// iteration; the sums over tokens (the loss values) and over a token's k choices run in a fixed
// order, so results do not depend on the thread count. Expert GEMMs go through linear_forward /
// linear_backward (OpenBLAS), called outside OpenMP regions.
#include "kernels/cpu/moe.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "core/counter_normal.hpp"
#include "core/error.hpp"
#include "core/rng.hpp"

namespace laoyao::kernels::cpu {
namespace {

// Megatron's epsilon in the sigmoid normalisations (probs over the k, and the aux-loss scores).
constexpr float kSigmoidNormEps = 1e-20f;

inline float sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }

// The score of a logit under the sigmoid-like score functions (probs renormalised over the k):
// sigmoid, or sqrtsoftplus's sqrt(softplus(v)) with PyTorch's softplus (the identity above 20).
inline float gate_score(MoeScoreFunction fn, float v) {
  if (fn == MoeScoreFunction::SqrtSoftplus) return std::sqrt(v > 20.0f ? v : std::log1p(std::exp(v)));
  return sigmoid(v);
}
// Its derivative: sig (1 - sig), or softplus'(v) / (2 sqrt(softplus(v))) (0 where softplus is 0).
inline double gate_score_grad(MoeScoreFunction fn, float v) {
  if (fn == MoeScoreFunction::SqrtSoftplus) {
    const double s = gate_score(fn, v);
    return s > 0.0 ? (v > 20.0f ? 1.0 : static_cast<double>(sigmoid(v))) / (2.0 * s) : 0.0;
  }
  const double sg = sigmoid(v);
  return sg * (1.0 - sg);
}

// Megatron scales with `if scaling_factor: probs = probs * scaling_factor`: None and 0 leave probs as they are.
float topk_scale(const MoeRouterParams& p) {
  return p.topk_scaling_factor && *p.topk_scaling_factor != 0.0f ? *p.topk_scaling_factor : 1.0f;
}

void check_sizes(const char* what, int64_t T, int64_t E, int64_t k) {
  if (T < 0 || E < 1 || k < 1 || k > E)
    throw Error(std::string(what) + ": need T >= 0, E >= 1 and 1 <= k <= E (got T = " + std::to_string(T) +
                ", E = " + std::to_string(E) + ", k = " + std::to_string(k) + ")");
}

// idx[0..k) = the k largest of v[0..E), descending; equal values keep the lower index first (an
// entry displaces a kept one only when strictly greater, and indices arrive in ascending order).
void topk_row(const float* v, int64_t E, int64_t k, int64_t* idx) {
  int64_t n = 0;
  for (int64_t e = 0; e < E; ++e) {
    const float val = v[e];
    if (n == k && !(val > v[idx[k - 1]])) continue;
    int64_t pos = n < k ? n++ : k - 1;
    while (pos > 0 && val > v[idx[pos - 1]]) {
      idx[pos] = idx[pos - 1];
      --pos;
    }
    idx[pos] = e;
  }
}

// s[0..n) = softmax(z[0..n)): max subtracted, the sum in double, as the rest of this reference.
void softmax_row(const float* z, float* s, int64_t n) {
  const float m = *std::max_element(z, z + n);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(z[i] - m));
  const double inv = 1.0 / sum;
  for (int64_t i = 0; i < n; ++i) s[i] = static_cast<float>(std::exp(static_cast<double>(z[i] - m)) * inv);
}

// Sigmoid-like probs over a token's k experts: p = s / (sum s + 1e-20) for k > 1, else s (s the
// gate scores). Returns the denominator (1 for k = 1).
float gate_probs(MoeScoreFunction fn, const float* logits_row, const int64_t* idx, int64_t k, float* p) {
  double sum = 0.0;
  for (int64_t j = 0; j < k; ++j) {
    p[j] = gate_score(fn, logits_row[idx[j]]);
    sum += p[j];
  }
  if (k == 1) return 1.0f;
  const float denom = static_cast<float>(sum) + kSigmoidNormEps;
  for (int64_t j = 0; j < k; ++j) p[j] /= denom;
  return denom;
}

// The k logits of a token's experts and their softmax (pre_softmax = false).
void topk_softmax_probs(const float* logits_row, const int64_t* idx, int64_t k, float* vals, float* p) {
  for (int64_t j = 0; j < k; ++j) vals[j] = logits_row[idx[j]];
  softmax_row(vals, p, k);
}

// rows[0..k) = a token's permuted rows in ascending order (the order of unpermute's scatter_add_).
void sorted_rows(const int64_t* permuted_row_t, int64_t k, int64_t* rows) {
  std::copy(permuted_row_t, permuted_row_t + k, rows);
  std::sort(rows, rows + k);
}

// dlogits_row += d/dlogits of sum_e g[e] * scores[e] through the aux-loss score function.
// Softmax: s * (g - <g, s>). Sigmoid-like: q = sig / D, D = sum sig + 1e-20 (sig the gate scores):
//   d/dsig_m = (g_m - <g, q>) / D, times the gate score's derivative.
void aux_scores_backward_row(const float* logits_row, const float* scores_row, const double* g, int64_t E,
                             MoeScoreFunction fn, float* dlogits_row) {
  double dot = 0.0;
  for (int64_t e = 0; e < E; ++e) dot += g[e] * scores_row[e];
  if (fn == MoeScoreFunction::Softmax) {
    for (int64_t e = 0; e < E; ++e) dlogits_row[e] += static_cast<float>(scores_row[e] * (g[e] - dot));
    return;
  }
  double sum = 0.0;
  for (int64_t e = 0; e < E; ++e) sum += gate_score(fn, logits_row[e]);
  const double denom = static_cast<double>(static_cast<float>(sum) + kSigmoidNormEps);
  for (int64_t e = 0; e < E; ++e)
    dlogits_row[e] += static_cast<float>((g[e] - dot) / denom * gate_score_grad(fn, logits_row[e]));
}

void check_seq(const char* what, int64_t b, int64_t s, int64_t E, int64_t k) {
  check_sizes(what, b * s, E, k);
  if (b < 1 || s < 1)
    throw Error(std::string(what) + ": need b >= 1 sequences of s >= 1 tokens (got b = " + std::to_string(b) +
                ", s = " + std::to_string(s) + ")");
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// router

namespace {

// Megatron's group_limited_topk over one token's scores v[0..E): groups ranked by the sum (fp32,
// descending order) of their k/g largest scores, the experts of the g best kept, the rest -inf in
// `masked`, then the top-k of that. group_score [G] and top [max(k/g, g)] are the caller's scratch.
void group_limited_topk_row(const float* v, int64_t E, int64_t k, int64_t G, int64_t g, float* masked,
                            float* group_score, int64_t* top, int64_t* idx) {
  const int64_t per = E / G, pick = k / g;
  for (int64_t grp = 0; grp < G; ++grp) {
    topk_row(v + grp * per, per, pick, top);
    float sum = 0.0f;
    for (int64_t j = 0; j < pick; ++j) sum += v[grp * per + top[j]];
    group_score[grp] = sum;
  }
  topk_row(group_score, G, g, top);
  std::fill(masked, masked + E, -std::numeric_limits<float>::infinity());
  for (int64_t j = 0; j < g; ++j) std::copy(v + top[j] * per, v + (top[j] + 1) * per, masked + top[j] * per);
  topk_row(masked, E, k, idx);
}

void check_groups(const MoeRouterParams& p, int64_t E, int64_t k) {
  if (p.num_groups == 0 && p.group_topk == 0) return;
  const int64_t G = p.num_groups, g = p.group_topk;
  if (G < 1 || E % G != 0 || g < 1 || g > G || k < g || k > g * (E / G))
    throw Error("moe router: group-limited routing needs num_groups dividing the " + std::to_string(E) +
                " experts, 1 <= group_topk <= num_groups and group_topk <= topk <= group_topk * experts per group "
                "(got num_groups = " + std::to_string(G) + ", group_topk = " + std::to_string(g) + ", topk = " +
                std::to_string(k) + ")");
}

}  // namespace

void moe_router_topk_forward(const float* logits, const float* expert_bias, int64_t* topk_idx, float* topk_probs,
                             int64_t T, int64_t E, int64_t k, const MoeRouterParams& params) {
  check_sizes("moe router", T, E, k);
  check_groups(params, E, k);
  const bool groups = params.num_groups > 0;
  if (expert_bias && params.score_function == MoeScoreFunction::Softmax)
    throw Error("moe router: an expert bias (aux-loss-free balancing) needs the sigmoid or sqrtsoftplus score "
                "function");
  const float scale = topk_scale(params);
#pragma omp parallel
  {
    std::vector<float> row(E), vals(k), masked(E), group_score(static_cast<size_t>(params.num_groups));
    const int64_t top_n = groups ? std::max(k / params.group_topk, params.group_topk) : 0;
    std::vector<int64_t> group_top(static_cast<size_t>(top_n));
    // The experts of one token's routing scores: all of them, or those of its best groups.
    auto choose = [&](const float* scores, int64_t* idx) {
      if (groups)
        group_limited_topk_row(scores, E, k, params.num_groups, params.group_topk, masked.data(), group_score.data(),
                               group_top.data(), idx);
      else
        topk_row(scores, E, k, idx);
    };
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      const float* z = logits + t * E;
      int64_t* idx = topk_idx + t * k;
      float* p = topk_probs + t * k;
      if (params.score_function == MoeScoreFunction::Softmax) {
        if (params.pre_softmax) {
          softmax_row(z, row.data(), E);
          choose(row.data(), idx);
          for (int64_t j = 0; j < k; ++j) p[j] = row[idx[j]];
        } else {
          choose(z, idx);
          topk_softmax_probs(z, idx, k, vals.data(), p);
        }
      } else {
        // The choice ranks the gate scores (+ bias) in fp32, as Megatron ranks its fp32 scores.
        const MoeScoreFunction fn = params.score_function;
        for (int64_t e = 0; e < E; ++e) row[e] = gate_score(fn, z[e]) + (expert_bias ? expert_bias[e] : 0.0f);
        choose(row.data(), idx);
        gate_probs(fn, z, idx, k, p);
      }
      if (scale != 1.0f)
        for (int64_t j = 0; j < k; ++j) p[j] *= scale;
    }
  }
}

void moe_router_topk_backward(const float* logits, const int64_t* topk_idx, const float* dprobs, float* dlogits,
                              int64_t T, int64_t E, int64_t k, const MoeRouterParams& params) {
  check_sizes("moe router backward", T, E, k);
  const double scale = topk_scale(params);
#pragma omp parallel
  {
    std::vector<float> vals(k), p(k);
    std::vector<double> s_sel(k);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      const float* z = logits + t * E;
      const int64_t* idx = topk_idx + t * k;
      float* dz = dlogits + t * E;
      // g = d/d(unscaled probs)
      auto g = [&](int64_t j) { return static_cast<double>(dprobs[t * k + j]) * scale; };
      if (params.score_function == MoeScoreFunction::Softmax && params.pre_softmax) {
        // probs = s[idx], s = softmax(z): dz = s * (G - <G, s>), G = g scattered over the k experts.
        softmax_row(z, dz, E);  // s, held in dz until it is turned into the gradient
        double dot = 0.0;
        for (int64_t j = 0; j < k; ++j) dot += g(j) * dz[idx[j]];
        for (int64_t j = 0; j < k; ++j) s_sel[j] = dz[idx[j]];
        for (int64_t e = 0; e < E; ++e) dz[e] = static_cast<float>(-dz[e] * dot);
        for (int64_t j = 0; j < k; ++j) dz[idx[j]] = static_cast<float>(s_sel[j] * (g(j) - dot));
        continue;
      }
      std::fill(dz, dz + E, 0.0f);
      if (params.score_function == MoeScoreFunction::Softmax) {
        // probs = softmax(z[idx]) over the k: dz[idx] = p * (g - <g, p>).
        topk_softmax_probs(z, idx, k, vals.data(), p.data());
        double dot = 0.0;
        for (int64_t j = 0; j < k; ++j) dot += g(j) * p[j];
        for (int64_t j = 0; j < k; ++j) dz[idx[j]] = static_cast<float>(p[j] * (g(j) - dot));
      } else {
        // q = sig / D (k > 1): d/dsig_j = (g_j - <g, q>) / D; then the gate score's derivative.
        const MoeScoreFunction fn = params.score_function;
        const double denom = gate_probs(fn, z, idx, k, p.data());
        double dot = 0.0;
        if (k > 1)
          for (int64_t j = 0; j < k; ++j) dot += g(j) * p[j];
        for (int64_t j = 0; j < k; ++j)
          dz[idx[j]] = static_cast<float>((g(j) - dot) / denom * gate_score_grad(fn, z[idx[j]]));
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// load-balancing losses

void moe_aux_loss_scores(const float* logits, float* scores, int64_t* aux_topk_idx, int64_t T, int64_t E, int64_t k,
                         MoeScoreFunction score_function) {
  check_sizes("moe aux loss scores", T, E, k);
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* z = logits + t * E;
    float* s = scores + t * E;
    if (score_function == MoeScoreFunction::Softmax) {
      softmax_row(z, s, E);
    } else {
      double sum = 0.0;
      for (int64_t e = 0; e < E; ++e) {
        s[e] = gate_score(score_function, z[e]);
        sum += s[e];
      }
      const float denom = static_cast<float>(sum) + kSigmoidNormEps;
      for (int64_t e = 0; e < E; ++e) s[e] /= denom;
    }
    topk_row(s, E, k, aux_topk_idx + t * k);
  }
}

std::vector<double> moe_sequence_counts(const int64_t* aux_topk_idx, int64_t b, int64_t s, int64_t E, int64_t k) {
  check_seq("moe sequence counts", b, s, E, k);
  std::vector<double> counts(static_cast<size_t>(b * E), 0.0);
  for (int64_t t = 0; t < b * s; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = aux_topk_idx[t * k + j];
      if (e < 0 || e >= E) throw Error("moe aux loss: expert id " + std::to_string(e) + " outside [0, E)");
      counts[static_cast<size_t>((t / s) * E + e)] += 1.0;
    }
  return counts;
}

float moe_seq_aux_loss_forward(const float* scores, const double* counts, int64_t b, int64_t s, int64_t whole,
                               int64_t E, int64_t k, float coeff) {
  check_seq("moe seq aux loss", b, s, E, k);
  if (whole < s) throw Error("moe seq aux loss: a sequence's whole length (" + std::to_string(whole) +
                             ") is less than this rank's share of it (" + std::to_string(s) + ")");
  double total = 0.0;
  for (int64_t j = 0; j < b; ++j) {
    for (int64_t i = 0; i < E; ++i) {
      if (counts[j * E + i] == 0) continue;
      double P = 0.0;  // sum over the sequence's tokens of scores[t, i]
      for (int64_t t = j * s; t < (j + 1) * s; ++t) P += scores[t * E + i];
      total += P * counts[j * E + i];
    }
  }
  const double wd = static_cast<double>(whole);
  return static_cast<float>(total * E * static_cast<double>(coeff) / (static_cast<double>(k) * wd * wd) / b);
}

void moe_seq_aux_loss_backward(const float* logits, const float* scores, const double* counts, int64_t b, int64_t s,
                               int64_t whole, int64_t E, int64_t k, MoeScoreFunction score_function, float coeff,
                               float dloss, float* dlogits) {
  check_seq("moe seq aux loss backward", b, s, E, k);
  if (whole < s) throw Error("moe seq aux loss backward: a sequence's whole length is less than this rank's share");
  // d(loss)/d(scores[t, i]) = dloss * E * coeff / (k whole^2 b) * c[seq(t), i]
  const double wd = static_cast<double>(whole);
  const double unit =
      static_cast<double>(dloss) * E * static_cast<double>(coeff) / (static_cast<double>(k) * wd * wd) / b;
#pragma omp parallel
  {
    std::vector<double> g(E);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < b * s; ++t) {
      for (int64_t i = 0; i < E; ++i) g[i] = unit * counts[(t / s) * E + i];
      aux_scores_backward_row(logits + t * E, scores + t * E, g.data(), E, score_function, dlogits + t * E);
    }
  }
}

float moe_seq_aux_loss_forward(const float* scores, const int64_t* aux_topk_idx, int64_t b, int64_t s, int64_t E,
                               int64_t k, float coeff) {
  const auto counts = moe_sequence_counts(aux_topk_idx, b, s, E, k);
  return moe_seq_aux_loss_forward(scores, counts.data(), b, s, s, E, k, coeff);
}

void moe_seq_aux_loss_backward(const float* logits, const float* scores, const int64_t* aux_topk_idx, int64_t b,
                               int64_t s, int64_t E, int64_t k, MoeScoreFunction score_function, float coeff,
                               float dloss, float* dlogits) {
  const auto counts = moe_sequence_counts(aux_topk_idx, b, s, E, k);
  moe_seq_aux_loss_backward(logits, scores, counts.data(), b, s, s, E, k, score_function, coeff, dloss, dlogits);
}

float moe_global_aux_loss_forward(const float* scores, const double* counts, int64_t T, double total, int64_t E,
                                  int64_t k, float coeff) {
  check_sizes("moe global aux loss", T, E, k);
  if (T == 0 || !(total > 0.0)) return 0.0f;
  double sum = 0.0;
  for (int64_t i = 0; i < E; ++i) {
    double P = 0.0;  // sum over this rank's tokens of scores[t, i]
    for (int64_t t = 0; t < T; ++t) P += scores[t * E + i];
    sum += P * counts[i];
  }
  return static_cast<float>(sum * E * static_cast<double>(coeff) / (static_cast<double>(k) * total * total));
}

void moe_global_aux_loss_backward(const float* logits, const float* scores, const double* counts, int64_t T,
                                  double total, int64_t E, int64_t k, MoeScoreFunction score_function, float coeff,
                                  float dloss, float* dlogits) {
  check_sizes("moe global aux loss backward", T, E, k);
  if (T == 0 || !(total > 0.0)) return;
  // d(loss)/d(scores[t, i]) = dloss * E * coeff / (k total^2) * counts[i], the same for every token.
  const double unit =
      static_cast<double>(dloss) * E * static_cast<double>(coeff) / (static_cast<double>(k) * total * total);
  std::vector<double> g(static_cast<size_t>(E));
  for (int64_t i = 0; i < E; ++i) g[i] = unit * counts[i];
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t)
    aux_scores_backward_row(logits + t * E, scores + t * E, g.data(), E, score_function, dlogits + t * E);
}

float moe_aux_loss_forward(const float* scores, const int64_t* aux_topk_idx, int64_t T, int64_t E, int64_t k,
                           float coeff) {
  if (T == 0) return 0.0f;
  return moe_seq_aux_loss_forward(scores, aux_topk_idx, 1, T, E, k, coeff);
}

void moe_aux_loss_backward(const float* logits, const float* scores, const int64_t* aux_topk_idx, int64_t T,
                           int64_t E, int64_t k, MoeScoreFunction score_function, float coeff, float dloss,
                           float* dlogits) {
  if (T == 0) return;
  moe_seq_aux_loss_backward(logits, scores, aux_topk_idx, 1, T, E, k, score_function, coeff, dloss, dlogits);
}

namespace {
double logsumexp_row(const float* z, int64_t E) {
  const float m = *std::max_element(z, z + E);
  double sum = 0.0;
  for (int64_t e = 0; e < E; ++e) sum += std::exp(static_cast<double>(z[e] - m));
  return static_cast<double>(m) + std::log(sum);
}
}  // namespace

float moe_z_loss_forward(const float* logits, int64_t T, int64_t E, float coeff) {
  check_sizes("moe z loss", T, E, 1);
  if (T == 0) return 0.0f;
  std::vector<double> sq(T);
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const double lse = logsumexp_row(logits + t * E, E);
    sq[t] = lse * lse;
  }
  double sum = 0.0;
  for (int64_t t = 0; t < T; ++t) sum += sq[t];  // fixed order: independent of the thread count
  return static_cast<float>(sum / static_cast<double>(T) * static_cast<double>(coeff));
}

void moe_z_loss_backward(const float* logits, int64_t T, int64_t E, float coeff, float dloss, float* dlogits) {
  check_sizes("moe z loss backward", T, E, 1);
  const double c = 2.0 * static_cast<double>(coeff) * static_cast<double>(dloss) / static_cast<double>(T);
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* z = logits + t * E;
    const double lse = logsumexp_row(z, E);
    for (int64_t e = 0; e < E; ++e)
      dlogits[t * E + e] += static_cast<float>(c * lse * std::exp(static_cast<double>(z[e]) - lse));
  }
}

// ---------------------------------------------------------------------------------------------
// dispatch / combine

void moe_permutation(const int64_t* topk_idx, int64_t T, int64_t E, int64_t k, int64_t* tokens_per_expert,
                     int64_t* sorted_indices, int64_t* permuted_row) {
  check_sizes("moe permutation", T, E, k);
  std::fill(tokens_per_expert, tokens_per_expert + E, 0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = topk_idx[t * k + j];
      if (e < 0 || e >= E)
        throw Error("moe permutation: token " + std::to_string(t) + " is routed to expert " + std::to_string(e) +
                    ", outside [0, " + std::to_string(E) + ")");
      for (int64_t i = 0; i < j; ++i)
        if (topk_idx[t * k + i] == e)
          throw Error("moe permutation: token " + std::to_string(t) + " is routed twice to expert " +
                      std::to_string(e));
      ++tokens_per_expert[e];
    }
  // Rows of expert e start at the sum of the earlier experts' counts; tokens fill them in order.
  std::vector<int64_t> cursor(E, 0);
  for (int64_t e = 1; e < E; ++e) cursor[e] = cursor[e - 1] + tokens_per_expert[e - 1];
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t r = cursor[topk_idx[t * k + j]]++;
      sorted_indices[r] = t;
      permuted_row[t * k + j] = r;
    }
}

void moe_permute_forward(const float* x, const int64_t* sorted_indices, float* permuted, int64_t N, int64_t H) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < N; ++r) {
    const float* src = x + sorted_indices[r] * H;
    std::copy(src, src + H, permuted + r * H);
  }
}

void moe_permute_backward(const float* dpermuted, const int64_t* permuted_row, float* dx, int64_t T, int64_t k,
                          int64_t H) {
#pragma omp parallel
  {
    std::vector<int64_t> rows(k);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      sorted_rows(permuted_row + t * k, k, rows.data());
      float* d = dx + t * H;
      std::copy(dpermuted + rows[0] * H, dpermuted + (rows[0] + 1) * H, d);
      for (int64_t j = 1; j < k; ++j)
        for (int64_t h = 0; h < H; ++h) d[h] += dpermuted[rows[j] * H + h];
    }
  }
}

void moe_unpermute_forward(const float* expert_out, const int64_t* permuted_row, const float* probs, float* y,
                           int64_t T, int64_t k, int64_t H) {
#pragma omp parallel
  {
    std::vector<int64_t> rows(k);
    std::vector<float> p(k);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      sorted_rows(permuted_row + t * k, k, rows.data());
      for (int64_t j = 0; j < k; ++j)  // the prob of each sorted row
        for (int64_t i = 0; i < k; ++i)
          if (permuted_row[t * k + i] == rows[j]) p[j] = probs[t * k + i];
      float* out = y + t * H;
      std::fill(out, out + H, 0.0f);
      for (int64_t j = 0; j < k; ++j) {
        const float* o = expert_out + rows[j] * H;
        for (int64_t h = 0; h < H; ++h) out[h] += o[h] * p[j];
      }
    }
  }
}

void moe_unpermute_backward(const float* expert_out, const int64_t* permuted_row, const float* probs, const float* dy,
                            float* dexpert_out, float* dprobs, int64_t T, int64_t k, int64_t H) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* g = dy + t * H;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t r = permuted_row[t * k + j];
      const float p = probs[t * k + j];
      float* d = dexpert_out + r * H;
      for (int64_t h = 0; h < H; ++h) d[h] = g[h] * p;
      if (dprobs) {
        double dot = 0.0;
        for (int64_t h = 0; h < H; ++h) dot += static_cast<double>(g[h]) * expert_out[r * H + h];
        dprobs[t * k + j] = static_cast<float>(dot);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// experts

namespace {
// The rows an experts' call computes (their groups' sizes summed); a negative size is an error.
int64_t expert_rows(const int64_t* tokens_per_expert, int64_t E, const char* what) {
  int64_t n = 0;
  for (int64_t e = 0; e < E; ++e) {
    if (tokens_per_expert[e] < 0) throw Error(std::string(what) + ": negative token count for expert " + std::to_string(e));
    n += tokens_per_expert[e];
  }
  return n;
}
}  // namespace

namespace {

// Expert e's linear `which` (0: fc1, 1: fc2): y[n, N] = x[n, K] w^T, in FP8 where fp8 says.
void expert_linear(const float* x, const float* w, float* y, int64_t n, int64_t K, int64_t N, MoeExpertsFp8* fp8,
                   int which, int64_t e) {
  if (!fp8) return linear_forward(x, w, nullptr, y, n, K, N);
  const Fp8Operand qx = fp8->input(which, e, x, n, K);
  fp8_linear_forward(qx, fp8->weight(which, e, w, N, K), nullptr, y, n, K, N);
}

// Its backward: dx[n, K] (nullable) and dw[N, K] += (nullable), in FP8 where fp8 says.
void expert_linear_backward(const float* x, const float* w, const float* dy, float* dx, float* dw, int64_t n, int64_t K,
                            int64_t N, MoeExpertsFp8* fp8, int which, int64_t e) {
  if (!fp8) return linear_backward(x, w, dy, dx, dw, nullptr, n, K, N);
  const Fp8Operand qx = fp8->saved_input(which, e, x, n, K), qw = fp8->weight(which, e, w, N, K);
  fp8_linear_backward(qx, qw, fp8->output_grad(which, e, dy, n, N), dx, dw, n, K, N);
}

}  // namespace

void moe_experts_forward(const float* permuted_x, const int64_t* tokens_per_expert, const float* fc1_weight,
                         const float* fc2_weight, float* fc1_out, float* act_out, float* y, int64_t E, int64_t H,
                         int64_t F, MoeActivation act, const MoeAdapters* lora, MoeExpertsFp8* fp8) {
  const int64_t F1 = moe_fc1_rows(act, F);
  const int64_t N = expert_rows(tokens_per_expert, E, "moe experts");
  if (fp8 && lora) throw Error("moe experts: FP8 GEMMs with LoRA adapters are not built");
  for (int64_t e = 0; fp8 && e < E; ++e) {  // every weight's FP8 copy, as GroupedLinear makes them all
    fp8->weight(0, e, fc1_weight + e * F1 * H, F1, H);
    fp8->weight(1, e, fc2_weight + e * H * F, H, F);
  }
  // The fc1 adapter's low-rank rows z1 = x A1^T for every row at once (the pair is every expert's).
  const bool a1 = lora && lora->fc1_a, a2 = lora && lora->fc2_a;
  const int64_t r = lora ? lora->dim : 0;
  std::vector<float> z1(a1 ? static_cast<size_t>(N * r) : 0);
  if (a1) linear_forward(permuted_x, lora->fc1_a, nullptr, z1.data(), N, H, r);
  int64_t row = 0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = tokens_per_expert[e];
    if (n == 0) continue;
    const float* xe = permuted_x + row * H;
    float* h1 = fc1_out + row * F1;
    float* a = act_out + row * F;
    expert_linear(xe, fc1_weight + e * F1 * H, h1, n, H, F1, fp8, 0, e);
    if (a1) linear_accumulate(z1.data() + row * r, lora->fc1_b, h1, n, r, F1, lora->scale);
    switch (act) {
      case MoeActivation::SwiGlu: swiglu_forward(h1, a, n, F); break;
      case MoeActivation::GeluTanh: gelu_forward(h1, a, n * F, Gelu::Tanh); break;
      case MoeActivation::GeluErf: gelu_forward(h1, a, n * F, Gelu::Erf); break;
    }
    expert_linear(a, fc2_weight + e * H * F, y + row * H, n, F, H, fp8, 1, e);
    row += n;
  }
  if (a2) {  // y += scale * (a A2^T) B2^T over every row
    std::vector<float> z2(static_cast<size_t>(N * r));
    linear_forward(act_out, lora->fc2_a, nullptr, z2.data(), N, F, r);
    linear_accumulate(z2.data(), lora->fc2_b, y, N, r, H, lora->scale);
  }
}

void moe_experts_backward(const float* permuted_x, const int64_t* tokens_per_expert, const float* fc1_weight,
                          const float* fc2_weight, const float* fc1_out, const float* act_out, const float* dy,
                          float* dact, float* dfc1_out, float* dx, float* dfc1_weight, float* dfc2_weight, int64_t E,
                          int64_t H, int64_t F, MoeActivation act, const MoeAdapters* lora, MoeExpertsFp8* fp8) {
  const int64_t F1 = moe_fc1_rows(act, F);
  const int64_t N = expert_rows(tokens_per_expert, E, "moe experts backward");
  if (fp8 && lora) throw Error("moe experts backward: FP8 GEMMs with LoRA adapters are not built");
  const bool a1 = lora && lora->fc1_a, a2 = lora && lora->fc2_a;
  const int64_t r = lora ? lora->dim : 0;
  // The fc2 adapter: dz2 = scale dy B2 (dB2 += scale dy^T z2), dA2 += dz2^T a, and its share of the
  // activation's gradient dz2 A2, added to each expert's below.
  std::vector<float> z(static_cast<size_t>(N * r)), dz(static_cast<size_t>(N * r)), da2(a2 ? static_cast<size_t>(N * F) : 0);
  if (a2) {
    linear_forward(act_out, lora->fc2_a, nullptr, z.data(), N, F, r);
    linear_backward_scaled(z.data(), lora->fc2_b, dy, dz.data(), lora->dfc2_b, N, r, H, lora->scale, false);
    linear_backward(act_out, lora->fc2_a, dz.data(), da2.data(), lora->dfc2_a, nullptr, N, F, r);
  }
  int64_t row = 0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = tokens_per_expert[e];
    if (n == 0) continue;
    float* da = dact + row * F;
    float* dh1 = dfc1_out + row * F1;
    const float* h1 = fc1_out + row * F1;
    expert_linear_backward(act_out + row * F, fc2_weight + e * H * F, dy + row * H, da,
                           dfc2_weight ? dfc2_weight + e * H * F : nullptr, n, F, H, fp8, 1, e);
    if (a2) add_inplace(da, da2.data() + row * F, n * F);
    switch (act) {
      case MoeActivation::SwiGlu: swiglu_backward(h1, da, dh1, n, F); break;
      case MoeActivation::GeluTanh: gelu_backward(h1, da, dh1, n * F, Gelu::Tanh); break;
      case MoeActivation::GeluErf: gelu_backward(h1, da, dh1, n * F, Gelu::Erf); break;
    }
    expert_linear_backward(permuted_x + row * H, fc1_weight + e * F1 * H, dh1, dx ? dx + row * H : nullptr,
                           dfc1_weight ? dfc1_weight + e * F1 * H : nullptr, n, H, F1, fp8, 0, e);
    row += n;
  }
  if (a1) {  // dz1 = scale dh1 B1 (dB1 += scale dh1^T z1), dA1 += dz1^T x, dx += dz1 A1
    linear_forward(permuted_x, lora->fc1_a, nullptr, z.data(), N, H, r);
    linear_backward_scaled(z.data(), lora->fc1_b, dfc1_out, dz.data(), lora->dfc1_b, N, r, F1, lora->scale, false);
    linear_backward_scaled(permuted_x, lora->fc1_a, dz.data(), dx, lora->dfc1_a, N, H, r, 1.0f, true);
  }
}

// ---------------------------------------------------------------------------------------------
// the whole layer

namespace {

// Megatron's moe_z_loss_coeff / tp_cp_size (the TP ranks here each take the whole gathered sequence).
float z_loss_coeff(const MoeLayerConfig& c) {
  return c.z_loss_coeff / static_cast<float>(c.context_parallel_size);
}

void check_layer(const MoeLayerConfig& c, const MoeLayerWeights& w, int64_t T) {
  check_sizes("moe layer", T, c.num_experts, c.topk);
  if (c.context_parallel_size < 1 || (c.context_parallel_size > 1 && !c.sum_over_context_parallel))
    throw Error("moe layer: context parallelism over " + std::to_string(c.context_parallel_size) +
                " ranks needs the sum over them");
  if (c.hidden_size < 1 || c.ffn_hidden_size < 1 || c.shared_expert_intermediate_size < 0)
    throw Error("moe layer: hidden_size and ffn_hidden_size must be >= 1, the shared expert size >= 0");
  if (!w.router_weight || !w.fc1_weight || !w.fc2_weight)
    throw Error("moe layer: the router and expert weights are required");
  if (c.shared_expert_intermediate_size > 0 && (!w.shared_fc1_weight || !w.shared_fc2_weight))
    throw Error("moe layer: a shared expert needs its linear_fc1 and linear_fc2 weights");
  if (c.seq_aux_loss_coeff > 0.0f && (c.seq_length < 1 || T % c.seq_length != 0))
    throw Error("moe layer: seq_aux_loss needs a seq_length that divides the token count (T = " + std::to_string(T) +
                ", seq_length = " + std::to_string(c.seq_length) + ")");
  // Dropping goes by sequence (Megatron's [s, b] token order) whenever seq_length is set, and
  // needs it with several shares.
  const bool by_sequence = c.capacity_factor && (c.capacity_shares > 1 || c.seq_length > 0);
  if (c.capacity_shares < 1 || (by_sequence && (c.seq_length < 1 || T % c.seq_length != 0)))
    throw Error("moe layer: dropping by " + std::to_string(c.capacity_shares) +
                " shares of the sequence needs a seq_length that divides the token count (T = " + std::to_string(T) +
                ", seq_length = " + std::to_string(c.seq_length) + ")");
}

template <class V>
void ensure(std::vector<V>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) != n) v.resize(n);
}

}  // namespace

int64_t moe_expert_capacity(int64_t T, int64_t E, int64_t k, double capacity_factor) {
  if (!(capacity_factor >= 0.0) || E < 1)
    throw Error("moe capacity: the capacity factor must be >= 0 (got " + std::to_string(capacity_factor) + ")");
  return static_cast<int64_t>(std::ceil(static_cast<double>(T * k) / static_cast<double>(E) * capacity_factor));
}

void moe_capacity_mask(const int64_t* topk_idx, const float* topk_probs, int64_t T, int64_t E, int64_t k,
                       int64_t capacity, bool by_position, uint8_t* kept) {
  // Each expert's pairs in token order, then the first `capacity` of them by the policy's order
  // (stable: equal probs keep the earlier token).
  check_sizes("moe capacity", T, E, k);
  std::vector<std::vector<int64_t>> pairs(static_cast<size_t>(E));
  for (int64_t i = 0; i < T * k; ++i) {
    if (topk_idx[i] < 0 || topk_idx[i] >= E) throw Error("moe capacity: an expert index outside [0, E)");
    pairs[static_cast<size_t>(topk_idx[i])].push_back(i);
    kept[i] = 0;
  }
  for (auto& p : pairs) {
    if (!by_position)
      std::stable_sort(p.begin(), p.end(), [&](int64_t a, int64_t b) { return topk_probs[a] > topk_probs[b]; });
    for (size_t j = 0; j < p.size() && static_cast<int64_t>(j) < capacity; ++j) kept[p[j]] = 1;
  }
}

void moe_capacity_mask_by_share(const int64_t* topk_idx, const float* topk_probs, int64_t b, int64_t s,
                                int64_t shares, int64_t E, int64_t k, double capacity_factor, bool by_position,
                                uint8_t* kept) {
  if (b < 1 || s < 1 || shares < 1 || s % shares != 0)
    throw Error("moe capacity: " + std::to_string(shares) + " shares of a sequence of " + std::to_string(s) +
                " positions (b = " + std::to_string(b) + "): the shares must divide the sequence");
  const int64_t span = s / shares, local = b * span, capacity = moe_expert_capacity(local, E, k, capacity_factor);
  // Each share's pairs gathered in Megatron's order, masked as one call's, and put back.
  std::vector<int64_t> idx(static_cast<size_t>(local * k));
  std::vector<float> probs(static_cast<size_t>(local * k));
  std::vector<uint8_t> share_kept(static_cast<size_t>(local * k));
  for (int64_t r = 0; r < shares; ++r) {
    auto token = [&](int64_t i) { return (i / b) + r * span + (i % b) * s; };  // its i-th token: position-major
    for (int64_t i = 0; i < local; ++i)
      for (int64_t j = 0; j < k; ++j) {
        idx[static_cast<size_t>(i * k + j)] = topk_idx[token(i) * k + j];
        probs[static_cast<size_t>(i * k + j)] = topk_probs[token(i) * k + j];
      }
    moe_capacity_mask(idx.data(), probs.data(), local, E, k, capacity, by_position, share_kept.data());
    for (int64_t i = 0; i < local; ++i)
      for (int64_t j = 0; j < k; ++j) kept[token(i) * k + j] = share_kept[static_cast<size_t>(i * k + j)];
  }
}

void MoeLocalExpertsStage::forward(const float* permuted_x, const int64_t* /*row_tokens*/,
                                   const int64_t* tokens_per_expert, int64_t N, float* expert_out,
                                   MoeExpertsFp8* fp8) {
  if (!fc1_ || !fc2_) throw Error("MoeLocalExpertsStage: no weights");
  N_ = N;
  tpe_.assign(tokens_per_expert, tokens_per_expert + E_);
  x_.assign(permuted_x, permuted_x + N * H_);
  fc1_out_.resize(static_cast<size_t>(N * moe_fc1_rows(act_, F_)));
  act_out_.resize(static_cast<size_t>(N * F_));
  moe_experts_forward(x_.data(), tpe_.data(), fc1_, fc2_, fc1_out_.data(), act_out_.data(), expert_out, E_, H_, F_,
                      act_, lora_, fp8);
}

void MoeLocalExpertsStage::backward(const float* dexpert_out, int64_t N, float* dpermuted_x, MoeExpertsFp8* fp8) {
  if (N != N_) throw Error("MoeLocalExpertsStage: backward of " + std::to_string(N) + " rows after a forward of " +
                           std::to_string(N_));
  dact_.resize(static_cast<size_t>(N * F_));
  dfc1_out_.resize(static_cast<size_t>(N * moe_fc1_rows(act_, F_)));
  moe_experts_backward(x_.data(), tpe_.data(), fc1_, fc2_, fc1_out_.data(), act_out_.data(), dexpert_out, dact_.data(),
                       dfc1_out_.data(), dpermuted_x, dfc1_, dfc2_, E_, H_, F_, act_, lora_, fp8);
}

void moe_layer_forward(const MoeLayerConfig& c, const MoeLayerWeights& w, const float* x, float* y, int64_t T,
                       MoeLayerState& st, MoeExpertsStage* experts) {
  check_layer(c, w, T);
  const int64_t H = c.hidden_size, E = c.num_experts, k = c.topk, F = c.ffn_hidden_size, N = T * k;
  const int64_t F1 = moe_fc1_rows(c.activation, F);
  ensure(st.logits, T * E);
  ensure(st.topk_idx, T * k);
  ensure(st.topk_probs, T * k);
  ensure(st.tokens_per_expert, E);
  ensure(st.sorted_indices, N);
  ensure(st.permuted_row, T * k);
  ensure(st.permuted_x, N * H);
  ensure(st.fc1_out, experts ? 0 : N * F1);  // a stage keeps its own
  ensure(st.act_out, experts ? 0 : N * F);
  ensure(st.expert_out, N * H);

  linear_forward(x, w.router_weight, w.router_bias, st.logits.data(), T, H, E);
  if (c.force_load_balancing)
    for (int64_t t = 0; t < T; ++t) {
      const int64_t row = c.random_logits_rows ? c.random_logits_rows[t] : t;
      for (int64_t e = 0; e < E; ++e)
        st.logits[t * E + e] = counter_normal(c.random_logits_key, static_cast<uint64_t>(row * E + e));
    }
  if (c.router_bf16_logits)
    for (float& v : st.logits) v = round_to_bf16(v);
  const float* logits = st.logits.data();
  st.z_loss = c.z_loss_coeff > 0.0f ? moe_z_loss_forward(logits, T, E, z_loss_coeff(c)) : 0.0f;
  moe_router_topk_forward(logits, w.expert_bias, st.topk_idx.data(), st.topk_probs.data(), T, E, k, c.router);
  if (c.router_bf16_logits)  // Megatron's probs.type_as(logits); the gradient passes straight through
    for (float& p : st.topk_probs) p = round_to_bf16(p);
  if (c.capacity_factor) {  // dropped pairs keep their rows but weigh nothing (Megatron's masked probs)
    ensure(st.kept, T * k);
    // In Megatron's token order ([s, b] flattened) when the sequences are known (check_layer), by
    // TP's shares.
    if (c.seq_length > 0)
      moe_capacity_mask_by_share(st.topk_idx.data(), st.topk_probs.data(), T / c.seq_length, c.seq_length,
                                 c.capacity_shares, E, k, *c.capacity_factor, c.drop_by_position, st.kept.data());
    else
      moe_capacity_mask(st.topk_idx.data(), st.topk_probs.data(), T, E, k,
                        moe_expert_capacity(T, E, k, *c.capacity_factor), c.drop_by_position, st.kept.data());
    for (int64_t i = 0; i < T * k; ++i)
      if (!st.kept[i]) st.topk_probs[i] = 0.0f;
  }
  st.aux_loss = st.seq_aux_loss = st.global_aux_loss = 0.0f;
  st.global_counts.clear();
  const bool global = c.global_aux_loss_coeff > 0.0f && c.global_aux_training;
  if (c.aux_loss_coeff > 0.0f || c.seq_aux_loss_coeff > 0.0f || global) {
    ensure(st.scores_for_aux_loss, T * E);
    ensure(st.aux_topk_idx, T * k);
    moe_aux_loss_scores(logits, st.scores_for_aux_loss.data(), st.aux_topk_idx.data(), T, E, k,
                        c.router.score_function);
    // Tokens per expert over the context-parallel ranks (each rank's scores its own tokens').
    auto counts_over_cp = [&](int64_t b, int64_t s) {
      std::vector<double> counts = moe_sequence_counts(st.aux_topk_idx.data(), b, s, E, k);
      if (c.context_parallel_size > 1) c.sum_over_context_parallel(counts.data(), b * E);
      return counts;
    };
    if (c.aux_loss_coeff > 0.0f && T > 0) {
      st.aux_counts = counts_over_cp(1, T);
      st.aux_loss = moe_seq_aux_loss_forward(st.scores_for_aux_loss.data(), st.aux_counts.data(), 1, T,
                                             T * c.context_parallel_size, E, k, c.aux_loss_coeff);
    }
    if (c.seq_aux_loss_coeff > 0.0f) {
      st.seq_aux_counts = counts_over_cp(T / c.seq_length, c.seq_length);
      st.seq_aux_loss =
          moe_seq_aux_loss_forward(st.scores_for_aux_loss.data(), st.seq_aux_counts.data(), T / c.seq_length,
                                   c.seq_length, c.seq_length * c.context_parallel_size, E, k, c.seq_aux_loss_coeff);
    }
    if (global) {  // this forward's counts over the data-parallel ranks join the step's running mean
      std::vector<double> counts(static_cast<size_t>(E), 0.0);
      for (int64_t i = 0; i < T * k; ++i) counts[static_cast<size_t>(st.aux_topk_idx[i])] += 1.0;
      if (c.sum_over_data_parallel) c.sum_over_data_parallel(counts.data(), E);
      st.global_tokens_per_expert.resize(static_cast<size_t>(E), 0.0);
      st.global_steps += 1;
      st.global_counts.resize(static_cast<size_t>(E));
      for (int64_t i = 0; i < E; ++i) {
        st.global_tokens_per_expert[i] += counts[i];
        st.global_counts[i] = st.global_tokens_per_expert[i] / static_cast<double>(st.global_steps);
      }
      st.global_aux_loss = moe_global_aux_loss_forward(st.scores_for_aux_loss.data(), st.global_counts.data(), T,
                                                       static_cast<double>(T * c.data_parallel_size), E, k,
                                                       c.global_aux_loss_coeff);
    }
  }

  moe_permutation(st.topk_idx.data(), T, E, k, st.tokens_per_expert.data(), st.sorted_indices.data(),
                  st.permuted_row.data());
  moe_permute_forward(x, st.sorted_indices.data(), st.permuted_x.data(), N, H);
  if (experts)
    experts->forward(st.permuted_x.data(), st.sorted_indices.data(), st.tokens_per_expert.data(), N,
                     st.expert_out.data(), w.expert_fp8);
  else
    moe_experts_forward(st.permuted_x.data(), st.tokens_per_expert.data(), w.fc1_weight, w.fc2_weight,
                        st.fc1_out.data(), st.act_out.data(), st.expert_out.data(), E, H, F, c.activation,
                        w.expert_lora, w.expert_fp8);
  moe_unpermute_forward(st.expert_out.data(), st.permuted_row.data(), st.topk_probs.data(), y, T, k, H);

  if (c.shared_expert_intermediate_size > 0) {
    // Megatron adds the shared expert's output to the routed output (MoELayer.forward).
    const int64_t Fs = c.shared_expert_intermediate_size, F1s = moe_fc1_rows(c.activation, Fs);
    ensure(st.shared_fc1_out, T * F1s);
    ensure(st.shared_act_out, T * Fs);
    ensure(st.shared_out, T * H);
    const int64_t all = T;
    moe_experts_forward(x, &all, w.shared_fc1_weight, w.shared_fc2_weight, st.shared_fc1_out.data(),
                        st.shared_act_out.data(), st.shared_out.data(), 1, H, Fs, c.activation, w.shared_lora,
                        w.shared_fp8);
    add_inplace(y, st.shared_out.data(), T * H);
  }
}

void moe_global_aux_reset(MoeLayerState& st) {
  std::fill(st.global_tokens_per_expert.begin(), st.global_tokens_per_expert.end(), 0.0);
  st.global_steps = 0;
}

void moe_layer_backward(const MoeLayerConfig& c, const MoeLayerWeights& w, const float* x, const float* dy,
                        float* dx, const MoeLayerGrads& g, int64_t T, MoeLayerState& st, float aux_loss_scale,
                        MoeExpertsStage* experts) {
  check_layer(c, w, T);
  const int64_t H = c.hidden_size, E = c.num_experts, k = c.topk, F = c.ffn_hidden_size, N = T * k;
  const int64_t F1 = moe_fc1_rows(c.activation, F);
  if (static_cast<int64_t>(st.expert_out.size()) != N * H || static_cast<int64_t>(st.logits.size()) != T * E)
    throw Error("moe layer backward: the state does not hold this layer's forward of " + std::to_string(T) +
                " tokens");
  ensure(st.dlogits, T * E);
  ensure(st.dprobs, T * k);
  ensure(st.dexpert_out, N * H);
  ensure(st.dpermuted_x, N * H);
  // The activation scratch serves the routed experts (N rows) and the shared expert (T rows).
  const int64_t Fs = c.shared_expert_intermediate_size, F1s = moe_fc1_rows(c.activation, Fs);
  ensure(st.dact, std::max(N * F, T * Fs));
  ensure(st.dfc1_out, std::max(N * F1, T * F1s));
  ensure(st.dx_part, T * H);

  // combine -> experts -> dispatch: dx = permute's backward.
  moe_unpermute_backward(st.expert_out.data(), st.permuted_row.data(), st.topk_probs.data(), dy,
                         st.dexpert_out.data(), st.dprobs.data(), T, k, H);
  if (c.capacity_factor)
    for (int64_t i = 0; i < T * k; ++i)
      if (!st.kept[i]) st.dprobs[i] = 0.0f;
  if (experts)
    experts->backward(st.dexpert_out.data(), N, st.dpermuted_x.data(), w.expert_fp8);
  else
    moe_experts_backward(st.permuted_x.data(), st.tokens_per_expert.data(), w.fc1_weight, w.fc2_weight,
                         st.fc1_out.data(), st.act_out.data(), st.dexpert_out.data(), st.dact.data(),
                         st.dfc1_out.data(), st.dpermuted_x.data(), g.fc1_weight, g.fc2_weight, E, H, F,
                         c.activation, w.expert_lora, w.expert_fp8);
  moe_permute_backward(st.dpermuted_x.data(), st.permuted_row.data(), dx, T, k, H);

  if (Fs > 0) {
    const int64_t all = T;
    moe_experts_backward(x, &all, w.shared_fc1_weight, w.shared_fc2_weight, st.shared_fc1_out.data(),
                         st.shared_act_out.data(), dy, st.dact.data(), st.dfc1_out.data(), st.dx_part.data(),
                         g.shared_fc1_weight, g.shared_fc2_weight, 1, H, Fs, c.activation, w.shared_lora,
                         w.shared_fp8);
    add_inplace(dx, st.dx_part.data(), T * H);
  }

  // router: probs' gradient, then the aux and z losses' (each with gradient aux_loss_scale).
  const float* logits = st.logits.data();
  float* dlogits = st.dlogits.data();
  moe_router_topk_backward(logits, st.topk_idx.data(), st.dprobs.data(), dlogits, T, E, k, c.router);
  if (c.aux_loss_coeff > 0.0f && T > 0)
    moe_seq_aux_loss_backward(logits, st.scores_for_aux_loss.data(), st.aux_counts.data(), 1, T,
                              T * c.context_parallel_size, E, k, c.router.score_function, c.aux_loss_coeff,
                              aux_loss_scale, dlogits);
  if (c.seq_aux_loss_coeff > 0.0f)
    moe_seq_aux_loss_backward(logits, st.scores_for_aux_loss.data(), st.seq_aux_counts.data(), T / c.seq_length,
                              c.seq_length, c.seq_length * c.context_parallel_size, E, k, c.router.score_function,
                              c.seq_aux_loss_coeff, aux_loss_scale,
                              dlogits);
  if (!st.global_counts.empty())
    moe_global_aux_loss_backward(logits, st.scores_for_aux_loss.data(), st.global_counts.data(), T,
                                 static_cast<double>(T * c.data_parallel_size), E, k, c.router.score_function,
                                 c.global_aux_loss_coeff, aux_loss_scale, dlogits);
  if (c.z_loss_coeff > 0.0f) moe_z_loss_backward(logits, T, E, z_loss_coeff(c), aux_loss_scale, dlogits);
  linear_backward(x, w.router_weight, dlogits, st.dx_part.data(), g.router_weight,
                  w.router_bias ? g.router_bias : nullptr, T, H, E);
  add_inplace(dx, st.dx_part.data(), T * H);
}

}  // namespace laoyao::kernels::cpu
