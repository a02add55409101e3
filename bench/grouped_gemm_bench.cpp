// The routed experts' grouped GEMMs (kernels/cuda/grouped_gemm.hpp) on the flagship MoE's shapes
// (hidden 1024, 64 experts, expert FFN 384 with SwiGLU: fc1 [768, 1024], fc2 [1024, 384]; 4096
// tokens x top-8 = 32768 permuted rows; 65536 in real training, ~1024 rows an expert): the forward
// of fc1 and fc2 (nt), both input gradients (nn) and both weight gradients (wgrad, accumulated
// into fp32), each with 64 groups of 512, 1024 and 4096 rows, with 64 random imbalanced groups
// of the first two totals and with one hot expert (8x the mean) among such groups (the last two
// totals). Beside our grouped kernel (one launch, the counts on the device), the same work
// through cuBLASLt (CublasLtGemm: plans cached, the fastest heuristic candidate kept): as one
// dense GEMM of all the rows with one weight (what a perfect grouped GEMM could reach; its wgrad
// writes one [N, K] dW instead of 64), and as a loop of 64 per-expert GEMMs with the counts known
// on the host (what a grouped GEMM replaces). Timed
// with CUDA events (3 warm-up calls, median of 20). The last column compares our output with the
// per-expert loop's (max |ours - loop| / max |loop|; wgrad from a zeroed dW): a large-scale sanity
// check, the tests (tests/model_cuda/grouped_gemm_test.cpp) being the real one. With --ours-only,
// only our kernels are timed (to compare variants quickly).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "bench/cuda_bench_util.hpp"
#include "core/rng.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/device_buffer.hpp"
#include "kernels/cuda/gemm_cublaslt.hpp"
#include "kernels/cuda/grouped_gemm.hpp"

using namespace laoyao::kernels::cuda;
using laoyao::bench::median_ms;
using laoyao::bench::random_bf16;

namespace {

constexpr int64_t kExperts = 64, kMaxRows = 262144, kMaxWidth = 1024, kMaxWeight = 768 * 1024;
constexpr int kReps = 20;

enum class Kind { Nt, Nn, Wgrad };

// How the rows fall on the experts: evenly, by lognormal weights (sigma 0.7), or with one hot
// expert (number 40) taking 8x the mean and the others lognormal: the flagship's busiest expert on
// mock data takes about 8x the mean (LAOYAO_MOE_PHASES, fifteenth session).
enum class Spread { Even, Lognormal, Hot };
constexpr int kHotExpert = 40;

// 64 counts summing to rows; the lognormal ones rounded down, the remainder to the largest group.
std::vector<int> group_counts(int64_t rows, Spread spread) {
  std::vector<int> c(kExperts, int(rows / kExperts));
  if (spread == Spread::Even) return c;
  laoyao::Rng rng(7, "bench.grouped_gemm.counts");
  std::vector<double> w(kExperts);
  double sum = 0;
  for (auto& x : w) sum += (x = std::exp(0.7 * rng.normal()));
  const int64_t hot = spread == Spread::Hot ? 8 * rows / kExperts : 0, rest = rows - hot;
  if (hot) sum -= w[kHotExpert];
  int64_t total = 0;
  for (int64_t g = 0; g < kExperts; ++g)
    total += (c[size_t(g)] = g == kHotExpert && hot ? int(hot) : int(std::floor(double(rest) * w[size_t(g)] / sum)));
  std::vector<int>::iterator largest = std::max_element(c.begin(), c.end());
  if (hot) largest = c.begin() + kHotExpert;
  *largest += int(rows - total);
  return c;
}

// max |a - b| / max |b| over n elements.
template <class T>
double rel_diff(const DeviceBuffer& a, const DeviceBuffer& b, int64_t n) {
  std::vector<T> ha(static_cast<size_t>(n)), hb(static_cast<size_t>(n));
  a.download(ha.data(), size_t(n) * sizeof(T));
  b.download(hb.data(), size_t(n) * sizeof(T));
  double diff = 0, ref = 0;
  for (size_t i = 0; i < size_t(n); ++i) {
    double x, y;
    if constexpr (sizeof(T) == 2) {
      x = double(__bfloat162float(ha[i])), y = double(__bfloat162float(hb[i]));
    } else {
      x = double(ha[i]), y = double(hb[i]);
    }
    diff = std::max(diff, std::abs(x - y));
    if (std::isnan(x - y)) diff = INFINITY;
    ref = std::max(ref, std::abs(y));
  }
  return ref > 0 ? diff / ref : diff;
}

}  // namespace

int main(int argc, char** argv) {
  laoyao::bench::read_runtime_options();
  const bool ours_only = argc > 1 && std::string(argv[1]) == "--ours-only";
  struct Shape { const char* name; Kind kind; int64_t N, K; };
  const Shape shapes[] = {{"fc1 fwd (nt)", Kind::Nt, 768, 1024},       {"fc2 fwd (nt)", Kind::Nt, 1024, 384},
                          {"fc2 dgrad (nn)", Kind::Nn, 1024, 384},     {"fc1 dgrad (nn)", Kind::Nn, 768, 1024},
                          {"fc1 wgrad", Kind::Wgrad, 768, 1024},       {"fc2 wgrad", Kind::Wgrad, 1024, 384}};
  cudaDeviceProp prop{};
  LAOYAO_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t stream;
  LAOYAO_CUDA_CHECK(cudaStreamCreate(&stream));

  // The activation operands (X or dY, and X of wgrad), the 64 weights, and the outputs (ours and
  // cuBLASLt's), sized for the largest shape.
  DeviceBuffer act = random_bf16(kMaxRows * kMaxWidth, "act"), act2 = random_bf16(kMaxRows * kMaxWidth, "act2");
  DeviceBuffer w = random_bf16(kExperts * kMaxWeight, "w", 0.02);
  DeviceBuffer y(sizeof(bf16) * kMaxRows * kMaxWidth), y_ref(sizeof(bf16) * kMaxRows * kMaxWidth);
  DeviceBuffer dw(sizeof(float) * kExperts * kMaxWeight), dw_ref(sizeof(float) * kExperts * kMaxWeight);
  DeviceBuffer offsets(sizeof(int32_t) * (kExperts + 1));
  CublasLtGemm lt;

  std::printf("%s, %lld experts; TFLOP/s = 2 rows N K / time\n\n", prop.name, (long long)kExperts);
  std::printf("| gemm | N | K | rows | groups | ours TFLOP/s | cuBLASLt dense TFLOP/s | "
              "cuBLASLt 64-GEMM loop TFLOP/s | ours / dense | ours / loop | max diff vs loop |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
  // 512 and 1024 rows an expert (32768 rows: 4096 tokens x top-8; 65536: micro-batches of 2 x 4096),
  // equal or not, and 4096 (micro-batches of 8 x 4096).
  const std::pair<int64_t, Spread> cases[] = {{32768, Spread::Even},    {32768, Spread::Lognormal},
                                              {65536, Spread::Even},    {65536, Spread::Lognormal},
                                              {65536, Spread::Hot},     {kMaxRows, Spread::Even},
                                              {kMaxRows, Spread::Hot}};
  for (const auto& c : cases) {
    const int64_t rows = c.first;
    const bool balanced = c.second == Spread::Even;
    const std::vector<int> counts = group_counts(rows, c.second);
    std::vector<int32_t> off(size_t(kExperts + 1), 0);
    for (int64_t g = 0; g < kExperts; ++g) off[size_t(g + 1)] = off[size_t(g)] + counts[size_t(g)];
    offsets.upload(off.data(), offsets.bytes);
    char groups[64];
    std::snprintf(groups, sizeof groups, balanced ? "64 x %d" : "64 in [%d, %d]",
                  *std::min_element(counts.begin(), counts.end()), *std::max_element(counts.begin(), counts.end()));
    for (const Shape& s : shapes) {
      const int64_t N = s.N, K = s.K;
      const bf16* a = act.as<bf16>();
      const bf16* b = act2.as<bf16>();
      const bf16* W = w.as<bf16>();
      const RowGroups o{offsets.as<int32_t>(), kExperts, kExperts, rows};
      const std::function<void()> ours = [&] {
        if (s.kind == Kind::Nt) grouped_gemm_nt(a, W, y.as<bf16>(), o, N, K, stream);
        if (s.kind == Kind::Nn) grouped_gemm_nn(a, W, y.as<bf16>(), o, N, K, stream);
        if (s.kind == Kind::Wgrad) grouped_gemm_wgrad(a, b, dw.as<float>(), o, N, K, true, stream);
      };
      const std::function<void()> dense = [&] {
        if (s.kind == Kind::Nt) lt.linear_forward(a, W, nullptr, y_ref.as<bf16>(), rows, K, N, stream);
        if (s.kind == Kind::Nn) lt.linear_backward_input(a, W, y_ref.as<bf16>(), rows, K, N, stream);
        if (s.kind == Kind::Wgrad) lt.linear_backward_weight(a, b, dw_ref.as<float>(), rows, K, N, stream);
      };
      const std::function<void()> loop = [&] {
        for (int64_t g = 0; g < kExperts; ++g) {
          const int64_t r0 = off[size_t(g)], n = counts[size_t(g)];
          if (n == 0) continue;
          const bf16* Wg = W + g * N * K;
          bf16* yg = y_ref.as<bf16>() + r0 * (s.kind == Kind::Nt ? N : K);
          if (s.kind == Kind::Nt) lt.linear_forward(a + r0 * K, Wg, nullptr, yg, n, K, N, stream);
          if (s.kind == Kind::Nn) lt.linear_backward_input(a + r0 * N, Wg, yg, n, K, N, stream);
          if (s.kind == Kind::Wgrad)
            lt.linear_backward_weight(a + r0 * N, b + r0 * K, dw_ref.as<float>() + g * N * K, n, K, N, stream);
        }
      };
      const double flops = 2.0 * double(rows) * double(N) * double(K);
      if (ours_only) {
        const float ours_ms = median_ms(ours, stream, kReps);
        std::printf("| %s | %lld | %lld | %lld | %s | %.0f | - | - | - | - | - |\n", s.name, (long long)N, (long long)K,
                    (long long)rows, groups, flops / ours_ms / 1e9);
        std::fflush(stdout);
        continue;
      }
      // Sanity: ours against the per-expert loop (which also builds and tunes the loop's plans).
      if (s.kind == Kind::Wgrad) {
        LAOYAO_CUDA_CHECK(cudaMemsetAsync(dw.ptr, 0, dw.bytes, stream));
        LAOYAO_CUDA_CHECK(cudaMemsetAsync(dw_ref.ptr, 0, dw_ref.bytes, stream));
      }
      ours();
      loop();
      LAOYAO_CUDA_CHECK(cudaStreamSynchronize(stream));
      const double diff = s.kind == Kind::Wgrad ? rel_diff<float>(dw, dw_ref, kExperts * N * K)
                                                : rel_diff<bf16>(y, y_ref, rows * (s.kind == Kind::Nt ? N : K));

      const float ours_ms = median_ms(ours, stream, kReps);
      const float dense_ms = median_ms(dense, stream, kReps);
      const float loop_ms = median_ms(loop, stream, kReps);
      std::printf("| %s | %lld | %lld | %lld | %s | %.0f | %.0f | %.0f | %.2f | %.2f | %.1e |\n", s.name,
                  (long long)N, (long long)K, (long long)rows, groups, flops / ours_ms / 1e9, flops / dense_ms / 1e9,
                  flops / loop_ms / 1e9, dense_ms / ours_ms, loop_ms / ours_ms, diff);
      std::fflush(stdout);
    }
  }
  LAOYAO_CUDA_CHECK(cudaStreamDestroy(stream));
  return 0;
}
