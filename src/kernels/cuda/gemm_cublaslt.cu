// cuBLASLt BF16 GEMM with a per-problem plan cache (host code only; see gemm_cublaslt.hpp).
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "core/runtime_options.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/gemm_cublaslt.hpp"

namespace laoyao::kernels::cuda {
namespace {

// The largest power of two <= 256 that divides the address. cuBLASLt's heuristic assumes 256-byte
// operands unless told otherwise, and an algorithm chosen under that assumption may fail on a
// pointer into the middle of a buffer; so the alignment is part of the plan's key.
uint32_t alignment_of(const void* p) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 256;
  while (a > 1 && v % a != 0) a >>= 1;
  return a;
}

const char* scale_name(GemmScale s) {
  return s == GemmScale::Vec128 ? "1x128" : s == GemmScale::Blk128 ? "128x128" : "tensor";
}

cublasLtMatmulMatrixScale_t scale_mode(GemmScale s) {
  return s == GemmScale::Vec128   ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F
         : s == GemmScale::Blk128 ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F
                                  : CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
}

std::string describe(const GemmProblem& p) {
  return "m=" + std::to_string(p.m) + " n=" + std::to_string(p.n) + " k=" + std::to_string(p.k) +
         " transA=" + std::to_string(p.trans_a) + " transB=" + std::to_string(p.trans_b) +
         " lda=" + std::to_string(p.lda) + " ldb=" + std::to_string(p.ldb) + " ldd=" + std::to_string(p.ldd) +
         (p.bias ? " +bias" : "") + (p.d_fp32 ? " D=fp32" : "") +
         (p.gelu == GemmGelu::GeluAux ? " +gelu(aux)" : p.gelu == GemmGelu::DGelu ? " *dgelu(aux)" : "") +
         (p.batch > 1 ? " batch=" + std::to_string(p.batch) : "") +
         (p.a_type == GemmOperand::Bf16 ? ""
                                        : std::string(" A=") + (p.a_type == GemmOperand::E4M3 ? "e4m3" : "e5m2") +
                                              " B=" + (p.b_type == GemmOperand::E4M3 ? "e4m3" : "e5m2") +
                                              (p.fast_accum ? " fast-accum" : "")) +
         (p.a_scale == GemmScale::Tensor && p.b_scale == GemmScale::Tensor
              ? ""
              : std::string(" scales ") + scale_name(p.a_scale) + " x " + scale_name(p.b_scale));
}

cudaDataType_t data_type(GemmOperand t) {
  return t == GemmOperand::E4M3 ? CUDA_R_8F_E4M3 : t == GemmOperand::E5M2 ? CUDA_R_8F_E5M2 : CUDA_R_16BF;
}

// The linear layer's forward, y[T, N] = x[T, K] @ w[N, K]^T row-major, as column-major
// y^T[N, T] = w x^T: w row-major [N, K] is column-major [K, N], transposed to op(A) = [N, K]; x
// row-major [T, K] is column-major [K, T] = op(B).
GemmProblem linear_forward_problem(int64_t T, int64_t K, int64_t N) {
  GemmProblem p;
  p.m = N;
  p.n = T;
  p.k = K;
  p.trans_a = true;
  p.lda = K;
  p.ldb = K;
  p.ldd = N;
  return p;
}

// Its input gradient, dx[T, K] = dy[T, N] @ w[N, K], as column-major dx^T[K, T] = w^T[K, N] dy^T[N, T]:
// w row-major [N, K] is column-major [K, N], dy row-major [T, N] column-major [N, T]; no transposes.
GemmProblem linear_backward_input_problem(int64_t T, int64_t K, int64_t N) {
  GemmProblem p;
  p.m = K;
  p.n = T;
  p.k = N;
  p.lda = K;
  p.ldb = N;
  p.ldd = K;
  return p;
}

}  // namespace

CublasLtGemm::CublasLtGemm(size_t workspace_bytes) : workspace_(workspace_bytes) {
  LAOYAO_CUDA_CHECK(cublasLtCreate(&handle_));
  autotune_ = runtime_options().gemm_autotune;
}

std::vector<CublasLtGemm::Tuning> CublasLtGemm::tunings() const {
  std::vector<Tuning> out;
  for (const auto& [key, plan] : plans_) out.push_back(plan.tuning);
  return out;
}

void CublasLtGemm::choose_fastest(Plan& plan, const Key& key, const cublasLtMatmulHeuristicResult_t* results,
                                  int found, const Operands& ops) {
  plan.algo = results[0].algo;
  plan.tuning.candidates = found;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  LAOYAO_CUDA_CHECK(cudaStreamIsCapturing(ops.stream, &capture));
  if (!autotune_ || found < 2 || capture != cudaStreamCaptureStatusNone) return;
  // A call that accumulates into D (C is D, beta != 0) must not see the timing runs' sums: those
  // write a scratch D instead. Any other call overwrites D anyway.
  const GemmProblem& p = key.p;
  DeviceBuffer scratch;
  void* d = ops.D;
  const void* c = ops.C;
  if (ops.C == ops.D && ops.beta != 0.0f) {
    const size_t elems = static_cast<size_t>(p.stride_d * (p.batch - 1) + p.ldd * p.n);
    try {
      scratch = DeviceBuffer(elems * (p.d_fp32 ? 4 : 2));
    } catch (const Error&) {
      return;  // no room for a scratch output: keep the heuristic's choice
    }
    d = scratch.ptr;
    c = scratch.ptr;
  }
  cudaEvent_t start, stop;
  LAOYAO_CUDA_CHECK(cudaEventCreate(&start));
  LAOYAO_CUDA_CHECK(cudaEventCreate(&stop));
  // Rounds interleave the candidates (a clock or temperature drift then hits them alike); each
  // keeps its fastest round. Another candidate replaces the heuristic's first choice only when it
  // is clearly faster: a measured tie is noise, and the first choice is cuBLASLt's own pick.
  constexpr int kRounds = 3, kReps = 5;
  constexpr float kClearlyFaster = 0.97f;
  std::vector<float> ms(static_cast<size_t>(found), -1.0f);
  try {
    for (int round = 0; round < kRounds; ++round)
      for (int i = 0; i < found; ++i) {
        if (round > 0 && ms[size_t(i)] < 0) continue;  // it would not run
        auto run = [&] {
          return cublasLtMatmul(handle_, plan.op, &ops.alpha, ops.A, plan.a, ops.B, plan.b, &ops.beta, c, plan.d, d,
                                plan.d, &results[i].algo, workspace_.ptr, workspace_.bytes, ops.stream);
        };
        if (round == 0 && run() != CUBLAS_STATUS_SUCCESS) continue;  // a candidate that will not run is none
        LAOYAO_CUDA_CHECK(cudaEventRecord(start, ops.stream));
        for (int r = 0; r < kReps; ++r) LAOYAO_CUDA_CHECK(run());
        LAOYAO_CUDA_CHECK(cudaEventRecord(stop, ops.stream));
        LAOYAO_CUDA_CHECK(cudaEventSynchronize(stop));
        float t = 0;
        LAOYAO_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
        t /= kReps;
        if (ms[size_t(i)] < 0 || t < ms[size_t(i)]) ms[size_t(i)] = t;
      }
  } catch (...) {
    (void)cudaEventDestroy(start);
    (void)cudaEventDestroy(stop);
    throw;
  }
  float best = ms[0];
  for (int i = 1; i < found; ++i)
    if (ms[size_t(i)] > 0 && (best <= 0 || ms[size_t(i)] < kClearlyFaster * best)) {
      best = ms[size_t(i)];
      plan.algo = results[i].algo;
      plan.tuning.chosen = i;
    }
  plan.tuning.first_ms = ms[0] > 0 ? ms[0] : 0;
  LAOYAO_CUDA_CHECK(cudaEventDestroy(start));
  LAOYAO_CUDA_CHECK(cudaEventDestroy(stop));
  plan.tuning.best_ms = best > 0 ? best : 0;
}

CublasLtGemm::~CublasLtGemm() {
  // Destructors cannot throw; a failing destroy at teardown leaves nothing to recover.
  for (auto& [key, plan] : plans_) {
    (void)key;
    (void)cublasLtMatrixLayoutDestroy(plan.a);
    (void)cublasLtMatrixLayoutDestroy(plan.b);
    (void)cublasLtMatrixLayoutDestroy(plan.d);
    (void)cublasLtMatmulDescDestroy(plan.op);
  }
  if (handle_) (void)cublasLtDestroy(handle_);
}

CublasLtGemm::Plan& CublasLtGemm::plan_for(const Key& key, const bf16* bias, const bf16* aux, const Operands& ops) {
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second;

  const GemmProblem& p = key.p;
  Plan plan;
  // Build into `plan`, and on any failure destroy what was made so far before rethrowing.
  try {
    LAOYAO_CUDA_CHECK(cublasLtMatmulDescCreate(&plan.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t tb = p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    LAOYAO_CUDA_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LAOYAO_CUDA_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    const cublasLtEpilogue_t epi = p.gelu == GemmGelu::DGelu     ? CUBLASLT_EPILOGUE_DGELU
                                   : p.gelu == GemmGelu::GeluAux ? (p.bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                                                                           : CUBLASLT_EPILOGUE_GELU_AUX)
                                   : p.bias                      ? CUBLASLT_EPILOGUE_BIAS
                                                                 : CUBLASLT_EPILOGUE_DEFAULT;
    LAOYAO_CUDA_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    if (p.gelu != GemmGelu::None) {
      // The heuristic reads the aux pointer's alignment too (cublasLt.h).
      const cudaDataType_t aux_type = CUDA_R_16BF;
      LAOYAO_CUDA_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &aux_type,
                                                       sizeof aux_type));
      LAOYAO_CUDA_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &p.ld_aux,
                                                       sizeof p.ld_aux));
      LAOYAO_CUDA_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                                       sizeof aux));
    }
    if (p.bias) {
      const cudaDataType_t bias_type = CUDA_R_16BF;
      LAOYAO_CUDA_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                                       sizeof bias_type));
      // The heuristic reads the bias pointer's alignment (cublasLt.h), so set it before asking.
      LAOYAO_CUDA_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                       sizeof bias));
    }
    if (p.a_type != GemmOperand::Bf16) {  // FP8: the dequantization factors, read at execution
      const int8_t fast = p.fast_accum ? 1 : 0;
      LAOYAO_CUDA_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast));
      LAOYAO_CUDA_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &ops.a_scale,
                                                       sizeof ops.a_scale));
      LAOYAO_CUDA_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &ops.b_scale,
                                                       sizeof ops.b_scale));
      if (p.a_scale != GemmScale::Tensor || p.b_scale != GemmScale::Tensor) {
        const int32_t a_mode = scale_mode(p.a_scale), b_mode = scale_mode(p.b_scale);
        LAOYAO_CUDA_CHECK(
            cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &a_mode, sizeof a_mode));
        LAOYAO_CUDA_CHECK(
            cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b_mode, sizeof b_mode));
      }
    }
    // Stored shapes (rows x cols, column-major): A [k, m] when transposed else [m, k]; likewise B.
    LAOYAO_CUDA_CHECK(cublasLtMatrixLayoutCreate(&plan.a, data_type(p.a_type), p.trans_a ? p.k : p.m,
                                                 p.trans_a ? p.m : p.k, p.lda));
    LAOYAO_CUDA_CHECK(cublasLtMatrixLayoutCreate(&plan.b, data_type(p.b_type), p.trans_b ? p.n : p.k,
                                                 p.trans_b ? p.k : p.n, p.ldb));
    LAOYAO_CUDA_CHECK(cublasLtMatrixLayoutCreate(&plan.d, p.d_fp32 ? CUDA_R_32F : CUDA_R_16BF, p.m, p.n, p.ldd));
    if (p.batch > 1) {
      const int32_t count = static_cast<int32_t>(p.batch);
      const std::pair<cublasLtMatrixLayout_t, int64_t> strided[] = {{plan.a, p.stride_a}, {plan.b, p.stride_b},
                                                                    {plan.d, p.stride_d}};
      for (const auto& [layout, stride] : strided) {
        LAOYAO_CUDA_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                           sizeof count));
        LAOYAO_CUDA_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                           &stride, sizeof stride));
      }
    }

    cublasLtMatmulPreference_t pref = nullptr;
    LAOYAO_CUDA_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    cublasLtMatmulHeuristicResult_t results[kCandidates] = {};
    int found = 0;
    try {
      const size_t ws = workspace_.bytes;
      LAOYAO_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                             sizeof ws));
      // Split-K partial sums only in fp32 (the compute type): schemes that add them in the output
      // type would round a bf16 output more than once.
      const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
      LAOYAO_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                                             &schemes, sizeof schemes));
      for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
        LAOYAO_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &key.alignment, sizeof key.alignment));
      // C is D (beta accumulates in place), so the same layout serves both.
      LAOYAO_CUDA_CHECK(cublasLtMatmulAlgoGetHeuristic(handle_, plan.op, plan.a, plan.b, plan.d, plan.d, pref,
                                                       kCandidates, results, &found));
    } catch (...) {
      (void)cublasLtMatmulPreferenceDestroy(pref);
      throw;
    }
    LAOYAO_CUDA_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    if (found == 0)
      throw Error(std::string("cuBLASLt has no ") + (p.a_type == GemmOperand::Bf16 ? "bf16" : "FP8") +
                  " algorithm for " + describe(p) + " at " + std::to_string(key.alignment) + "-byte alignment");
    plan.tuning.problem = describe(p) + " align=" + std::to_string(key.alignment);
    choose_fastest(plan, key, results, found, ops);
  } catch (...) {
    if (plan.a) (void)cublasLtMatrixLayoutDestroy(plan.a);
    if (plan.b) (void)cublasLtMatrixLayoutDestroy(plan.b);
    if (plan.d) (void)cublasLtMatrixLayoutDestroy(plan.d);
    if (plan.op) (void)cublasLtMatmulDescDestroy(plan.op);
    throw;
  }
  return plans_.emplace(key, plan).first->second;
}

void CublasLtGemm::gemm(const GemmProblem& problem, const bf16* A, const bf16* B, void* D, const bf16* bias,
                        float alpha, float beta, cudaStream_t stream, const void* C, bf16* aux) {
  if (!C) C = D;
  if ((problem.gelu != GemmGelu::None) != (aux != nullptr))
    throw Error("CublasLtGemm::gemm: an aux buffer must be given exactly when the problem has a GeLU epilogue (" +
                describe(problem) + ")");
  if (problem.gelu != GemmGelu::None && (problem.d_fp32 || problem.ld_aux % 8 != 0 || problem.ld_aux < problem.m ||
                                         (problem.gelu == GemmGelu::DGelu && problem.bias)))
    throw Error("CublasLtGemm::gemm: a GeLU epilogue needs a bf16 output, an aux leading dimension that is a "
                "multiple of 8 and at least m, and no bias with DGELU (" + describe(problem) + ")");
  if (problem.bias != (bias != nullptr))
    throw Error("CublasLtGemm::gemm: a bias pointer must be given exactly when the problem has a bias epilogue (" +
                describe(problem) + ")");
  if (problem.bias && problem.d_fp32)
    throw Error("CublasLtGemm::gemm: the bias epilogue is for bf16 outputs only (" + describe(problem) + ")");
  if (problem.m <= 0 || problem.n <= 0 || problem.k <= 0 || problem.batch <= 0)
    throw Error("CublasLtGemm::gemm: empty problem (" + describe(problem) + ")");
  if (problem.a_type != GemmOperand::Bf16 || problem.b_type != GemmOperand::Bf16)
    throw Error("CublasLtGemm::gemm: FP8 operands go through gemm_fp8 (" + describe(problem) + ")");
  enqueue(problem, Operands{A, B, D, C, alpha, beta, stream}, bias, aux);
}

void CublasLtGemm::gemm_fp8(const GemmProblem& problem, const uint8_t* A, const float* a_scale_inv, const uint8_t* B,
                            const float* b_scale_inv, void* D, const bf16* bias, float alpha, float beta,
                            cudaStream_t stream, const void* C) {
  const GemmProblem& p = problem;
  const bool fp8 = p.a_type != GemmOperand::Bf16 && p.b_type != GemmOperand::Bf16;
  if (!fp8 || (p.a_type == GemmOperand::E5M2 && p.b_type == GemmOperand::E5M2))
    throw Error("CublasLtGemm::gemm_fp8: A and B must both be FP8, not both E5M2 (" + describe(p) + ")");
  if (!p.trans_a || p.trans_b || p.k % 16 != 0 || p.lda % 16 != 0 || p.ldb % 16 != 0 || p.batch != 1 ||
      p.gelu != GemmGelu::None)
    throw Error("CublasLtGemm::gemm_fp8: Hopper's FP8 GEMMs take TN operands with k and the leading dimensions "
                "multiples of 16, one problem, no GeLU epilogue (" + describe(p) + ")");
  if (!a_scale_inv || !b_scale_inv) throw Error("CublasLtGemm::gemm_fp8: the operands' scale_inv pointers are null");
  if (!p.d_fp32 && beta != 0.0f && !C)
    throw Error("CublasLtGemm::gemm_fp8: a bf16 D is written (beta 0) or adds a separate C, not added to in place (" +
                describe(p) + ")");
  if (p.bias != (bias != nullptr) || (p.bias && p.d_fp32))
    throw Error("CublasLtGemm::gemm_fp8: a bias pointer exactly when the problem has a bf16 bias epilogue (" +
                describe(p) + ")");
  if (p.m <= 0 || p.n <= 0 || p.k <= 0) throw Error("CublasLtGemm::gemm_fp8: empty problem (" + describe(p) + ")");
  if ((p.a_scale != GemmScale::Tensor) != (p.b_scale != GemmScale::Tensor) ||
      (p.a_scale == GemmScale::Blk128 && p.b_scale == GemmScale::Blk128) ||
      (p.a_scale != GemmScale::Tensor && (p.fast_accum || (p.b_scale == GemmScale::Vec128 && p.n % 8 != 0))))
    throw Error("CublasLtGemm::gemm_fp8: block scaling takes 1x128 or 128x128 scales on both operands, not 128x128 "
                "on both, without fast accumulation, n a multiple of 8 under B's 1x128 (" + describe(p) + ")");
  Operands ops{A, B, D, C ? C : D, alpha, beta, stream};
  ops.a_scale = a_scale_inv, ops.b_scale = b_scale_inv;
  enqueue(p, ops, bias, nullptr);
}

void CublasLtGemm::enqueue(const GemmProblem& problem, const Operands& ops, const bf16* bias, bf16* aux) {
  uint32_t align = alignment_of(ops.A);
  for (const void* p : {ops.B, static_cast<const void*>(ops.D), static_cast<const void*>(bias), ops.C,
                        static_cast<const void*>(aux)})
    if (p) align = std::min(align, alignment_of(p));
  if (problem.batch > 1) {  // every batch's matrix must meet the alignment the plan assumes
    const size_t d_bytes = problem.d_fp32 ? 4 : 2;
    for (size_t stride_bytes : {size_t(problem.stride_a) * 2, size_t(problem.stride_b) * 2,
                                size_t(problem.stride_d) * d_bytes})
      align = std::min(align, alignment_of(reinterpret_cast<const void*>(stride_bytes)));
  }
  Plan& plan = plan_for(Key{problem, align}, bias, aux, ops);
  // Same problem, perhaps other bias, aux and scale buffers: attribute writes, nothing is rebuilt.
  if (bias)
    LAOYAO_CUDA_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
  if (aux)
    LAOYAO_CUDA_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                                     sizeof aux));
  if (ops.a_scale) {
    LAOYAO_CUDA_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &ops.a_scale,
                                                     sizeof ops.a_scale));
    LAOYAO_CUDA_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &ops.b_scale,
                                                     sizeof ops.b_scale));
  }
  const cublasStatus_t st = cublasLtMatmul(handle_, plan.op, &ops.alpha, ops.A, plan.a, ops.B, plan.b, &ops.beta,
                                           ops.C, plan.d, ops.D, plan.d, &plan.algo, workspace_.ptr, workspace_.bytes,
                                           ops.stream);
  if (st != CUBLAS_STATUS_SUCCESS)
    throw Error(std::string("cublasLtMatmul: ") + cublasLtGetStatusString(st) + " (cublasStatus " +
                std::to_string(static_cast<int>(st)) + ") for " + describe(problem) + ", beta " +
                std::to_string(ops.beta) + (ops.C != ops.D ? ", C apart from D" : "") + ", operands aligned to " +
                std::to_string(align) + " bytes");
}

void CublasLtGemm::linear_forward(const bf16* x, const bf16* w, const bf16* bias, bf16* y, int64_t T, int64_t K,
                                  int64_t N, cudaStream_t stream, const bf16* residual) {
  GemmProblem p = linear_forward_problem(T, K, N);
  p.bias = bias != nullptr;
  gemm(p, w, x, y, bias, 1.0f, residual ? 1.0f : 0.0f, stream, residual);
}

void CublasLtGemm::linear_forward_gelu(const bf16* x, const bf16* w, const bf16* bias, bf16* y, bf16* u, int64_t T,
                                       int64_t K, int64_t N, cudaStream_t stream) {
  GemmProblem p = linear_forward_problem(T, K, N);  // u has y's layout
  p.bias = bias != nullptr;
  p.gelu = GemmGelu::GeluAux;
  p.ld_aux = N;
  gemm(p, w, x, y, bias, 1.0f, 0.0f, stream, nullptr, u);
}

void CublasLtGemm::linear_backward_input_dgelu(const bf16* dy, const bf16* w, const bf16* u, bf16* du, int64_t T,
                                               int64_t K, int64_t N, cudaStream_t stream) {
  GemmProblem p = linear_backward_input_problem(T, K, N);  // u has du's layout
  p.gelu = GemmGelu::DGelu;
  p.ld_aux = K;
  gemm(p, w, dy, du, nullptr, 1.0f, 0.0f, stream, nullptr, const_cast<bf16*>(u));  // DGELU only reads aux
}

void CublasLtGemm::linear_backward_input(const bf16* dy, const bf16* w, bf16* dx, int64_t T, int64_t K, int64_t N,
                                         cudaStream_t stream) {
  gemm(linear_backward_input_problem(T, K, N), w, dy, dx, nullptr, 1.0f, 0.0f, stream);
}

void CublasLtGemm::linear_backward_weight(const bf16* dy, const bf16* x, float* dw, int64_t T, int64_t K, int64_t N,
                                          cudaStream_t stream, bool accumulate) {
  // Column-major dw^T[K, N] += x^T[K, T] dy[T, N]: x row-major [T, K] is column-major [K, T] (no
  // transpose); dy row-major [T, N] is column-major [N, T], transposed to [T, N].
  GemmProblem p;
  p.m = K;
  p.n = N;
  p.k = T;
  p.trans_b = true;
  p.lda = K;
  p.ldb = N;
  p.ldd = K;
  p.d_fp32 = true;
  gemm(p, x, dy, dw, nullptr, 1.0f, accumulate ? 1.0f : 0.0f, stream);  // beta 0: dw is not read
}


void CublasLtGemm::matmul_rm(const bf16* X, bool tx, const bf16* Y, bool ty, void* C, bool c_fp32, int64_t M,
                             int64_t N, int64_t K, float alpha, float beta, int64_t batch, cudaStream_t stream) {
  // Row-major C = op(X) op(Y) is column-major C^T[N, M] = op(Y)^T op(X)^T, and a row-major matrix
  // read column-major is its transpose: Y stored [K, N] is already op(Y)^T (no transpose), stored
  // [N, K] it needs one; likewise X.
  GemmProblem p;
  p.m = N;
  p.n = M;
  p.k = K;
  p.trans_a = ty;
  p.lda = ty ? K : N;
  p.trans_b = tx;
  p.ldb = tx ? M : K;
  p.ldd = N;
  p.d_fp32 = c_fp32;
  p.batch = batch;
  p.stride_a = K * N;
  p.stride_b = M * K;
  p.stride_d = M * N;
  gemm(p, Y, X, C, nullptr, alpha, beta, stream);
}

}  // namespace laoyao::kernels::cuda
