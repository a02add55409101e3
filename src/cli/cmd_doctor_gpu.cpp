// `laoyao doctor` on the GPUs: executes a cuBLASLt GEMM, the attention forward and backward, the
// fused bias+GeLU and (with two or more GPUs) an NCCL all-reduce, compares each with a CPU
// reference on fresh random inputs, and prints one line per check. Built only with CUDA.
#ifdef LAOYAO_HAVE_CUDA
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstdarg>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "cli/doctor.hpp"
#include "core/device.hpp"
#include "core/rng.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/cuda/attention_reference.hpp"
#include "kernels/cuda/bias_gelu.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/device_buffer.hpp"
#include "kernels/cuda/gemm_cublaslt.hpp"
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

// ---- attention forward and backward against the CPU op (kernels/cpu/attention.cpp).
struct AttentionCase {
  int64_t b, s, H, G, D;
};

CheckResult check_attention(const AttentionCase& a, uint64_t seed) {
  const std::string name =
      fmt("attention causal bf16 fwd+bwd D=%lld (b=%lld s=%lld heads=%lld groups=%lld; laoyao reference kernel)",
          (long long)a.D, (long long)a.b, (long long)a.s, (long long)a.H, (long long)a.G);
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
    kc::attention_reference_forward(d_qkv.as<bf16>(), d_ctx.as<bf16>(), d_lse.as<float>(), shape, nullptr);
    kc::attention_reference_backward(d_qkv.as<bf16>(), d_ctx.as<bf16>(), d_dctx.as<bf16>(), d_lse.as<float>(),
                                     d_delta.as<float>(), d_dqkv.as<bf16>(), shape, nullptr);
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
    r.figure = "vs CPU: ctx " + describe(cf) + "; dqkv " + describe(cb);
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
    report(check_attention({2, 384, 8, 2, 64}, seed));   // GQA: 4 heads per group
    report(check_attention({2, 256, 4, 4, 128}, seed));  // MHA
    report(check_bias_gelu(seed));
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
