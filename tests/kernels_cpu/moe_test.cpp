// Megatron-Core MoE ops (router, aux / seq-aux / z losses, permute / unpermute, routed experts, the
// whole layer) against naive fp64 twins written here with straight loops, and finite differences.
//
// Top-k and finite differences: the expert choice is piecewise constant, so a central difference
// is the derivative only if neither perturbed evaluation changes a token's top-k (set or order).
// Every twin below returns the indices it chose and each FD loss checks them against the
// unperturbed ones (`flips` counts the evaluations that changed): random normal logits have gaps
// ~1e-3 or more between neighbours, far above eps = 1e-6, so no flip is expected and any is a failure.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <deque>
#include <functional>
#include <optional>
#include <string>

#include "core/counter_normal.hpp"
#include "core/error.hpp"
#include "core/fp8_scaling.hpp"
#include "core/rng.hpp"
#include "kernels/cpu/moe.hpp"
#include "test_util.hpp"

namespace laoyao::kernels::cpu::test {
namespace {

// ---------------------------------------------------------------------------------------------
// fp64 twins

// Top k by repeated argmax over the not-yet-taken entries; strict > keeps the lower index on ties.
std::vector<int64_t> topk_twin(const double* v, int64_t E, int64_t k) {
  std::vector<bool> taken(E, false);
  std::vector<int64_t> idx;
  for (int64_t j = 0; j < k; ++j) {
    int64_t best = -1;
    for (int64_t e = 0; e < E; ++e)
      if (!taken[e] && (best < 0 || v[e] > v[best])) best = e;
    taken[best] = true;
    idx.push_back(best);
  }
  return idx;
}

double sigmoid_d(double v) { return 1.0 / (1.0 + std::exp(-v)); }
// A sigmoid-like score function's score in double: the sigmoid, or sqrt(softplus) (PyTorch's
// softplus: the identity above 20).
double gate_d(MoeScoreFunction fn, double v) {
  if (fn == MoeScoreFunction::SqrtSoftplus) return std::sqrt(v > 20.0 ? v : std::log1p(std::exp(v)));
  return sigmoid_d(v);
}

std::vector<double> softmax_twin(const double* z, int64_t n) {
  double m = z[0];
  for (int64_t i = 1; i < n; ++i) m = std::max(m, z[i]);
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(z[i] - m);
  std::vector<double> p(n);
  for (int64_t i = 0; i < n; ++i) p[i] = std::exp(z[i] - m) / s;
  return p;
}

struct Routed {
  std::vector<int64_t> idx;   // [T, k]
  std::vector<double> probs;  // [T, k]
};

// The top-k of a token's routing scores, group-limited when p.num_groups > 0 (Megatron's
// group_limited_topk): groups scored by the sum of their k/g largest, the g best kept.
std::vector<int64_t> choose_twin(const double* v, int64_t E, int64_t k, const MoeRouterParams& p) {
  if (p.num_groups == 0) return topk_twin(v, E, k);
  const int64_t G = p.num_groups, per = E / G, pick = k / p.group_topk;
  std::vector<double> group(G, 0.0);
  for (int64_t g = 0; g < G; ++g)
    for (int64_t e : topk_twin(v + g * per, per, pick)) group[g] += v[g * per + e];
  std::vector<double> masked(E, -INFINITY);
  for (int64_t g : topk_twin(group.data(), G, p.group_topk))
    for (int64_t e = g * per; e < (g + 1) * per; ++e) masked[e] = v[e];
  return topk_twin(masked.data(), E, k);
}

// Megatron's topk_routing_with_score_function, written out per token.
Routed router_twin(const std::vector<double>& logits, const std::vector<double>* expert_bias, int64_t T, int64_t E,
                   int64_t k, const MoeRouterParams& p) {
  Routed r;
  for (int64_t t = 0; t < T; ++t) {
    const double* z = logits.data() + t * E;
    std::vector<int64_t> idx;
    std::vector<double> probs(k);
    if (p.score_function == MoeScoreFunction::Softmax && !p.pre_softmax) {
      idx = choose_twin(z, E, k, p);
      std::vector<double> vals(k);
      for (int64_t j = 0; j < k; ++j) vals[j] = z[idx[j]];
      probs = softmax_twin(vals.data(), k);
    } else if (p.score_function == MoeScoreFunction::Softmax) {
      const auto s = softmax_twin(z, E);
      idx = choose_twin(s.data(), E, k, p);
      for (int64_t j = 0; j < k; ++j) probs[j] = s[idx[j]];
    } else {
      std::vector<double> s(E), key(E);
      for (int64_t e = 0; e < E; ++e) {
        s[e] = gate_d(p.score_function, z[e]);
        key[e] = s[e] + (expert_bias ? (*expert_bias)[e] : 0.0);
      }
      idx = choose_twin(key.data(), E, k, p);
      double sum = 0.0;
      for (int64_t j = 0; j < k; ++j) sum += s[idx[j]];
      for (int64_t j = 0; j < k; ++j) probs[j] = k > 1 ? s[idx[j]] / (sum + 1e-20) : s[idx[j]];
    }
    if (p.topk_scaling_factor)
      for (auto& v : probs) v *= *p.topk_scaling_factor;
    r.idx.insert(r.idx.end(), idx.begin(), idx.end());
    r.probs.insert(r.probs.end(), probs.begin(), probs.end());
  }
  return r;
}

// scores_for_aux_loss and their own top-k.
std::vector<double> aux_scores_twin(const std::vector<double>& logits, int64_t T, int64_t E, MoeScoreFunction fn,
                                    int64_t k, std::vector<int64_t>* aux_idx) {
  std::vector<double> scores(T * E);
  if (aux_idx) aux_idx->clear();
  for (int64_t t = 0; t < T; ++t) {
    const double* z = logits.data() + t * E;
    std::vector<double> s;
    if (fn == MoeScoreFunction::Softmax) {
      s = softmax_twin(z, E);
    } else {
      s.resize(E);
      double sum = 0.0;
      for (int64_t e = 0; e < E; ++e) sum += gate_d(fn, z[e]);
      for (int64_t e = 0; e < E; ++e) s[e] = gate_d(fn, z[e]) / (sum + 1e-20);
    }
    for (int64_t e = 0; e < E; ++e) scores[t * E + e] = s[e];
    if (aux_idx) {
      const auto idx = topk_twin(s.data(), E, k);
      aux_idx->insert(aux_idx->end(), idx.begin(), idx.end());
    }
  }
  return scores;
}

// seq_aux_loss written as Megatron's sequence_load_balancing_loss_func: per sequence j,
// cost_coeff[j, i] = c[j, i] / (s*k/E); loss = mean_j sum_i cost_coeff[j, i] * mean_{t in j} scores[t, i]
// times coeff. b = 1, s = T is the switch aux_loss.
double seq_aux_twin(const std::vector<double>& logits, int64_t b, int64_t s, int64_t E, int64_t k,
                    MoeScoreFunction fn, double coeff, std::vector<int64_t>* aux_idx_out = nullptr) {
  std::vector<int64_t> aux_idx;
  const auto scores = aux_scores_twin(logits, b * s, E, fn, k, &aux_idx);
  if (aux_idx_out) *aux_idx_out = aux_idx;
  double total = 0.0;
  for (int64_t j = 0; j < b; ++j) {
    double seq = 0.0;
    for (int64_t i = 0; i < E; ++i) {
      double count = 0.0, mean_score = 0.0;
      for (int64_t t = j * s; t < (j + 1) * s; ++t) {
        for (int64_t c = 0; c < k; ++c) count += aux_idx[t * k + c] == i ? 1.0 : 0.0;
        mean_score += scores[t * E + i] / static_cast<double>(s);
      }
      seq += count / (static_cast<double>(s) * k / E) * mean_score;
    }
    total += seq;
  }
  return total / b * coeff;
}

// Megatron's switch_load_balancing_loss_func, as its own formula (not via the seq twin).
double aux_twin(const std::vector<double>& logits, int64_t T, int64_t E, int64_t k, MoeScoreFunction fn,
                double coeff, std::vector<int64_t>* aux_idx_out = nullptr) {
  std::vector<int64_t> aux_idx;
  const auto scores = aux_scores_twin(logits, T, E, fn, k, &aux_idx);
  if (aux_idx_out) *aux_idx_out = aux_idx;
  double sum = 0.0;
  for (int64_t i = 0; i < E; ++i) {
    double tokens = 0.0, probs = 0.0;
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t c = 0; c < k; ++c) tokens += aux_idx[t * k + c] == i ? 1.0 : 0.0;
      probs += scores[t * E + i];
    }
    sum += probs * tokens;
  }
  return sum * (E * coeff / (static_cast<double>(k) * T * T));
}

// global_aux_loss with given counts and token total: E * coeff / (k * total^2) * sum_i P_i * counts_i.
double global_aux_twin(const std::vector<double>& logits, const std::vector<double>& counts, int64_t T, double total,
                       int64_t E, int64_t k, MoeScoreFunction fn, double coeff) {
  std::vector<int64_t> aux_idx;
  const auto scores = aux_scores_twin(logits, T, E, fn, k, &aux_idx);
  double sum = 0.0;
  for (int64_t i = 0; i < E; ++i) {
    double probs = 0.0;
    for (int64_t t = 0; t < T; ++t) probs += scores[t * E + i];
    sum += probs * counts[i];
  }
  return sum * (E * coeff / (static_cast<double>(k) * total * total));
}

double z_twin(const std::vector<double>& logits, int64_t T, int64_t E, double coeff) {
  double sum = 0.0;
  for (int64_t t = 0; t < T; ++t) {
    double m = logits[t * E];
    for (int64_t e = 1; e < E; ++e) m = std::max(m, logits[t * E + e]);
    double s = 0.0;
    for (int64_t e = 0; e < E; ++e) s += std::exp(logits[t * E + e] - m);
    const double lse = m + std::log(s);
    sum += lse * lse;
  }
  return sum / T * coeff;
}

double silu_d(double v) { return v * sigmoid_d(v); }
double gelu_d(double v, MoeActivation act) {
  if (act == MoeActivation::GeluTanh) return v * 0.5 * (1.0 + std::tanh(0.79788456 * v * (1.0 + 0.044715 * v * v)));
  return v * 0.5 * (1.0 + std::erf(v / std::sqrt(2.0)));
}

// One expert MLP on one token: out[H] = fc2 @ act(fc1 @ x). SwiGLU: fc1 rows [0, F) are the gate.
void mlp_twin(const double* x, const double* w1, const double* w2, int64_t H, int64_t F, MoeActivation act,
              double* out) {
  const int64_t F1 = act == MoeActivation::SwiGlu ? 2 * F : F;
  std::vector<double> h(F1), a(F);
  for (int64_t f = 0; f < F1; ++f) {
    h[f] = 0.0;
    for (int64_t c = 0; c < H; ++c) h[f] += w1[f * H + c] * x[c];
  }
  for (int64_t f = 0; f < F; ++f) a[f] = act == MoeActivation::SwiGlu ? silu_d(h[f]) * h[F + f] : gelu_d(h[f], act);
  for (int64_t c = 0; c < H; ++c) {
    out[c] = 0.0;
    for (int64_t f = 0; f < F; ++f) out[c] += w2[c * F + f] * a[f];
  }
}

// Megatron's permute: walk the [T, E] routing map expert by expert, tokens in order.
std::vector<int64_t> sorted_indices_twin(const std::vector<int64_t>& idx, int64_t T, int64_t E, int64_t k,
                                         std::vector<int64_t>* counts) {
  std::vector<std::vector<bool>> map(T, std::vector<bool>(E, false));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) map[t][idx[t * k + j]] = true;
  std::vector<int64_t> sorted;
  counts->assign(E, 0);
  for (int64_t e = 0; e < E; ++e)
    for (int64_t t = 0; t < T; ++t)
      if (map[t][e]) {
        sorted.push_back(t);
        ++(*counts)[e];
      }
  return sorted;
}

// y[t] = sum_j probs[t, j] * expert_out[row of (t, j)]: finds the row by scanning sorted_indices
// within the expert's segment (independent of the op's permuted_row).
std::vector<double> unpermute_twin(const std::vector<double>& expert_out, const std::vector<double>& probs,
                                   const std::vector<int64_t>& idx, const std::vector<int64_t>& sorted,
                                   const std::vector<int64_t>& counts, int64_t T, int64_t k, int64_t H) {
  std::vector<double> y(T * H, 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      int64_t start = 0;
      for (int64_t e = 0; e < idx[t * k + j]; ++e) start += counts[e];
      int64_t row = start;
      while (sorted[row] != t) ++row;
      for (int64_t h = 0; h < H; ++h) y[t * H + h] += probs[t * k + j] * expert_out[row * H + h];
    }
  return y;
}

// Expects the same indices; returns how many differ (for FD flip counting).
int64_t count_diff(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  if (a.size() != b.size()) return static_cast<int64_t>(std::max(a.size(), b.size()));
  int64_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += a[i] != b[i];
  return n;
}

// ---------------------------------------------------------------------------------------------
// router

enum class Mode { SoftmaxPost, SoftmaxPre, Sigmoid, SigmoidBias, SqrtSoftplus, SqrtSoftplusBias };
const char* mode_name(Mode m) {
  switch (m) {
    case Mode::SoftmaxPost: return "SoftmaxPost";
    case Mode::SoftmaxPre: return "SoftmaxPre";
    case Mode::Sigmoid: return "Sigmoid";
    case Mode::SigmoidBias: return "SigmoidBias";
    case Mode::SqrtSoftplus: return "SqrtSoftplus";
    case Mode::SqrtSoftplusBias: return "SqrtSoftplusBias";
  }
  return "?";
}
bool biased(Mode m) { return m == Mode::SigmoidBias || m == Mode::SqrtSoftplusBias; }
MoeRouterParams params_of(Mode m, std::optional<float> scaling) {
  MoeRouterParams p;
  p.score_function = (m == Mode::Sigmoid || m == Mode::SigmoidBias)             ? MoeScoreFunction::Sigmoid
                     : (m == Mode::SqrtSoftplus || m == Mode::SqrtSoftplusBias) ? MoeScoreFunction::SqrtSoftplus
                                                                                : MoeScoreFunction::Softmax;
  p.pre_softmax = m == Mode::SoftmaxPre;
  p.topk_scaling_factor = scaling;
  return p;
}

using RouterCase = std::tuple<Mode, int64_t, int64_t>;  // mode, E, k
class MoeRouterTest : public ::testing::TestWithParam<RouterCase> {};
INSTANTIATE_TEST_SUITE_P(Moe, MoeRouterTest,
                         ::testing::Combine(::testing::Values(Mode::SoftmaxPost, Mode::SoftmaxPre, Mode::Sigmoid,
                                                              Mode::SigmoidBias, Mode::SqrtSoftplus,
                                                              Mode::SqrtSoftplusBias),
                                            ::testing::Values<int64_t>(8, 64), ::testing::Values<int64_t>(1, 2, 8)),
                         [](const auto& info) {
                           return std::string(mode_name(std::get<0>(info.param))) + "_E" +
                                  std::to_string(std::get<1>(info.param)) + "_k" +
                                  std::to_string(std::get<2>(info.param));
                         });

// The expert bias is of the size sigmoid scores differ by (~0.1), so it changes some choices.
std::vector<float> expert_bias_for(Mode m, int64_t E, std::mt19937& rng) {
  if (!biased(m)) return {};
  return randn(E, rng, 0.1f);
}

TEST_P(MoeRouterTest, ForwardMatchesFp64Twin) {
  const auto [mode, E, k] = GetParam();
  std::mt19937 rng(1101 + static_cast<int>(E * 10 + k));
  const int64_t T = 9;
  for (const std::optional<float> scaling : {std::optional<float>{}, std::optional<float>{2.5f}}) {
    const auto logits = randn(T * E, rng, 1.5f);
    const auto bias = expert_bias_for(mode, E, rng);
    const auto params = params_of(mode, scaling);
    std::vector<int64_t> idx(T * k, -1);
    auto probs = nans(T * k);
    moe_router_topk_forward(logits.data(), bias.empty() ? nullptr : bias.data(), idx.data(), probs.data(), T, E, k,
                            params);
    const auto bias_d = to_double(bias);
    const auto want = router_twin(to_double(logits), bias.empty() ? nullptr : &bias_d, T, E, k, params);
    EXPECT_EQ(idx, want.idx) << (scaling ? "scaled" : "unscaled");
    // Probabilities: an exp and a normalisation over <= E terms, each fp32-rounded once.
    expect_close(probs, want.probs, kForwardTol, scaling ? "probs (scaled)" : "probs");
  }
}

// Group-limited routing (DeepSeek's: 64 experts in 8 groups, the best 4 groups, top-8; and a small
// case) against the twin, for every score function; it must change some tokens' choices, or the
// test would not show the groups matter.
TEST(MoeRouter, GroupLimitedRoutingMatchesFp64Twin) {
  struct Case {
    int64_t E, k, G, g;
  };
  for (const Case c : {Case{64, 8, 8, 4}, Case{16, 4, 4, 2}})
    for (const Mode mode : {Mode::SoftmaxPost, Mode::SoftmaxPre, Mode::Sigmoid, Mode::SigmoidBias,
                            Mode::SqrtSoftplusBias}) {
      SCOPED_TRACE(std::string(mode_name(mode)) + " E" + std::to_string(c.E));
      std::mt19937 rng(1301 + static_cast<int>(c.E));
      const int64_t T = 40;
      const auto logits = randn(T * c.E, rng, 1.5f);
      const auto bias = expert_bias_for(mode, c.E, rng);
      MoeRouterParams params = params_of(mode, std::nullopt);
      params.num_groups = c.G, params.group_topk = c.g;
      std::vector<int64_t> idx(T * c.k, -1), plain(T * c.k, -1);
      auto probs = nans(T * c.k), plain_probs = nans(T * c.k);
      const float* b = bias.empty() ? nullptr : bias.data();
      moe_router_topk_forward(logits.data(), b, idx.data(), probs.data(), T, c.E, c.k, params);
      const auto bias_d = to_double(bias);
      const auto want = router_twin(to_double(logits), bias.empty() ? nullptr : &bias_d, T, c.E, c.k, params);
      EXPECT_EQ(idx, want.idx);
      expect_close(probs, want.probs, kForwardTol, "probs");
      moe_router_topk_forward(logits.data(), b, plain.data(), plain_probs.data(), T, c.E, c.k,
                              params_of(mode, std::nullopt));
      EXPECT_NE(idx, plain) << "the groups changed no token's experts";
    }
  MoeRouterParams bad;
  bad.num_groups = 3, bad.group_topk = 2;  // 3 does not divide 16
  std::vector<float> z(16, 0.0f), p(4);
  std::vector<int64_t> i(4);
  EXPECT_THROW(moe_router_topk_forward(z.data(), nullptr, i.data(), p.data(), 1, 16, 4, bad), Error);
}

TEST_P(MoeRouterTest, BackwardMatchesFiniteDifferences) {
  const auto [mode, E, k] = GetParam();
  std::mt19937 rng(1201 + static_cast<int>(E * 10 + k));
  const int64_t T = 9;
  const std::optional<float> scaling = k == 2 ? std::optional<float>{2.5f} : std::nullopt;
  const auto params = params_of(mode, scaling);
  const auto logits = randn(T * E, rng, 1.5f);
  const auto bias = expert_bias_for(mode, E, rng);
  const auto r = randn(T * k, rng);
  std::vector<int64_t> idx(T * k);
  std::vector<float> probs(T * k);
  const float* bias_p = bias.empty() ? nullptr : bias.data();
  moe_router_topk_forward(logits.data(), bias_p, idx.data(), probs.data(), T, E, k, params);
  auto dlogits = nans(T * E);  // overwritten, every element
  moe_router_topk_backward(logits.data(), idx.data(), r.data(), dlogits.data(), T, E, k, params);

  auto zd = to_double(logits);
  const auto rd = to_double(r), bias_d = to_double(bias);
  int64_t flips = 0;
  auto loss = [&] {
    const auto out = router_twin(zd, bias.empty() ? nullptr : &bias_d, T, E, k, params);
    flips += count_diff(out.idx, idx) > 0;
    return project(rd, out.probs);
  };
  const auto want = numeric_grad(loss, zd);
  EXPECT_EQ(flips, 0) << "a perturbation changed a top-k choice";
  if (mode == Mode::SoftmaxPost && k == 1) {
    // softmax over one value is identically 1: no gradient reaches the logits.
    for (float g : dlogits) EXPECT_EQ(g, 0.0f);
    EXPECT_LT(max_abs(want), 1e-8);
  } else {
    expect_close(dlogits, want, kGradTol, "dlogits");
  }
}

TEST(MoeRouter, TiesPickTheLowerExpertIndex) {
  const int64_t E = 8;
  // Equal logits (and hence equal softmax / sigmoid scores) everywhere, then a row with ties at 3.0.
  const std::vector<float> logits = {0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f,
                                     1.0f, 3.0f, 2.0f, 3.0f, 0.0f, 3.0f, -1.0f, 2.0f};
  for (Mode m : {Mode::SoftmaxPost, Mode::SoftmaxPre, Mode::Sigmoid}) {
    for (int64_t k : {1, 3, 4}) {
      std::vector<int64_t> idx(2 * k);
      std::vector<float> probs(2 * k);
      moe_router_topk_forward(logits.data(), nullptr, idx.data(), probs.data(), 2, E, k, params_of(m, {}));
      const std::vector<int64_t> first = {0, 1, 2, 3}, second = {1, 3, 5, 2};
      for (int64_t j = 0; j < k; ++j) {
        EXPECT_EQ(idx[j], first[j]) << mode_name(m) << " k=" << k;
        EXPECT_EQ(idx[k + j], second[j]) << mode_name(m) << " k=" << k;
      }
    }
  }
}

TEST(MoeRouter, SoftmaxTop1WithoutPreSoftmaxIsOne) {
  std::mt19937 rng(1301);
  const int64_t T = 5, E = 8;
  const auto logits = randn(T * E, rng);
  std::vector<int64_t> idx(T);
  std::vector<float> probs(T), dlogits = nans(T * E);
  const auto params = params_of(Mode::SoftmaxPost, 3.0f);
  moe_router_topk_forward(logits.data(), nullptr, idx.data(), probs.data(), T, E, 1, params);
  for (float p : probs) EXPECT_EQ(p, 3.0f);  // exp(0) / 1, times the scaling factor: exact
  const auto dprobs = randn(T, rng);
  moe_router_topk_backward(logits.data(), idx.data(), dprobs.data(), dlogits.data(), T, E, 1, params);
  for (float g : dlogits) EXPECT_EQ(g, 0.0f);
}

// The expert bias only chooses: a large bias on the last expert puts it in every token's top-k,
// and the probs are the unbiased sigmoid scores of the chosen experts, normalised.
TEST(MoeRouter, SigmoidExpertBiasChoosesButDoesNotWeigh) {
  std::mt19937 rng(1302);
  const int64_t T = 6, E = 8, k = 2;
  const auto logits = randn(T * E, rng);
  std::vector<float> bias(E, 0.0f);
  bias[E - 1] = 5.0f;
  std::vector<int64_t> idx(T * k);
  std::vector<float> probs(T * k);
  moe_router_topk_forward(logits.data(), bias.data(), idx.data(), probs.data(), T, E, k, params_of(Mode::Sigmoid, {}));
  for (int64_t t = 0; t < T; ++t) {
    EXPECT_EQ(idx[t * k], E - 1);
    const double s0 = sigmoid_d(logits[t * E + idx[t * k]]), s1 = sigmoid_d(logits[t * E + idx[t * k + 1]]);
    EXPECT_NEAR(probs[t * k], s0 / (s0 + s1), 1e-6);
    EXPECT_NEAR(probs[t * k + 1], s1 / (s0 + s1), 1e-6);
  }
}

// ---------------------------------------------------------------------------------------------
// aux losses

using AuxCase = std::tuple<MoeScoreFunction, int64_t, int64_t>;  // score function, E, k
class MoeAuxLossTest : public ::testing::TestWithParam<AuxCase> {};
INSTANTIATE_TEST_SUITE_P(Moe, MoeAuxLossTest,
                         ::testing::Combine(::testing::Values(MoeScoreFunction::Softmax, MoeScoreFunction::Sigmoid,
                                                              MoeScoreFunction::SqrtSoftplus),
                                            ::testing::Values<int64_t>(8, 64), ::testing::Values<int64_t>(1, 2, 8)),
                         [](const auto& info) {
                           const MoeScoreFunction fn = std::get<0>(info.param);
                           return std::string(fn == MoeScoreFunction::Softmax   ? "Softmax"
                                              : fn == MoeScoreFunction::Sigmoid ? "Sigmoid"
                                                                                : "SqrtSoftplus") +
                                  "_E" + std::to_string(std::get<1>(info.param)) + "_k" +
                                  std::to_string(std::get<2>(info.param));
                         });

TEST_P(MoeAuxLossTest, ForwardMatchesFp64Twin) {
  const auto [fn, E, k] = GetParam();
  std::mt19937 rng(1401 + static_cast<int>(E * 10 + k));
  const int64_t b = 3, s = 5, T = b * s;
  const float coeff = 0.03f;
  const auto logits = randn(T * E, rng, 1.5f);
  auto scores = nans(T * E);
  std::vector<int64_t> aux_idx(T * k, -1);
  moe_aux_loss_scores(logits.data(), scores.data(), aux_idx.data(), T, E, k, fn);
  const auto zd = to_double(logits);
  std::vector<int64_t> want_idx;
  expect_close(scores, aux_scores_twin(zd, T, E, fn, k, &want_idx), kForwardTol, "scores_for_aux_loss");
  EXPECT_EQ(aux_idx, want_idx);
  // Scalars from T*E fp32 scores summed in double: relative error ~ the scores' rounding.
  const double aux = aux_twin(zd, T, E, k, fn, coeff), seq = seq_aux_twin(zd, b, s, E, k, fn, coeff);
  EXPECT_NEAR(moe_aux_loss_forward(scores.data(), aux_idx.data(), T, E, k, coeff), aux, 1e-6 * aux);
  EXPECT_NEAR(moe_seq_aux_loss_forward(scores.data(), aux_idx.data(), b, s, E, k, coeff), seq, 1e-6 * seq);
}

TEST_P(MoeAuxLossTest, BackwardMatchesFiniteDifferences) {
  const auto [fn, E, k] = GetParam();
  std::mt19937 rng(1501 + static_cast<int>(E * 10 + k));
  const int64_t b = 3, s = 5, T = b * s;
  const float coeff = 0.3f, dloss = 0.7f;
  const auto logits = randn(T * E, rng, 1.5f);
  std::vector<float> scores(T * E);
  std::vector<int64_t> aux_idx(T * k);
  moe_aux_loss_scores(logits.data(), scores.data(), aux_idx.data(), T, E, k, fn);
  const auto base = randn(T * E, rng);
  for (const bool seq : {false, true}) {
    auto backward = [&](std::vector<float>& dlogits) {
      if (seq)
        moe_seq_aux_loss_backward(logits.data(), scores.data(), aux_idx.data(), b, s, E, k, fn, coeff, dloss,
                                  dlogits.data());
      else
        moe_aux_loss_backward(logits.data(), scores.data(), aux_idx.data(), T, E, k, fn, coeff, dloss,
                              dlogits.data());
    };
    std::vector<float> dlogits(T * E, 0.0f);
    backward(dlogits);
    auto zd = to_double(logits);
    int64_t flips = 0;
    auto loss = [&] {
      std::vector<int64_t> idx;
      const double v = seq ? seq_aux_twin(zd, b, s, E, k, fn, coeff, &idx) : aux_twin(zd, T, E, k, fn, coeff, &idx);
      flips += count_diff(idx, aux_idx) > 0;
      return dloss * v;
    };
    const auto want = numeric_grad(loss, zd);
    EXPECT_EQ(flips, 0) << "a perturbation changed a top-k choice";
    if (k == E) {
      // Every token picks every expert: tokens_per_expert = T (s per sequence) and the loss is
      // coeff whatever the logits, so the gradient is 0 up to the fp32 rounding of the scores'
      // row sums (~1e-7 of a per-token gradient unit E * coeff * dloss / (k * T), here ~1e-2).
      std::vector<double> got(dlogits.begin(), dlogits.end());
      EXPECT_LT(max_abs(got), 1e-8);
      EXPECT_LT(max_abs(want), 1e-8);
    } else {
      expect_close(dlogits, want, kGradTol, seq ? "dlogits (seq_aux_loss)" : "dlogits (aux_loss)");
    }
    // It adds to what the buffer holds (each element receives one fp32 +=, so the sum is exact to compare).
    auto accumulated = base;
    backward(accumulated);
    for (int64_t i = 0; i < T * E; ++i) EXPECT_EQ(accumulated[i], base[i] + dlogits[i]) << i;
  }
}

// global_aux_loss with other ranks' counts folded in (fixed counts, so no choice can flip): the
// fp64 twin and finite differences; with this rank's own counts and total T it is aux_loss.
TEST_P(MoeAuxLossTest, GlobalAuxLossMatchesItsTwinAndFiniteDifferences) {
  const auto [fn, E, k] = GetParam();
  std::mt19937 rng(1601 + static_cast<int>(E * 10 + k));
  const int64_t T = 12;
  const float coeff = 0.3f, dloss = 0.7f;
  const double total = 2.0 * T;  // two data-parallel ranks
  const auto logits = randn(T * E, rng, 1.5f);
  std::vector<float> scores(T * E);
  std::vector<int64_t> aux_idx(T * k);
  moe_aux_loss_scores(logits.data(), scores.data(), aux_idx.data(), T, E, k, fn);
  std::vector<double> counts(E);
  std::uniform_real_distribution<double> u(0.0, 2.0 * T * k / E);
  for (auto& c : counts) c = u(rng);
  const auto zd = to_double(logits);
  const double want = global_aux_twin(zd, counts, T, total, E, k, fn, coeff);
  EXPECT_NEAR(moe_global_aux_loss_forward(scores.data(), counts.data(), T, total, E, k, coeff), want, 1e-6 * want);
  std::vector<float> dlogits(T * E, 0.0f);
  moe_global_aux_loss_backward(logits.data(), scores.data(), counts.data(), T, total, E, k, fn, coeff, dloss,
                               dlogits.data());
  auto zp = zd;
  const auto grad = numeric_grad([&] { return dloss * global_aux_twin(zp, counts, T, total, E, k, fn, coeff); }, zp);
  expect_close(dlogits, grad, kGradTol, "dlogits (global_aux_loss)");
  // This rank alone: the aux loss, forward and backward.
  std::vector<double> own(E, 0.0);
  for (int64_t i : aux_idx) own[i] += 1.0;
  const float aux = moe_aux_loss_forward(scores.data(), aux_idx.data(), T, E, k, coeff);
  EXPECT_NEAR(moe_global_aux_loss_forward(scores.data(), own.data(), T, T, E, k, coeff), aux, 1e-6 * aux);
  std::vector<float> d_global(T * E, 0.0f), d_aux(T * E, 0.0f);
  moe_global_aux_loss_backward(logits.data(), scores.data(), own.data(), T, T, E, k, fn, coeff, dloss, d_global.data());
  moe_aux_loss_backward(logits.data(), scores.data(), aux_idx.data(), T, E, k, fn, coeff, dloss, d_aux.data());
  for (int64_t i = 0; i < T * E; ++i) EXPECT_NEAR(d_global[i], d_aux[i], 1e-6 * std::abs(d_aux[i]) + 1e-9) << i;
}

// Context parallelism: each of 2 ranks holds chunks r and 3 - r of every sequence's 4 (Megatron's
// load-balanced split), scores its own tokens, and takes the tokens per expert summed over both
// ranks with the whole sequence's length: the ranks' seq-aux (and aux) losses sum to the whole
// sequences' loss, and each rank's logit gradients are the whole loss's at its tokens.
TEST_P(MoeAuxLossTest, ContextParallelSharesSumToTheWholeSequencesLoss) {
  const auto [fn, E, k] = GetParam();
  std::mt19937 rng(1651 + static_cast<int>(E * 10 + k));
  const int64_t b = 3, S = 8, T = b * S, cp = 2;
  const float coeff = 0.3f, dloss = 0.7f;
  const auto logits = randn(T * E, rng, 1.5f);
  std::vector<float> scores(T * E);
  std::vector<int64_t> aux_idx(T * k);
  moe_aux_loss_scores(logits.data(), scores.data(), aux_idx.data(), T, E, k, fn);
  for (const bool per_sequence : {true, false}) {
    // aux_loss is the one-sequence case: all T tokens one sequence, each rank T / cp of them.
    const int64_t nb = per_sequence ? b : 1, whole = per_sequence ? S : T, local = whole / cp, cw = whole / (2 * cp);
    const float want = moe_seq_aux_loss_forward(scores.data(), aux_idx.data(), nb, whole, E, k, coeff);
    std::vector<float> want_grad(T * E, 0.0f);
    moe_seq_aux_loss_backward(logits.data(), scores.data(), aux_idx.data(), nb, whole, E, k, fn, coeff, dloss,
                              want_grad.data());
    std::vector<std::vector<int64_t>> rows(cp);  // each rank's tokens, in its order
    for (int64_t r = 0; r < cp; ++r)
      for (int64_t j = 0; j < nb; ++j)
        for (const int64_t chunk : {r, 2 * cp - 1 - r})
          for (int64_t i = 0; i < cw; ++i) rows[r].push_back(j * whole + chunk * cw + i);
    std::vector<double> counts(nb * E, 0.0);
    std::vector<std::vector<float>> rank_logits(cp), rank_scores(cp);
    for (int64_t r = 0; r < cp; ++r) {
      std::vector<int64_t> idx;
      for (const int64_t t : rows[r]) {
        rank_logits[r].insert(rank_logits[r].end(), logits.begin() + t * E, logits.begin() + (t + 1) * E);
        rank_scores[r].insert(rank_scores[r].end(), scores.begin() + t * E, scores.begin() + (t + 1) * E);
        idx.insert(idx.end(), aux_idx.begin() + t * k, aux_idx.begin() + (t + 1) * k);
      }
      const auto own = moe_sequence_counts(idx.data(), nb, local, E, k);
      for (size_t i = 0; i < counts.size(); ++i) counts[i] += own[i];  // the sum over the CP group
    }
    double sum = 0.0;
    for (int64_t r = 0; r < cp; ++r) {
      sum += moe_seq_aux_loss_forward(rank_scores[r].data(), counts.data(), nb, local, whole, E, k, coeff);
      std::vector<float> grad(local * nb * E, 0.0f);
      moe_seq_aux_loss_backward(rank_logits[r].data(), rank_scores[r].data(), counts.data(), nb, local, whole, E, k,
                                fn, coeff, dloss, grad.data());
      for (size_t i = 0; i < rows[r].size(); ++i)
        for (int64_t e = 0; e < E; ++e)
          EXPECT_NEAR(grad[i * E + e], want_grad[rows[r][i] * E + e], 1e-6 * std::abs(want_grad[rows[r][i] * E + e]) + 1e-9)
              << (per_sequence ? "seq_aux" : "aux") << " rank " << r << " token " << rows[r][i];
    }
    EXPECT_NEAR(sum, want, 1e-6 * want) << (per_sequence ? "seq_aux" : "aux");
  }
  EXPECT_THROW(moe_seq_aux_loss_forward(scores.data(), std::vector<double>(E, 1.0).data(), 1, T, T - 1, E, k, coeff),
               laoyao::Error);
}

// Each expert gets exactly T*k/E tokens (and s*k/E per sequence): aux = seq_aux = coeff, whatever
// the scores, since each token's scores sum to 1.
TEST(MoeAuxLoss, PerfectlyBalancedRoutingGivesCoeff) {
  for (const auto fn : {MoeScoreFunction::Softmax, MoeScoreFunction::Sigmoid, MoeScoreFunction::SqrtSoftplus}) {
    std::mt19937 rng(1601);
    const int64_t E = 8, k = 2, b = 2, s = 8, T = b * s;
    auto logits = randn(T * E, rng, 0.5f);
    for (int64_t t = 0; t < T; ++t) {  // token t prefers experts t mod E and (t+1) mod E
      logits[t * E + t % E] += 6.0f;
      logits[t * E + (t + 1) % E] += 5.0f;
    }
    std::vector<float> scores(T * E);
    std::vector<int64_t> aux_idx(T * k);
    moe_aux_loss_scores(logits.data(), scores.data(), aux_idx.data(), T, E, k, fn);
    std::vector<int64_t> counts(E, 0);
    for (int64_t v : aux_idx) ++counts[v];
    for (int64_t c : counts) ASSERT_EQ(c, T * k / E);
    const float coeff = 0.01f;
    EXPECT_NEAR(moe_aux_loss_forward(scores.data(), aux_idx.data(), T, E, k, coeff), coeff, 1e-6 * coeff);
    EXPECT_NEAR(moe_seq_aux_loss_forward(scores.data(), aux_idx.data(), b, s, E, k, coeff), coeff, 1e-6 * coeff);
  }
}

// Everything on one expert (k = 1): aux = E * coeff * mean_t scores[t, that expert] (the maximum
// imbalance), a known value that the balanced case does not test.
TEST(MoeAuxLoss, FullyImbalancedRouting) {
  std::mt19937 rng(1602);
  const int64_t E = 8, k = 1, T = 10;
  auto logits = randn(T * E, rng, 0.5f);
  for (int64_t t = 0; t < T; ++t) logits[t * E + 3] += 8.0f;
  std::vector<float> scores(T * E);
  std::vector<int64_t> aux_idx(T * k);
  moe_aux_loss_scores(logits.data(), scores.data(), aux_idx.data(), T, E, k, MoeScoreFunction::Softmax);
  double mean = 0.0;
  for (int64_t t = 0; t < T; ++t) mean += scores[t * E + 3] / T;
  EXPECT_NEAR(moe_aux_loss_forward(scores.data(), aux_idx.data(), T, E, k, 1.0f), E * mean, 1e-6 * E);
}

TEST(MoeZLoss, ValueAndGradient) {
  std::mt19937 rng(1701);
  const int64_t T = 7, E = 64;
  auto logits = randn(T * E, rng, 2.0f);
  for (int64_t e = 0; e < E; ++e) {  // rows far from zero: the logsumexp must subtract the max
    logits[1 * E + e] += 60.0f;
    logits[2 * E + e] -= 90.0f;
  }
  const float coeff = 1e-3f, dloss = 0.7f;
  const auto zd0 = to_double(logits);
  const double want = z_twin(zd0, T, E, coeff);
  EXPECT_NEAR(moe_z_loss_forward(logits.data(), T, E, coeff), want, 1e-6 * want);

  std::vector<float> dlogits(T * E, 0.0f);
  moe_z_loss_backward(logits.data(), T, E, coeff, dloss, dlogits.data());
  auto zd = zd0;
  // Rows at |logits| ~ 90: fp32 inputs carry 90 * 6e-8 absolute error into exp(z - lse), ~5e-6 relative.
  expect_close(dlogits, numeric_grad([&] { return dloss * z_twin(zd, T, E, coeff); }, zd), 2 * kGradTol,
               "dlogits");
  // accumulates
  const auto once = dlogits;
  moe_z_loss_backward(logits.data(), T, E, coeff, dloss, dlogits.data());
  for (int64_t i = 0; i < T * E; ++i) EXPECT_FLOAT_EQ(dlogits[i], 2 * once[i]);
}

// ---------------------------------------------------------------------------------------------
// permute / unpermute

struct Dispatch {
  std::vector<int64_t> idx, counts, sorted, row;
};
Dispatch random_dispatch(int64_t T, int64_t E, int64_t k, std::mt19937& rng) {
  const auto logits = randn(T * E, rng);
  Dispatch d{std::vector<int64_t>(T * k), std::vector<int64_t>(E), std::vector<int64_t>(T * k),
             std::vector<int64_t>(T * k)};
  std::vector<float> probs(T * k);
  moe_router_topk_forward(logits.data(), nullptr, d.idx.data(), probs.data(), T, E, k,
                          params_of(Mode::SoftmaxPost, {}));
  moe_permutation(d.idx.data(), T, E, k, d.counts.data(), d.sorted.data(), d.row.data());
  return d;
}

TEST(MoePermute, PermutationIsMegatronsStableExpertMajorOrder) {
  std::mt19937 rng(1801);
  for (const auto& [E, k] : {std::pair<int64_t, int64_t>{8, 1}, {8, 2}, {8, 8}, {64, 8}}) {
    const int64_t T = 23;
    const auto d = random_dispatch(T, E, k, rng);
    std::vector<int64_t> want_counts;
    EXPECT_EQ(d.sorted, sorted_indices_twin(d.idx, T, E, k, &want_counts)) << "E=" << E << " k=" << k;
    EXPECT_EQ(d.counts, want_counts);
    for (int64_t t = 0; t < T; ++t)  // permuted_row is the inverse map
      for (int64_t j = 0; j < k; ++j) EXPECT_EQ(d.sorted[d.row[t * k + j]], t);
  }
}

TEST(MoePermute, ForwardsMatchFp64Twin) {
  std::mt19937 rng(1802);
  const int64_t T = 11, E = 8, k = 2, H = 5, N = T * k;
  const auto d = random_dispatch(T, E, k, rng);
  const auto x = randn(T * H, rng), out = randn(N * H, rng), probs = uniform(T * k, rng, 0.1f, 1.0f);
  auto permuted = nans(N * H);
  moe_permute_forward(x.data(), d.sorted.data(), permuted.data(), N, H);
  for (int64_t r = 0; r < N; ++r)
    for (int64_t h = 0; h < H; ++h) EXPECT_EQ(permuted[r * H + h], x[d.sorted[r] * H + h]);
  auto y = nans(T * H);
  moe_unpermute_forward(out.data(), d.row.data(), probs.data(), y.data(), T, k, H);
  expect_close(y, unpermute_twin(to_double(out), to_double(probs), d.idx, d.sorted, d.counts, T, k, H), kForwardTol,
               "y");
}

// Dispatch then combine with the router's probs (which sum to 1 over a token's k experts, softmax
// after top-k) and identity experts gives back x.
TEST(MoePermute, RoundTripGivesBackTheTokens) {
  std::mt19937 rng(1803);
  for (const int64_t k : {1, 2, 8}) {
    const int64_t T = 13, E = 8, H = 7, N = T * k;
    const auto logits = randn(T * E, rng), x = randn(T * H, rng);
    std::vector<int64_t> idx(T * k), counts(E), sorted(N), row(T * k);
    std::vector<float> probs(T * k), permuted(N * H), y(T * H);
    moe_router_topk_forward(logits.data(), nullptr, idx.data(), probs.data(), T, E, k,
                            params_of(Mode::SoftmaxPost, {}));
    moe_permutation(idx.data(), T, E, k, counts.data(), sorted.data(), row.data());
    moe_permute_forward(x.data(), sorted.data(), permuted.data(), N, H);
    moe_unpermute_forward(permuted.data(), row.data(), probs.data(), y.data(), T, k, H);
    expect_close(y, to_double(x), kForwardTol, "round trip, k = " + std::to_string(k));
  }
}

TEST(MoePermute, BackwardsMatchFiniteDifferences) {
  std::mt19937 rng(1804);
  const int64_t T = 11, E = 8, k = 2, H = 5, N = T * k;
  const auto d = random_dispatch(T, E, k, rng);
  const auto x = randn(T * H, rng), out = randn(N * H, rng), probs = uniform(T * k, rng, 0.1f, 1.0f);
  const auto r_perm = randn(N * H, rng), r_y = randn(T * H, rng);

  auto dx = nans(T * H);
  moe_permute_backward(r_perm.data(), d.row.data(), dx.data(), T, k, H);
  auto xd = to_double(x);
  const auto rpd = to_double(r_perm), ryd = to_double(r_y);
  auto permute_loss = [&] {
    std::vector<double> p(N * H);
    for (int64_t row = 0; row < N; ++row)
      for (int64_t h = 0; h < H; ++h) p[row * H + h] = xd[d.sorted[row] * H + h];
    return project(rpd, p);
  };
  expect_close(dx, numeric_grad(permute_loss, xd), kGradTol, "dx (permute)");

  auto dout = nans(N * H), dprobs = nans(T * k);
  moe_unpermute_backward(out.data(), d.row.data(), probs.data(), r_y.data(), dout.data(), dprobs.data(), T, k, H);
  auto outd = to_double(out), pd = to_double(probs);
  auto unpermute_loss = [&] { return project(ryd, unpermute_twin(outd, pd, d.idx, d.sorted, d.counts, T, k, H)); };
  expect_close(dout, numeric_grad(unpermute_loss, outd), kGradTol, "dexpert_out");
  expect_close(dprobs, numeric_grad(unpermute_loss, pd), kGradTol, "dprobs");
}

// ---------------------------------------------------------------------------------------------
// experts

const char* act_name(MoeActivation a) {
  return a == MoeActivation::SwiGlu ? "SwiGlu" : a == MoeActivation::GeluTanh ? "GeluTanh" : "GeluErf";
}

class MoeExpertsTest : public ::testing::TestWithParam<MoeActivation> {};
INSTANTIATE_TEST_SUITE_P(Moe, MoeExpertsTest,
                         ::testing::Values(MoeActivation::SwiGlu, MoeActivation::GeluTanh, MoeActivation::GeluErf),
                         [](const auto& info) { return std::string(act_name(info.param)); });

// Expert e's rows are [sum of earlier counts, + counts[e]); expert 1 has none.
std::vector<double> experts_twin(const std::vector<double>& x, const std::vector<int64_t>& counts,
                                 const std::vector<double>& w1, const std::vector<double>& w2, int64_t H, int64_t F,
                                 MoeActivation act) {
  const int64_t F1 = act == MoeActivation::SwiGlu ? 2 * F : F;
  int64_t N = 0;
  for (int64_t c : counts) N += c;
  std::vector<double> y(N * H);
  int64_t row = 0;
  for (size_t e = 0; e < counts.size(); ++e)
    for (int64_t i = 0; i < counts[e]; ++i, ++row)
      mlp_twin(&x[row * H], &w1[e * F1 * H], &w2[e * H * F], H, F, act, &y[row * H]);
  return y;
}

TEST_P(MoeExpertsTest, ForwardMatchesFp64Twin) {
  const auto act = GetParam();
  std::mt19937 rng(1901);
  const std::vector<int64_t> counts = {3, 0, 5, 2};
  const int64_t E = 4, H = 6, F = 5, N = 10, F1 = moe_fc1_rows(act, F);
  const auto x = randn(N * H, rng), w1 = randn(E * F1 * H, rng, 0.5f), w2 = randn(E * H * F, rng, 0.5f);
  auto h1 = nans(N * F1), a = nans(N * F), y = nans(N * H);
  moe_experts_forward(x.data(), counts.data(), w1.data(), w2.data(), h1.data(), a.data(), y.data(), E, H, F, act);
  expect_close(y, experts_twin(to_double(x), counts, to_double(w1), to_double(w2), H, F, act), kForwardTol, "y");
}

TEST_P(MoeExpertsTest, BackwardMatchesFiniteDifferences) {
  const auto act = GetParam();
  std::mt19937 rng(1902);
  const std::vector<int64_t> counts = {3, 0, 5, 2};
  const int64_t E = 4, H = 6, F = 5, N = 10, F1 = moe_fc1_rows(act, F);
  const auto x = randn(N * H, rng), w1 = randn(E * F1 * H, rng, 0.5f), w2 = randn(E * H * F, rng, 0.5f);
  const auto r = randn(N * H, rng);
  std::vector<float> h1(N * F1), a(N * F), y(N * H), dact(N * F), dh1(N * F1);
  moe_experts_forward(x.data(), counts.data(), w1.data(), w2.data(), h1.data(), a.data(), y.data(), E, H, F, act);
  auto dx = nans(N * H);
  std::vector<float> dw1(E * F1 * H, 0.0f), dw2(E * H * F, 0.0f);
  moe_experts_backward(x.data(), counts.data(), w1.data(), w2.data(), h1.data(), a.data(), r.data(), dact.data(),
                       dh1.data(), dx.data(), dw1.data(), dw2.data(), E, H, F, act);
  auto xd = to_double(x), w1d = to_double(w1), w2d = to_double(w2);
  const auto rd = to_double(r);
  auto loss = [&] { return project(rd, experts_twin(xd, counts, w1d, w2d, H, F, act)); };
  expect_close(dx, numeric_grad(loss, xd), kGradTol, "dx");
  expect_close(dw1, numeric_grad(loss, w1d), kGradTol, "dfc1");
  expect_close(dw2, numeric_grad(loss, w2d), kGradTol, "dfc2");
  for (int64_t i = 0; i < F1 * H; ++i) EXPECT_EQ(dw1[1 * F1 * H + i], 0.0f);  // expert 1 saw no token

  // dx overwritten, weight grads accumulated
  const auto dx1 = dx, dw1_1 = dw1, dw2_1 = dw2;
  moe_experts_backward(x.data(), counts.data(), w1.data(), w2.data(), h1.data(), a.data(), r.data(), dact.data(),
                       dh1.data(), dx.data(), dw1.data(), dw2.data(), E, H, F, act);
  EXPECT_EQ(dx, dx1);
  for (size_t i = 0; i < dw1.size(); ++i) EXPECT_FLOAT_EQ(dw1[i], 2 * dw1_1[i]);
  for (size_t i = 0; i < dw2.size(); ++i) EXPECT_FLOAT_EQ(dw2[i], 2 * dw2_1[i]);
}

// FP8 experts: each (linear, expert) casts with its own scale, 2^(e + linear) for inputs and
// 2^(e + linear + 1) for weights (powers of two: the FP8 values divided by them are exact), and
// logs its casts.
class LoggedFp8 final : public MoeExpertsFp8 {
 public:
  static float input_scale(int linear, int64_t e) { return std::ldexp(1.0f, int(e) + linear); }
  static float weight_scale(int linear, int64_t e) { return std::ldexp(1.0f, int(e) + linear + 1); }
  Fp8Operand input(int linear, int64_t e, const float* x, int64_t rows, int64_t cols) override {
    return cast("in", linear, e, x, rows * cols, input_scale(linear, e), Fp8Format::E4M3);
  }
  Fp8Operand weight(int linear, int64_t e, const float* w, int64_t rows, int64_t cols) override {
    return cast("w", linear, e, w, rows * cols, weight_scale(linear, e), Fp8Format::E4M3);
  }
  Fp8Operand saved_input(int linear, int64_t e, const float* x, int64_t rows, int64_t cols) override {
    return cast("saved", linear, e, x, rows * cols, input_scale(linear, e), Fp8Format::E4M3);
  }
  Fp8GradOperands output_grad(int linear, int64_t e, const float* dy, int64_t rows, int64_t cols) override {
    const Fp8Operand q = cast("dy", linear, e, dy, rows * cols, 1.0f, Fp8Format::E5M2);
    return {q, q};
  }
  std::vector<std::string> log;

 private:
  Fp8Operand cast(const char* what, int linear, int64_t e, const float* x, int64_t n, float scale, Fp8Format f) {
    log.push_back(std::string(what) + std::to_string(linear) + "e" + std::to_string(e));
    bufs_.emplace_back(size_t(n));
    fp8_quantize_values(x, n, scale, f, bufs_.back().data());
    return {bufs_.back().data(), 1.0f / scale};
  }
  std::deque<std::vector<float>> bufs_;
};

// x's FP8 values at scale s, divided back (exact for a power-of-two s), as doubles.
std::vector<double> fp8_dequantized(const float* x, int64_t n, float s) {
  std::vector<float> q(static_cast<size_t>(n));
  fp8_quantize_values(x, n, s, Fp8Format::E4M3, q.data());
  std::vector<double> d(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) d[size_t(i)] = double(q[size_t(i)]) / s;
  return d;
}

// SwiGLU experts with FP8 GEMMs: y equals an fp64 twin over the same FP8 values (each GEMM's input
// and weight cast with its expert's scale, the activation cast before linear_fc2); every expert's
// weights are cast, inputs only where an expert has rows; the backward casts each expert's saved
// inputs and output gradients, and an expert without rows gets no weight gradient.
TEST(MoeExpertsFp8, GemmsReadEachExpertsFp8Values) {
  std::mt19937 rng(1903);
  const std::vector<int64_t> counts = {3, 0, 5, 2};
  const int64_t E = 4, H = 16, F = 8, N = 10, F1 = 2 * F;
  const auto x = randn(N * H, rng), w1 = randn(E * F1 * H, rng, 0.5f), w2 = randn(E * H * F, rng, 0.5f);
  std::vector<float> h1(N * F1), a(N * F), y(N * H);
  LoggedFp8 fp8;
  moe_experts_forward(x.data(), counts.data(), w1.data(), w2.data(), h1.data(), a.data(), y.data(), E, H, F,
                      MoeActivation::SwiGlu, nullptr, &fp8);
  std::vector<double> want(N * H);
  int64_t row = 0;
  for (int64_t e = 0; e < E; ++e) {
    const auto q1 = fp8_dequantized(&w1[e * F1 * H], F1 * H, LoggedFp8::weight_scale(0, e));
    const auto q2 = fp8_dequantized(&w2[e * H * F], H * F, LoggedFp8::weight_scale(1, e));
    for (int64_t i = 0; i < counts[e]; ++i, ++row) {
      const auto xq = fp8_dequantized(&x[row * H], H, LoggedFp8::input_scale(0, e));
      std::vector<float> act(F);
      for (int64_t f = 0; f < F; ++f) {
        double g = 0, u = 0;
        for (int64_t h = 0; h < H; ++h) g += xq[h] * q1[f * H + h], u += xq[h] * q1[(F + f) * H + h];
        act[f] = float(g / (1.0 + std::exp(-g)) * u);
      }
      const auto aq = fp8_dequantized(act.data(), F, LoggedFp8::input_scale(1, e));
      for (int64_t h = 0; h < H; ++h) {
        double s = 0;
        for (int64_t f = 0; f < F; ++f) s += aq[f] * q2[h * F + f];
        want[row * H + h] = s;
      }
    }
  }
  expect_close(y, want, kForwardTol, "y");
  const std::vector<std::string> forward_log = {"w0e0", "w1e0", "w0e1", "w1e1", "w0e2", "w1e2", "w0e3", "w1e3",
                                                "in0e0", "w0e0", "in1e0", "w1e0", "in0e2", "w0e2", "in1e2", "w1e2",
                                                "in0e3", "w0e3", "in1e3", "w1e3"};
  EXPECT_EQ(fp8.log, forward_log);

  fp8.log.clear();
  const auto r = randn(N * H, rng);
  std::vector<float> dact(N * F), dh1(N * F1), dx(N * H), dw1(E * F1 * H, 0.0f), dw2(E * H * F, 0.0f);
  moe_experts_backward(x.data(), counts.data(), w1.data(), w2.data(), h1.data(), a.data(), r.data(), dact.data(),
                       dh1.data(), dx.data(), dw1.data(), dw2.data(), E, H, F, MoeActivation::SwiGlu, nullptr, &fp8);
  const std::vector<std::string> backward_log = {"saved1e0", "w1e0", "dy1e0", "saved0e0", "w0e0", "dy0e0",
                                                 "saved1e2", "w1e2", "dy1e2", "saved0e2", "w0e2", "dy0e2",
                                                 "saved1e3", "w1e3", "dy1e3", "saved0e3", "w0e3", "dy0e3"};
  EXPECT_EQ(fp8.log, backward_log);
  for (int64_t i = 0; i < F1 * H; ++i) ASSERT_EQ(dw1[F1 * H + i], 0.0f);
  for (int64_t i = 0; i < H * F; ++i) ASSERT_EQ(dw2[H * F + i], 0.0f);
  double norm = 0;
  for (float v : dw1) norm += std::abs(v);
  EXPECT_GT(norm, 0.0);
  const MoeAdapters lora{};
  EXPECT_THROW(moe_experts_forward(x.data(), counts.data(), w1.data(), w2.data(), h1.data(), a.data(), y.data(), E, H,
                                   F, MoeActivation::SwiGlu, &lora, &fp8),
               Error);
}

// ---------------------------------------------------------------------------------------------
// the whole layer

struct LayerCase {
  std::string name;
  MoeActivation act;
  Mode mode;
  std::optional<float> scaling;
  int64_t k;
  int64_t shared;  // shared expert intermediate size (0: none)
  bool router_bias;
  float aux, seq_aux, z;
  std::optional<double> capacity = {};  // --moe-expert-capacity-factor (none: dropless)
  bool by_position = false;             // --moe-token-drop-policy position
};

struct LayerData {
  MoeLayerConfig cfg;
  int64_t T;
  std::vector<float> x, wr, br, eb, w1, w2, sw1, sw2;
  MoeLayerWeights weights() const {
    MoeLayerWeights w;
    w.router_weight = wr.data();
    w.router_bias = br.empty() ? nullptr : br.data();
    w.expert_bias = eb.empty() ? nullptr : eb.data();
    w.fc1_weight = w1.data();
    w.fc2_weight = w2.data();
    w.shared_fc1_weight = sw1.empty() ? nullptr : sw1.data();
    w.shared_fc2_weight = sw2.empty() ? nullptr : sw2.data();
    return w;
  }
};

LayerData make_layer(const LayerCase& c, std::mt19937& rng) {
  LayerData d;
  auto& cfg = d.cfg;
  cfg.hidden_size = 6;
  cfg.num_experts = 8;
  cfg.topk = c.k;
  cfg.ffn_hidden_size = 5;
  cfg.shared_expert_intermediate_size = c.shared;
  cfg.activation = c.act;
  cfg.router = params_of(c.mode, c.scaling);
  cfg.capacity_factor = c.capacity;
  cfg.drop_by_position = c.by_position;
  cfg.aux_loss_coeff = c.aux;
  cfg.seq_aux_loss_coeff = c.seq_aux;
  cfg.z_loss_coeff = c.z;
  cfg.seq_length = 4;
  d.T = 8;  // b = 2 sequences of 4
  const int64_t H = 6, E = 8, F = 5, F1 = moe_fc1_rows(c.act, F), Fs = c.shared, F1s = moe_fc1_rows(c.act, Fs);
  d.x = randn(d.T * H, rng);
  d.wr = randn(E * H, rng, 0.7f);
  if (c.router_bias) d.br = randn(E, rng, 0.3f);
  if (biased(c.mode)) d.eb = randn(E, rng, 0.1f);
  d.w1 = randn(E * F1 * H, rng, 0.5f);
  d.w2 = randn(E * H * F, rng, 0.5f);
  if (Fs > 0) {
    d.sw1 = randn(F1s * H, rng, 0.5f);
    d.sw2 = randn(H * Fs, rng, 0.5f);
  }
  return d;
}

// Megatron's capacity map written out: per expert, its (token, choice) pairs in token order, and
// `capacity` of them picked one at a time: the largest prob (the earliest on ties), or the earliest.
std::vector<uint8_t> capacity_twin(const std::vector<int64_t>& idx, const std::vector<double>& probs, int64_t E,
                                   int64_t capacity, bool by_position) {
  std::vector<uint8_t> kept(idx.size(), 0);
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t taken = 0; taken < capacity; ++taken) {
      int64_t best = -1;
      for (size_t i = 0; i < idx.size(); ++i) {
        if (idx[i] != e || kept[i]) continue;
        if (best < 0 || (!by_position && probs[i] > probs[best])) best = static_cast<int64_t>(i);
      }
      if (best < 0) break;
      kept[best] = 1;
    }
  }
  return kept;
}

struct LayerTwinOut {
  std::vector<double> y;
  std::vector<int64_t> idx, aux_idx;
  double aux = 0, seq_aux = 0, z = 0;
};

// The layer written token by token: y[t] = sum_j probs[t, j] * mlp_{idx[t, j]}(x[t]) + shared(x[t]).
LayerTwinOut layer_twin(const MoeLayerConfig& cfg, int64_t T, const std::vector<double>& x,
                        const std::vector<double>& wr, const std::vector<double>& br, const std::vector<double>& eb,
                        const std::vector<double>& w1, const std::vector<double>& w2, const std::vector<double>& sw1,
                        const std::vector<double>& sw2) {
  const int64_t H = cfg.hidden_size, E = cfg.num_experts, k = cfg.topk, F = cfg.ffn_hidden_size;
  const int64_t F1 = cfg.activation == MoeActivation::SwiGlu ? 2 * F : F;
  std::vector<double> logits(T * E);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t e = 0; e < E; ++e) {
      double s = br.empty() ? 0.0 : br[e];
      for (int64_t c = 0; c < H; ++c) s += x[t * H + c] * wr[e * H + c];
      logits[t * E + e] = s;
    }
  LayerTwinOut out;
  auto routed = router_twin(logits, eb.empty() ? nullptr : &eb, T, E, k, cfg.router);
  if (cfg.capacity_factor) {  // dropped pairs weigh nothing
    // Megatron's router sees the [s, b] tokens position by position: its i-th token is position
    // i / b of sequence i % b (ours: t = sequence * s + position).
    const int64_t s = cfg.seq_length > 0 ? cfg.seq_length : T, b = T / s;
    std::vector<int64_t> order_idx(T * k);
    std::vector<double> order_probs(T * k);
    auto token = [&](int64_t i) { return (i / b) + (i % b) * s; };
    for (int64_t i = 0; i < T; ++i)
      for (int64_t j = 0; j < k; ++j)
        order_idx[i * k + j] = routed.idx[token(i) * k + j], order_probs[i * k + j] = routed.probs[token(i) * k + j];
    const auto kept = capacity_twin(order_idx, order_probs, E, moe_expert_capacity(T, E, k, *cfg.capacity_factor),
                                    cfg.drop_by_position);
    for (int64_t i = 0; i < T; ++i)
      for (int64_t j = 0; j < k; ++j)
        if (!kept[i * k + j]) routed.probs[token(i) * k + j] = 0.0;
  }
  out.idx = routed.idx;
  const auto fn = cfg.router.score_function;
  if (cfg.aux_loss_coeff > 0) out.aux = aux_twin(logits, T, E, k, fn, cfg.aux_loss_coeff, &out.aux_idx);
  if (cfg.seq_aux_loss_coeff > 0)
    out.seq_aux = seq_aux_twin(logits, T / cfg.seq_length, cfg.seq_length, E, k, fn, cfg.seq_aux_loss_coeff,
                               &out.aux_idx);
  if (cfg.z_loss_coeff > 0) out.z = z_twin(logits, T, E, cfg.z_loss_coeff);
  out.y.assign(T * H, 0.0);
  std::vector<double> o(H);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = routed.idx[t * k + j];
      mlp_twin(&x[t * H], &w1[e * F1 * H], &w2[e * H * F], H, F, cfg.activation, o.data());
      for (int64_t h = 0; h < H; ++h) out.y[t * H + h] += routed.probs[t * k + j] * o[h];
    }
    if (cfg.shared_expert_intermediate_size > 0) {
      mlp_twin(&x[t * H], sw1.data(), sw2.data(), H, cfg.shared_expert_intermediate_size, cfg.activation, o.data());
      for (int64_t h = 0; h < H; ++h) out.y[t * H + h] += o[h];
    }
  }
  return out;
}

class MoeLayerTest : public ::testing::TestWithParam<LayerCase> {};
INSTANTIATE_TEST_SUITE_P(
    Moe, MoeLayerTest,
    ::testing::Values(
        LayerCase{"SwiGluSoftmaxShared", MoeActivation::SwiGlu, Mode::SoftmaxPost, {}, 2, 7, false, 0.3f, 0.2f, 0.05f},
        LayerCase{"GeluTanhSigmoidBiasScaledShared", MoeActivation::GeluTanh, Mode::SigmoidBias, 2.5f, 2, 4, true,
                  0.3f, 0.2f, 0.05f},
        LayerCase{"GeluErfPreSoftmaxTop1", MoeActivation::GeluErf, Mode::SoftmaxPre, {}, 1, 0, false, 0.3f, 0.0f,
                  0.0f},
        LayerCase{"SwiGluSoftmaxTop1Shared", MoeActivation::SwiGlu, Mode::SoftmaxPost, {}, 1, 3, false, 0.3f, 0.2f,
                  0.05f},
        LayerCase{"SwiGluSigmoidTop8", MoeActivation::SwiGlu, Mode::Sigmoid, {}, 8, 0, false, 0.3f, 0.0f, 0.0f},
        LayerCase{"SwiGluSqrtSoftplusBiasScaledShared", MoeActivation::SwiGlu, Mode::SqrtSoftplusBias, 1.5f, 4, 4,
                  true, 0.3f, 0.2f, 0.05f},
        // Token dropping: 16 pairs over 8 experts, one each (factor 0.5) or three (1.5).
        LayerCase{"SwiGluSoftmaxCapacityProbs", MoeActivation::SwiGlu, Mode::SoftmaxPost, {}, 2, 3, false, 0.3f,
                  0.0f, 0.05f, 0.5},
        LayerCase{"GeluTanhSigmoidCapacityPosition", MoeActivation::GeluTanh, Mode::Sigmoid, {}, 2, 0, false, 0.3f,
                  0.2f, 0.0f, 1.5, true}),
    [](const auto& info) { return info.param.name; });

// make_layer's layer on T tokens of fresh input.
LayerData layer_of_tokens(const LayerCase& c, int64_t T, std::mt19937& rng) {
  LayerData d = make_layer(c, rng);
  d.T = T;
  d.x = randn(T * d.cfg.hidden_size, rng);
  return d;
}

TEST_P(MoeLayerTest, ForwardMatchesFp64Twin) {
  std::mt19937 rng(2001);
  const auto d = make_layer(GetParam(), rng);
  const int64_t T = d.T, H = d.cfg.hidden_size;
  MoeLayerState st;
  auto y = nans(T * H);
  moe_layer_forward(d.cfg, d.weights(), d.x.data(), y.data(), T, st);
  const auto want = layer_twin(d.cfg, T, to_double(d.x), to_double(d.wr), to_double(d.br), to_double(d.eb),
                               to_double(d.w1), to_double(d.w2), to_double(d.sw1), to_double(d.sw2));
  EXPECT_EQ(st.topk_idx, want.idx);
  if (!want.aux_idx.empty()) {
    EXPECT_EQ(st.aux_topk_idx, want.aux_idx);
  }
  // Chained fp32 GEMMs (router, fc1, fc2) and the probs: a few roundings of O(1) terms each.
  expect_close(y, want.y, kForwardTol, "y");
  EXPECT_NEAR(st.aux_loss, want.aux, 1e-6 * want.aux);
  EXPECT_NEAR(st.seq_aux_loss, want.seq_aux, 1e-6 * want.seq_aux);
  EXPECT_NEAR(st.z_loss, want.z, 1e-6 * want.z);
  std::vector<int64_t> counts(d.cfg.num_experts, 0);
  for (int64_t e : want.idx) ++counts[e];
  EXPECT_EQ(st.tokens_per_expert, counts);
}

TEST_P(MoeLayerTest, BackwardMatchesFiniteDifferences) {
  std::mt19937 rng(2002);
  const auto d = make_layer(GetParam(), rng);
  const int64_t T = d.T, H = d.cfg.hidden_size;
  const float aux_scale = 0.7f;  // as MoEAuxLossAutoScaler's 1/num_microbatches would be
  MoeLayerState st;
  std::vector<float> y(T * H);
  moe_layer_forward(d.cfg, d.weights(), d.x.data(), y.data(), T, st);
  const auto r = randn(T * H, rng);
  auto dx = nans(T * H);
  std::vector<float> dwr(d.wr.size(), 0.0f), dbr(d.br.size(), 0.0f), dw1(d.w1.size(), 0.0f), dw2(d.w2.size(), 0.0f),
      dsw1(d.sw1.size(), 0.0f), dsw2(d.sw2.size(), 0.0f);
  MoeLayerGrads g;
  g.router_weight = dwr.data();
  g.router_bias = dbr.empty() ? nullptr : dbr.data();
  g.fc1_weight = dw1.data();
  g.fc2_weight = dw2.data();
  g.shared_fc1_weight = dsw1.empty() ? nullptr : dsw1.data();
  g.shared_fc2_weight = dsw2.empty() ? nullptr : dsw2.data();
  moe_layer_backward(d.cfg, d.weights(), d.x.data(), r.data(), dx.data(), g, T, st, aux_scale);

  auto xd = to_double(d.x), wrd = to_double(d.wr), brd = to_double(d.br), w1d = to_double(d.w1),
       w2d = to_double(d.w2), sw1d = to_double(d.sw1), sw2d = to_double(d.sw2);
  const auto ebd = to_double(d.eb), rd = to_double(r);
  int64_t flips = 0;
  auto loss = [&] {
    const auto out = layer_twin(d.cfg, T, xd, wrd, brd, ebd, w1d, w2d, sw1d, sw2d);
    flips += count_diff(out.idx, st.topk_idx) > 0 || (!out.aux_idx.empty() && count_diff(out.aux_idx, st.aux_topk_idx));
    return project(rd, out.y) + aux_scale * (out.aux + out.seq_aux + out.z);
  };
  expect_close(dx, numeric_grad(loss, xd), kGradTol, "dx");
  expect_close(dwr, numeric_grad(loss, wrd), kGradTol, "drouter_weight");
  if (!dbr.empty()) expect_close(dbr, numeric_grad(loss, brd), kGradTol, "drouter_bias");
  expect_close(dw1, numeric_grad(loss, w1d), kGradTol, "dfc1");
  expect_close(dw2, numeric_grad(loss, w2d), kGradTol, "dfc2");
  if (!dsw1.empty()) {
    expect_close(dsw1, numeric_grad(loss, sw1d), kGradTol, "dshared_fc1");
    expect_close(dsw2, numeric_grad(loss, sw2d), kGradTol, "dshared_fc2");
  }
  EXPECT_EQ(flips, 0) << "a perturbation changed a top-k choice";
}

TEST_P(MoeLayerTest, BackwardOverwritesDxAndAccumulatesGrads) {
  std::mt19937 rng(2003);
  const auto d = make_layer(GetParam(), rng);
  const int64_t T = d.T, H = d.cfg.hidden_size;
  MoeLayerState st;
  std::vector<float> y(T * H), dx(T * H), dw1(d.w1.size(), 0.0f), dwr(d.wr.size(), 0.0f);
  moe_layer_forward(d.cfg, d.weights(), d.x.data(), y.data(), T, st);
  const auto dy = randn(T * H, rng);
  MoeLayerGrads g;
  g.fc1_weight = dw1.data();
  g.router_weight = dwr.data();  // the other grads are skipped (nullptr)
  moe_layer_backward(d.cfg, d.weights(), d.x.data(), dy.data(), dx.data(), g, T, st);
  const auto dx1 = dx, dw1_1 = dw1, dwr1 = dwr;
  moe_layer_backward(d.cfg, d.weights(), d.x.data(), dy.data(), dx.data(), g, T, st);
  EXPECT_EQ(dx, dx1);
  for (size_t i = 0; i < dw1.size(); ++i) EXPECT_FLOAT_EQ(dw1[i], 2 * dw1_1[i]);
  for (size_t i = 0; i < dwr.size(); ++i) EXPECT_FLOAT_EQ(dwr[i], 2 * dwr1[i]);
}

// --moe-router-force-load-balancing: the router's logits are the counter stream's normals, whatever
// the weights, so the routing of many tokens is close to uniform over the experts.
TEST(MoeLayer, ForceLoadBalancingRoutesOnRandomLogits) {
  std::mt19937 rng(2005);
  auto d = layer_of_tokens({"", MoeActivation::SwiGlu, Mode::SoftmaxPost, {}, 2, 0, false, 0.3f, 0.0f, 0.0f}, 2048, rng);
  d.cfg.force_load_balancing = true;
  d.cfg.random_logits_key = rng_stream_key(1234, "router.layer0.random_logits.0");
  const int64_t T = d.T, H = d.cfg.hidden_size, E = d.cfg.num_experts, k = d.cfg.topk;
  MoeLayerState st;
  std::vector<float> y(T * H);
  moe_layer_forward(d.cfg, d.weights(), d.x.data(), y.data(), T, st);
  for (int64_t i = 0; i < T * E; ++i)
    ASSERT_EQ(st.logits[i], counter_normal(d.cfg.random_logits_key, static_cast<uint64_t>(i))) << i;
  const double expected = static_cast<double>(T * k) / static_cast<double>(E);  // 512; sd about 21
  for (int64_t e = 0; e < E; ++e) EXPECT_NEAR(st.tokens_per_expert[e], expected, 0.12 * expected) << "expert " << e;
  // Another micro-batch's stream routes differently.
  const std::vector<int64_t> first = st.topk_idx;
  d.cfg.random_logits_key = rng_stream_key(1234, "router.layer0.random_logits.1");
  moe_layer_forward(d.cfg, d.weights(), d.x.data(), y.data(), T, st);
  EXPECT_NE(st.topk_idx, first);
}

// --moe-router-dtype unset (router_bf16_logits): the logits the router and the losses see are the
// fp32 logits rounded to bf16, and the routing probabilities are rounded to bf16 too (Megatron's
// probs.type_as(logits)); random logits are rounded as well.
TEST(MoeLayer, Bf16RouterLogitsAreTheFp32OnesRounded) {
  std::mt19937 rng(2006);
  auto d = layer_of_tokens({"", MoeActivation::SwiGlu, Mode::SoftmaxPost, {}, 2, 0, false, 0.3f, 0.0f, 0.0f}, 64, rng);
  d.cfg.z_loss_coeff = 1e-2f;
  const int64_t T = d.T, H = d.cfg.hidden_size, E = d.cfg.num_experts;
  MoeLayerState fp32, rounded;
  std::vector<float> y(T * H);
  moe_layer_forward(d.cfg, d.weights(), d.x.data(), y.data(), T, fp32);
  d.cfg.router_bf16_logits = true;
  moe_layer_forward(d.cfg, d.weights(), d.x.data(), y.data(), T, rounded);
  int64_t changed = 0;
  for (int64_t i = 0; i < T * E; ++i) {
    ASSERT_EQ(rounded.logits[i], round_to_bf16(fp32.logits[i])) << i;
    changed += rounded.logits[i] != fp32.logits[i];
  }
  EXPECT_GT(changed, T * E / 2);
  EXPECT_NE(rounded.z_loss, fp32.z_loss);
  int64_t same_choice = 0;
  for (size_t i = 0; i < rounded.topk_probs.size(); ++i) {
    ASSERT_EQ(rounded.topk_probs[i], round_to_bf16(rounded.topk_probs[i])) << "prob " << i;
    if (rounded.topk_idx[i] != fp32.topk_idx[i]) continue;
    ++same_choice;
    EXPECT_NEAR(rounded.topk_probs[i], fp32.topk_probs[i], 0.02 * fp32.topk_probs[i]) << "prob " << i;
  }
  EXPECT_GT(same_choice, static_cast<int64_t>(rounded.topk_probs.size()) * 9 / 10);
  d.cfg.force_load_balancing = true;
  d.cfg.random_logits_key = rng_stream_key(1234, "router.layer0.random_logits.0");
  moe_layer_forward(d.cfg, d.weights(), d.x.data(), y.data(), T, rounded);
  for (int64_t i = 0; i < T * E; ++i)
    ASSERT_EQ(rounded.logits[i], round_to_bf16(counter_normal(d.cfg.random_logits_key, static_cast<uint64_t>(i))));
}

// The capacity mask against its twin, on probs with many exact ties (quarters), for both policies
// and capacities from 0 to more than any expert gets.
TEST(MoeCapacity, MaskMatchesTheTwin) {
  std::mt19937 rng(2006);
  const int64_t T = 40, E = 6, k = 2;
  std::vector<int64_t> idx(T * k);
  std::vector<float> probs(T * k);
  std::vector<double> probs_d(T * k);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t a = static_cast<int64_t>(rng() % E), b = (a + 1 + static_cast<int64_t>(rng() % (E - 1))) % E;
    idx[t * k] = a, idx[t * k + 1] = b;
    for (int64_t j = 0; j < k; ++j) probs_d[t * k + j] = probs[t * k + j] = 0.25f * static_cast<float>(rng() % 4);
  }
  for (bool by_position : {false, true})
    for (int64_t cap : {0, 1, 3, 7, 100}) {
      std::vector<uint8_t> kept(T * k, 7);
      moe_capacity_mask(idx.data(), probs.data(), T, E, k, cap, by_position, kept.data());
      EXPECT_EQ(kept, capacity_twin(idx, probs_d, E, cap, by_position)) << "capacity " << cap << ", by position "
                                                                        << by_position;
    }
  EXPECT_EQ(moe_expert_capacity(8, 8, 2, 0.5), 1);  // ceil(16 / 8 * 0.5)
  EXPECT_EQ(moe_expert_capacity(10, 4, 3, 1.1), 9);  // ceil(7.5 * 1.1) = ceil(8.25)
  EXPECT_THROW(moe_expert_capacity(8, 8, 2, -1.0), Error);
}

// Dropping by shares of the sequence (tensor parallelism): each share, positions [r s / n, (r + 1)
// s / n) of every sequence taken position by position, masked as the twin masks it with the
// share's own capacity. First by hand: 2 sequences of 4, one expert, a capacity of 1 a share: the
// position policy keeps token 0 (position 0 of sequence 0) and token 2 (position 2 of sequence 0);
// one share (capacity 2) takes all 8 position by position too: tokens 0 and 4 (moe_capacity_mask,
// in our order, would keep 0 and 1).
TEST(MoeCapacity, MaskByShareTakesEachShareInMegatronsOrder) {
  {
    const std::vector<int64_t> idx(8, 0);
    const std::vector<float> probs(8, 1.0f);
    std::vector<uint8_t> kept(8, 7);
    moe_capacity_mask_by_share(idx.data(), probs.data(), 2, 4, 2, 1, 1, 0.25, true, kept.data());
    EXPECT_EQ(kept, (std::vector<uint8_t>{1, 0, 1, 0, 0, 0, 0, 0}));
    moe_capacity_mask_by_share(idx.data(), probs.data(), 2, 4, 1, 1, 1, 0.25, true, kept.data());
    EXPECT_EQ(kept, (std::vector<uint8_t>{1, 0, 0, 0, 1, 0, 0, 0}));  // one share: position 0 of both
  }
  std::mt19937 rng(2008);
  const int64_t b = 3, s = 8, T = b * s, E = 5, k = 2;
  std::vector<int64_t> idx(T * k);
  std::vector<float> probs(T * k);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t a = static_cast<int64_t>(rng() % E), c = (a + 1 + static_cast<int64_t>(rng() % (E - 1))) % E;
    idx[t * k] = a, idx[t * k + 1] = c;
    for (int64_t j = 0; j < k; ++j) probs[t * k + j] = 0.25f * static_cast<float>(rng() % 4);  // many ties
  }
  for (int64_t shares : {1, 2, 4})
    for (bool by_position : {false, true})
      for (double factor : {0.0, 0.5, 1.0, 4.0}) {
        const int64_t span = s / shares, local = b * span;
        const int64_t cap = moe_expert_capacity(local, E, k, factor);
        std::vector<uint8_t> want(T * k, 9);
        for (int64_t r = 0; r < shares; ++r) {
          std::vector<int64_t> tokens, share_idx;
          std::vector<double> share_probs;
          for (int64_t pos = r * span; pos < (r + 1) * span; ++pos)
            for (int64_t q = 0; q < b; ++q) tokens.push_back(q * s + pos);
          for (int64_t t : tokens)
            for (int64_t j = 0; j < k; ++j) share_idx.push_back(idx[t * k + j]), share_probs.push_back(probs[t * k + j]);
          const auto share_kept = capacity_twin(share_idx, share_probs, E, cap, by_position);
          for (size_t i = 0; i < tokens.size(); ++i)
            for (int64_t j = 0; j < k; ++j) want[tokens[i] * k + j] = share_kept[i * k + j];
        }
        std::vector<uint8_t> kept(T * k, 7);
        moe_capacity_mask_by_share(idx.data(), probs.data(), b, s, shares, E, k, factor, by_position, kept.data());
        EXPECT_EQ(kept, want) << shares << " shares, by position " << by_position << ", factor " << factor;
      }
  std::vector<uint8_t> kept(T * k);
  EXPECT_THROW(moe_capacity_mask_by_share(idx.data(), probs.data(), b, s, 3, E, k, 1.0, false, kept.data()), Error);
}

// The layer keeps global_aux_loss's running counts: two training forwards use the mean of their
// counts summed over the data-parallel ranks (here a stand-in that doubles them: two identical
// ranks), an evaluation forward neither adds nor uses them, and moe_global_aux_reset starts over.
TEST(MoeLayer, GlobalAuxLossKeepsTheStepsRunningMeanOfTheRanksCounts) {
  std::mt19937 rng(2007);
  auto d = layer_of_tokens({"", MoeActivation::SwiGlu, Mode::SoftmaxPost, {}, 2, 0, false, 0.0f, 0.0f, 0.0f}, 16, rng);
  d.cfg.global_aux_loss_coeff = 0.1f;
  d.cfg.data_parallel_size = 2;
  d.cfg.sum_over_data_parallel = [](double* c, int64_t n) {
    for (int64_t i = 0; i < n; ++i) c[i] *= 2.0;
  };
  const int64_t T = d.T, H = d.cfg.hidden_size, E = d.cfg.num_experts, k = d.cfg.topk;
  auto counts_of = [&](const MoeLayerState& st) {
    std::vector<double> c(E, 0.0);
    for (int64_t i : st.aux_topk_idx) c[i] += 2.0;  // this rank's and its identical twin's
    return c;
  };
  MoeLayerState st;
  std::vector<float> y(T * H);
  d.cfg.global_aux_training = true;
  moe_layer_forward(d.cfg, d.weights(), d.x.data(), y.data(), T, st);
  const auto c1 = counts_of(st);
  EXPECT_EQ(st.global_counts, c1);
  const auto x1 = d.x;
  d.x = randn(T * H, rng);
  moe_layer_forward(d.cfg, d.weights(), d.x.data(), y.data(), T, st);
  const auto c2 = counts_of(st);
  for (int64_t i = 0; i < E; ++i) EXPECT_DOUBLE_EQ(st.global_counts[i], (c1[i] + c2[i]) / 2) << i;
  const float want = moe_global_aux_loss_forward(st.scores_for_aux_loss.data(), st.global_counts.data(), T,
                                                 2.0 * T, E, k, 0.1f);
  EXPECT_EQ(st.global_aux_loss, want);
  EXPECT_GT(want, 0.0f);
  d.cfg.global_aux_training = false;  // an evaluation
  moe_layer_forward(d.cfg, d.weights(), x1.data(), y.data(), T, st);
  EXPECT_TRUE(st.global_counts.empty());
  EXPECT_EQ(st.global_aux_loss, 0.0f);
  EXPECT_EQ(st.global_steps, 2);
  moe_global_aux_reset(st);
  d.cfg.global_aux_training = true;
  moe_layer_forward(d.cfg, d.weights(), x1.data(), y.data(), T, st);
  EXPECT_EQ(st.global_counts, c1);
}

TEST(MoeLayer, BitwiseIndependentOfThreadCount) {
  std::mt19937 rng(2004);
  // More tokens than threads, so that the row loops really split.
  auto d = layer_of_tokens({"", MoeActivation::SwiGlu, Mode::SoftmaxPost, {}, 2, 7, true, 0.3f, 0.2f, 0.05f}, 64, rng);
  const auto dy = randn(d.T * d.cfg.hidden_size, rng);
  auto run = [&] {
    MoeLayerState st;
    const int64_t T = d.T, H = d.cfg.hidden_size;
    std::vector<float> y(T * H), dx(T * H), dwr(d.wr.size(), 0.0f), dw1(d.w1.size(), 0.0f), dsw1(d.sw1.size(), 0.0f);
    MoeLayerGrads g;
    g.router_weight = dwr.data();
    g.fc1_weight = dw1.data();
    g.shared_fc1_weight = dsw1.data();
    moe_layer_forward(d.cfg, d.weights(), d.x.data(), y.data(), T, st);
    moe_layer_backward(d.cfg, d.weights(), d.x.data(), dy.data(), dx.data(), g, T, st);
    for (const auto* v : {&dx, &dwr, &dw1, &dsw1}) y.insert(y.end(), v->begin(), v->end());
    y.push_back(st.aux_loss);
    y.push_back(st.seq_aux_loss);
    y.push_back(st.z_loss);
    return y;
  };
  const int keep = omp_get_max_threads();
  omp_set_num_threads(1);
  const auto one = run();
  omp_set_num_threads(3);
  const auto three = run();
  omp_set_num_threads(keep);
  EXPECT_EQ(one, three);
}

TEST(MoeErrors, BadInputsThrow) {
  const int64_t T = 2, E = 4;
  const std::vector<float> logits(T * E, 0.25f), bias(E, 0.0f);
  std::vector<int64_t> idx(T * E), counts(E), sorted(T * E), row(T * E);
  std::vector<float> probs(T * E);
  // k outside [1, E]
  EXPECT_THROW(moe_router_topk_forward(logits.data(), nullptr, idx.data(), probs.data(), T, E, E + 1, {}), Error);
  EXPECT_THROW(moe_router_topk_forward(logits.data(), nullptr, idx.data(), probs.data(), T, E, 0, {}), Error);
  // an expert bias needs the sigmoid score function
  EXPECT_THROW(moe_router_topk_forward(logits.data(), bias.data(), idx.data(), probs.data(), T, E, 2, {}), Error);
  // routing to an expert out of range, or twice to one expert
  const std::vector<int64_t> out_of_range = {0, 4, 1, 2}, twice = {1, 1, 0, 3};
  EXPECT_THROW(moe_permutation(out_of_range.data(), T, E, 2, counts.data(), sorted.data(), row.data()), Error);
  EXPECT_THROW(moe_permutation(twice.data(), T, E, 2, counts.data(), sorted.data(), row.data()), Error);
  // seq_aux_loss with a seq_length that does not divide T
  std::mt19937 rng(2101);
  auto d = make_layer(LayerCase{"", MoeActivation::SwiGlu, Mode::SoftmaxPost, {}, 2, 0, false, 0.0f, 0.2f, 0.0f}, rng);
  d.cfg.seq_length = 3;
  MoeLayerState st;
  std::vector<float> y(d.T * d.cfg.hidden_size);
  EXPECT_THROW(moe_layer_forward(d.cfg, d.weights(), d.x.data(), y.data(), d.T, st), Error);
}

}  // namespace
}  // namespace laoyao::kernels::cpu::test
