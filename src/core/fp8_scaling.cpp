#include "core/fp8_scaling.hpp"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <string>

#include "core/error.hpp"

namespace laoyao {

Fp8Format fp8_format_of(Fp8Formats formats, bool gradient) {
  return formats == Fp8Formats::Hybrid && gradient ? Fp8Format::E5M2 : Fp8Format::E4M3;
}

DelayedScaling::DelayedScaling(std::vector<Fp8Format> formats, int64_t history_len, AmaxComputeAlgo algo, int margin)
    : formats_(std::move(formats)), len_(history_len), algo_(algo), margin_(margin) {
  if (history_len < 1) throw Error("FP8 delayed scaling: an amax history of " + std::to_string(history_len) +
                                   " (--fp8-amax-history-len takes 1 or more)");
  scale_.assign(formats_.size(), 1.0f);
  history_.assign(formats_.size() * static_cast<size_t>(len_), 0.0f);
}

void DelayedScaling::record_amax(int64_t i, float amax) {
  float& slot = history_[static_cast<size_t>(i)];
  slot = std::fmax(slot, amax);
}

void DelayedScaling::update() {
  const int64_t n = size();
  for (int64_t i = 0; i < n; ++i) {
    auto at = [&](int64_t r) -> float& { return history_[static_cast<size_t>(r * n + i)]; };
    const float last = at(0);
    float amax = last;  // (a tensor not cast this pass: 0 under either algorithm)
    if (algo_ == AmaxComputeAlgo::Max && last != 0.0f)
      for (int64_t r = 1; r < len_; ++r) amax = std::fmax(amax, at(r));
    if (last != 0.0f) {
      for (int64_t r = 0; r + 1 < len_; ++r) at(r) = at(r + 1);
      at(len_ - 1) = last;
      at(0) = 0.0f;  // (with a history of one the slot just written is also row 0: it starts over)
    }
    const float scaled_max = static_cast<float>(fp8_max(formats_[static_cast<size_t>(i)])) *
                             std::ldexp(1.0f, -margin_);
    if (std::isfinite(amax) && amax > 0.0f) {
      float s = scaled_max / amax;
      if (std::isinf(s)) s = FLT_MAX;
      scale_[static_cast<size_t>(i)] = s;
    }
  }
}

float current_scaling_scale(float amax, Fp8Format f, float eps, bool pow2) {
  if (amax < eps) amax = eps;
  if (!std::isfinite(amax) || amax == 0.0f) return 1.0f;
  float s = static_cast<float>(fp8_max(f)) / amax;
  if (std::isinf(s)) s = FLT_MAX;
  if (pow2) {  // clear the mantissa: the power of two at or below
    uint32_t bits;
    std::memcpy(&bits, &s, sizeof bits);
    bits &= 0xFF800000u;
    std::memcpy(&s, &bits, sizeof s);
  }
  return s;
}

float fp8_amax(const float* x, int64_t n) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) m = std::fmax(m, std::fabs(x[i]));
  return m;
}

void fp8_quantize(const float* x, int64_t n, float scale, Fp8Format f, uint8_t* q) {
  for (int64_t i = 0; i < n; ++i) q[i] = fp8_from_float(x[i] * scale, f);
}

void fp8_quantize_values(const float* x, int64_t n, float scale, Fp8Format f, float* q) {
  for (int64_t i = 0; i < n; ++i) q[i] = fp8_to_float(fp8_from_float(x[i] * scale, f), f);
}

namespace {

// Each block of x[rows][cols] (br x bc) as `visit(r0, r1, c0, c1, scale, block)` after its amax.
template <class Visit>
void for_each_block(const float* x, int64_t rows, int64_t cols, int64_t br, int64_t bc, Fp8Format f, bool pow2,
                    Visit visit) {
  if (rows < 0 || cols < 0 || br < 1 || bc < 1)
    throw Error("FP8 block cast: a [" + std::to_string(rows) + ", " + std::to_string(cols) + "] tensor in " +
                std::to_string(br) + " x " + std::to_string(bc) + " blocks");
  const int64_t col_blocks = (cols + bc - 1) / bc;
  for (int64_t r0 = 0; r0 < rows; r0 += br)
    for (int64_t c0 = 0; c0 < cols; c0 += bc) {
      const int64_t r1 = std::min(rows, r0 + br), c1 = std::min(cols, c0 + bc);
      float amax = 0.0f;
      for (int64_t r = r0; r < r1; ++r) amax = std::fmax(amax, fp8_amax(x + r * cols + c0, c1 - c0));
      visit(r0, r1, c0, c1, current_scaling_scale(amax, f, 0.0f, pow2), r0 / br * col_blocks + c0 / bc);
    }
}

}  // namespace

void fp8_block_quantize(const float* x, int64_t rows, int64_t cols, int64_t br, int64_t bc, Fp8Format f, bool pow2,
                        uint8_t* q, float* scale_inv) {
  for_each_block(x, rows, cols, br, bc, f, pow2, [&](int64_t r0, int64_t r1, int64_t c0, int64_t c1, float s, int64_t b) {
    for (int64_t r = r0; r < r1; ++r) fp8_quantize(x + r * cols + c0, c1 - c0, s, f, q + r * cols + c0);
    if (scale_inv) scale_inv[b] = 1.0f / s;
  });
}

void fp8_block_quantize_dequantized(const float* x, int64_t rows, int64_t cols, int64_t br, int64_t bc, Fp8Format f,
                                    bool pow2, float* out) {
  for_each_block(x, rows, cols, br, bc, f, pow2, [&](int64_t r0, int64_t r1, int64_t c0, int64_t c1, float s, int64_t) {
    const float inv = 1.0f / s;
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = c0; c < c1; ++c) out[r * cols + c] = fp8_to_float(fp8_from_float(x[r * cols + c] * s, f), f) * inv;
  });
}

void fp8_dequantize(const uint8_t* q, int64_t n, float scale_inv, Fp8Format f, float* x) {
  for (int64_t i = 0; i < n; ++i) x[i] = fp8_to_float(q[i], f) * scale_inv;
}

void fp8_gemm_tn(const uint8_t* a, Fp8Format fa, float scale_inv_a, const uint8_t* b, Fp8Format fb,
                 float scale_inv_b, float* d, int64_t m, int64_t n, int64_t k, float beta) {
  if (fa == Fp8Format::E5M2 && fb == Fp8Format::E5M2)
    throw Error("FP8 GEMM: two E5M2 operands (cuBLASLt multiplies E4M3 by E4M3 or by E5M2 only)");
  // The FP8 values as floats once (exact), then fp32 dot products.
  std::vector<float> av(static_cast<size_t>(m * k)), bv(static_cast<size_t>(n * k));
  for (int64_t i = 0; i < m * k; ++i) av[static_cast<size_t>(i)] = fp8_to_float(a[i], fa);
  for (int64_t i = 0; i < n * k; ++i) bv[static_cast<size_t>(i)] = fp8_to_float(b[i], fb);
  const float alpha = scale_inv_a * scale_inv_b;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      float acc = 0.0f;
      const float* ar = av.data() + i * k;
      const float* br = bv.data() + j * k;
      for (int64_t p = 0; p < k; ++p) acc += ar[p] * br[p];
      float& out = d[i * n + j];
      out = alpha * acc + (beta != 0.0f ? beta * out : 0.0f);
    }
}

}  // namespace laoyao
