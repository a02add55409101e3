// Rotary position embedding as Megatron-Core computes it (RotaryEmbedding in
// models/common/embeddings/rotary_pos_embedding.py, _apply_rotary_pos_emb_bshd in rope_utils.py),
// non-interleaved, applied in place to the q heads and k of the fused QKV rows.
//
// The tables. Megatron builds them from fp32 tensors, on the GPU by default
// (use_cpu_initialization False), one torch op at a time; every op rounds its result to fp32:
//   inv_freq = 1.0 / (rotary_base ** (arange(0, dim, 2, fp32) / dim))
//       `/ dim`: a CUDA tensor divided by a CPU scalar is computed as x * fl32(1 / dim) (PyTorch's
//       div_true_kernel_cuda); identical to the division whenever dim is a power of two.
//       `base ** t`: torch.pow(Scalar, Tensor) in fp32 (CUDA powf).
//       `1.0 / t`: Tensor.__rtruediv__ is t.reciprocal() * 1.0.
//   Llama 3.1 scaling (_apply_scaling, adapted from Hugging Face's llama3 rope):
//       wavelen   = 2*math.pi / f            = fl(fl(1/f) * fl32(2 pi))
//       f_llama   = where(wavelen > old/low, f / factor, f), f / factor = fl(f * fl32(1/factor))
//       smooth    = (old / wavelen - low) / (high - low)
//                 = fl(fl(fl(fl(1/wavelen) * old) - low) * fl32(1/(high - low)))
//       smoothed  = (1 - smooth) * f_llama / factor + smooth * f_llama (left to right, each op fl)
//       medium    = !(wavelen < old/high) && !(wavelen > old/low): f_llama replaced by smoothed
//   seq = arange(max_seq_len, fp32); seq *= 1 / seq_len_interpolation_factor (fp32 mul by
//       fl32(1/factor)); freqs = outer(seq, inv_freq) in fp32; cos/sin in fp32.
//   YaRN (YarnRotaryEmbedding, dim = kv_channels):
//       extra = inv_freq above; inter = 1.0 / (factor * base ** t) = recip(fl(fl32(factor) * pw))
//       low, high = the correction range in double (floor / ceil when rounding), clamped to [0, dim-1]
//       ramp = clamp((arange(dim // 2, fp32) - low) * fl32(1 / (high - low)), 0, 1); mask = 1 - ramp
//       inv_freq = inter * (1 - mask) + extra * mask (each op fl); cos/sin = fl(fl(cos) * fl32(mscale))
// Each fp32 op is reproduced exactly here by computing it in double and rounding once (for + - * /
// the double result rounded to fp32 is the correctly rounded fp32 result). pow, cos and sin are
// computed in double and rounded: correctly rounded (barring ties), where CUDA's powf/cosf/sinf may
// differ by an ulp or two. The fp32 angle fl(position * inv_freq) matters: at position 8191 its
// rounding moves the angle by up to ~5e-4 rad, so this follows Megatron rather than exact math.
//
// The rotation: out = t * cos(emb) + rotate_half(t) * sin(emb), emb = cat(freqs, freqs),
// rotate_half(t) = cat(-t2, t1), on the first rot_dim values of each head; the rest pass through.
// Computed in fp32 as the unfused torch path computes it: each product rounded, then the sum.
// (Megatron casts cos/sin to the activation dtype first: bf16 in bf16 training on the unfused
// path; TE's fused kernel, which the Llama bridge enables, keeps them in fp32. The CPU reference
// runs in fp32, where the cast is a no-op.)
#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

#include "core/error.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/qkv_layout.hpp"

namespace laoyao::kernels::cpu {
namespace {

// One fp32 op, correctly rounded (double holds the exact product of two floats, and double
// rounding is innocuous for + - * / since 53 >= 2*24 + 2).
inline float f32(double x) { return static_cast<float>(x); }
inline float mul(float a, float b) { return f32(static_cast<double>(a) * b); }
inline float sub(float a, float b) { return f32(static_cast<double>(a) - b); }
inline float add(float a, float b) { return f32(static_cast<double>(a) + b); }
inline float recip(float a) { return f32(1.0 / static_cast<double>(a)); }


void check_rope_args(const char* what, const int64_t* positions, const RopeTable& table, int64_t T, int64_t D) {
  if (table.rot_dim > D)
    throw Error(std::string(what) + ": the rotary table rotates " + std::to_string(table.rot_dim) +
                " dims per head but the head dim is " + std::to_string(D));
  for (int64_t t = 0; t < T; ++t)
    if (positions[t] < 0 || positions[t] >= table.max_positions)
      throw Error(std::string(what) + ": position " + std::to_string(positions[t]) + " at token " +
                  std::to_string(t) + " is outside the rotary table's positions [0, " +
                  std::to_string(table.max_positions) + ")");
}

// Rotates every q/k slot of the T rows by its token's angles; sign = +1 forward (R), -1 backward
// (R^T: the same formula with -sin).
void rotate(float* qkv, const int64_t* positions, const RopeTable& table, const QkvLayout& L, int64_t T, float sign) {
  const int64_t half = table.rot_dim / 2;
  if (half == 0) return;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* c = table.cos.data() + positions[t] * half;
    const float* s = table.sin.data() + positions[t] * half;
    float* row = qkv + t * L.row;
    for (int64_t g = 0; g < L.G; ++g)
      for (int64_t j = 0; j <= L.Q; ++j) {
        float* x = row + L.col(g, j);
        for (int64_t i = 0; i < half; ++i) {
          const float x1 = x[i], x2 = x[i + half];
          const float si = sign * s[i];
          // t * cos + rotate_half(t) * sin, each product rounded to fp32, then the sum.
          x[i] = add(mul(x1, c[i]), mul(-x2, si));
          x[i + half] = add(mul(x2, c[i]), mul(x1, si));
        }
      }
  }
}

}  // namespace

RopeTable rope_table(int64_t kv_channels, int64_t max_positions, const RopeParams& p) {
  auto fail = [](const std::string& msg) { throw Error("rotary embedding: " + msg); };
  if (kv_channels < 1) fail("kv_channels must be positive, got " + std::to_string(kv_channels));
  if (max_positions < 1) fail("max positions must be positive, got " + std::to_string(max_positions));
  if (!(p.rotary_percent > 0.0)) fail("rotary_percent must be positive, got " + std::to_string(p.rotary_percent));
  if (!(p.rotary_base > 0.0)) fail("rotary_base must be positive, got " + std::to_string(p.rotary_base));
  if (p.rope_scaling &&
      (!(p.rope_scaling_factor > 0.0) || !(p.low_freq_factor > 0.0) || !(p.high_freq_factor > 0.0) ||
       !(p.original_max_position_embeddings > 0.0) || p.high_freq_factor == p.low_freq_factor))
    fail("rope scaling needs positive factor, low/high frequency factors and original max positions, with "
         "high_freq_factor != low_freq_factor");
  if (p.seq_len_interpolation_factor && !(*p.seq_len_interpolation_factor > 0.0))
    fail("seq_len_interpolation_factor must be positive, got " + std::to_string(*p.seq_len_interpolation_factor));

  if (p.yarn && (!(p.yarn->scaling_factor > 0.0) || p.yarn->original_max_position_embeddings < 1 ||
                 !(p.yarn->beta_fast > 0.0) || !(p.yarn->beta_slow > 0.0) || kv_channels % 2 != 0))
    fail("YaRN needs a positive scaling factor, original max positions and betas, and an even kv_channels");
  if (p.yarn && p.rope_scaling) fail("YaRN and Llama 3 rope scaling exclude each other");

  RopeTable tb;
  tb.kv_channels = kv_channels;
  tb.max_positions = max_positions;
  // dim = kv_channels; if rotary_percent < 1.0: dim = int(dim * rotary_percent) (Python float product,
  // truncated). YaRN's frequencies span the whole head.
  tb.dim = kv_channels;
  if (p.rotary_percent < 1.0 && !p.yarn)
    tb.dim = static_cast<int64_t>(static_cast<double>(kv_channels) * p.rotary_percent);
  if (tb.dim < 1)
    fail("rotary_percent " + std::to_string(p.rotary_percent) + " of kv_channels " + std::to_string(kv_channels) +
         " leaves no rotary dims");
  const int64_t n = (tb.dim + 1) / 2;  // len(arange(0, dim, 2))
  tb.rot_dim = 2 * n;
  if (tb.rot_dim > kv_channels)
    fail("an odd rotary dim " + std::to_string(tb.dim) + " equal to kv_channels rotates " +
         std::to_string(tb.rot_dim) + " > " + std::to_string(kv_channels) + " values");

  // inv_freq = 1.0 / (base ** (arange(0, dim, 2) / dim)), fp32 ops (see the top of this file).
  const float inv_dim = recip(f32(static_cast<double>(tb.dim)));
  const float base = f32(p.rotary_base);
  tb.inv_freq.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    const float e = mul(f32(static_cast<double>(2 * i)), inv_dim);
    const float pw = f32(std::pow(static_cast<double>(base), static_cast<double>(e)));
    tb.inv_freq[i] = recip(pw);
  }

  if (p.rope_scaling) {
    const double old_len = p.original_max_position_embeddings;
    const float low_wavelen = f32(old_len / p.low_freq_factor);    // compared in fp32
    const float high_wavelen = f32(old_len / p.high_freq_factor);
    const float two_pi = f32(2.0 * std::numbers::pi);
    const float inv_factor = recip(f32(p.rope_scaling_factor));    // f / factor on CUDA: f * fl32(1/factor)
    const float old_f = f32(old_len), low_f = f32(p.low_freq_factor);
    const float inv_span = recip(f32(p.high_freq_factor - p.low_freq_factor));
    for (int64_t i = 0; i < n; ++i) {
      const float f = tb.inv_freq[i];
      const float wavelen = mul(recip(f), two_pi);
      const float f_llama = wavelen > low_wavelen ? mul(f, inv_factor) : f;
      const float smooth = mul(sub(mul(recip(wavelen), old_f), low_f), inv_span);
      const float smoothed = add(mul(mul(sub(1.0f, smooth), f_llama), inv_factor), mul(smooth, f_llama));
      const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
      tb.inv_freq[i] = medium ? smoothed : f_llama;
    }
  }

  float scale = 1.0f;  // of cos and sin: YaRN's concentration factor
  if (p.yarn) {
    const YarnParams& y = *p.yarn;
    const double dim = static_cast<double>(tb.dim), base_d = p.rotary_base;
    const double two_pi = 2.0 * std::numbers::pi;
    auto correction_dim = [&](double rotations) {  // _yarn_find_correction_dim
      return dim * std::log(static_cast<double>(y.original_max_position_embeddings) / (rotations * two_pi)) /
             (2.0 * std::log(base_d));
    };
    double low = correction_dim(y.beta_fast), high = correction_dim(y.beta_slow);
    if (y.correction_range_round_to_int) low = std::floor(low), high = std::ceil(high);
    low = std::max(low, 0.0), high = std::min(high, dim - 1.0);
    if (low == high) high += 0.001;  // _yarn_linear_ramp_mask's guard against a zero span
    const float low_f = f32(low), inv_span = f32(1.0 / (high - low)), factor = f32(y.scaling_factor);
    for (int64_t i = 0; i < n; ++i) {
      const float extra = tb.inv_freq[i];
      const float pw = f32(std::pow(static_cast<double>(base), static_cast<double>(mul(f32(2.0 * i), inv_dim))));
      const float inter = recip(mul(factor, pw));  // 1 / (factor * base ** t)
      const float ramp = std::clamp(mul(sub(f32(static_cast<double>(i)), low_f), inv_span), 0.0f, 1.0f);
      const float mask = sub(1.0f, ramp);
      tb.inv_freq[i] = add(mul(inter, sub(1.0f, mask)), mul(extra, mask));
    }
    scale = f32(yarn_concentration_factor(y));
  }

  // seq = arange(max_positions) (* fl32(1 / interpolation factor)); freqs = outer(seq, inv_freq).
  const bool interpolate = p.seq_len_interpolation_factor && !p.yarn;
  const float interp = interpolate ? f32(1.0 / *p.seq_len_interpolation_factor) : 1.0f;
  tb.cos.resize(max_positions * n);
  tb.sin.resize(max_positions * n);
#pragma omp parallel for schedule(static)
  for (int64_t pos = 0; pos < max_positions; ++pos) {
    float seq = f32(static_cast<double>(pos));
    if (interpolate) seq = mul(seq, interp);
    for (int64_t i = 0; i < n; ++i) {
      const double angle = mul(seq, tb.inv_freq[i]);  // the fp32 angle, exactly as torch.outer rounds it
      tb.cos[pos * n + i] = f32(std::cos(angle));
      tb.sin[pos * n + i] = f32(std::sin(angle));
      if (p.yarn) {
        tb.cos[pos * n + i] = mul(tb.cos[pos * n + i], scale);
        tb.sin[pos * n + i] = mul(tb.sin[pos * n + i], scale);
      }
    }
  }
  return tb;
}

void rope_forward_qkv(float* qkv, const int64_t* positions, const RopeTable& table, int64_t T, int64_t H, int64_t G,
                      int64_t D) {
  const QkvLayout L("rope_forward_qkv", H, G, D);
  check_rope_args("rope_forward_qkv", positions, table, T, D);
  rotate(qkv, positions, table, L, T, 1.0f);
}

void rope_backward_qkv(float* dqkv, const int64_t* positions, const RopeTable& table, int64_t T, int64_t H, int64_t G,
                       int64_t D) {
  const QkvLayout L("rope_backward_qkv", H, G, D);
  check_rope_args("rope_backward_qkv", positions, table, T, D);
  rotate(dqkv, positions, table, L, T, -1.0f);
}

}  // namespace laoyao::kernels::cpu
