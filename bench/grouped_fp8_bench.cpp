// The routed experts' FP8 path (docs/fp8.md: CudaFp8Linears' grouped casts and FP8 grouped GEMMs)
// piece by piece beside the BF16 grouped GEMMs, at the flagship's shapes (hidden 1024, 64 experts,
// expert FFN 384 with SwiGLU: fc1 [768, 1024], fc2 [1024, 384]) over 65536 rows (two sequences of
// 4096 x top-8) with one hot expert at 8x the mean rows, as mock data routes them. For each linear:
// the forward (the input's grouped cast with the transpose the backward keeps, then the nt GEMM),
// the input gradient (the output gradient's cast with its transpose, then the nt GEMM over the
// weights' transposes with the split accumulator) and the weight gradient (the wgrad GEMM over the
// two transposes);
// each piece's median time (CUDA events, 3 warm-up calls, 20 timed), the GEMMs' TFLOP/s, and the
// BF16 grouped GEMM of the same problem. What the sum says against BF16 is what the step says.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <vector>

#include "bench/cuda_bench_util.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/device_buffer.hpp"
#include "kernels/cuda/fp8_cast.hpp"
#include "kernels/cuda/grouped_gemm.hpp"

using namespace laoyao;
using namespace laoyao::kernels::cuda;
using laoyao::bench::median_ms;
using laoyao::bench::random_bf16;

namespace {

constexpr int64_t kExperts = 64, kRows = 65536, kHot = 40;
constexpr int kReps = 20;

// 64 groups of 65536 rows: expert kHot 8x the mean (and the remainder), the others equal.
std::vector<int32_t> offsets_with_a_hot_expert() {
  const int64_t rest = (kRows - 8 * kRows / kExperts) / (kExperts - 1);
  std::vector<int32_t> off(kExperts + 1, 0);
  for (int64_t g = 0; g < kExperts; ++g)
    off[size_t(g) + 1] = off[size_t(g)] + int32_t(g == kHot ? kRows - rest * (kExperts - 1) : rest);
  return off;
}

double tflops(int64_t N, int64_t K, float ms) { return 2.0 * double(kRows) * double(N) * double(K) / (ms * 1e9); }

}  // namespace

int main() {
  laoyao::bench::read_runtime_options();
  if (!grouped_gemm_fp8_supported()) {
    std::printf("the FP8 grouped GEMMs run on Hopper only\n");
    return 2;
  }
  cudaStream_t stream;
  LAOYAO_CUDA_CHECK(cudaStreamCreate(&stream));
  const std::vector<int32_t> off = offsets_with_a_hot_expert();
  DeviceBuffer offsets(sizeof(int32_t) * off.size());
  offsets.upload(off.data(), offsets.bytes);
  const RowGroups groups{offsets.as<int32_t>(), kExperts, kExperts, kRows, 0};
  const int64_t ld = kRows;  // (a multiple of 16)

  constexpr int64_t kMaxWidth = 1024, kMaxWeight = 768 * 1024;
  DeviceBuffer x = random_bf16(kRows * kMaxWidth, "x"), dy = random_bf16(kRows * kMaxWidth, "dy", 1e-3);
  DeviceBuffer w = random_bf16(kExperts * kMaxWeight, "w", 0.02);
  DeviceBuffer y(sizeof(bf16) * kRows * kMaxWidth), dw(sizeof(float) * kExperts * kMaxWeight);
  DeviceBuffer xq(kRows * kMaxWidth), xqt(kRows * kMaxWidth), dyq(kRows * kMaxWidth), dyqt(kRows * kMaxWidth), wq(kExperts * kMaxWeight),
      wqt(kExperts * kMaxWeight);
  // Per-expert scales (every one 1: the values are what they are), inverses and amaxes.
  std::vector<float> ones(kExperts, 1.0f);
  DeviceBuffer scale(sizeof(float) * kExperts), inv(sizeof(float) * kExperts), amax(sizeof(float) * kExperts);
  scale.upload(ones.data(), scale.bytes);
  inv.upload(ones.data(), inv.bytes);
  LAOYAO_CUDA_CHECK(cudaMemset(amax.ptr, 0, amax.bytes));
  const Fp8Slots slots{scale.as<float>(), 1, inv.as<float>(), 1, amax.as<float>(), 1};
  const Fp8GroupScales sc{inv.as<float>(), inv.as<float>(), 1, 1};

  cudaDeviceProp prop{};
  LAOYAO_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, %lld experts, %lld rows (expert %lld at 8x the mean); ms, GEMMs' TFLOP/s in ()\n\n", prop.name,
              (long long)kExperts, (long long)kRows, (long long)kHot);
  // The casts' roofline: a device-to-device copy of x (bytes read plus bytes written a second).
  const size_t copy_bytes = sizeof(bf16) * kRows * kMaxWidth;
  const float copy_ms = median_ms(
      [&] { LAOYAO_CUDA_CHECK(cudaMemcpyAsync(y.ptr, x.ptr, copy_bytes, cudaMemcpyDeviceToDevice, stream)); }, stream,
      kReps);
  std::printf("device-to-device copy of %.0f MiB: %.3f ms, %.2f TB/s read + written\n\n", copy_bytes / 1048576.0,
              copy_ms, 2.0 * copy_bytes / (copy_ms * 1e9));
  std::printf("| linear | N | K | pass | FP8 cast(s) | FP8 GEMM | FP8 total | BF16 GEMM | FP8 / BF16 |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  struct Linear { const char* name; int64_t N, K; };
  for (const Linear& l : {Linear{"fc1", 768, 1024}, Linear{"fc2", 1024, 384}}) {
    const int64_t N = l.N, K = l.K;
    fp8_batched_cast_transpose(w.as<bf16>(), kExperts, N, K, slots, Fp8Format::E4M3, wq.as<uint8_t>(),
                               wqt.as<uint8_t>(), stream);
    // One pass: its FP8 cast(s), its FP8 GEMM and the BF16 GEMM of the same problem (n x k a row), timed.
    using Work = std::function<void()>;
    auto pass = [&](const char* name, const Work& cast, const Work& gemm, const Work& bf16_gemm, int64_t n, int64_t k) {
      const float c = cast ? median_ms(cast, stream, kReps) : 0.0f, g = median_ms(gemm, stream, kReps),
                  b = median_ms(bf16_gemm, stream, kReps);
      std::printf("| %s | %lld | %lld | %s | %.3f | %.3f (%.0f) | %.3f | %.3f (%.0f) | %.2f |\n", l.name,
                  (long long)N, (long long)K, name, c, g, tflops(n, k, g), c + g, b, tflops(n, k, b), (c + g) / b);
    };
    // A pass's operand cast with its transpose (in [rows][width] -> q, qt), and its FP8 nt GEMM
    // (a [rows][k] times the matrices b [n][k]^T, split accumulator or fast).
    auto cast = [&](DeviceBuffer& in, int64_t width, Fp8Format f, DeviceBuffer& q, DeviceBuffer& qt) -> Work {
      return [&, width, f] {
        fp8_grouped_cast_transpose(in.as<bf16>(), width, groups, slots, f, q.as<uint8_t>(), qt.as<uint8_t>(), ld,
                                   stream);
      };
    };
    auto fp8_nt = [&](DeviceBuffer& a, Fp8Format f, DeviceBuffer& b, int64_t n, int64_t k, bool split) -> Work {
      return [&, f, n, k, split] {
        grouped_gemm_fp8_nt(a.as<uint8_t>(), f, b.as<uint8_t>(), y.as<bf16>(), groups, n, k, sc, split, stream);
      };
    };
    // forward: y = x W^T
    pass("forward", cast(x, K, Fp8Format::E4M3, xq, xqt), fp8_nt(xq, Fp8Format::E4M3, wq, N, K, false),
         [&] { grouped_gemm_nt(x.as<bf16>(), w.as<bf16>(), y.as<bf16>(), groups, N, K, stream); }, N, K);
    // input gradient: dx = dy W (the output gradient's cast with its transpose, shared with dW)
    pass("input gradient", cast(dy, N, Fp8Format::E5M2, dyq, dyqt), fp8_nt(dyq, Fp8Format::E5M2, wqt, K, N, true),
         [&] { grouped_gemm_nn(dy.as<bf16>(), w.as<bf16>(), y.as<bf16>(), groups, N, K, stream); }, K, N);
    // weight gradient: dW (+)= dy^T x (both transposes from the casts above)
    pass("weight gradient", nullptr,
         [&] {
           grouped_gemm_fp8_wgrad(dyqt.as<uint8_t>(), Fp8Format::E5M2, xqt.as<uint8_t>(), ld, dw.as<float>(), groups,
                                  N, K, sc, true, stream);
         },
         [&] { grouped_gemm_wgrad(dy.as<bf16>(), x.as<bf16>(), dw.as<float>(), groups, N, K, true, stream); }, N, K);
  }
  LAOYAO_CUDA_CHECK(cudaStreamDestroy(stream));
  return 0;
}
