// Rotary position embedding: the tables against Megatron's formulas (RotaryEmbedding.__init__,
// _apply_scaling, get_freqs_non_repeated) in fp64 and against Llama 3.2 values derived
// independently; the rotation against an fp64 twin written the way _apply_rotary_pos_emb_bshd
// writes it (emb = cat(freqs, freqs), t * cos + rotate_half(t) * sin, pass-through of the dims
// past rot_dim), finite differences of the backward, and RoPE's defining properties.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <tuple>

#include "core/error.hpp"
#include "kernels/cpu/ops.hpp"
#include "test_util.hpp"

namespace laoyao::kernels::cpu::test {
namespace {

// ---- fp64 twins

// RotaryEmbedding.__init__: dim = int(kv_channels * rotary_percent) if rotary_percent < 1;
// inv_freq = 1 / base ** (arange(0, dim, 2) / dim); then _apply_scaling when rope_scaling.
std::vector<double> inv_freq_twin(int64_t kv_channels, const RopeParams& p) {
  int64_t dim = kv_channels;
  if (p.rotary_percent < 1.0) dim = static_cast<int64_t>(static_cast<double>(kv_channels) * p.rotary_percent);
  std::vector<double> freqs;
  for (int64_t i = 0; i < dim; i += 2)
    freqs.push_back(1.0 / std::pow(p.rotary_base, static_cast<double>(i) / static_cast<double>(dim)));
  if (p.rope_scaling) {
    const double factor = p.rope_scaling_factor, low = p.low_freq_factor, high = p.high_freq_factor;
    const double old_context_len = p.original_max_position_embeddings;
    const double low_freq_wavelen = old_context_len / low, high_freq_wavelen = old_context_len / high;
    for (double& f : freqs) {
      const double wavelen = 2 * std::numbers::pi / f;
      const double inv_freq_llama = wavelen > low_freq_wavelen ? f / factor : f;
      const double smooth_factor = (old_context_len / wavelen - low) / (high - low);
      const double smoothed = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama;
      const bool is_medium_freq = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
      f = is_medium_freq ? smoothed : inv_freq_llama;
    }
  }
  return freqs;
}

struct Shape {
  int64_t T, H, G, D;
  double rotary_percent;
  int64_t row() const { return G * (H / G + 2) * D; }
};

// _apply_rotary_pos_emb_bshd on every q head and k of the fused rows (v untouched), in fp64, with
// freqs = position * inv_freq (inv_freq as the table holds it, so this twin checks the rotation).
std::vector<double> rope_twin(const std::vector<double>& qkv, const std::vector<int64_t>& positions,
                              const std::vector<double>& inv_freq, const Shape& sh) {
  const int64_t Q = sh.H / sh.G, D = sh.D, W = sh.row();
  const int64_t rot_dim = 2 * static_cast<int64_t>(inv_freq.size()), half = rot_dim / 2;
  std::vector<double> out = qkv;
  for (int64_t t = 0; t < sh.T; ++t) {
    std::vector<double> emb(rot_dim);  // cat(freqs, freqs)
    for (int64_t i = 0; i < half; ++i) emb[i] = emb[i + half] = static_cast<double>(positions[t]) * inv_freq[i];
    for (int64_t g = 0; g < sh.G; ++g)
      for (int64_t j = 0; j <= Q; ++j) {  // q heads of the group, then its k (j == Q); v (Q + 1) skipped
        const int64_t base = t * W + (g * (Q + 2) + j) * D;
        std::vector<double> x(qkv.begin() + base, qkv.begin() + base + rot_dim);  // t[..., :rot_dim]
        std::vector<double> rotated(rot_dim);                                    // rotate_half: cat(-x2, x1)
        for (int64_t i = 0; i < half; ++i) {
          rotated[i] = -x[i + half];
          rotated[i + half] = x[i];
        }
        for (int64_t i = 0; i < rot_dim; ++i)
          out[base + i] = x[i] * std::cos(emb[i]) + rotated[i] * std::sin(emb[i]);
        // t_pass = t[..., rot_dim:] stays as it is
      }
  }
  return out;
}

std::vector<double> table_inv_freq(const RopeTable& tb) { return to_double(tb.inv_freq); }

// Relative error per element (inv_freq spans 1 .. 1e-7: a scale-relative check would be blind to
// the small ones).
void expect_each_relative(const std::vector<float>& got, const std::vector<double>& want, double rtol,
                          const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_LE(std::abs(got[i] - want[i]), rtol * std::abs(want[i]))
        << what << " [" << i << "]: got " << got[i] << " want " << want[i];
}

// fp32 inv_freq rounds a handful of fp32 ops (pow, reciprocal; scaling adds ~8 more): a few ulp.
constexpr double kInvFreqTol = 1e-6;

// ---- the tables

TEST(RopeTable, InverseFrequenciesFollowMegatronsFormula) {
  struct Case {
    int64_t kv;
    RopeParams p;
    int64_t dim, rot_dim;
  };
  RopeParams gpt, half8, half6, qwen3, llama32, llama31;
  half8.rotary_percent = 0.5;
  half6.rotary_percent = 0.5;  // dim = int(6 * 0.5) = 3: arange(0, 3, 2) = [0, 2], 4 dims rotate
  qwen3.rotary_base = 1000000.0;
  llama32.rotary_base = llama31.rotary_base = 500000.0;
  llama32.rope_scaling = llama31.rope_scaling = true;
  llama32.rope_scaling_factor = 32.0;
  llama31.rope_scaling_factor = 8.0;
  for (const Case& c : {Case{8, gpt, 8, 8}, Case{8, half8, 4, 4}, Case{6, half6, 3, 4}, Case{128, qwen3, 128, 128},
                        Case{64, llama32, 64, 64}, Case{128, llama31, 128, 128}}) {
    const RopeTable tb = rope_table(c.kv, 3, c.p);
    const std::string what = "kv " + std::to_string(c.kv) + " percent " + std::to_string(c.p.rotary_percent) +
                             " base " + std::to_string(c.p.rotary_base) + (c.p.rope_scaling ? " scaled" : "");
    EXPECT_EQ(tb.dim, c.dim) << what;
    EXPECT_EQ(tb.rot_dim, c.rot_dim) << what;
    EXPECT_EQ(tb.inv_freq.size(), static_cast<size_t>(c.rot_dim / 2)) << what;
    expect_each_relative(tb.inv_freq, inv_freq_twin(c.kv, c.p), kInvFreqTol, what);
  }
}

// Llama 3.2 (rope_theta 500000, head_dim 64, llama3 rope_scaling factor 32, low 1, high 4,
// original_max_position_embeddings 8192). Values computed once in fp64 with Python from the
// published formula (wavelen = 2 pi / f; < 2048: f; > 8192: f / 32; else smooth interpolation with
// s = (8192 / wavelen - 1) / 3). Index 10 is high-frequency, 15-17 are the medium band, 18 and 31
// are low-frequency.
TEST(RopeTable, Llama32ScaledFrequenciesMatchIndependentValues) {
  RopeParams p;
  p.rotary_base = 500000.0;
  p.rope_scaling = true;
  p.rope_scaling_factor = 32.0;
  const RopeTable tb = rope_table(64, 1, p);
  ASSERT_EQ(tb.inv_freq.size(), 32u);
  const struct {
    int i;
    double want;
  } published[] = {{0, 1.0},
                   {10, 0.016560440080994446},
                   {15, 0.001290547928209264},
                   {16, 0.00042955679655936815},
                   {17, 9.70828780262767e-05},
                   {18, 1.9461638184831125e-05},
                   {31, 9.418306725434909e-08}};
  for (const auto& v : published)
    EXPECT_LE(std::abs(tb.inv_freq[v.i] - v.want), kInvFreqTol * v.want)
        << "inv_freq[" << v.i << "] = " << tb.inv_freq[v.i] << " want " << v.want;

  // The bands, exactly: high frequencies are the unscaled fp32 values untouched; low ones are
  // divided by 32 (a power of two: exact); the medium band lies strictly between.
  RopeParams unscaled = p;
  unscaled.rope_scaling = false;
  const RopeTable plain = rope_table(64, 1, unscaled);
  for (int i = 0; i < 32; ++i) {
    if (i < 15) {
      EXPECT_EQ(tb.inv_freq[i], plain.inv_freq[i]) << i;
    } else if (i > 17) {
      EXPECT_EQ(tb.inv_freq[i], plain.inv_freq[i] / 32.0f) << i;
    } else {
      EXPECT_LT(tb.inv_freq[i], plain.inv_freq[i]) << i;
      EXPECT_GT(tb.inv_freq[i], plain.inv_freq[i] / 32.0f) << i;
    }
  }
}

TEST(RopeTable, PositionZeroIsTheIdentityRotation) {
  RopeParams p;
  p.rotary_base = 500000.0;
  p.rope_scaling = true;
  p.rope_scaling_factor = 32.0;
  p.seq_len_interpolation_factor = 3.0;
  const RopeTable tb = rope_table(64, 4, p);
  for (int64_t i = 0; i < 32; ++i) {
    EXPECT_EQ(tb.cos[i], 1.0f) << i;
    EXPECT_EQ(tb.sin[i], 0.0f) << i;
  }
}

// get_freqs_non_repeated: torch.outer(seq, inv_freq) of fp32 tensors, so the angle is the fp32
// product; at long positions its rounding (up to ~5e-4 rad at 8191) is part of Megatron's numbers.
TEST(RopeTable, AnglesAreTheFp32ProductOfPositionAndInverseFrequency) {
  RopeParams p;
  p.rotary_base = 500000.0;  // Llama 3 8B: kv_channels 128, seq 8192
  const int64_t n = 64;
  const RopeTable tb = rope_table(128, 8192, p);
  double exact_angle_gap = 0.0;
  for (int64_t pos : {1, 100, 4097, 8191})
    for (int64_t i = 0; i < n; ++i) {
      const float angle32 = static_cast<float>(pos) * tb.inv_freq[i];  // one fp32 multiply
      EXPECT_NEAR(tb.cos[pos * n + i], std::cos(static_cast<double>(angle32)), 1.2e-7) << pos << " " << i;
      EXPECT_NEAR(tb.sin[pos * n + i], std::sin(static_cast<double>(angle32)), 1.2e-7) << pos << " " << i;
      const double exact = static_cast<double>(pos) * static_cast<double>(tb.inv_freq[i]);
      exact_angle_gap = std::max(exact_angle_gap, std::abs(std::cos(exact) - tb.cos[pos * n + i]));
    }
  EXPECT_GT(exact_angle_gap, 1e-5);  // the fp32 angle really differs from the exact one
}

TEST(RopeTable, InterpolationFactorDividesThePositions) {
  RopeParams p;
  const RopeTable plain = rope_table(8, 16, p);
  p.seq_len_interpolation_factor = 4.0;  // seq *= 1/4: exact, so row 4k is row k of the plain table
  const RopeTable by4 = rope_table(8, 64, p);
  for (int64_t k = 0; k < 16; ++k)
    for (int64_t i = 0; i < 4; ++i) {
      EXPECT_EQ(by4.cos[4 * k * 4 + i], plain.cos[k * 4 + i]) << k << " " << i;
      EXPECT_EQ(by4.sin[4 * k * 4 + i], plain.sin[k * 4 + i]) << k << " " << i;
    }
  p.seq_len_interpolation_factor = 3.0;  // fp32 1/3: the angles carry a few fp32 roundings
  const RopeTable by3 = rope_table(8, 16, p);
  const auto inv = inv_freq_twin(8, p);
  for (int64_t pos = 0; pos < 16; ++pos)
    for (int64_t i = 0; i < 4; ++i) {
      const double angle = static_cast<double>(pos) / 3.0 * inv[i];
      EXPECT_NEAR(by3.cos[pos * 4 + i], std::cos(angle), 3e-6) << pos << " " << i;
      EXPECT_NEAR(by3.sin[pos * 4 + i], std::sin(angle), 3e-6) << pos << " " << i;
    }
}

// YaRN (YarnRotaryEmbedding): the frequencies against its formula in fp64 (DeepSeek-V2-Lite's values:
// factor 40 over an original 4096 positions, betas 32 and 1), the bands exactly (the fast dims keep
// the original frequencies, the slow ones are the interpolated ones), cos and sin scaled by the
// concentration factor (1 when mscale equals mscale_all_dim; 1 + 0.1 ln 40 with Megatron-LM's
// defaults mscale 1, mscale_all_dim 0).
TEST(RopeTable, YarnFollowsMegatronsFormula) {
  const int64_t D = 64;
  const double base = 10000.0, factor = 40.0, original = 4096.0;
  auto correction_dim = [&](double rotations) {
    return D * std::log(original / (rotations * 2.0 * std::numbers::pi)) / (2.0 * std::log(base));
  };
  const double low = std::floor(correction_dim(32.0)), high = std::ceil(correction_dim(1.0));
  ASSERT_EQ(low, 10.0);
  ASSERT_EQ(high, 23.0);
  RopeParams plain;
  plain.rotary_base = base;
  const RopeTable original_table = rope_table(D, 2, plain);
  for (const auto& [mscale, all_dim, concentration] :
       {std::tuple{0.707, 0.707, 1.0}, std::tuple{1.0, 0.0, 1.0 + 0.1 * std::log(40.0)}}) {
    SCOPED_TRACE(mscale);
    RopeParams p = plain;
    p.rotary_percent = 0.5;  // not read: YaRN's frequencies span the whole head
    p.yarn = YarnParams{factor, 4096, 32.0, 1.0, mscale, all_dim, true};
    EXPECT_NEAR(yarn_concentration_factor(*p.yarn), concentration, 1e-12);
    const int64_t positions = 300;
    const RopeTable tb = rope_table(D, positions, p);
    ASSERT_EQ(tb.rot_dim, D);
    ASSERT_EQ(tb.inv_freq.size(), size_t(D / 2));
    for (int64_t i = 0; i < D / 2; ++i) {
      const double extra = std::pow(base, -2.0 * static_cast<double>(i) / D), inter = extra / factor;
      const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
      const double want = inter * ramp + extra * (1.0 - ramp);
      // (1 - mask and mask are fp32 values near 1 apart: up to an ulp of 1 of extra's weight is lost)
      EXPECT_LE(std::abs(tb.inv_freq[i] - want), 4e-7 * want + 1.2e-7 * extra) << "inv_freq[" << i << "]";
      if (i <= low) {  // the original frequencies
        EXPECT_EQ(tb.inv_freq[i], original_table.inv_freq[i]) << i;
      }
      if (i >= high) {
        const float pw = 1.0f / original_table.inv_freq[i];  // (the fp32 ops Megatron's are, not their value)
        EXPECT_NEAR(tb.inv_freq[i], 1.0 / (factor * pw), 1e-6 / (factor * pw)) << i;
      }
    }
    for (int64_t pos : {int64_t{0}, int64_t{1}, int64_t{77}, positions - 1})
      for (int64_t i = 0; i < D / 2; ++i) {
        const double angle = static_cast<double>(static_cast<float>(pos * static_cast<double>(tb.inv_freq[i])));
        EXPECT_NEAR(tb.cos[pos * (D / 2) + i], std::cos(angle) * concentration, 2e-6) << pos << "," << i;
        EXPECT_NEAR(tb.sin[pos * (D / 2) + i], std::sin(angle) * concentration, 2e-6) << pos << "," << i;
      }
  }
  // Without rounding the correction range the ramp starts and ends between dims.
  RopeParams unrounded = plain;
  unrounded.yarn = YarnParams{factor, 4096, 32.0, 1.0, 1.0, 1.0, false};
  RopeParams rounded = unrounded;
  rounded.yarn->correction_range_round_to_int = true;
  EXPECT_NE(rope_table(D, 2, unrounded).inv_freq[12], rope_table(D, 2, rounded).inv_freq[12]);
}

TEST(RopeTable, BadParametersAreRefused) {
  RopeParams p;
  EXPECT_THROW(rope_table(0, 4, p), laoyao::Error);
  EXPECT_THROW(rope_table(8, 0, p), laoyao::Error);
  EXPECT_THROW(rope_table(5, 4, p), laoyao::Error);  // odd dim 5 == kv_channels would rotate 6 values
  RopeParams q = p;
  q.rotary_percent = 0.1;  // int(8 * 0.1) = 0 rotary dims
  EXPECT_THROW(rope_table(8, 4, q), laoyao::Error);
  q = p;
  q.rope_scaling = true;
  q.high_freq_factor = q.low_freq_factor;
  EXPECT_THROW(rope_table(8, 4, q), laoyao::Error);
  q = p;
  q.seq_len_interpolation_factor = 0.0;
  EXPECT_THROW(rope_table(8, 4, q), laoyao::Error);
  q = p;
  q.yarn = YarnParams{};
  EXPECT_NO_THROW(rope_table(8, 4, q));
  EXPECT_THROW(rope_table(7, 4, q), laoyao::Error);  // YaRN's ramp needs an even head dim
  q.yarn->scaling_factor = 0.0;
  EXPECT_THROW(rope_table(8, 4, q), laoyao::Error);
  q.yarn = YarnParams{};
  q.rope_scaling = true;
  EXPECT_THROW(rope_table(8, 4, q), laoyao::Error);  // YaRN and Llama 3 scaling
}

// ---- the rotation on fused QKV rows

std::string name_of(const Shape& sh) {
  return "T" + std::to_string(sh.T) + "H" + std::to_string(sh.H) + "G" + std::to_string(sh.G) + "D" +
         std::to_string(sh.D) + (sh.rotary_percent < 1.0 ? "Partial" : "Full");
}
void PrintTo(const Shape& sh, std::ostream* os) { *os << name_of(sh); }

constexpr int64_t kMaxPos = 40;

RopeTable table_for(const Shape& sh) {
  RopeParams p;
  p.rotary_percent = sh.rotary_percent;
  return rope_table(sh.D, kMaxPos, p);  // base 10000: inv_freq[0] = 1, so angles up to 39 rad
}

std::vector<int64_t> random_positions(int64_t T, std::mt19937& rng) {
  std::uniform_int_distribution<int64_t> d(0, kMaxPos - 1);
  std::vector<int64_t> pos(T);
  for (auto& x : pos) x = d(rng);
  return pos;
}

class RopeTest : public ::testing::TestWithParam<Shape> {};
INSTANTIATE_TEST_SUITE_P(Shapes, RopeTest,
                         ::testing::Values(Shape{7, 4, 2, 8, 1.0},   // GQA, 2 q heads per group
                                           Shape{7, 4, 2, 6, 0.5},   // dim 3: 4 of 6 dims rotate
                                           Shape{7, 4, 2, 8, 0.5},   // 4 of 8 dims rotate
                                           Shape{7, 3, 3, 6, 1.0},   // MHA
                                           Shape{5, 4, 1, 8, 1.0}),  // one group
                         [](const auto& info) { return name_of(info.param); });

TEST_P(RopeTest, ForwardMatchesFp64Twin) {
  const Shape sh = GetParam();
  std::mt19937 rng(701);
  const RopeTable tb = table_for(sh);
  auto qkv = randn(sh.T * sh.row(), rng);
  const auto pos = random_positions(sh.T, rng);
  const auto want = rope_twin(to_double(qkv), pos, table_inv_freq(tb), sh);
  rope_forward_qkv(qkv.data(), pos.data(), tb, sh.T, sh.H, sh.G, sh.D);
  expect_close(qkv, want, kForwardTol, "rotated qkv");
}

TEST_P(RopeTest, LeavesValuesAndPassThroughDimsBitwiseAndPreservesEachHeadsNorm) {
  const Shape sh = GetParam();
  std::mt19937 rng(702);
  const RopeTable tb = table_for(sh);
  const auto before = randn(sh.T * sh.row(), rng);
  const auto pos = random_positions(sh.T, rng);
  auto qkv = before;
  rope_forward_qkv(qkv.data(), pos.data(), tb, sh.T, sh.H, sh.G, sh.D);
  const int64_t Q = sh.H / sh.G, D = sh.D;
  for (int64_t t = 0; t < sh.T; ++t)
    for (int64_t g = 0; g < sh.G; ++g)
      for (int64_t j = 0; j < Q + 2; ++j) {
        const int64_t base = t * sh.row() + (g * (Q + 2) + j) * D;
        if (j == Q + 1) {  // v
          for (int64_t d = 0; d < D; ++d) EXPECT_EQ(qkv[base + d], before[base + d]) << "v, token " << t;
          continue;
        }
        for (int64_t d = tb.rot_dim; d < D; ++d) EXPECT_EQ(qkv[base + d], before[base + d]) << "pass-through " << d;
        double n0 = 0.0, n1 = 0.0;
        for (int64_t d = 0; d < D; ++d) {
          n0 += static_cast<double>(before[base + d]) * before[base + d];
          n1 += static_cast<double>(qkv[base + d]) * qkv[base + d];
        }
        EXPECT_NEAR(n1, n0, 1e-6 * n0) << "token " << t << " group " << g << " slot " << j;
      }
}

TEST_P(RopeTest, PositionZeroIsTheIdentity) {
  const Shape sh = GetParam();
  std::mt19937 rng(703);
  const RopeTable tb = table_for(sh);
  const auto before = randn(sh.T * sh.row(), rng);
  const std::vector<int64_t> zeros(sh.T, 0);
  auto qkv = before;
  rope_forward_qkv(qkv.data(), zeros.data(), tb, sh.T, sh.H, sh.G, sh.D);
  EXPECT_EQ(qkv, before);
  rope_backward_qkv(qkv.data(), zeros.data(), tb, sh.T, sh.H, sh.G, sh.D);
  EXPECT_EQ(qkv, before);
}

TEST_P(RopeTest, BackwardMatchesFiniteDifferences) {
  const Shape sh = GetParam();
  std::mt19937 rng(704);
  const RopeTable tb = table_for(sh);
  const auto qkv = randn(sh.T * sh.row(), rng);
  const auto r = randn(sh.T * sh.row(), rng);
  const auto pos = random_positions(sh.T, rng);
  auto dqkv = r;  // in place: dqkv starts as d loss / d out
  rope_backward_qkv(dqkv.data(), pos.data(), tb, sh.T, sh.H, sh.G, sh.D);
  auto qd = to_double(qkv);
  const auto rd = to_double(r);
  const auto inv = table_inv_freq(tb);
  expect_close(dqkv, numeric_grad([&] { return project(rd, rope_twin(qd, pos, inv, sh)); }, qd), kGradTol,
               "dqkv");
}

TEST_P(RopeTest, BackwardUndoesForward) {  // the rotation is orthogonal: R^T R = I
  const Shape sh = GetParam();
  std::mt19937 rng(705);
  const RopeTable tb = table_for(sh);
  const auto before = randn(sh.T * sh.row(), rng);
  const auto pos = random_positions(sh.T, rng);
  auto qkv = before;
  rope_forward_qkv(qkv.data(), pos.data(), tb, sh.T, sh.H, sh.G, sh.D);
  rope_backward_qkv(qkv.data(), pos.data(), tb, sh.T, sh.H, sh.G, sh.D);
  expect_close(qkv, to_double(before), 1e-6, "R^T R x");
}

// Non-interleaved layout: dim i pairs with dim i + rot_dim/2 (not i + 1). A unit vector in dim i
// of a head at position p becomes cos in dim i and sin in dim i + half.
TEST(Rope, DimensionIPairsWithIPlusHalf) {
  const Shape sh{1, 1, 1, 8, 1.0};
  RopeParams p;
  const RopeTable tb = rope_table(8, 8, p);
  const int64_t pos = 5, half = 4;
  for (int64_t i = 0; i < half; ++i) {
    std::vector<float> qkv(sh.row(), 0.0f);
    qkv[i] = 1.0f;             // q, dim i
    qkv[8 + i + half] = 1.0f;  // k, dim i + half
    rope_forward_qkv(qkv.data(), &pos, tb, 1, 1, 1, 8);
    for (int64_t d = 0; d < 8; ++d) {
      const float q_want = d == i ? tb.cos[pos * half + i] : d == i + half ? tb.sin[pos * half + i] : 0.0f;
      const float k_want = d == i ? -tb.sin[pos * half + i] : d == i + half ? tb.cos[pos * half + i] : 0.0f;
      EXPECT_EQ(qkv[d], q_want) << "q dim " << d << " (unit dim " << i << ")";
      EXPECT_EQ(qkv[8 + d], k_want) << "k dim " << d << " (unit dim " << i + half << ")";
    }
  }
}

// RoPE's point: q(m) . k(n) depends on m - n only. Two tokens carry the same q and k; token 0 sits
// at position m, token 1 at n, and q0 . k1 is compared across shifts of both.
TEST(Rope, QueryKeyProductDependsOnlyOnTheOffset) {
  const int64_t D = 8, W = 3 * D;  // MHA, one head: q k v
  RopeParams p;
  const RopeTable tb = rope_table(D, 64, p);
  std::mt19937 rng(706);
  const auto row = randn(W, rng);
  auto dot_at = [&](int64_t m, int64_t n) {
    std::vector<float> qkv(row);
    qkv.insert(qkv.end(), row.begin(), row.end());
    const int64_t pos[2] = {m, n};
    rope_forward_qkv(qkv.data(), pos, tb, 2, 1, 1, D);
    double s = 0.0;
    for (int64_t d = 0; d < D; ++d) s += static_cast<double>(qkv[d]) * qkv[W + D + d];  // q of token 0, k of 1
    return s;
  };
  const double ref = dot_at(7, 4);
  for (int64_t shift : {1, 10, 30, 56}) EXPECT_NEAR(dot_at(7 + shift, 4 + shift), ref, 2e-5) << shift;
  EXPECT_GT(std::abs(dot_at(9, 4) - ref), 1e-3);  // a different offset does change it
}

TEST(Rope, BadArgumentsAreRefusedBeforeWriting) {
  RopeParams p;
  const RopeTable tb = rope_table(8, 4, p);
  std::vector<float> qkv(2 * 3 * 8, 1.0f);  // T = 2, H = G = 1, D = 8: rows of q k v
  const auto keep = qkv;
  const int64_t bad[2] = {0, 4};
  EXPECT_THROW(rope_forward_qkv(qkv.data(), bad, tb, 2, 1, 1, 8), laoyao::Error);
  EXPECT_THROW(rope_backward_qkv(qkv.data(), bad, tb, 2, 1, 1, 8), laoyao::Error);
  const int64_t neg[2] = {-1, 0};
  EXPECT_THROW(rope_forward_qkv(qkv.data(), neg, tb, 2, 1, 1, 8), laoyao::Error);
  EXPECT_EQ(qkv, keep);
  const int64_t ok[2] = {1, 2};
  EXPECT_THROW(rope_forward_qkv(qkv.data(), ok, tb, 2, 1, 1, 6), laoyao::Error);  // rot_dim 8 > head dim 6
  EXPECT_THROW(rope_forward_qkv(qkv.data(), ok, tb, 1, 3, 2, 8), laoyao::Error);  // 3 heads, 2 groups
}

}  // namespace
}  // namespace laoyao::kernels::cpu::test
