// `laoyao doctor --no-gpu` (see doctor.hpp).
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "cli/doctor.hpp"
#include "core/device.hpp"
#include "core/fp8.hpp"
#include "kernels/cpu/ops.hpp"
#ifdef LAOYAO_HAVE_CUDA
#include "kernels/cuda/library_versions.hpp"
#endif

namespace laoyao::cli::doctor {
namespace {

std::vector<float> random_values(size_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// y = x w^T by the CPU backend's GEMM against an fp64 loop.
CheckResult check_cpu_gemm(uint64_t seed) {
  const int64_t T = 67, K = 96, N = 80;
  std::mt19937_64 rng(seed);
  const auto x = random_values(size_t(T * K), rng), w = random_values(size_t(N * K), rng);
  const auto bias = random_values(size_t(N), rng);
  std::vector<float> y(size_t(T * N));
  kernels::cpu::linear_forward(x.data(), w.data(), bias.data(), y.data(), T, K, N);
  std::vector<double> ref(y.size());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) {
      double acc = bias[size_t(n)];
      for (int64_t k = 0; k < K; ++k) acc += double(x[size_t(t * K + k)]) * w[size_t(n * K + k)];
      ref[size_t(t * N + n)] = acc;
    }
  const Comparison c = compare(y, ref, {1e-5, 1e-6});
  return {"cpu gemm fp32 67x96x80 + bias", c.pass(), describe(c)};
}

// Causal attention (GQA: 4 heads in 2 groups) by the CPU backend against an fp64 softmax.
CheckResult check_cpu_attention(uint64_t seed) {
  const int64_t b = 2, s = 37, H = 4, G = 2, D = 16, Q = H / G, row = G * (Q + 2) * D;
  std::mt19937_64 rng(seed ^ 0x5a5a);
  const auto qkv = random_values(size_t(b * s * row), rng);
  const float scale = 1.0f / std::sqrt(float(D));
  std::vector<float> ctx(size_t(b * s * H * D)), probs(size_t(b * H * s * s));
  kernels::cpu::attention_forward(qkv.data(), ctx.data(), probs.data(), b, s, H, G, D, scale);
  std::vector<double> ref(ctx.size());
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / Q, q_col = (g * (Q + 2) + h % Q) * D, k_col = (g * (Q + 2) + Q) * D, v_col = k_col + D;
      for (int64_t i = 0; i < s; ++i) {
        std::vector<double> p(size_t(i + 1));
        double m = -INFINITY, sum = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < D; ++d)
            dot += double(qkv[size_t((bi * s + i) * row + q_col + d)]) * qkv[size_t((bi * s + j) * row + k_col + d)];
          p[size_t(j)] = dot * scale;
          m = std::max(m, p[size_t(j)]);
        }
        for (double& e : p) sum += (e = std::exp(e - m));
        for (int64_t d = 0; d < D; ++d) {
          double acc = 0;
          for (int64_t j = 0; j <= i; ++j) acc += p[size_t(j)] / sum * qkv[size_t((bi * s + j) * row + v_col + d)];
          ref[size_t((bi * s + i) * H * D + h * D + d)] = acc;
        }
      }
    }
  const Comparison c = compare(ctx, ref, {1e-5, 1e-6});
  return {"cpu causal attention fp32 b2 s37 H4 G2 D16", c.pass(), describe(c)};
}

// Every finite code of both FP8 formats cast back to itself through its value.
CheckResult check_fp8_casts() {
  int bad = 0, checked = 0;
  for (const Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2})
    for (int c = 0; c < 256; ++c) {
      const float v = fp8_to_float(uint8_t(c), f);
      if (!std::isfinite(v)) continue;
      ++checked;
      const uint8_t back = fp8_from_float(v, f);
      bad += back != c && !(v == 0.0f && (back & 0x7F) == 0);
    }
  return {"fp8 casts (E4M3, E5M2)", bad == 0,
          std::to_string(checked) + " finite codes, " + std::to_string(bad) + " not cast back to themselves"};
}

#ifdef LAOYAO_HAVE_CUDA
CheckResult check_library_versions() {
  try {
    const kernels::cuda::LibraryVersionCodes v = kernels::cuda::library_version_codes();
    const std::pair<Version, Version> libs[] = {
        {cuda_version(v.cudart_compiled), cuda_version(v.cudart_loaded)},
        {cublaslt_version(v.cublaslt_compiled), cublaslt_version(v.cublaslt_loaded)},
        {cudnn_version(v.cudnn_compiled), cudnn_version(v.cudnn_loaded)},
        {nccl_version(v.nccl_compiled), nccl_version(v.nccl_loaded)}};
    const char* names[] = {"CUDA runtime", "cuBLASLt", "cuDNN", "NCCL"};
    bool same = true;
    for (int i = 0; i < 4; ++i) {
      std::printf("%s\n", version_line(names[i], libs[i].first, libs[i].second, i > 0).c_str());
      same = same && !major_minor_differs(libs[i].first, libs[i].second);
    }
    return {"CUDA libraries loaded", same, same ? "the versions compiled against" : "a major.minor differs"};
  } catch (const std::exception& e) {
    return {"CUDA libraries loaded", false, e.what()};
  }
}

// The device code in the binary (nvcc's own list): Hopper's for the wgmma kernels, and any other
// architecture from sm_80 on runs the portable ones (docs/blackwell.md).
CheckResult check_device_code() {
  const std::vector<int> archs = kernels::cuda::compiled_cuda_architectures();
  std::string list;
  bool hopper = false, usable = !archs.empty();
  for (int a : archs) {
    list += (list.empty() ? "sm_" : ", sm_") + std::to_string(a / 10);
    hopper = hopper || a == 900;
    usable = usable && a >= 800;
  }
  return {"CUDA device code", hopper && usable,
          list + (hopper ? "" : " (no sm_90: the Hopper kernels are missing)") +
              "; the experts' grouped GEMMs: wgmma on sm_90, portable elsewhere"};
}
#endif

}  // namespace

int run_host_checks(const Options& options) {
  std::printf("laoyao doctor --no-gpu: the CUDA backend %s; random inputs from --seed %llu\n",
              cuda_backend_built() ? "is built" : "is not built (nvcc was not found when it was configured)",
              (unsigned long long)options.seed);
  std::vector<CheckResult> results;
  auto report = [&](CheckResult r) {
    std::printf("%s\n", check_line(r).c_str());
    results.push_back(std::move(r));
  };
#ifdef LAOYAO_HAVE_CUDA
  report(check_library_versions());
  report(check_device_code());
#endif
  report(check_cpu_gemm(options.seed));
  report(check_cpu_attention(options.seed));
  report(check_fp8_casts());
  std::printf("%s\n", summary_line(results).c_str());
  return exit_status(results);
}

}  // namespace laoyao::cli::doctor
