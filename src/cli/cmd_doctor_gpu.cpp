// `laoyao doctor` on the GPUs: executes a cuBLASLt GEMM, the attention forward and backward, the
// fused bias+GeLU, LayerNorm, cross entropy, the embedding and (with two or more GPUs) an NCCL
// all-reduce, compares each with a CPU reference on fresh random inputs, and prints one line per
// check. Built only with CUDA.
#ifdef LAOYAO_HAVE_CUDA
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstdarg>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "cli/doctor.hpp"
#include "core/device.hpp"
#include "core/rng.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/cuda/attention_cudnn.hpp"
#include "kernels/cuda/attention_flash.hpp"
#include "kernels/cuda/attention_reference.hpp"
#include "kernels/cuda/grouped_gemm.hpp"
#include "kernels/cuda/bias_gelu.hpp"
#include "kernels/cuda/cross_entropy.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/device_buffer.hpp"
#include "kernels/cuda/embedding.hpp"
#include "kernels/cuda/gemm_cublaslt.hpp"
#include "kernels/cuda/layernorm.hpp"
#include "kernels/cuda/library_versions.hpp"

namespace laoyao::cli::doctor {
namespace {

namespace kc = kernels::cuda;
using bf16 = __nv_bfloat16;
using kc::DeviceBuffer;

// BF16 tolerances (doctor.hpp, Tolerance): one unit in the last place relative, plus a floor
// scaled by the tensor's largest value for sums whose rounded terms cancel.
constexpr Tolerance kGemmTol{0x1p-7, 0x1p-10};
constexpr Tolerance kElementwiseTol{0x1p-7, 0x1p-12};
// Attention's backward uses delta = rowsum(dO * O) with O rounded to bf16 (as FlashAttention does),
// which moves dS by up to 2^-9 of |dO||O|: hence the larger floor.
constexpr Tolerance kAttentionTol{0x1p-7, 0x1p-8};
// fp32 outputs (LayerNorm mean/rstd, the CE loss and lse, fp32 gradient sums) are not rounded to
// bf16: the GPU sums in fp32 in a tree order, the CPU reference in double. The fp32 sum of n terms
// is off by at most ~log2(n) * 2^-24 of the sum of |terms| with tree sums (rows of <= 50304 here:
// ~17 levels, ~1e-6 relative); 2^-14 relative (6e-5) leaves a wide margin over that and is still
// ~1000x below what a wrong term (one missing column or token) would move. The floor is 2^-16 of
// the largest value for sums that cancel (random-sign gradients, means near zero).
constexpr Tolerance kFp32SumTol{0x1p-14, 0x1p-16};
// Embedding gradients: the GPU adds each row's tokens in token order onto the row's old value,
// the order the CPU reference uses, so the fp32 results should agree to the last bit; the
// tolerance only allows for a compiler contracting or reordering the CPU loop.
constexpr Tolerance kSameOrderTol{0x1p-20, 0x1p-22};

std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));
std::string fmt(const char* f, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

// Random bf16 tensors: the bits to upload and the same values as floats for the CPU reference.
struct HostBf16 {
  std::vector<uint16_t> bits;
  std::vector<float> values;
  size_t bytes() const { return bits.size() * sizeof(uint16_t); }
};

HostBf16 random_bf16(size_t n, uint64_t seed, const char* stream, double stddev = 1.0, double mean = 0.0) {
  Rng rng(seed, stream);
  HostBf16 h;
  h.bits.resize(n);
  h.values.resize(n);
  for (size_t i = 0; i < n; ++i) {
    h.bits[i] = to_bf16_bits(static_cast<float>(mean + stddev * rng.normal()));
    h.values[i] = from_bf16_bits(h.bits[i]);
  }
  return h;
}

DeviceBuffer upload(const HostBf16& h) {
  DeviceBuffer d(h.bytes());
  d.upload(h.bits.data(), h.bytes());
  return d;
}

std::vector<float> download_bf16(const DeviceBuffer& d, size_t n) {
  std::vector<uint16_t> bits(n);
  d.download(bits.data(), n * sizeof(uint16_t));
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = from_bf16_bits(bits[i]);
  return out;
}

std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

struct Event {
  cudaEvent_t e = nullptr;
  Event() { LAOYAO_CUDA_CHECK(cudaEventCreate(&e)); }
  ~Event() { (void)cudaEventDestroy(e); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
};

// Median milliseconds of `runs` timed calls of f on the default stream, after `warmup` untimed ones.
double median_ms(const std::function<void()>& f, int warmup, int runs) {
  for (int i = 0; i < warmup; ++i) f();
  LAOYAO_CUDA_CHECK(cudaDeviceSynchronize());
  Event start, stop;
  std::vector<double> ms;
  for (int i = 0; i < runs; ++i) {
    LAOYAO_CUDA_CHECK(cudaEventRecord(start.e, nullptr));
    f();
    LAOYAO_CUDA_CHECK(cudaEventRecord(stop.e, nullptr));
    LAOYAO_CUDA_CHECK(cudaEventSynchronize(stop.e));
    float t = 0;
    LAOYAO_CUDA_CHECK(cudaEventElapsedTime(&t, start.e, stop.e));
    ms.push_back(t);
  }
  return median(ms);
}

// A check that throws (a failed CUDA call, a launch error) is a FAIL with the error as its figure.
CheckResult guarded(const std::string& name, const std::function<void(CheckResult&)>& body) {
  CheckResult r{name, false, ""};
  try {
    body(r);
  } catch (const std::exception& e) {
    r.pass = false;
    r.figure = e.what();
  }
  return r;
}

// ---- GEMM: 4096^3, timed, a sample of outputs against fp64 dot products of the same bf16 inputs.
constexpr int64_t kGemmN = 4096;

CheckResult check_gemm(kc::CublasLtGemm& gemm, const HostBf16& x, const HostBf16& w, uint64_t seed) {
  const int64_t n = kGemmN;
  return guarded(fmt("gemm bf16 %lldx%lldx%lld, fp32 accumulate (cuBLASLt)", (long long)n, (long long)n, (long long)n),
                 [&](CheckResult& r) {
    DeviceBuffer dx = upload(x), dw = upload(w), dy(size_t(n * n) * sizeof(bf16));
    LAOYAO_CUDA_CHECK(cudaMemset(dy.ptr, 0xff, dy.bytes));  // NaNs, unless the GEMM writes every output
    const size_t plans_before = gemm.plans_built();
    const int warmup = 3, runs = 20;
    const double ms = median_ms(
        [&] { gemm.linear_forward(dx.as<bf16>(), dw.as<bf16>(), nullptr, dy.as<bf16>(), n, n, n, nullptr); }, warmup,
        runs);
    const size_t plans = gemm.plans_built() - plans_before;
    const std::vector<float> y = download_bf16(dy, size_t(n * n));
    constexpr int kSamples = 512;
    Rng pick(seed, "doctor.gemm.sample");
    std::vector<float> got(kSamples);
    std::vector<double> ref(kSamples);
    for (int s = 0; s < kSamples; ++s) {
      const int64_t t = static_cast<int64_t>(pick.next_u64() % n), j = static_cast<int64_t>(pick.next_u64() % n);
      double dot = 0.0;
      for (int64_t k = 0; k < n; ++k) dot += double(x.values[t * n + k]) * double(w.values[j * n + k]);
      ref[s] = dot;
      got[s] = y[t * n + j];
    }
    const Comparison c = compare(got, ref, kGemmTol);
    r.pass = c.pass() && plans == 1;
    r.figure = fmt("%.1f TFLOP/s (median of %d); %d sampled outputs vs fp64: %s; %zu plan(s) built for %d calls",
                   tflops(2.0 * n * n * n, ms * 1e-3), runs, kSamples, describe(c).c_str(), plans, warmup + runs);
  });
}

// ---- GEMM with the bias epilogue on a GPT-2 QKV shape (T not a multiple of the tile), every
// output against the CPU linear op. Run twice with two bias vectors: the second call must reuse the
// plan and still add the new bias.
CheckResult check_gemm_bias(kc::CublasLtGemm& gemm, uint64_t seed) {
  const int64_t T = 1000, K = 768, N = 2304;
  return guarded(fmt("gemm bf16 + bias epilogue, linear %lldx%lld -> %lld (cuBLASLt)", (long long)T, (long long)K,
                     (long long)N),
                 [&](CheckResult& r) {
    const HostBf16 x = random_bf16(T * K, seed, "doctor.linear.x");
    const HostBf16 w = random_bf16(N * K, seed, "doctor.linear.w", 1.0 / std::sqrt(double(K)));
    const HostBf16 b1 = random_bf16(N, seed, "doctor.linear.b1");
    const HostBf16 b2 = random_bf16(N, seed, "doctor.linear.b2");
    DeviceBuffer dx = upload(x), dw = upload(w), db1 = upload(b1), db2 = upload(b2), dy(size_t(T * N) * sizeof(bf16));
    LAOYAO_CUDA_CHECK(cudaMemset(dy.ptr, 0xff, dy.bytes));
    const size_t plans_before = gemm.plans_built();
    gemm.linear_forward(dx.as<bf16>(), dw.as<bf16>(), db1.as<bf16>(), dy.as<bf16>(), T, K, N, nullptr);
    gemm.linear_forward(dx.as<bf16>(), dw.as<bf16>(), db2.as<bf16>(), dy.as<bf16>(), T, K, N, nullptr);
    const size_t plans = gemm.plans_built() - plans_before;
    const std::vector<float> y = download_bf16(dy, size_t(T * N));
    std::vector<float> ref(size_t(T * N));
    kernels::cpu::linear_forward(x.values.data(), w.values.data(), b2.values.data(), ref.data(), T, K, N);
    const Comparison c = compare(y, to_double(ref), kGemmTol);
    r.pass = c.pass() && plans == 1;
    r.figure = fmt("all %zu outputs vs CPU linear: %s; %zu plan(s) built for 2 calls", c.count, describe(c).c_str(),
                   plans);
  });
}

// ---- the routed experts' grouped GEMM (forward, nt) on uneven groups, every output against fp64
// dot products of the same bf16 inputs; the figure names the kernels this GPU takes (auto: the
// wgmma ones on Hopper, the portable ones elsewhere; LAOYAO_GROUPED_GEMM).
CheckResult check_grouped_gemm(uint64_t seed) {
  const std::vector<int32_t> offsets = {0, 100, 100, 357, 512};  // an empty group, partial tiles
  const int64_t G = 4, rows = offsets.back(), N = 384, K = 256;
  return guarded(fmt("grouped gemm bf16 (MoE experts' forward), %lld groups of %lld rows -> %lld (%s)", (long long)G,
                     (long long)rows, (long long)N, kc::grouped_gemm_kernels_name(kc::grouped_gemm_kernels())),
                 [&](CheckResult& r) {
    const HostBf16 x = random_bf16(size_t(rows * K), seed, "doctor.grouped.x");
    const HostBf16 w = random_bf16(size_t(G * N * K), seed, "doctor.grouped.w", 1.0 / std::sqrt(double(K)));
    DeviceBuffer dx = upload(x), dw = upload(w), dy(size_t(rows * N) * sizeof(bf16)),
                 doff(offsets.size() * sizeof(int32_t));
    doff.upload(offsets.data(), doff.bytes);
    LAOYAO_CUDA_CHECK(cudaMemset(dy.ptr, 0xff, dy.bytes));  // NaNs, unless every output is written
    kc::grouped_gemm_nt(dx.as<bf16>(), dw.as<bf16>(), dy.as<bf16>(), {doff.as<int32_t>(), G, G, rows, 0}, N, K,
                        nullptr);
    LAOYAO_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> y = download_bf16(dy, size_t(rows * N));
    std::vector<double> ref(size_t(rows * N));
    for (int64_t g = 0; g < G; ++g)
      for (int64_t t = offsets[size_t(g)]; t < offsets[size_t(g + 1)]; ++t)
        for (int64_t j = 0; j < N; ++j) {
          double dot = 0.0;
          for (int64_t k = 0; k < K; ++k) dot += double(x.values[t * K + k]) * double(w.values[(g * N + j) * K + k]);
          ref[size_t(t * N + j)] = dot;
        }
    const Comparison c = compare(y, ref, kGemmTol);
    r.pass = c.pass();
    r.figure = fmt("all %zu outputs vs fp64: %s", c.count, describe(c).c_str());
  });
}

// ---- attention forward and backward against the CPU op (kernels/cpu/attention.cpp).
// The paths: cuDNN's fused attention (training without attention dropout), our flash kernels
// (training with it), our simple reference kernel.
enum class AttentionKernel { Cudnn, Flash, Reference };
struct AttentionCase {
  int64_t b, s, H, G, D;
  AttentionKernel kernel;
};

CheckResult check_attention(const AttentionCase& a, uint64_t seed) {
  const char* path = a.kernel == AttentionKernel::Cudnn   ? "cuDNN fused attention, the training path"
                     : a.kernel == AttentionKernel::Flash ? "laoyao flash kernels, the path with attention dropout"
                                                          : "laoyao reference kernel";
  const std::string name = fmt("attention causal bf16 fwd+bwd D=%lld (b=%lld s=%lld heads=%lld groups=%lld; %s)",
                               (long long)a.D, (long long)a.b, (long long)a.s, (long long)a.H, (long long)a.G, path);
  return guarded(name, [&](CheckResult& r) {
    kc::AttentionShape shape{a.b, a.s, a.H, a.G, a.D, static_cast<float>(1.0 / std::sqrt(double(a.D)))};
    const int64_t T = a.b * a.s, row = a.G * (a.H / a.G + 2) * a.D, HD = a.H * a.D;
    const std::string tag = "doctor.attention.d" + std::to_string(a.D);
    const HostBf16 qkv = random_bf16(T * row, seed, (tag + ".qkv").c_str());
    const HostBf16 dctx = random_bf16(T * HD, seed, (tag + ".dctx").c_str());
    DeviceBuffer d_qkv = upload(qkv), d_dctx = upload(dctx);
    DeviceBuffer d_ctx(size_t(T * HD) * sizeof(bf16)), d_dqkv(size_t(T * row) * sizeof(bf16));
    DeviceBuffer d_lse(size_t(a.b * a.H * a.s) * sizeof(float)), d_delta(size_t(a.b * a.H * a.s) * sizeof(float));
    // Poison the outputs so that an element the kernels never write cannot pass by accident.
    LAOYAO_CUDA_CHECK(cudaMemset(d_ctx.ptr, 0xff, d_ctx.bytes));
    LAOYAO_CUDA_CHECK(cudaMemset(d_dqkv.ptr, 0xff, d_dqkv.bytes));
    std::string engines;
    if (a.kernel == AttentionKernel::Cudnn) {
      kc::CudnnAttention attn(shape, nullptr);
      attn.forward(d_qkv.as<bf16>(), d_ctx.as<bf16>(), d_lse.as<float>(), a.b);
      attn.backward(d_qkv.as<bf16>(), d_ctx.as<bf16>(), d_dctx.as<bf16>(), d_lse.as<float>(), d_dqkv.as<bf16>(), a.b);
      LAOYAO_CUDA_CHECK(cudaDeviceSynchronize());
      engines = " (" + attn.engines() + ")";
    } else if (a.kernel == AttentionKernel::Flash) {
      kc::attention_flash_forward(d_qkv.as<bf16>(), d_ctx.as<bf16>(), d_lse.as<float>(), shape, {}, nullptr);
      kc::attention_flash_backward(d_qkv.as<bf16>(), d_ctx.as<bf16>(), d_dctx.as<bf16>(), d_lse.as<float>(),
                                   d_delta.as<float>(), d_dqkv.as<bf16>(), shape, {}, nullptr);
    } else {
      kc::attention_reference_forward(d_qkv.as<bf16>(), d_ctx.as<bf16>(), d_lse.as<float>(), shape, nullptr);
      kc::attention_reference_backward(d_qkv.as<bf16>(), d_ctx.as<bf16>(), d_dctx.as<bf16>(), d_lse.as<float>(),
                                       d_delta.as<float>(), d_dqkv.as<bf16>(), shape, nullptr);
    }
    LAOYAO_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> ctx = download_bf16(d_ctx, size_t(T * HD));
    const std::vector<float> dqkv = download_bf16(d_dqkv, size_t(T * row));

    std::vector<float> ctx_ref(size_t(T * HD)), probs(size_t(a.b * a.H * a.s * a.s)), dqkv_ref(size_t(T * row));
    kernels::cpu::attention_forward(qkv.values.data(), ctx_ref.data(), probs.data(), a.b, a.s, a.H, a.G, a.D,
                                    shape.scale);
    kernels::cpu::attention_backward(qkv.values.data(), probs.data(), dctx.values.data(), dqkv_ref.data(), a.b, a.s,
                                     a.H, a.G, a.D, shape.scale);
    const Comparison cf = compare(ctx, to_double(ctx_ref), kAttentionTol);
    const Comparison cb = compare(dqkv, to_double(dqkv_ref), kAttentionTol);
    r.pass = cf.pass() && cb.pass();
    r.figure = "vs CPU: ctx " + describe(cf) + "; dqkv " + describe(cb) + engines;
  });
}

// ---- fused bias + GeLU forward and backward against the CPU ops, on a 16-byte-vector shape and
// on one that takes the scalar path.
CheckResult check_bias_gelu(uint64_t seed) {
  return guarded("bias+GeLU fused fwd+bwd bf16 (Megatron bias_gelu, tanh)", [&](CheckResult& r) {
    r.pass = true;
    struct Shape {
      int64_t T, F;
    };
    for (const Shape sh : {Shape{2048, 3072}, Shape{333, 1001}}) {
      const int64_t T = sh.T, F = sh.F;
      const std::string tag = "doctor.gelu." + std::to_string(F);
      const HostBf16 x = random_bf16(T * F, seed, (tag + ".x").c_str(), 2.0);
      const HostBf16 bias = random_bf16(F, seed, (tag + ".bias").c_str(), 0.5);
      const HostBf16 dy = random_bf16(T * F, seed, (tag + ".dy").c_str());
      DeviceBuffer d_x = upload(x), d_bias = upload(bias), d_dy = upload(dy);
      DeviceBuffer d_y(x.bytes()), d_dx(x.bytes());
      LAOYAO_CUDA_CHECK(cudaMemset(d_y.ptr, 0xff, d_y.bytes));
      LAOYAO_CUDA_CHECK(cudaMemset(d_dx.ptr, 0xff, d_dx.bytes));
      kc::bias_gelu_forward(d_x.as<bf16>(), d_bias.as<bf16>(), d_y.as<bf16>(), T, F, nullptr);
      kc::bias_gelu_backward(d_dy.as<bf16>(), d_x.as<bf16>(), d_bias.as<bf16>(), d_dx.as<bf16>(), T, F, nullptr);
      const std::vector<float> y = download_bf16(d_y, size_t(T * F)), dx = download_bf16(d_dx, size_t(T * F));

      std::vector<float> u(size_t(T * F)), y_ref(u.size()), dx_ref(u.size());
      for (int64_t t = 0; t < T; ++t)
        for (int64_t f = 0; f < F; ++f) u[t * F + f] = x.values[t * F + f] + bias.values[f];
      kernels::cpu::gelu_forward(u.data(), y_ref.data(), T * F, kernels::cpu::Gelu::Tanh);
      kernels::cpu::gelu_backward(u.data(), dy.values.data(), dx_ref.data(), T * F, kernels::cpu::Gelu::Tanh);
      const Comparison cf = compare(y, to_double(y_ref), kElementwiseTol);
      const Comparison cb = compare(dx, to_double(dx_ref), kElementwiseTol);
      r.pass = r.pass && cf.pass() && cb.pass();
      if (!r.figure.empty()) r.figure += "; ";
      r.figure += fmt("%lldx%lld (%s): fwd %s, bwd %s", (long long)T, (long long)F,
                      F % 8 == 0 ? "16-byte path" : "scalar path", describe(cf).c_str(), describe(cb).c_str());
    }
  });
}

// Fresh fp32 values (not rounded to bf16): accumulate-into gradient buffers start from these, so a
// kernel that overwrites instead of adding fails.
std::vector<float> random_f32(size_t n, uint64_t seed, const char* stream) {
  Rng rng(seed, stream);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(rng.normal());
  return v;
}

DeviceBuffer upload_f32(const std::vector<float>& v) {
  DeviceBuffer d(v.size() * sizeof(float));
  d.upload(v.data(), d.bytes);
  return d;
}

std::vector<float> download_f32(const DeviceBuffer& d, size_t n) {
  std::vector<float> v(n);
  d.download(v.data(), n * sizeof(float));
  return v;
}

DeviceBuffer upload_i64(const std::vector<int64_t>& v) {
  DeviceBuffer d(v.size() * sizeof(int64_t));
  d.upload(v.data(), d.bytes);
  return d;
}

// ---- LayerNorm forward and backward (bf16 y/dx against kElementwiseTol: one bf16 rounding of an
// fp32 result, y = xhat*gamma + beta and dx may cancel, hence the floor; fp32 statistics and
// parameter gradients against kFp32SumTol). T is not a multiple of the 128-row chunks, C not a
// multiple of the block width; x has a mean offset so the two-pass variance matters;
// zero_centered_gamma on the second shape.
CheckResult check_layernorm(uint64_t seed) {
  return guarded("layernorm fwd+bwd bf16, fp32 stats and dgamma/dbeta (laoyao kernels)", [&](CheckResult& r) {
    r.pass = true;
    struct Shape {
      int64_t T, C;
      bool zc;
    };
    for (const Shape sh : {Shape{1000, 1024, false}, Shape{77, 1000, true}}) {
      const int64_t T = sh.T, C = sh.C;
      const float eps = 1e-5f;
      const std::string tag = "doctor.layernorm." + std::to_string(C);
      const HostBf16 x = random_bf16(T * C, seed, (tag + ".x").c_str(), 2.0, 3.0);
      const HostBf16 gamma = random_bf16(C, seed, (tag + ".gamma").c_str(), 0.5, sh.zc ? 0.0 : 1.0);
      const HostBf16 beta = random_bf16(C, seed, (tag + ".beta").c_str(), 0.5);
      const HostBf16 dy = random_bf16(T * C, seed, (tag + ".dy").c_str());
      const std::vector<float> dg0 = random_f32(C, seed, (tag + ".dgamma0").c_str());
      const std::vector<float> db0 = random_f32(C, seed, (tag + ".dbeta0").c_str());
      DeviceBuffer d_x = upload(x), d_g = upload(gamma), d_b = upload(beta), d_dy = upload(dy);
      DeviceBuffer d_y(x.bytes()), d_dx(x.bytes()), d_mean(T * sizeof(float)), d_rstd(T * sizeof(float));
      DeviceBuffer d_dg = upload_f32(dg0), d_db = upload_f32(db0);
      DeviceBuffer d_scratch(kc::layernorm_backward_scratch_floats(T, C) * sizeof(float));
      LAOYAO_CUDA_CHECK(cudaMemset(d_y.ptr, 0xff, d_y.bytes));  // NaN poison: every output must be written
      LAOYAO_CUDA_CHECK(cudaMemset(d_dx.ptr, 0xff, d_dx.bytes));
      LAOYAO_CUDA_CHECK(cudaMemset(d_mean.ptr, 0xff, d_mean.bytes));
      LAOYAO_CUDA_CHECK(cudaMemset(d_rstd.ptr, 0xff, d_rstd.bytes));
      LAOYAO_CUDA_CHECK(cudaMemset(d_scratch.ptr, 0xff, d_scratch.bytes));
      kc::layernorm_forward(d_x.as<bf16>(), d_g.as<bf16>(), d_b.as<bf16>(), d_y.as<bf16>(), d_mean.as<float>(),
                            d_rstd.as<float>(), T, C, eps, sh.zc, nullptr);
      kc::layernorm_backward(d_dy.as<bf16>(), d_x.as<bf16>(), d_g.as<bf16>(), d_mean.as<float>(), d_rstd.as<float>(),
                             d_dx.as<bf16>(), d_dg.as<float>(), d_db.as<float>(), d_scratch.as<float>(), T, C, sh.zc,
                             nullptr);
      LAOYAO_CUDA_CHECK(cudaDeviceSynchronize());
      const std::vector<float> y = download_bf16(d_y, size_t(T * C)), dx = download_bf16(d_dx, size_t(T * C));
      const std::vector<float> mean = download_f32(d_mean, T), rstd = download_f32(d_rstd, T);
      const std::vector<float> dg = download_f32(d_dg, C), db = download_f32(d_db, C);

      std::vector<float> y_ref(size_t(T * C)), dx_ref(y_ref.size()), mean_ref(T), rstd_ref(T);
      std::vector<float> dg_ref = dg0, db_ref = db0;
      kernels::cpu::layernorm_forward(x.values.data(), gamma.values.data(), beta.values.data(), y_ref.data(),
                                      mean_ref.data(), rstd_ref.data(), T, C, eps, sh.zc);
      kernels::cpu::layernorm_backward(dy.values.data(), x.values.data(), gamma.values.data(), mean_ref.data(),
                                       rstd_ref.data(), dx_ref.data(), dg_ref.data(), db_ref.data(), T, C, sh.zc);
      const Comparison cy = compare(y, to_double(y_ref), kElementwiseTol);
      const Comparison cm = compare(mean, to_double(mean_ref), kFp32SumTol);
      const Comparison cr = compare(rstd, to_double(rstd_ref), kFp32SumTol);
      const Comparison cdx = compare(dx, to_double(dx_ref), kElementwiseTol);
      const Comparison cdg = compare(dg, to_double(dg_ref), kFp32SumTol);
      const Comparison cdb = compare(db, to_double(db_ref), kFp32SumTol);
      r.pass = r.pass && cy.pass() && cm.pass() && cr.pass() && cdx.pass() && cdg.pass() && cdb.pass();
      if (!r.figure.empty()) r.figure += "; ";
      r.figure += fmt("%lldx%lld%s: y %s, mean/rstd %.2f/%.2f, dx %s, dgamma %.2f, dbeta %.2f of tolerance",
                      (long long)T, (long long)C, sh.zc ? " (1p)" : "", describe(cy).c_str(), cm.worst_ratio,
                      cr.worst_ratio, describe(cdx).c_str(), cdg.worst_ratio, cdb.worst_ratio);
      if (!(cm.pass() && cr.pass() && cdg.pass() && cdb.pass()))
        r.figure += fmt(" [mean %s; rstd %s; dgamma %s; dbeta %s]", describe(cm).c_str(), describe(cr).c_str(),
                        describe(cdg).c_str(), describe(cdb).c_str());
    }
  });
}

// ---- cross entropy over GPT-2's padded vocabulary (50304): fp32 loss/lse against kFp32SumTol, the
// bf16 gradient (one rounding of an fp32 value) against kElementwiseTol. Logits with stddev 3 give
// a spread of probabilities; targets random (padded columns included); dloss random per token.
CheckResult check_cross_entropy(uint64_t seed) {
  const int64_t T = 37, V = 50304;
  return guarded(fmt("cross entropy fwd+bwd bf16 logits, V=%lld (laoyao kernels)", (long long)V), [&](CheckResult& r) {
    const HostBf16 logits = random_bf16(T * V, seed, "doctor.ce.logits", 3.0);
    const std::vector<float> dloss = random_f32(T, seed, "doctor.ce.dloss");
    Rng pick(seed, "doctor.ce.targets");
    std::vector<int64_t> targets(T);
    for (auto& t : targets) t = static_cast<int64_t>(pick.next_u64() % uint64_t(V));
    DeviceBuffer d_logits = upload(logits), d_targets = upload_i64(targets), d_dloss = upload_f32(dloss);
    DeviceBuffer d_loss(T * sizeof(float)), d_lse(T * sizeof(float));
    LAOYAO_CUDA_CHECK(cudaMemset(d_loss.ptr, 0xff, d_loss.bytes));
    LAOYAO_CUDA_CHECK(cudaMemset(d_lse.ptr, 0xff, d_lse.bytes));
    kc::cross_entropy_forward(d_logits.as<bf16>(), d_targets.as<int64_t>(), d_loss.as<float>(), d_lse.as<float>(), T,
                              V, nullptr);
    kc::cross_entropy_backward(d_logits.as<bf16>(), d_targets.as<int64_t>(), d_lse.as<float>(), d_dloss.as<float>(),
                               T, V, nullptr);
    LAOYAO_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> loss = download_f32(d_loss, T), lse = download_f32(d_lse, T);
    const std::vector<float> grad = download_bf16(d_logits, size_t(T * V));

    std::vector<float> loss_ref(T), lse_ref(T), grad_ref = logits.values;
    kernels::cpu::cross_entropy_forward(logits.values.data(), targets.data(), loss_ref.data(), lse_ref.data(), T, V);
    kernels::cpu::cross_entropy_backward(grad_ref.data(), targets.data(), lse_ref.data(), dloss.data(), T, V);
    const Comparison cl = compare(loss, to_double(loss_ref), kFp32SumTol);
    const Comparison cs = compare(lse, to_double(lse_ref), kFp32SumTol);
    const Comparison cg = compare(grad, to_double(grad_ref), kElementwiseTol);
    r.pass = cl.pass() && cs.pass() && cg.pass();
    r.figure = fmt("%lld tokens: loss %s; lse %s; dlogits %s", (long long)T, describe(cl).c_str(),
                   describe(cs).c_str(), describe(cg).c_str());
  });
}

// ---- embedding: word + position forward (bf16, one rounding of the fp32 sum: kElementwiseTol) and
// backward into fp32 gradients that start non-zero (kSameOrderTol). Ids drawn from 300 of the 5000
// rows so most rows repeat many times; positions t % s as Megatron's position_ids. The backward is
// run a second time from the same start and must reproduce the first bit for bit.
CheckResult check_embedding(uint64_t seed) {
  const int64_t b = 2, s = 1000, T = b * s, C = 768, rows = 5000, pos_rows = 1024;
  return guarded("embedding word+position fwd+bwd bf16, fp32 deterministic grads (laoyao kernels)",
                 [&](CheckResult& r) {
    const HostBf16 wte = random_bf16(rows * C, seed, "doctor.embedding.wte");
    const HostBf16 wpe = random_bf16(pos_rows * C, seed, "doctor.embedding.wpe");
    const HostBf16 dy = random_bf16(T * C, seed, "doctor.embedding.dy");
    const std::vector<float> dwte0 = random_f32(rows * C, seed, "doctor.embedding.dwte0");
    const std::vector<float> dwpe0 = random_f32(pos_rows * C, seed, "doctor.embedding.dwpe0");
    Rng pick(seed, "doctor.embedding.ids");
    std::vector<int64_t> ids(T), pos(T);
    for (int64_t t = 0; t < T; ++t) {
      ids[t] = static_cast<int64_t>((pick.next_u64() % 300) * 13 % uint64_t(rows));
      pos[t] = t % s;
    }
    DeviceBuffer d_ids = upload_i64(ids), d_pos = upload_i64(pos), d_wte = upload(wte), d_wpe = upload(wpe);
    DeviceBuffer d_dy = upload(dy), d_y(size_t(T * C) * sizeof(bf16));
    DeviceBuffer d_dwte = upload_f32(dwte0), d_dwpe = upload_f32(dwpe0);
    const size_t scratch_bytes =
        std::max(kc::embedding_backward_scratch_bytes(T, rows), kc::embedding_backward_scratch_bytes(T, pos_rows));
    DeviceBuffer d_scratch(scratch_bytes);
    LAOYAO_CUDA_CHECK(cudaMemset(d_y.ptr, 0xff, d_y.bytes));
    kc::embedding_forward(d_ids.as<int64_t>(), d_wte.as<bf16>(), d_pos.as<int64_t>(), d_wpe.as<bf16>(),
                          d_y.as<bf16>(), T, C, rows, pos_rows, nullptr);
    kc::embedding_backward(d_ids.as<int64_t>(), d_dy.as<bf16>(), d_dwte.as<float>(), T, C, rows, d_scratch.ptr,
                           scratch_bytes, nullptr);
    kc::embedding_backward(d_pos.as<int64_t>(), d_dy.as<bf16>(), d_dwpe.as<float>(), T, C, pos_rows, d_scratch.ptr,
                           scratch_bytes, nullptr);
    LAOYAO_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> y = download_bf16(d_y, size_t(T * C));
    const std::vector<float> dwte = download_f32(d_dwte, size_t(rows * C)), dwpe = download_f32(d_dwpe, size_t(pos_rows * C));
    // Determinism: the word-embedding backward again from the same starting gradient.
    d_dwte.upload(dwte0.data(), d_dwte.bytes);
    kc::embedding_backward(d_ids.as<int64_t>(), d_dy.as<bf16>(), d_dwte.as<float>(), T, C, rows, d_scratch.ptr,
                           scratch_bytes, nullptr);
    LAOYAO_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> dwte2 = download_f32(d_dwte, size_t(rows * C));
    const bool same = std::memcmp(dwte.data(), dwte2.data(), dwte.size() * sizeof(float)) == 0;

    std::vector<float> y_ref(size_t(T * C)), dwte_ref = dwte0, dwpe_ref = dwpe0;
    kernels::cpu::embedding_forward(ids.data(), wte.values.data(), y_ref.data(), T, C, rows, false);
    kernels::cpu::embedding_forward(pos.data(), wpe.values.data(), y_ref.data(), T, C, pos_rows, true);
    kernels::cpu::embedding_backward(ids.data(), dy.values.data(), dwte_ref.data(), T, C);
    kernels::cpu::embedding_backward(pos.data(), dy.values.data(), dwpe_ref.data(), T, C);
    const Comparison cy = compare(y, to_double(y_ref), kElementwiseTol);
    const Comparison cw = compare(dwte, to_double(dwte_ref), kSameOrderTol);
    const Comparison cp = compare(dwpe, to_double(dwpe_ref), kSameOrderTol);
    r.pass = cy.pass() && cw.pass() && cp.pass() && same;
    r.figure = fmt("%lld tokens, C=%lld: y %s; dwte %s; dwpe %s; rerun %s", (long long)T, (long long)C,
                   describe(cy).c_str(), describe(cw).c_str(), describe(cp).c_str(),
                   same ? "bitwise identical" : "DIFFERS");
  });
}

// ---- NCCL all-reduce over every visible GPU (one process, ncclCommInitAll), out of place, fp32
// sum of non-zero small integers (exact in fp32), every element of every rank checked exactly.
CheckResult check_allreduce(int ngpus, uint64_t seed) {
  const size_t count = size_t{16} << 20;  // 64 MiB per GPU
  return guarded(fmt("nccl all-reduce fp32 sum over %d GPUs, %zu MiB", ngpus, count * 4 >> 20), [&](CheckResult& r) {
    // This check needs no NVLink SHARP; keeping NCCL off multicast memory avoids a feature that can
    // disturb shared hosts. A value the user set is kept.
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    auto value = [&](int rank, size_t i) {
      uint64_t z = (seed ^ (uint64_t(rank) << 48)) + i * 0x9E3779B97F4A7C15ull;
      z = (z ^ (z >> 31)) * 0xBF58476D1CE4E5B9ull;
      const int v = int((z ^ (z >> 29)) % 16) - 8;  // -8..7, mapped to -8..-1, 1..8
      return float(v >= 0 ? v + 1 : v);
    };
    std::vector<float> expected(count, 0.0f), host(count);
    std::vector<DeviceBuffer> send(ngpus), recv(ngpus);
    std::vector<cudaStream_t> streams(ngpus, nullptr);
    std::vector<ncclComm_t> comms(ngpus, nullptr);
    std::vector<int> devs(ngpus);
    struct Cleanup {  // streams and communicators go even when a call throws
      std::vector<cudaStream_t>& s;
      std::vector<ncclComm_t>& c;
      ~Cleanup() {
        for (auto comm : c)
          if (comm) (void)ncclCommDestroy(comm);
        for (auto st : s)
          if (st) (void)cudaStreamDestroy(st);
      }
    } cleanup{streams, comms};
    for (int d = 0; d < ngpus; ++d) {
      devs[d] = d;
      for (size_t i = 0; i < count; ++i) {
        host[i] = value(d, i);
        expected[i] += host[i];
      }
      LAOYAO_CUDA_CHECK(cudaSetDevice(d));
      send[d] = DeviceBuffer(count * sizeof(float));
      recv[d] = DeviceBuffer(count * sizeof(float));
      send[d].upload(host.data(), count * sizeof(float));
      LAOYAO_CUDA_CHECK(cudaMemset(recv[d].ptr, 0xff, recv[d].bytes));
      LAOYAO_CUDA_CHECK(cudaStreamCreateWithFlags(&streams[d], cudaStreamNonBlocking));
    }
    LAOYAO_CUDA_CHECK(ncclCommInitAll(comms.data(), ngpus, devs.data()));
    auto all_reduce = [&] {
      LAOYAO_CUDA_CHECK(ncclGroupStart());
      for (int d = 0; d < ngpus; ++d)
        LAOYAO_CUDA_CHECK(ncclAllReduce(send[d].ptr, recv[d].ptr, count, ncclFloat, ncclSum, comms[d], streams[d]));
      LAOYAO_CUDA_CHECK(ncclGroupEnd());
      for (int d = 0; d < ngpus; ++d) {
        LAOYAO_CUDA_CHECK(cudaSetDevice(d));
        LAOYAO_CUDA_CHECK(cudaStreamSynchronize(streams[d]));
      }
    };
    all_reduce();  // the first call also sets up NCCL's channels
    constexpr int kRuns = 10;
    std::vector<double> seconds;
    for (int i = 0; i < kRuns; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      all_reduce();
      seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    size_t wrong = 0;
    for (int d = 0; d < ngpus; ++d) {
      LAOYAO_CUDA_CHECK(cudaSetDevice(d));
      recv[d].download(host.data(), count * sizeof(float));
      for (size_t i = 0; i < count; ++i) wrong += host[i] != expected[i];
    }
    const double t = median(seconds);
    const double algbw = double(count * sizeof(float)) / t * 1e-9;
    const double busbw = algbw * 2.0 * (ngpus - 1) / ngpus;
    r.pass = wrong == 0;
    r.figure = fmt("%zu of %zu elements differ from the exact sum; %.0f GB/s bus bandwidth (median of %d, %.2f ms)",
                   wrong, count * size_t(ngpus), busbw, kRuns, t * 1e3);
  });
}

std::string read_file_text(const char* path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void print(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);  // lines appear as checks finish, not all at the end
}

}  // namespace

int run_gpu_checks(const Options& options) {
  int ngpus = 0;
  const cudaError_t st = cudaGetDeviceCount(&ngpus);
  if (st != cudaSuccess || ngpus == 0) {
    (void)cudaGetLastError();
    print(no_gpu_line(true, st != cudaSuccess ? std::string(cudaGetErrorName(st)) + ": " + cudaGetErrorString(st)
                                              : "cudaGetDeviceCount found 0 devices"));
    return 1;
  }
  const uint64_t seed = options.seed;
  print(fmt("laoyao doctor: %d GPU%s visible; random inputs from --seed %llu", ngpus, ngpus == 1 ? "" : "s",
            (unsigned long long)seed));

  std::vector<CheckResult> results;
  auto report = [&](CheckResult r) {
    print(check_line(r));
    results.push_back(std::move(r));
  };

  // Versions: the binary's headers against the libraries the loader found.
  try {
    const kc::LibraryVersionCodes v = kc::library_version_codes();
    const std::string driver = nvidia_driver_version(read_file_text("/proc/driver/nvidia/version"));
    print(fmt("driver %s, supports CUDA %s", driver.empty() ? "(version unknown)" : driver.c_str(),
              to_string(cuda_version(v.driver), false).c_str()));
    print(version_line("CUDA runtime", cuda_version(v.cudart_compiled), cuda_version(v.cudart_loaded), false));
    print(version_line("cuBLASLt", cublaslt_version(v.cublaslt_compiled), cublaslt_version(v.cublaslt_loaded)));
    print(version_line("cuDNN", cudnn_version(v.cudnn_compiled), cudnn_version(v.cudnn_loaded)));
    print(version_line("NCCL", nccl_version(v.nccl_compiled), nccl_version(v.nccl_loaded)));
  } catch (const std::exception& e) {
    report({"library versions", false, e.what()});
  }

  // Shared inputs of the big GEMM (generated once, uploaded to each GPU).
  const HostBf16 gx = random_bf16(size_t(kGemmN * kGemmN), seed, "doctor.gemm.x");
  const HostBf16 gw = random_bf16(size_t(kGemmN * kGemmN), seed, "doctor.gemm.w");
  for (int d = 0; d < ngpus; ++d) {
    print(fmt("GPU %d: %s", d, cuda_device_summary(d).c_str()));
    try {
      LAOYAO_CUDA_CHECK(cudaSetDevice(d));
      kc::CublasLtGemm gemm;
      report(check_gemm(gemm, gx, gw, seed));
      report(check_gemm_bias(gemm, seed));
    } catch (const std::exception& e) {  // the handle or its workspace could not be made
      report({"cuBLASLt set-up", false, e.what()});
    }
    report(check_attention({2, 384, 8, 2, 64, AttentionKernel::Cudnn}, seed));  // GQA: 4 heads per group
    report(check_attention({2, 256, 4, 4, 128, AttentionKernel::Cudnn}, seed)); // MHA
    report(check_attention({2, 384, 8, 2, 64, AttentionKernel::Flash}, seed));
    report(check_attention({2, 256, 4, 4, 128, AttentionKernel::Flash}, seed));
    report(check_attention({2, 200, 4, 2, 128, AttentionKernel::Reference}, seed)); // a partial tile
    report(check_grouped_gemm(seed));
    report(check_bias_gelu(seed));
    report(check_layernorm(seed));
    report(check_cross_entropy(seed));
    report(check_embedding(seed));
  }
  if (ngpus >= 2)
    report(check_allreduce(ngpus, seed));
  else
    print("  (nccl all-reduce: needs 2 or more GPUs, 1 visible: not run)");
  print(summary_line(results));
  return exit_status(results);
}

}  // namespace laoyao::cli::doctor
#endif  // LAOYAO_HAVE_CUDA
