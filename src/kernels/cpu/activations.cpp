// GeLU (Megatron's fused bias_gelu tanh form, or exact erf GeLU = F.gelu) and SwiGLU, in fp32 as
// Megatron's fused (torch.compile / jit) versions compute internally.
#include <cmath>

#include "kernels/cpu/ops.hpp"

namespace laoyao::kernels::cpu {
namespace {

// Megatron's fused_bias_gelu constants, kept exactly (0.79788456 is sqrt(2/pi) rounded; the
// backward's 0.1070322243 is 3 * 0.044715 * 0.79788456).
constexpr float kTanhA = 0.79788456f;
constexpr float kTanhB = 0.044715f;
constexpr float kTanhDB = 0.1070322243f;
constexpr float kInvSqrt2 = 0.70710678118654752440f;
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;  // 1/sqrt(2*pi)

inline float sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }

}  // namespace

void gelu_forward(const float* x, float* y, int64_t n, Gelu kind) {
  if (kind == Gelu::Tanh) {
    // bias_gelu: x * 0.5 * (1 + tanh(0.79788456 * x * (1 + 0.044715 * x * x)))
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float v = x[i];
      y[i] = v * 0.5f * (1.0f + std::tanh(kTanhA * v * (1.0f + kTanhB * v * v)));
    }
  } else {
    // F.gelu (approximate='none'): x * 0.5 * (1 + erf(x / sqrt(2)))
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float v = x[i];
      y[i] = v * 0.5f * (1.0f + std::erf(v * kInvSqrt2));
    }
  }
}

void gelu_backward(const float* x, const float* dy, float* dx, int64_t n, Gelu kind) {
  if (kind == Gelu::Tanh) {
    // bias_gelu_back: ff = 0.5*x*((1 - t^2)*(0.79788456 + 0.1070322243*x^2)) + 0.5*(1 + t); dx = ff*dy
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float v = x[i];
      const float t = std::tanh(kTanhA * v * (1.0f + kTanhB * v * v));
      const float ff = 0.5f * v * ((1.0f - t * t) * (kTanhA + kTanhDB * v * v)) + 0.5f * (1.0f + t);
      dx[i] = ff * dy[i];
    }
  } else {
    // d/dx [x * Phi(x)] = Phi(x) + x * phi(x), as torch's GeLU backward (approximate='none').
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float v = x[i];
      const float cdf = 0.5f * (1.0f + std::erf(v * kInvSqrt2));
      const float pdf = kInvSqrt2Pi * std::exp(-0.5f * v * v);
      dx[i] = dy[i] * (cdf + v * pdf);
    }
  }
}

// Megatron's swiglu: chunk(x, 2, -1) -> (gate, linear); y = silu(gate) * linear.
void swiglu_forward(const float* x, float* y, int64_t T, int64_t F) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* gate = x + t * 2 * F;
    const float* lin = gate + F;
    for (int64_t f = 0; f < F; ++f) y[t * F + f] = gate[f] * sigmoid(gate[f]) * lin[f];
  }
}

// Megatron's swiglu_back: dgate = dy * sig * (1 + gate * (1 - sig)) * linear; dlinear = dy * silu(gate).
void swiglu_backward(const float* x, const float* dy, float* dx, int64_t T, int64_t F) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* gate = x + t * 2 * F;
    const float* lin = gate + F;
    float* dgate = dx + t * 2 * F;
    float* dlin = dgate + F;
    for (int64_t f = 0; f < F; ++f) {
      const float g = dy[t * F + f];
      const float s = sigmoid(gate[f]);
      dgate[f] = g * s * (1.0f + gate[f] * (1.0f - s)) * lin[f];
      dlin[f] = g * gate[f] * s;
    }
  }
}

}  // namespace laoyao::kernels::cpu
