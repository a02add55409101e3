// CPU reference ops (fp32, multi-threaded, OpenBLAS for GEMMs): the numerics every other backend
// is checked against. Each op has a naive fp64 twin in tests/kernels_cpu and its backward is
// checked by finite differences.
//
// Conventions: activations are row-major [T, C] with T = b*s tokens, token t = batch*s + position
// (batch-major; Megatron's [s, b, h] order changes nothing numerically). Weights are stored as
// Megatron/torch store them: a linear's weight is [out, in]. Backward functions ACCUMULATE (+=)
// into parameter gradients, and OVERWRITE input gradients unless stated otherwise.
#pragma once
#include <cstdint>

namespace laoyao::kernels::cpu {

// ---- linear: y[T,N] = x[T,K] @ w[N,K]^T (+ bias[N])
void linear_forward(const float* x, const float* w, const float* bias, float* y, int64_t T, int64_t K, int64_t N);
// dx[T,K] = dy @ w (overwrite; nullptr to skip); dw[N,K] += dy^T @ x; dbias[N] += sum_t dy (nullptr to skip).
void linear_backward(const float* x, const float* w, const float* dy, float* dx, float* dw, float* dbias,
                     int64_t T, int64_t K, int64_t N);

// ---- norms over the last dimension C, statistics in fp32. mean/rstd [T] are saved for backward.
// zero_centered_gamma (Megatron --apply-layernorm-1p): the stored gamma is used as (1 + gamma).
void layernorm_forward(const float* x, const float* gamma, const float* beta, float* y, float* mean, float* rstd,
                       int64_t T, int64_t C, float eps, bool zero_centered_gamma);
// dx overwritten; dgamma, dbeta accumulated.
void layernorm_backward(const float* dy, const float* x, const float* gamma, const float* mean, const float* rstd,
                        float* dx, float* dgamma, float* dbeta, int64_t T, int64_t C, bool zero_centered_gamma);
// RMSNorm: y = x / sqrt(mean(x^2) + eps) * gamma; rstd [T] saved.
void rmsnorm_forward(const float* x, const float* gamma, float* y, float* rstd, int64_t T, int64_t C, float eps,
                     bool zero_centered_gamma);
void rmsnorm_backward(const float* dy, const float* x, const float* gamma, const float* rstd, float* dx,
                      float* dgamma, int64_t T, int64_t C, bool zero_centered_gamma);

// ---- activations (elementwise over n values)
enum class Gelu { Tanh, Erf };  // Tanh: Megatron's fused bias_gelu (0.79788456, 0.044715); Erf: F.gelu
void gelu_forward(const float* x, float* y, int64_t n, Gelu kind);
void gelu_backward(const float* x, const float* dy, float* dx, int64_t n, Gelu kind);  // dx overwritten
// SwiGLU on Megatron's linear_fc1 output: x[T, 2F] = [gate | linear]; y[T, F] = silu(gate) * linear.
void swiglu_forward(const float* x, float* y, int64_t T, int64_t F);
void swiglu_backward(const float* x, const float* dy, float* dx, int64_t T, int64_t F);  // dx[T, 2F] overwritten

// ---- causal self-attention on Megatron-Core's fused QKV layout.
// qkv[T, G*(H/G + 2)*D]: per token, G query groups each laid out [q (H/G heads x D), k (D), v (D)]
// (MHA, G = H: q0 k0 v0 q1 k1 v1 ...). ctx[T, H*D]: heads concatenated in head order.
// probs[b, H, s, s]: the softmax probabilities, saved for backward (this reference keeps the
// S x S matrix; the CUDA backend does not). Scores are scaled by `scale` (1/sqrt(D)); a key after
// the query is masked (Megatron fills -10000.0; in fp32 that is exactly a zero probability).
// Query head h reads the k/v of group h / (H/G) (GQA without materialising repeated k/v).
// H must be a positive multiple of G (checked: laoyao::Error).
// dropout_mask (nullable) [b, H, s, s] holds 0 or 1/(1-p): attention dropout on the probabilities
// (ctx = (probs * mask) V); probs keeps the undropped softmax, which backward needs.
void attention_forward(const float* qkv, float* ctx, float* probs, int64_t b, int64_t s, int64_t H, int64_t G,
                       int64_t D, float scale, const float* dropout_mask = nullptr);
// dqkv[T, G*(H/G+2)*D] overwritten.
void attention_backward(const float* qkv, const float* probs, const float* dctx, float* dqkv, int64_t b, int64_t s,
                        int64_t H, int64_t G, int64_t D, float scale, const float* dropout_mask = nullptr);

// ---- cross entropy over all V (padded) logits, as Megatron's vocab-parallel CE at TP=1:
// loss[t] = logsumexp(logits[t]) - logits[t][target[t]]. lse[T] saved for backward.
// targets must be in [0, V) (checked in forward and backward: laoyao::Error).
void cross_entropy_forward(const float* logits, const int64_t* targets, float* loss, float* lse, int64_t T, int64_t V);
// Overwrites logits with d(sum_t dloss[t]*loss[t]) / dlogits = (softmax - onehot) * dloss[t].
void cross_entropy_backward(float* logits, const int64_t* targets, const float* lse, const float* dloss, int64_t T,
                            int64_t V);

// ---- embedding: y[T, C] (+)= table[ids[t]]; ids must be in [0, rows) (checked: laoyao::Error).
void embedding_forward(const int64_t* ids, const float* table, float* y, int64_t T, int64_t C, int64_t rows,
                       bool accumulate);
// dtable[ids[t]] += dy[t]; ids are not re-checked here (the forward checked them).
void embedding_backward(const int64_t* ids, const float* dy, float* dtable, int64_t T, int64_t C);

// ---- elementwise helpers
void add_inplace(float* y, const float* x, int64_t n);                     // y += x
void add_bias_inplace(float* y, const float* bias, int64_t T, int64_t C);  // y[t,:] += bias
void bias_grad_accumulate(const float* dy, float* dbias, int64_t T, int64_t C);  // dbias += sum_t dy[t,:]

}  // namespace laoyao::kernels::cpu
