// BF16 GEMMs through cuBLASLt: bf16 A, B and D, fp32 accumulation and scaling, optional bias
// epilogue. Each distinct problem (shape, transposes, leading dimensions, epilogue, pointer
// alignment) gets its matmul descriptor, matrix layouts and heuristic algorithm built once, on its
// first call; every later call with that problem reuses them (the training step never builds one).
#pragma once
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <tuple>

#include "kernels/cuda/device_buffer.hpp"

namespace laoyao::kernels::cuda {

using bf16 = __nv_bfloat16;

// A column-major problem as cuBLASLt states it: D[m, n] = alpha * op(A) op(B) + beta * D
// (+ bias[m] added to every column when `bias`). op(A) is [m, k]: A is stored [k, m] when trans_a,
// else [m, k]; op(B) is [k, n]: B is stored [n, k] when trans_b, else [k, n].
struct GemmProblem {
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  int64_t lda = 0, ldb = 0, ldd = 0;
  bool bias = false;
};

struct CublasLtGemm {
  // Creates the cuBLASLt handle and a workspace on the current device; use it on that device only.
  explicit CublasLtGemm(size_t workspace_bytes = size_t{32} << 20);
  ~CublasLtGemm();
  CublasLtGemm(const CublasLtGemm&) = delete;
  CublasLtGemm& operator=(const CublasLtGemm&) = delete;

  // Enqueues D = alpha * op(A) op(B) + beta * D (+ bias) on `stream`. bias must be non-null exactly
  // when problem.bias. Throws laoyao::Error when no cuBLASLt algorithm supports the problem.
  void gemm(const GemmProblem& problem, const bf16* A, const bf16* B, bf16* D, const bf16* bias, float alpha,
            float beta, cudaStream_t stream);

  // laoyao's linear layer (kernels/cpu/ops.hpp conventions, row-major): y[T, N] = x[T, K] @ w[N, K]^T
  // (+ bias[N] when bias is non-null). Row-major y is column-major y^T[N, T] = w x^T, so this is
  // gemm(m = N, n = T, k = K, trans_a) with the bias running along D's rows, as cuBLASLt wants.
  void linear_forward(const bf16* x, const bf16* w, const bf16* bias, bf16* y, int64_t T, int64_t K, int64_t N,
                      cudaStream_t stream);

  // How many distinct problems have had a plan built (for checks that the cache is hit).
  size_t plans_built() const { return plans_.size(); }

 private:
  struct Key {
    GemmProblem p;
    uint32_t alignment;  // the smallest alignment (bytes, <= 256) of the operands' pointers
    bool operator<(const Key& o) const {
      return std::tie(p.m, p.n, p.k, p.trans_a, p.trans_b, p.lda, p.ldb, p.ldd, p.bias, alignment) <
             std::tie(o.p.m, o.p.n, o.p.k, o.p.trans_a, o.p.trans_b, o.p.lda, o.p.ldb, o.p.ldd, o.p.bias,
                      o.alignment);
    }
  };
  struct Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };

  Plan& plan_for(const Key& key, const bf16* bias);

  cublasLtHandle_t handle_ = nullptr;
  DeviceBuffer workspace_;
  std::map<Key, Plan> plans_;
};

}  // namespace laoyao::kernels::cuda
