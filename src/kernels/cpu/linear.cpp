// Linear layer y = x @ w^T (+ bias) with torch's [out, in] weight layout, through OpenBLAS sgemm.
// These GEMMs are called outside any OpenMP region, so OpenBLAS uses its own thread pool.
#include <cblas.h>

#include <cstring>

#include "kernels/cpu/ops.hpp"

namespace laoyao::kernels::cpu {

void linear_forward(const float* x, const float* w, const float* bias, float* y, int64_t T, int64_t K, int64_t N) {
  if (T == 0 || N == 0) return;
  if (K == 0) {  // an empty reduction: y = bias (or 0)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t n = 0; n < N; ++n) y[t * N + n] = bias ? bias[n] : 0.0f;
    return;
  }
  // Like torch's addmm (F.linear with a bias): y = 1*bias + x @ w^T, the bias pre-loaded into C.
  float beta = 0.0f;
  if (bias) {
    for (int64_t t = 0; t < T; ++t) std::memcpy(y + t * N, bias, sizeof(float) * N);
    beta = 1.0f;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, N, K, 1.0f, x, K, w, K, beta, y, N);
}

void linear_backward(const float* x, const float* w, const float* dy, float* dx, float* dw, float* dbias,
                     int64_t T, int64_t K, int64_t N) {
  if (dx && T > 0 && K > 0) {
    if (N == 0) {
      std::memset(dx, 0, sizeof(float) * T * K);
    } else {
      // dx[T,K] = dy[T,N] @ w[N,K]; beta = 0 overwrites (OpenBLAS zeroes C, so stale NaNs do not leak).
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, K, N, 1.0f, dy, N, w, K, 0.0f, dx, K);
    }
  }
  // dw[N,K] += dy^T @ x (beta = 1 accumulates, as Megatron's main_grad accumulation does).
  if (dw && T > 0 && K > 0 && N > 0)
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, N, K, T, 1.0f, dy, N, x, K, 1.0f, dw, K);
  if (dbias) bias_grad_accumulate(dy, dbias, T, N);
}

void linear_accumulate(const float* x, const float* w, float* y, int64_t T, int64_t K, int64_t N, float alpha) {
  if (T > 0 && K > 0 && N > 0)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, N, K, alpha, x, K, w, K, 1.0f, y, N);
}

void linear_backward_scaled(const float* x, const float* w, const float* dy, float* dx, float* dw, int64_t T,
                            int64_t K, int64_t N, float alpha, bool accumulate_dx) {
  if (dw && T > 0 && K > 0 && N > 0)  // first: dx may be x
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, N, K, T, alpha, dy, N, x, K, 1.0f, dw, K);
  if (!dx || T <= 0 || K <= 0) return;
  if (N == 0) {
    if (!accumulate_dx) std::memset(dx, 0, sizeof(float) * T * K);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, K, N, alpha, dy, N, w, K, accumulate_dx ? 1.0f : 0.0f,
              dx, K);
}

void fp8_linear_forward(Fp8Operand x, Fp8Operand w, const float* bias, float* y, int64_t T, int64_t K, int64_t N) {
  linear_forward(x.q, w.q, nullptr, y, T, K, N);
  const float s = x.scale_inv * w.scale_inv;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) y[t * N + n] = s * y[t * N + n] + (bias ? bias[n] : 0.0f);
}

void fp8_linear_backward(Fp8Operand x, Fp8Operand w, Fp8GradOperands dy, float* dx, float* dw, int64_t T, int64_t K,
                         int64_t N) {
  linear_backward_scaled(x.q, w.q, dy.wgrad.q, nullptr, dw, T, K, N, dy.wgrad.scale_inv * x.scale_inv, false);
  linear_backward_scaled(x.q, w.q, dy.dgrad.q, dx, nullptr, T, K, N, dy.dgrad.scale_inv * w.scale_inv, false);
}

}  // namespace laoyao::kernels::cpu
