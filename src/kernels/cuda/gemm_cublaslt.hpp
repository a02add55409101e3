// BF16 GEMMs through cuBLASLt: bf16 A, B and D, fp32 accumulation and scaling, optional bias
// epilogue. Each distinct problem (shape, transposes, leading dimensions, epilogue, pointer
// alignment) gets its matmul descriptor, matrix layouts and algorithm built once, on its first
// call; every later call with that problem reuses them (the training step never builds one).
//
// The algorithm: cuBLASLt's heuristic offers up to kCandidates; on the first call each is timed on
// the call's own operands (a scratch output where the call accumulates into D; three interleaved
// rounds, each candidate's fastest kept) and another candidate replaces the heuristic's first
// choice only when it is at least 3% faster: the first choice is not always the fastest on the GPU
// at hand, but a measured tie is noise.
// LAOYAO_GEMM_AUTOTUNE=0 keeps the heuristic's first choice. A first call made while the stream is
// being captured into a CUDA graph cannot time anything and keeps the first choice too.
#pragma once
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cuda/device_buffer.hpp"

namespace laoyao::kernels::cuda {

using bf16 = __nv_bfloat16;

// A column-major problem as cuBLASLt states it: D[m, n] = alpha * op(A) op(B) + beta * D
// (+ bias[m] added to every column when `bias`). op(A) is [m, k]: A is stored [k, m] when trans_a,
// else [m, k]; op(B) is [k, n]: B is stored [n, k] when trans_b, else [k, n].
// A and B are bf16; D is bf16, or fp32 when d_fp32 (Megatron's fp32 main_grad accumulation:
// beta = 1 adds the product into D). batch > 1 runs `batch` problems, the i-th at A + i*stride_a,
// B + i*stride_b, D + i*stride_d (elements).
// gelu: GeluAux makes D = gelu(product [+ bias]) and stores the GeLU's input, bf16 [m, n] with
// leading dimension ld_aux, in the aux buffer (cuBLASLt's GELU_AUX[_BIAS] epilogue); DGelu makes
// D = product * gelu'(aux) (DGELU), reading that buffer: the MLP's activation and its backward
// without a kernel of their own.
enum class GemmGelu : uint8_t { None, GeluAux, DGelu };
// An operand's element type: bf16, or FP8 (gemm_fp8).
enum class GemmOperand : uint8_t { Bf16, E4M3, E5M2 };
// How an FP8 operand's scale_inv pointer is read: one float for the tensor; or block scaling's
// (kernels/cuda/fp8_block_cast.hpp has the layouts): one float per 128 values along k for each of
// the operand's rows (cuBLASLt's VEC128_32F), or one per 128 x 128 tile (BLK128x128_32F).
enum class GemmScale : uint8_t { Tensor, Vec128, Blk128 };
struct GemmProblem {
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  int64_t lda = 0, ldb = 0, ldd = 0;
  bool bias = false;
  bool d_fp32 = false;
  GemmGelu gelu = GemmGelu::None;
  int64_t ld_aux = 0;
  int64_t batch = 1, stride_a = 0, stride_b = 0, stride_d = 0;
  // FP8 operands (gemm_fp8): A's and B's types, and cuBLASLt's FAST_ACCUM (Transformer Engine's
  // forward GEMM; its gradient GEMMs promote the partial sums, fast_accum false).
  GemmOperand a_type = GemmOperand::Bf16, b_type = GemmOperand::Bf16;
  bool fast_accum = false;
  GemmScale a_scale = GemmScale::Tensor, b_scale = GemmScale::Tensor;
};

struct CublasLtGemm {
  // Creates the cuBLASLt handle and a workspace on the current device; use it on that device only.
  explicit CublasLtGemm(size_t workspace_bytes = size_t{32} << 20);
  ~CublasLtGemm();
  CublasLtGemm(const CublasLtGemm&) = delete;
  CublasLtGemm& operator=(const CublasLtGemm&) = delete;

  // Enqueues D = alpha * op(A) op(B) + beta * D (+ bias) on `stream`. bias must be non-null exactly
  // when problem.bias. Throws laoyao::Error when no cuBLASLt algorithm supports the problem.
  // D points to bf16, or to fp32 when problem.d_fp32. C (same layout and type as D) is what beta
  // scales: D itself when C is null.
  void gemm(const GemmProblem& problem, const bf16* A, const bf16* B, void* D, const bf16* bias, float alpha,
            float beta, cudaStream_t stream, const void* C = nullptr, bf16* aux = nullptr);

  // The same with FP8 A and B (problem.a_type, b_type: E4M3 x E4M3 or one E5M2, as cuBLASLt
  // multiplies them), dequantized by the device floats a_scale_inv and b_scale_inv:
  // D = alpha * a_scale_inv * b_scale_inv * op(A) op(B) + beta * C (+ bias). Hopper takes TN only
  // (trans_a, not trans_b), k and the leading dimensions multiples of 16, one problem (no batch),
  // no GeLU epilogue, and a bf16 D written (beta 0) or the sum with a bf16 C (beta 1: the residual
  // stream), an fp32 D written or accumulated; anything else throws laoyao::Error. cuBLASLt also
  // wants the scale_inv pointers aligned: an H100 refused 4-byte-aligned ones (cublasStatus 15);
  // 256-byte-aligned ones run.
  // Block scaling (problem.a_scale, b_scale not Tensor): the scale_inv tensors of fp8_block_cast,
  // not both Blk128, no fast accumulation (Transformer Engine's split accumulator), n a multiple
  // of 8 when B's are Vec128 (cuBLAS 12.9+, Hopper).
  void gemm_fp8(const GemmProblem& problem, const uint8_t* A, const float* a_scale_inv, const uint8_t* B,
                const float* b_scale_inv, void* D, const bf16* bias, float alpha, float beta, cudaStream_t stream,
                const void* C = nullptr);

  // laoyao's linear layer (kernels/cpu/ops.hpp conventions, row-major): y[T, N] = x[T, K] @ w[N, K]^T
  // (+ bias[N] when bias is non-null). Row-major y is column-major y^T[N, T] = w x^T, so this is
  // gemm(m = N, n = T, k = K, trans_a) with the bias running along D's rows, as cuBLASLt wants.
  // With `residual` ([T, N]), y = residual + x @ w^T (+ bias) in one GEMM (beta = 1, C = residual),
  // rounded once: the residual connection without dropout.
  void linear_forward(const bf16* x, const bf16* w, const bf16* bias, bf16* y, int64_t T, int64_t K, int64_t N,
                      cudaStream_t stream, const bf16* residual = nullptr);

  // The two gradients of that linear layer, given dy[T, N]:
  //   dx[T, K] = dy @ w                        (bf16, overwritten)
  //   dw[N, K] += dy^T @ x                     (fp32 main_grad, accumulated: beta = 1; with
  //                                             accumulate false written: beta = 0, dw not read)
  void linear_backward_input(const bf16* dy, const bf16* w, bf16* dx, int64_t T, int64_t K, int64_t N,
                             cudaStream_t stream);

  // The MLP's first linear layer with its GeLU (cuBLASLt's GELU epilogue, the tanh form as
  // Megatron's bias_gelu): y[T, N] = gelu(x @ w^T (+ bias)), and u[T, N] = x @ w^T (+ bias), the
  // GeLU's input that the backward needs.
  void linear_forward_gelu(const bf16* x, const bf16* w, const bf16* bias, bf16* y, bf16* u, int64_t T, int64_t K,
                           int64_t N, cudaStream_t stream);
  // The input gradient through the second linear layer and that GeLU at once:
  //   du[T, K] = (dy @ w) * gelu'(u)       (w [N, K], u [T, K] from linear_forward_gelu)
  void linear_backward_input_dgelu(const bf16* dy, const bf16* w, const bf16* u, bf16* du, int64_t T, int64_t K,
                                   int64_t N, cudaStream_t stream);
  void linear_backward_weight(const bf16* dy, const bf16* x, float* dw, int64_t T, int64_t K, int64_t N,
                              cudaStream_t stream, bool accumulate = true);

  // A batch of row-major products C[M, N] = alpha * op(X) op(Y) + beta * C, where X is stored
  // [M, K] (or [K, M] when tx) and Y is stored [K, N] (or [N, K] when ty), each matrix contiguous,
  // the i-th of `batch` at X + i*M*K, Y + i*K*N, C + i*M*N. C is bf16, or fp32 when c_fp32.
  void matmul_rm(const bf16* X, bool tx, const bf16* Y, bool ty, void* C, bool c_fp32, int64_t M, int64_t N,
                 int64_t K, float alpha, float beta, int64_t batch, cudaStream_t stream);

  // How many distinct problems have had a plan built (for checks that the cache is hit).
  size_t plans_built() const { return plans_.size(); }

  // What the first call of each problem found: the heuristic's first choice against the fastest
  // candidate, each timed on the same operands (ms; 0 when not timed).
  struct Tuning {
    std::string problem;
    int candidates = 0, chosen = 0;  // chosen: the candidate's rank in the heuristic's list
    float first_ms = 0, best_ms = 0;
  };
  std::vector<Tuning> tunings() const;
  static constexpr int kCandidates = 8;

 private:
  struct Key {
    GemmProblem p;
    uint32_t alignment;  // the smallest alignment (bytes, <= 256) of the operands' pointers
    bool operator<(const Key& o) const {
      return std::tie(p.m, p.n, p.k, p.trans_a, p.trans_b, p.lda, p.ldb, p.ldd, p.bias, p.d_fp32, p.gelu, p.ld_aux,
                      p.batch, p.stride_a, p.stride_b, p.stride_d, p.a_type, p.b_type, p.fast_accum, p.a_scale,
                      p.b_scale, alignment) <
             std::tie(o.p.m, o.p.n, o.p.k, o.p.trans_a, o.p.trans_b, o.p.lda, o.p.ldb, o.p.ldd, o.p.bias, o.p.d_fp32,
                      o.p.gelu, o.p.ld_aux, o.p.batch, o.p.stride_a, o.p.stride_b, o.p.stride_d, o.p.a_type,
                      o.p.b_type, o.p.fast_accum, o.p.a_scale, o.p.b_scale, o.alignment);
    }
  };
  struct Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
    Tuning tuning;
  };
  // One call's operands: what the first call of a problem times its candidates on.
  struct Operands {
    const void *A, *B;
    void* D;
    const void* C;
    float alpha, beta;
    cudaStream_t stream;
    const float *a_scale = nullptr, *b_scale = nullptr;  // FP8's dequantization factors
  };
  // gemm's and gemm_fp8's checks passed: the plan (built on first use) run on the operands.
  void enqueue(const GemmProblem& problem, const Operands& ops, const bf16* bias, bf16* aux);

  Plan& plan_for(const Key& key, const bf16* bias, const bf16* aux, const Operands& ops);
  // Times the heuristic's candidates on `ops` and stores the fastest in plan.algo.
  void choose_fastest(Plan& plan, const Key& key, const cublasLtMatmulHeuristicResult_t* results, int found,
                      const Operands& ops);

  cublasLtHandle_t handle_ = nullptr;
  DeviceBuffer workspace_;
  bool autotune_ = true;
  std::map<Key, Plan> plans_;
};

}  // namespace laoyao::kernels::cuda
