// Multi-latent attention's CPU reference ops:
// - separate_attention_forward/backward (causal attention on separate q, k, v buffers whose q/k and
//   v head dims differ) against an fp64 twin written as Megatron's DotProductAttention computes it
//   (baddbmm with alpha = scale, masked_fill(-10000), softmax over all keys, dropout on the
//   probabilities, bmm with V), finite differences, and the fused attention_forward/backward on the
//   same values;
// - mla_qkv_forward/backward (MLASelfAttention's query/key/value assembly with the interleaved RoPE)
//   against an fp64 twin written as Megatron's torch code does it (x[0::2], x[1::2] concatenated,
//   t * cat(cos, cos) + rotate_half(t) * cat(sin, sin), k_pos_emb expanded to every head), finite
//   differences, the heads' sum in dk_pe, the strided k_pe buffers, and RoPE's complex-rotation
//   form of the q.k products (YaRN's mscale included);
// - copy_columns.
#include <gtest/gtest.h>

#include <cmath>
#include <complex>
#include <string>

#include "core/error.hpp"
#include "kernels/cpu/ops.hpp"
#include "test_util.hpp"

namespace laoyao::kernels::cpu::test {
namespace {

// ===================================================================== separate attention

struct SepShape {
  int64_t b, s, H, Dqk, Dv;
  int64_t T() const { return b * s; }
  size_t nq() const { return static_cast<size_t>(T() * H * Dqk); }
  size_t nv() const { return static_cast<size_t>(T() * H * Dv); }
  size_t np() const { return static_cast<size_t>(b * H * s * s); }
};

// Not 1/sqrt(Dqk): the op must use the scale it is given (MLA's softmax_scale carries YaRN's mscale^2).
constexpr float kSepScale = 0.37f;

struct SepTwinOut {
  std::vector<double> ctx, probs;
};

// fp64 twin of DotProductAttention on [s, b, H, D] q/k/v (here batch-major rows t = bi*s + pos):
// scores[bi, h] = scale * q[bi, h] @ k[bi, h]^T (baddbmm, alpha = scale); masked_fill(mask, -10000)
// with mask = the causal upper triangle, plus, with `eods` (each sequence's EOD positions), the
// --reset-attention-mask blocks of _get_ltor_masks_and_position_ids (for an EOD at e, rows after e
// lose columns up to e); softmax over all s keys; attention_dropout on the probabilities (`mask`:
// 0 or 1/(1-p)); ctx = probs_dropped @ v, heads concatenated [T, H*Dv].
SepTwinOut sep_twin(const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v,
                    const SepShape& sh, double scale, const std::vector<double>* drop = nullptr,
                    const std::vector<std::vector<int64_t>>* eods = nullptr) {
  const int64_t s = sh.s, H = sh.H, Dqk = sh.Dqk, Dv = sh.Dv;
  SepTwinOut out{std::vector<double>(sh.nv()), std::vector<double>(sh.np())};
  for (int64_t bi = 0; bi < sh.b; ++bi) {
    std::vector<char> masked(s * s, 0);
    for (int64_t i = 0; i < s; ++i)
      for (int64_t j = i + 1; j < s; ++j) masked[i * s + j] = 1;  // ~tril
    if (eods)
      for (int64_t e : (*eods)[bi])
        for (int64_t i = e + 1; i < s; ++i)
          for (int64_t j = 0; j <= e; ++j) masked[i * s + j] = 1;
    for (int64_t h = 0; h < H; ++h) {
      double* P = out.probs.data() + (bi * H + h) * s * s;
      for (int64_t i = 0; i < s; ++i) {
        for (int64_t j = 0; j < s; ++j) {
          double sc = 0.0;
          for (int64_t d = 0; d < Dqk; ++d)
            sc += q[((bi * s + i) * H + h) * Dqk + d] * k[((bi * s + j) * H + h) * Dqk + d];
          P[i * s + j] = masked[i * s + j] ? -10000.0 : scale * sc;
        }
        double m = P[i * s];
        for (int64_t j = 1; j < s; ++j) m = std::max(m, P[i * s + j]);
        double sum = 0.0;
        for (int64_t j = 0; j < s; ++j) sum += (P[i * s + j] = std::exp(P[i * s + j] - m));
        for (int64_t j = 0; j < s; ++j) P[i * s + j] /= sum;
        for (int64_t d = 0; d < Dv; ++d) {
          double c = 0.0;
          for (int64_t j = 0; j < s; ++j) {
            const double keep = drop ? (*drop)[((bi * H + h) * s + i) * s + j] : 1.0;
            c += P[i * s + j] * keep * v[((bi * s + j) * H + h) * Dv + d];
          }
          out.ctx[((bi * s + i) * H + h) * Dv + d] = c;
        }
      }
    }
  }
  return out;
}

std::vector<float> dropout_mask(size_t n, double p_keep, std::mt19937& rng) {
  std::vector<float> mask(n);
  std::bernoulli_distribution keep(p_keep);
  for (auto& m : mask) m = keep(rng) ? static_cast<float>(1.0 / p_keep) : 0.0f;
  return mask;
}

// Random EOD positions per sequence and each query's first key (just after the last EOD before it).
struct Documents {
  std::vector<std::vector<int64_t>> eods;
  std::vector<int32_t> key_start;
};
Documents random_documents(int64_t b, int64_t s, std::mt19937& rng) {
  Documents docs{std::vector<std::vector<int64_t>>(b), std::vector<int32_t>(b * s)};
  std::bernoulli_distribution eod(0.35);
  for (int64_t bi = 0; bi < b; ++bi) {
    int32_t start = 0;
    for (int64_t i = 0; i < s; ++i) {
      docs.key_start[bi * s + i] = start;
      if (eod(rng)) docs.eods[bi].push_back(i), start = static_cast<int32_t>(i + 1);
    }
  }
  return docs;
}

std::string sep_name(const SepShape& sh) {
  return "b" + std::to_string(sh.b) + "s" + std::to_string(sh.s) + "H" + std::to_string(sh.H) + "Dqk" +
         std::to_string(sh.Dqk) + "Dv" + std::to_string(sh.Dv);
}
void PrintTo(const SepShape& sh, std::ostream* os) { *os << sep_name(sh); }

class MlaSeparateAttention : public ::testing::TestWithParam<SepShape> {};
INSTANTIATE_TEST_SUITE_P(Shapes, MlaSeparateAttention,
                         ::testing::Values(SepShape{2, 5, 3, 12, 8},   // q/k dim > v dim (MLA: 192 vs 128)
                                           SepShape{1, 7, 2, 5, 9},    // v dim > q/k dim
                                           SepShape{2, 6, 1, 3, 3},    // one head, equal dims
                                           SepShape{3, 1, 2, 4, 6}),   // s = 1: a single key
                         [](const auto& info) { return sep_name(info.param); });

struct SepInputs {
  std::vector<float> q, k, v, r;  // r: the dctx = d(sum(r * ctx)) / dctx of the loss
};
SepInputs sep_inputs(const SepShape& sh, std::mt19937& rng) {
  return {randn(sh.nq(), rng), randn(sh.nq(), rng), randn(sh.nv(), rng), randn(sh.nv(), rng)};
}

// Forward vs the twin and backward vs central differences of L = sum(r * ctx) w.r.t. q, k and v,
// with the given dropout mask and documents (either may be null).
void check_separate(const SepShape& sh, const SepInputs& in, const std::vector<float>* drop, const Documents* docs,
                    const std::string& what) {
  const float* dm = drop ? drop->data() : nullptr;
  const int32_t* ks = docs ? docs->key_start.data() : nullptr;
  const std::vector<double> dropd = drop ? to_double(*drop) : std::vector<double>{};
  const std::vector<double>* dropp = drop ? &dropd : nullptr;
  const auto* eods = docs ? &docs->eods : nullptr;

  auto ctx = nans(sh.nv()), probs = nans(sh.np());
  separate_attention_forward(in.q.data(), in.k.data(), in.v.data(), ctx.data(), probs.data(), sh.b, sh.s, sh.H,
                             sh.Dqk, sh.Dv, kSepScale, dm, ks);
  auto qd = to_double(in.q), kd = to_double(in.k), vd = to_double(in.v);
  const double scale = kSepScale;  // the fp32 scale the op is given, exactly
  const auto want = sep_twin(qd, kd, vd, sh, scale, dropp, eods);
  expect_close(ctx, want.ctx, kForwardTol, what + ": ctx");
  expect_close(probs, want.probs, kForwardTol, what + ": probs (saved before dropout)");
  for (int64_t bh = 0; bh < sh.b * sh.H; ++bh)  // future keys and other documents' keys: exactly zero
    for (int64_t i = 0; i < sh.s; ++i)
      for (int64_t j = 0; j < sh.s; ++j) {
        const int64_t j0 = ks ? ks[(bh / sh.H) * sh.s + i] : 0;
        if (j > i || j < j0) {
          EXPECT_EQ(probs[(bh * sh.s + i) * sh.s + j], 0.0f) << what << ": query " << i << " key " << j;
        }
      }

  auto dq = nans(sh.nq()), dk = nans(sh.nq()), dv = nans(sh.nv());
  separate_attention_backward(in.q.data(), in.k.data(), in.v.data(), probs.data(), in.r.data(), dq.data(), dk.data(),
                              dv.data(), sh.b, sh.s, sh.H, sh.Dqk, sh.Dv, kSepScale, dm, ks);
  const auto rd = to_double(in.r);
  auto loss = [&] { return project(rd, sep_twin(qd, kd, vd, sh, scale, dropp, eods).ctx); };
  expect_close(dq, numeric_grad(loss, qd), kGradTol, what + ": dq");
  expect_close(dk, numeric_grad(loss, kd), kGradTol, what + ": dk");
  expect_close(dv, numeric_grad(loss, vd), kGradTol, what + ": dv");

  // Overwritten, not accumulated: a second call on the first call's results gives the same values.
  const auto dq1 = dq, dk1 = dk, dv1 = dv;
  separate_attention_backward(in.q.data(), in.k.data(), in.v.data(), probs.data(), in.r.data(), dq.data(), dk.data(),
                              dv.data(), sh.b, sh.s, sh.H, sh.Dqk, sh.Dv, kSepScale, dm, ks);
  EXPECT_EQ(dq, dq1) << what;
  EXPECT_EQ(dk, dk1) << what;
  EXPECT_EQ(dv, dv1) << what;
}

TEST_P(MlaSeparateAttention, ForwardAndBackwardMatchFp64TwinAndFiniteDifferences) {
  const SepShape sh = GetParam();
  std::mt19937 rng(501);
  check_separate(sh, sep_inputs(sh, rng), nullptr, nullptr, "plain causal");
}

TEST_P(MlaSeparateAttention, DropoutOnTheProbabilitiesMatchesTwinAndFiniteDifferences) {
  const SepShape sh = GetParam();
  std::mt19937 rng(502);
  const SepInputs in = sep_inputs(sh, rng);
  const auto mask = dropout_mask(sh.np(), 0.7, rng);
  check_separate(sh, in, &mask, nullptr, "dropout");
}

TEST_P(MlaSeparateAttention, DocumentMasksMatchMegatronsResetAttentionMask) {
  const SepShape sh = GetParam();
  std::mt19937 rng(503);
  const SepInputs in = sep_inputs(sh, rng);
  const Documents docs = random_documents(sh.b, sh.s, rng);
  const auto mask = dropout_mask(sh.np(), 0.8, rng);
  check_separate(sh, in, nullptr, &docs, "documents");
  check_separate(sh, in, &mask, &docs, "documents and dropout");
}

// Fixed documents that certainly split the sequences (the random ones above may draw no EOD for a
// short sequence): s = 6 with an EOD at 1 in sequence 0 and at 3 in sequence 1.
TEST(MlaSeparateAttentionDocuments, FixedDocumentsMatchTwinAndFiniteDifferences) {
  const SepShape sh{2, 6, 2, 6, 4};
  std::mt19937 rng(504);
  const SepInputs in = sep_inputs(sh, rng);
  Documents docs{{{1}, {3}}, {0, 0, 2, 2, 2, 2, 0, 0, 0, 0, 4, 4}};
  check_separate(sh, in, nullptr, &docs, "fixed documents");
  // A query that starts a document sees only itself: its context is its own value.
  auto ctx = nans(sh.nv()), probs = nans(sh.np());
  separate_attention_forward(in.q.data(), in.k.data(), in.v.data(), ctx.data(), probs.data(), sh.b, sh.s, sh.H,
                             sh.Dqk, sh.Dv, kSepScale, nullptr, docs.key_start.data());
  for (int64_t t : {2, 10})
    for (int64_t c = 0; c < sh.H * sh.Dv; ++c) EXPECT_EQ(ctx[t * sh.H * sh.Dv + c], in.v[t * sh.H * sh.Dv + c]) << t;
}

// Each head reads its own k and v columns: a head's v zeroed -> that head's ctx is exactly zero,
// the other heads' ctx bitwise unchanged; a dctx only in head 1 -> gradients only in head 1's columns.
TEST(MlaSeparateAttentionLayout, EachHeadReadsAndWritesOnlyItsOwnColumns) {
  const SepShape sh{2, 4, 3, 5, 2};
  std::mt19937 rng(505);
  const SepInputs in = sep_inputs(sh, rng);
  std::vector<float> ctx(sh.nv()), probs(sh.np());
  separate_attention_forward(in.q.data(), in.k.data(), in.v.data(), ctx.data(), probs.data(), sh.b, sh.s, sh.H,
                             sh.Dqk, sh.Dv, kSepScale);
  auto v0 = in.v;
  for (int64_t t = 0; t < sh.T(); ++t)
    for (int64_t d = 0; d < sh.Dv; ++d) v0[(t * sh.H + 0) * sh.Dv + d] = 0.0f;
  std::vector<float> ctx0(sh.nv()), probs0(sh.np());
  separate_attention_forward(in.q.data(), in.k.data(), v0.data(), ctx0.data(), probs0.data(), sh.b, sh.s, sh.H,
                             sh.Dqk, sh.Dv, kSepScale);
  for (int64_t t = 0; t < sh.T(); ++t)
    for (int64_t h = 0; h < sh.H; ++h)
      for (int64_t d = 0; d < sh.Dv; ++d) {
        const int64_t c = (t * sh.H + h) * sh.Dv + d;
        EXPECT_EQ(ctx0[c], h == 0 ? 0.0f : ctx[c]) << "token " << t << " head " << h;
      }

  std::vector<float> dctx(sh.nv(), 0.0f);
  for (int64_t t = 0; t < sh.T(); ++t)
    for (int64_t d = 0; d < sh.Dv; ++d) dctx[(t * sh.H + 1) * sh.Dv + d] = in.r[(t * sh.H + 1) * sh.Dv + d];
  auto dq = nans(sh.nq()), dk = nans(sh.nq()), dv = nans(sh.nv());
  separate_attention_backward(in.q.data(), in.k.data(), in.v.data(), probs.data(), dctx.data(), dq.data(), dk.data(),
                              dv.data(), sh.b, sh.s, sh.H, sh.Dqk, sh.Dv, kSepScale);
  double live = 0.0;
  for (int64_t t = 0; t < sh.T(); ++t)
    for (int64_t h = 0; h < sh.H; ++h) {
      for (int64_t d = 0; d < sh.Dqk; ++d) {
        const int64_t c = (t * sh.H + h) * sh.Dqk + d;
        if (h != 1) {
          EXPECT_EQ(dq[c], 0.0f) << "dq token " << t << " head " << h;
          EXPECT_EQ(dk[c], 0.0f) << "dk token " << t << " head " << h;
        } else {
          live += std::abs(dq[c]) + std::abs(dk[c]);
        }
      }
      for (int64_t d = 0; d < sh.Dv; ++d) {
        const int64_t c = (t * sh.H + h) * sh.Dv + d;
        if (h != 1) {
          EXPECT_EQ(dv[c], 0.0f) << "dv token " << t << " head " << h;
        } else {
          live += std::abs(dv[c]);
        }
      }
    }
  EXPECT_GT(live, 1e-3);
}

// With Dqk == Dv == D and H == G, separate q, k, v hold what the fused MHA rows hold (Megatron's
// layout per head: [q_h, k_h, v_h], i.e. columns h*3D, h*3D + D, h*3D + 2D): the two ops agree
// (same numbers, the layouts only differ), forward and backward, with dropout and documents.
TEST(MlaSeparateAttentionVsFused, EqualsFusedAttentionWhenHeadDimsAreEqual) {
  const int64_t b = 2, s = 6, H = 3, D = 4, T = b * s, row = H * 3 * D;
  std::mt19937 rng(506);
  const auto qkv = randn(T * row, rng);
  const auto dctx = randn(T * H * D, rng);
  const auto mask = dropout_mask(b * H * s * s, 0.75, rng);
  const Documents docs = random_documents(b, s, rng);
  std::vector<float> q(T * H * D), k(T * H * D), v(T * H * D);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t d = 0; d < D; ++d) {
        q[(t * H + h) * D + d] = qkv[t * row + h * 3 * D + d];
        k[(t * H + h) * D + d] = qkv[t * row + h * 3 * D + D + d];
        v[(t * H + h) * D + d] = qkv[t * row + h * 3 * D + 2 * D + d];
      }
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  for (int variant = 0; variant < 3; ++variant) {
    const float* dm = variant >= 1 ? mask.data() : nullptr;
    const int32_t* ks = variant == 2 ? docs.key_start.data() : nullptr;
    const std::string what = variant == 0 ? "plain" : variant == 1 ? "dropout" : "dropout and documents";
    auto ctx_f = nans(T * H * D), probs_f = nans(b * H * s * s), ctx_s = nans(T * H * D), probs_s = nans(b * H * s * s);
    attention_forward(qkv.data(), ctx_f.data(), probs_f.data(), b, s, H, H, D, scale, dm, ks);
    separate_attention_forward(q.data(), k.data(), v.data(), ctx_s.data(), probs_s.data(), b, s, H, D, D, scale, dm, ks);
    // Same arithmetic on the same values: agreement to a few fp32 ulp (a layout mix-up is O(1)).
    expect_close(ctx_s, to_double(ctx_f), 1e-6, what + ": ctx");
    expect_close(probs_s, to_double(probs_f), 1e-6, what + ": probs");

    auto dqkv = nans(T * row), dq = nans(T * H * D), dk = nans(T * H * D), dv = nans(T * H * D);
    attention_backward(qkv.data(), probs_f.data(), dctx.data(), dqkv.data(), b, s, H, H, D, scale, dm, ks);
    separate_attention_backward(q.data(), k.data(), v.data(), probs_s.data(), dctx.data(), dq.data(), dk.data(),
                                dv.data(), b, s, H, D, D, scale, dm, ks);
    std::vector<double> want_q(T * H * D), want_k(T * H * D), want_v(T * H * D);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < D; ++d) {
          want_q[(t * H + h) * D + d] = dqkv[t * row + h * 3 * D + d];
          want_k[(t * H + h) * D + d] = dqkv[t * row + h * 3 * D + D + d];
          want_v[(t * H + h) * D + d] = dqkv[t * row + h * 3 * D + 2 * D + d];
        }
    expect_close(dq, want_q, 1e-6, what + ": dq");
    expect_close(dk, want_k, 1e-6, what + ": dk");
    expect_close(dv, want_v, 1e-6, what + ": dv");
  }
}

TEST(MlaSeparateAttentionArgs, BadKeyStartAndHeadDimsAreRefused) {
  const SepShape sh{1, 3, 1, 2, 3};
  std::vector<float> q(sh.nq(), 0.5f), k(sh.nq(), 0.25f), v(sh.nv(), 1.0f), ctx(sh.nv()), probs(sh.np());
  std::vector<float> dq(sh.nq()), dk(sh.nq()), dv(sh.nv());
  const std::vector<int32_t> after{0, 2, 2};    // query 1 cannot start at key 2
  const std::vector<int32_t> negative{0, -1, 0};
  for (const auto* ks : {&after, &negative}) {
    EXPECT_THROW(separate_attention_forward(q.data(), k.data(), v.data(), ctx.data(), probs.data(), sh.b, sh.s, sh.H,
                                            sh.Dqk, sh.Dv, kSepScale, nullptr, ks->data()),
                 laoyao::Error);
    EXPECT_THROW(separate_attention_backward(q.data(), k.data(), v.data(), probs.data(), ctx.data(), dq.data(),
                                             dk.data(), dv.data(), sh.b, sh.s, sh.H, sh.Dqk, sh.Dv, kSepScale, nullptr,
                                             ks->data()),
                 laoyao::Error);
  }
  EXPECT_THROW(separate_attention_forward(q.data(), k.data(), v.data(), ctx.data(), probs.data(), 1, 3, 0, 2, 3,
                                          kSepScale),
               laoyao::Error);
  EXPECT_THROW(separate_attention_forward(q.data(), k.data(), v.data(), ctx.data(), probs.data(), 1, 3, 1, 2, 0,
                                          kSepScale),
               laoyao::Error);
}

// ===================================================================== mla_qkv

// YaRN's concentration factor written out (Megatron's _yarn_get_mscale ratio), independent of yarn.hpp.
double yarn_mscale(double factor, double mscale, double mscale_all_dim) {
  auto get = [&](double m) { return factor <= 1.0 ? 1.0 : 0.1 * m * std::log(factor) + 1.0; };
  return get(mscale) / get(mscale_all_dim);
}

struct MlaCase {
  std::string name;
  int64_t T, H, dqk, dr, dv, kv_lora, max_positions;
  int yarn;  // 0: plain RoPE; 1: YaRN with mscale == mscale_all_dim (DeepSeek-V2-Lite's); 2: YaRN, mscale != 1
  RopeParams params() const {
    RopeParams p;
    if (yarn == 1) p.yarn = YarnParams{40.0, 16, 32.0, 1.0, 0.707, 0.707, true};
    if (yarn == 2) p.yarn = YarnParams{40.0, 16, 32.0, 1.0, 0.707, 0.0, true};
    return p;
  }
  // The factor Megatron multiplies cos and sin by (1 without YaRN).
  double mscale() const {
    if (yarn == 1) return yarn_mscale(40.0, 0.707, 0.707);
    if (yarn == 2) return yarn_mscale(40.0, 0.707, 0.0);
    return 1.0;
  }
  int64_t dq() const { return dqk + dr; }
  int64_t k_pe_ld() const { return kv_lora + dr; }  // linear_kv_down_proj's row: [kv latent | k_pe]
  size_t nq() const { return static_cast<size_t>(T * H * dq()); }
  size_t nkv() const { return static_cast<size_t>(T * H * (dqk + dv)); }
  size_t nkc() const { return static_cast<size_t>(T * k_pe_ld()); }
  size_t nv() const { return static_cast<size_t>(T * H * dv); }
};
void PrintTo(const MlaCase& c, std::ostream* os) { *os << c.name; }

struct MlaTwinOut {
  std::vector<double> query, key, value;
};

// apply_rotary_pos_emb on one head's dr values with multi_latent_attention (rot_dim == dr here):
//   x1 = t[..., 0::2]; x2 = t[..., 1::2]; t = cat((x1, x2))
//   t = t * cos_ + _rotate_half(t) * sin_, cos_ = cat(cos, cos) * mscale (the table's values carry
//   the mscale), _rotate_half(t) = cat((-t2, t1)) of t's halves.
std::vector<double> mla_rope_twin(const double* x, int64_t dr, const RopeTable& tb, int64_t pos) {
  const int64_t half = dr / 2;
  std::vector<double> t(dr), cos_(dr), sin_(dr), rot(dr), out(dr);
  for (int64_t i = 0; i < half; ++i) {
    t[i] = x[2 * i];             // x1 = t[..., 0::2]
    t[half + i] = x[2 * i + 1];  // x2 = t[..., 1::2]
    cos_[i] = cos_[i + half] = tb.cos[pos * half + i];
    sin_[i] = sin_[i + half] = tb.sin[pos * half + i];
  }
  for (int64_t i = 0; i < half; ++i) {
    rot[i] = -t[half + i];
    rot[half + i] = t[i];
  }
  for (int64_t i = 0; i < dr; ++i) out[i] = t[i] * cos_[i] + rot[i] * sin_[i];
  return out;
}

// qkv_up_proj_and_rope_apply (unfused): q -> [q_no_pe | q_pos_emb] per head, kv -> [k_no_pe | value]
// per head, k_pos_emb = the k_pe columns (row stride ld); both pos embs rotated; query = cat(q_no_pe,
// q_pos_emb), key = cat(k_no_pe, k_pos_emb.expand(heads)), value.
MlaTwinOut mla_twin(const std::vector<double>& q, const std::vector<double>& kv, const double* k_pe, int64_t ld,
                    const std::vector<int64_t>& positions, const RopeTable& tb, const MlaCase& c) {
  const int64_t H = c.H, dqk = c.dqk, dr = c.dr, dv = c.dv, dq = c.dq();
  MlaTwinOut out{std::vector<double>(c.nq()), std::vector<double>(c.nq()), std::vector<double>(c.nv())};
  for (int64_t t = 0; t < c.T; ++t) {
    const auto k_pos_emb = mla_rope_twin(k_pe + t * ld, dr, tb, positions[t]);
    for (int64_t h = 0; h < H; ++h) {
      const double* qh = q.data() + (t * H + h) * dq;
      const double* kvh = kv.data() + (t * H + h) * (dqk + dv);
      const auto q_pos_emb = mla_rope_twin(qh + dqk, dr, tb, positions[t]);
      double* query = out.query.data() + (t * H + h) * dq;
      double* key = out.key.data() + (t * H + h) * dq;
      for (int64_t d = 0; d < dqk; ++d) query[d] = qh[d], key[d] = kvh[d];
      for (int64_t d = 0; d < dr; ++d) query[dqk + d] = q_pos_emb[d], key[dqk + d] = k_pos_emb[d];
      for (int64_t d = 0; d < dv; ++d) out.value[(t * H + h) * dv + d] = kvh[dqk + d];
    }
  }
  return out;
}

class MlaQkv : public ::testing::TestWithParam<MlaCase> {};
INSTANTIATE_TEST_SUITE_P(
    Cases, MlaQkv,
    ::testing::Values(MlaCase{"plain_H3_dqk4_dr6_dv5", 6, 3, 4, 6, 5, 7, 12, 0},
                      MlaCase{"yarn_deepseek_H2_dqk3_dr8_dv4", 5, 2, 3, 8, 4, 5, 64, 1},
                      MlaCase{"yarn_mscale_H4_dqk2_dr4_dv6", 4, 4, 2, 4, 6, 3, 64, 2},
                      MlaCase{"plain_H1_dqk5_dr2_dv3", 3, 1, 5, 2, 3, 4, 8, 0}),
    [](const auto& info) { return info.param.name; });

struct MlaInputs {
  std::vector<float> q, kv, kv_combined;  // kv_combined: [T, kv_lora + dr], k_pe at column kv_lora
  std::vector<int64_t> positions;
};
MlaInputs mla_inputs(const MlaCase& c, std::mt19937& rng) {
  MlaInputs in{randn(c.nq(), rng), randn(c.nkv(), rng), randn(c.nkc(), rng), std::vector<int64_t>(c.T)};
  std::uniform_int_distribution<int64_t> pos(0, c.max_positions - 1);
  for (auto& p : in.positions) p = pos(rng);
  in.positions[0] = c.max_positions - 1;  // the table's last row
  return in;
}

TEST_P(MlaQkv, ForwardMatchesFp64Twin) {
  const MlaCase c = GetParam();
  const RopeTable tb = rope_table(c.dr, c.max_positions, c.params());
  ASSERT_EQ(tb.rot_dim, c.dr);
  std::mt19937 rng(601);
  const MlaInputs in = mla_inputs(c, rng);
  auto query = nans(c.nq()), key = nans(c.nq()), value = nans(c.nv());
  const auto kc_before = in.kv_combined;
  mla_qkv_forward(in.q.data(), in.kv.data(), in.kv_combined.data() + c.kv_lora, c.k_pe_ld(), in.positions.data(), tb,
                  query.data(), key.data(), value.data(), c.T, c.H, c.dqk, c.dr, c.dv);
  const auto kcd = to_double(in.kv_combined);
  const auto want = mla_twin(to_double(in.q), to_double(in.kv), kcd.data() + c.kv_lora, c.k_pe_ld(), in.positions,
                             tb, c);
  expect_close(query, want.query, kForwardTol, "query");
  expect_close(key, want.key, kForwardTol, "key");
  expect_close(value, want.value, kForwardTol, "value");
  // The no-pe parts and the value are copies: bitwise.
  for (int64_t t = 0; t < c.T; ++t)
    for (int64_t h = 0; h < c.H; ++h) {
      for (int64_t d = 0; d < c.dqk; ++d) {
        EXPECT_EQ(query[(t * c.H + h) * c.dq() + d], in.q[(t * c.H + h) * c.dq() + d]);
        EXPECT_EQ(key[(t * c.H + h) * c.dq() + d], in.kv[(t * c.H + h) * (c.dqk + c.dv) + d]);
      }
      for (int64_t d = 0; d < c.dv; ++d)
        EXPECT_EQ(value[(t * c.H + h) * c.dv + d], in.kv[(t * c.H + h) * (c.dqk + c.dv) + c.dqk + d]);
      // Every head gets the same rotated k_pe.
      for (int64_t d = 0; d < c.dr; ++d) EXPECT_EQ(key[(t * c.H + h) * c.dq() + c.dqk + d], key[t * c.H * c.dq() + c.dqk + d]);
    }
  EXPECT_EQ(in.kv_combined, kc_before);  // inputs are read only
}

// The same rotation seen as Megatron's RoPE means it (independent of the twin's cat/rotate_half
// form): the interleaved pair z_i = x[2i] + i x[2i+1] is multiplied by mscale * exp(i angle_i(p)),
// its real part lands in column i of the rotated part and its imaginary part in column i + dr/2, the
// same for q and k. So a query's and a key's rotated parts have the dot product
// mscale^2 * sum_i Re(zq_i conj(zk_i) exp(i (angle_i(pq) - angle_i(pk)))). angle = fp32(p * inv_freq)
// (torch.outer of fp32 tensors); mscale from Megatron's formula, not the table.
TEST_P(MlaQkv, RotatedPartsAreComplexRotationsOfTheInterleavedPairsScaledByMscale) {
  const MlaCase c = GetParam();
  const RopeTable tb = rope_table(c.dr, c.max_positions, c.params());
  std::mt19937 rng(602);
  const MlaInputs in = mla_inputs(c, rng);
  std::vector<float> query(c.nq()), key(c.nq()), value(c.nv());
  mla_qkv_forward(in.q.data(), in.kv.data(), in.kv_combined.data() + c.kv_lora, c.k_pe_ld(), in.positions.data(), tb,
                  query.data(), key.data(), value.data(), c.T, c.H, c.dqk, c.dr, c.dv);
  const int64_t half = c.dr / 2;
  const double m = c.mscale();
  if (c.yarn == 2) {
    EXPECT_GT(std::abs(m - 1.0), 0.2);  // a case where the mscale really scales
  }
  auto rotation = [&](int64_t p, int64_t i) {
    const float angle = static_cast<float>(p) * tb.inv_freq[i];
    return std::polar(m, static_cast<double>(angle));
  };
  double worst = 0.0, scale = 0.0;
  for (int64_t t = 0; t < c.T; ++t) {
    const float* kpe = in.kv_combined.data() + t * c.k_pe_ld() + c.kv_lora;
    for (int64_t h = 0; h < c.H; ++h) {
      const float* qpe = in.q.data() + (t * c.H + h) * c.dq() + c.dqk;
      const float* qo = query.data() + (t * c.H + h) * c.dq() + c.dqk;
      const float* ko = key.data() + (t * c.H + h) * c.dq() + c.dqk;
      for (int64_t i = 0; i < half; ++i) {  // each output pair is the rotated input pair
        const auto zq = std::complex<double>(qpe[2 * i], qpe[2 * i + 1]) * rotation(in.positions[t], i);
        const auto zk = std::complex<double>(kpe[2 * i], kpe[2 * i + 1]) * rotation(in.positions[t], i);
        EXPECT_NEAR(qo[i], zq.real(), 1e-5 * (1 + std::abs(zq))) << "token " << t << " head " << h << " pair " << i;
        EXPECT_NEAR(qo[i + half], zq.imag(), 1e-5 * (1 + std::abs(zq))) << "token " << t << " head " << h;
        EXPECT_NEAR(ko[i], zk.real(), 1e-5 * (1 + std::abs(zk))) << "token " << t << " head " << h << " pair " << i;
        EXPECT_NEAR(ko[i + half], zk.imag(), 1e-5 * (1 + std::abs(zk))) << "token " << t << " head " << h;
      }
    }
  }
  // Dot products across tokens (the attention scores' RoPE part).
  for (int64_t tq = 0; tq < c.T; ++tq)
    for (int64_t tk = 0; tk < c.T; ++tk)
      for (int64_t h = 0; h < c.H; ++h) {
        const float* qpe = in.q.data() + (tq * c.H + h) * c.dq() + c.dqk;
        const float* kpe = in.kv_combined.data() + tk * c.k_pe_ld() + c.kv_lora;
        std::complex<double> want = 0.0;
        double mag = 0.0;
        for (int64_t i = 0; i < half; ++i) {
          const std::complex<double> zq(qpe[2 * i], qpe[2 * i + 1]), zk(kpe[2 * i], kpe[2 * i + 1]);
          want += zq * std::conj(zk) * rotation(in.positions[tq], i) * std::conj(rotation(in.positions[tk], i));
          mag += m * m * std::abs(zq) * std::abs(zk);
        }
        double got = 0.0;
        for (int64_t d = 0; d < c.dr; ++d)
          got += static_cast<double>(query[(tq * c.H + h) * c.dq() + c.dqk + d]) * key[(tk * c.H + h) * c.dq() + c.dqk + d];
        worst = std::max(worst, std::abs(got - want.real()));
        scale = std::max(scale, mag);
      }
  EXPECT_LE(worst, kForwardTol * scale) << "q.k of the rotated parts (scale " << scale << ")";
}

TEST_P(MlaQkv, BackwardMatchesFiniteDifferences) {
  const MlaCase c = GetParam();
  const RopeTable tb = rope_table(c.dr, c.max_positions, c.params());
  std::mt19937 rng(603);
  const MlaInputs in = mla_inputs(c, rng);
  // L = sum(wq * query) + sum(wk * key) + sum(wv * value): dquery = wq, dkey = wk, dvalue = wv.
  const auto wq = randn(c.nq(), rng), wk = randn(c.nq(), rng), wv = randn(c.nv(), rng);
  auto dq = nans(c.nq()), dkv = nans(c.nkv());
  // dk_pe lands in the k_pe columns of a [T, kv_lora + dr] gradient buffer (as the real caller's
  // d(kv_combined)); the latent columns hold other values that must survive.
  const auto dkc_before = randn(c.nkc(), rng, 1.0f, 3.0f);
  auto dkc = dkc_before;
  mla_qkv_backward(wq.data(), wk.data(), wv.data(), in.positions.data(), tb, dq.data(), dkv.data(),
                   dkc.data() + c.kv_lora, c.k_pe_ld(), c.T, c.H, c.dqk, c.dr, c.dv);

  auto qd = to_double(in.q), kvd = to_double(in.kv), kcd = to_double(in.kv_combined);
  const auto wqd = to_double(wq), wkd = to_double(wk), wvd = to_double(wv);
  auto loss = [&] {
    const auto o = mla_twin(qd, kvd, kcd.data() + c.kv_lora, c.k_pe_ld(), in.positions, tb, c);
    return project(wqd, o.query) + project(wkd, o.key) + project(wvd, o.value);
  };
  expect_close(dq, numeric_grad(loss, qd), kGradTol, "dq");
  expect_close(dkv, numeric_grad(loss, kvd), kGradTol, "dkv");
  const auto g = numeric_grad(loss, kcd);
  std::vector<float> got_kpe;
  std::vector<double> want_kpe;
  for (int64_t t = 0; t < c.T; ++t)
    for (int64_t col = 0; col < c.k_pe_ld(); ++col) {
      const size_t i = static_cast<size_t>(t * c.k_pe_ld() + col);
      if (col >= c.kv_lora) {
        got_kpe.push_back(dkc[i]);
        want_kpe.push_back(g[i]);
      } else {
        EXPECT_EQ(dkc[i], dkc_before[i]) << "latent column " << col << " of token " << t << " was written";
      }
    }
  expect_close(got_kpe, want_kpe, kGradTol, "dk_pe (the heads' sum)");

  // Overwritten, not accumulated.
  const auto dq1 = dq, dkv1 = dkv, dkc1 = dkc;
  mla_qkv_backward(wq.data(), wk.data(), wv.data(), in.positions.data(), tb, dq.data(), dkv.data(),
                   dkc.data() + c.kv_lora, c.k_pe_ld(), c.T, c.H, c.dqk, c.dr, c.dv);
  EXPECT_EQ(dq, dq1);
  EXPECT_EQ(dkv, dkv1);
  EXPECT_EQ(dkc, dkc1);
}

// The adjoint identity through the op itself: the map (q, kv, k_pe) -> (query, key, value) is
// linear, so <w, F(x)> = <F^T w, x>, both sides summed in double from the op's fp32 results.
TEST_P(MlaQkv, BackwardIsTheAdjointOfForward) {
  const MlaCase c = GetParam();
  const RopeTable tb = rope_table(c.dr, c.max_positions, c.params());
  std::mt19937 rng(604);
  const MlaInputs in = mla_inputs(c, rng);
  const auto wq = randn(c.nq(), rng), wk = randn(c.nq(), rng), wv = randn(c.nv(), rng);
  std::vector<float> query(c.nq()), key(c.nq()), value(c.nv());
  mla_qkv_forward(in.q.data(), in.kv.data(), in.kv_combined.data() + c.kv_lora, c.k_pe_ld(), in.positions.data(), tb,
                  query.data(), key.data(), value.data(), c.T, c.H, c.dqk, c.dr, c.dv);
  std::vector<float> dq(c.nq()), dkv(c.nkv()), dkpe(static_cast<size_t>(c.T * c.dr));  // contiguous: ld = dr
  mla_qkv_backward(wq.data(), wk.data(), wv.data(), in.positions.data(), tb, dq.data(), dkv.data(), dkpe.data(), c.dr,
                   c.T, c.H, c.dqk, c.dr, c.dv);
  double lhs = 0.0, rhs = 0.0, mag = 0.0;
  for (size_t i = 0; i < query.size(); ++i) {
    lhs += static_cast<double>(wq[i]) * query[i] + static_cast<double>(wk[i]) * key[i];
    mag += std::abs(static_cast<double>(wq[i]) * query[i]) + std::abs(static_cast<double>(wk[i]) * key[i]);
  }
  for (size_t i = 0; i < value.size(); ++i) lhs += static_cast<double>(wv[i]) * value[i];
  for (size_t i = 0; i < dq.size(); ++i) rhs += static_cast<double>(dq[i]) * in.q[i];
  for (size_t i = 0; i < dkv.size(); ++i) rhs += static_cast<double>(dkv[i]) * in.kv[i];
  for (int64_t t = 0; t < c.T; ++t)
    for (int64_t d = 0; d < c.dr; ++d)
      rhs += static_cast<double>(dkpe[t * c.dr + d]) * in.kv_combined[t * c.k_pe_ld() + c.kv_lora + d];
  EXPECT_NEAR(lhs, rhs, 1e-6 * mag) << "<w, F x> vs <F^T w, x>";
}

// dk_pe is the heads' sum: the gradient from all heads equals the sum of each head's alone, and a
// dkey whose RoPE'd part is the same in every head gives H times one head's gradient.
TEST(MlaQkvHeads, KPeGradientSumsEveryHead) {
  const MlaCase c{"heads", 4, 4, 3, 6, 2, 5, 16, 0};
  const RopeTable tb = rope_table(c.dr, c.max_positions, c.params());
  std::mt19937 rng(605);
  const MlaInputs in = mla_inputs(c, rng);
  const auto wq = randn(c.nq(), rng), wk = randn(c.nq(), rng), wv = randn(c.nv(), rng);
  std::vector<float> dq(c.nq()), dkv(c.nkv());
  auto backward_kpe = [&](const std::vector<float>& dkey) {
    auto dkpe = nans(static_cast<size_t>(c.T * c.dr));
    mla_qkv_backward(wq.data(), dkey.data(), wv.data(), in.positions.data(), tb, dq.data(), dkv.data(), dkpe.data(),
                     c.dr, c.T, c.H, c.dqk, c.dr, c.dv);
    return dkpe;
  };
  const auto full = backward_kpe(wk);
  std::vector<double> sum(full.size(), 0.0);
  for (int64_t h = 0; h < c.H; ++h) {
    auto only = wk;
    for (int64_t t = 0; t < c.T; ++t)
      for (int64_t hh = 0; hh < c.H; ++hh)
        if (hh != h)
          for (int64_t d = 0; d < c.dq(); ++d) only[(t * c.H + hh) * c.dq() + d] = 0.0f;
    const auto part = backward_kpe(only);
    double norm = 0.0;
    for (size_t i = 0; i < part.size(); ++i) sum[i] += part[i], norm += std::abs(part[i]);
    EXPECT_GT(norm, 1e-3) << "head " << h << " contributes";
  }
  expect_close(full, sum, kForwardTol, "dk_pe vs the sum of each head's");

  auto same = wk;  // head 0's RoPE'd gradient copied into every head
  for (int64_t t = 0; t < c.T; ++t)
    for (int64_t h = 1; h < c.H; ++h)
      for (int64_t d = 0; d < c.dr; ++d) same[(t * c.H + h) * c.dq() + c.dqk + d] = same[t * c.H * c.dq() + c.dqk + d];
  auto head0 = same;
  for (int64_t t = 0; t < c.T; ++t)
    for (int64_t h = 1; h < c.H; ++h)
      for (int64_t d = 0; d < c.dq(); ++d) head0[(t * c.H + h) * c.dq() + d] = 0.0f;
  const auto all = backward_kpe(same), one = backward_kpe(head0);
  std::vector<double> want(one.size());
  for (size_t i = 0; i < one.size(); ++i) want[i] = static_cast<double>(c.H) * one[i];
  expect_close(all, want, kForwardTol, "identical heads: H times one head");
}

TEST(MlaQkvArgs, PositionsOutsideTheTableAndTooShortPosEmbAreRefused) {
  const MlaCase c{"args", 3, 2, 2, 4, 3, 2, 8, 0};
  const RopeTable tb = rope_table(c.dr, c.max_positions, c.params());
  std::mt19937 rng(606);
  MlaInputs in = mla_inputs(c, rng);
  std::vector<float> query(c.nq()), key(c.nq()), value(c.nv()), dq(c.nq()), dkv(c.nkv()), dkc(c.nkc());
  auto fwd = [&](const RopeTable& table, int64_t dr) {
    mla_qkv_forward(in.q.data(), in.kv.data(), in.kv_combined.data() + c.kv_lora, c.k_pe_ld(), in.positions.data(),
                    table, query.data(), key.data(), value.data(), c.T, c.H, c.dqk, dr, c.dv);
  };
  auto bwd = [&](const RopeTable& table, int64_t dr) {
    mla_qkv_backward(query.data(), key.data(), value.data(), in.positions.data(), table, dq.data(), dkv.data(),
                     dkc.data() + c.kv_lora, c.k_pe_ld(), c.T, c.H, c.dqk, dr, c.dv);
  };
  EXPECT_NO_THROW(fwd(tb, c.dr));
  EXPECT_NO_THROW(bwd(tb, c.dr));
  for (int64_t bad : {c.max_positions, int64_t{-1}, int64_t{1000}}) {
    in.positions[1] = bad;
    EXPECT_THROW(fwd(tb, c.dr), laoyao::Error) << "position " << bad;
    EXPECT_THROW(bwd(tb, c.dr), laoyao::Error) << "position " << bad;
  }
  in.positions[1] = 0;
  const RopeTable wide = rope_table(c.dr + 2, c.max_positions, c.params());  // rotates more dims than dr
  EXPECT_THROW(fwd(wide, c.dr), laoyao::Error);
  EXPECT_THROW(bwd(wide, c.dr), laoyao::Error);
}

// ===================================================================== copy_columns

TEST(MlaCopyColumns, StridedCopyWritesOnlyTheSliceAndReadsOnlyItsSource) {
  const int64_t rows = 6, src_ld = 11, dst_ld = 9, cols = 4, src_off = 3, dst_off = 2;
  std::mt19937 rng(701);
  const auto src = randn(rows * src_ld, rng);
  const auto dst_before = randn(rows * dst_ld, rng, 1.0f, 5.0f);
  auto dst = dst_before;
  const auto src_copy = src;
  copy_columns(src.data() + src_off, src_ld, dst.data() + dst_off, dst_ld, rows, cols);
  EXPECT_EQ(src, src_copy);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < dst_ld; ++c) {
      const float v = dst[r * dst_ld + c];
      if (c >= dst_off && c < dst_off + cols) {
        EXPECT_EQ(v, src[r * src_ld + src_off + (c - dst_off)]) << "row " << r << " column " << c;
      } else {
        EXPECT_EQ(v, dst_before[r * dst_ld + c]) << "row " << r << " column " << c << " was written";
      }
    }
  // A contiguous slice (ld == cols) gathered out of strided rows, and zero rows writes nothing.
  std::vector<float> packed = nans(rows * cols);
  copy_columns(src.data() + src_off, src_ld, packed.data(), cols, rows, cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) EXPECT_EQ(packed[r * cols + c], src[r * src_ld + src_off + c]);
  auto untouched = dst_before;
  copy_columns(src.data(), src_ld, untouched.data(), dst_ld, 0, cols);
  EXPECT_EQ(untouched, dst_before);
}

}  // namespace
}  // namespace laoyao::kernels::cpu::test
