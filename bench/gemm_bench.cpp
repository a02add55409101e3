// The GEMMs of 8192-class layers (#5: "within 10% of cuBLASLt's own best for the shape"): each
// linear layer's forward, input-gradient and weight-gradient GEMM as the model issues them
// (CublasLtGemm: plans cached, the fastest of cuBLASLt's heuristic candidates kept on the first
// call), timed with CUDA events (median of 20), beside the same GEMM with the heuristic's first
// choice (LAOYAO_GEMM_AUTOTUNE=0) timed the same way: what the choice is worth. The kept algorithm
// is, by construction, the fastest of cuBLASLt's candidates as the first call timed them.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>

#include "bench/cuda_bench_util.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/device_buffer.hpp"
#include "kernels/cuda/gemm_cublaslt.hpp"

using namespace laoyao::kernels::cuda;
using laoyao::bench::median_ms;
using laoyao::bench::random_bf16;

int main() {
  laoyao::bench::read_runtime_options();
  struct Layer { const char* model; const char* name; int64_t T, K, N; };
  // Llama-3-8B at seq 8192 (SwiGLU fc1 is 2 x 14336 wide), and GPT-2 124M's 16 x 1024 tokens.
  const Layer layers[] = {{"llama3_8b", "qkv", 8192, 4096, 6144},    {"llama3_8b", "proj", 8192, 4096, 4096},
                          {"llama3_8b", "fc1", 8192, 4096, 28672},   {"llama3_8b", "fc2", 8192, 14336, 4096},
                          {"llama3_8b", "logits", 8192, 4096, 128256}, {"gpt2", "qkv", 16384, 768, 2304},
                          {"gpt2", "fc1", 16384, 768, 3072},         {"gpt2", "fc2", 16384, 3072, 768}};
  cudaStream_t stream;
  LAOYAO_CUDA_CHECK(cudaStreamCreate(&stream));
  std::printf("| layer | gemm | TFLOP/s (fastest candidate) | TFLOP/s (heuristic's first) | ratio | candidates | kept |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (const Layer& l : layers) {
    DeviceBuffer x = random_bf16(l.T * l.K, "x"), w = random_bf16(l.N * l.K, "w", 0.02);
    DeviceBuffer dy = random_bf16(l.T * l.N, "dy"), y(sizeof(__nv_bfloat16) * l.T * l.N);
    DeviceBuffer dx(sizeof(__nv_bfloat16) * l.T * l.K), dw(sizeof(float) * l.N * l.K);
    LAOYAO_CUDA_CHECK(cudaMemset(dw.ptr, 0, dw.bytes));
    const double flops = 2.0 * l.T * l.K * l.N;
    struct Kind { const char* name; std::function<void(CublasLtGemm&)> call; };
    const Kind kinds[] = {
        {"fwd", [&](CublasLtGemm& g) {
           g.linear_forward(x.as<__nv_bfloat16>(), w.as<__nv_bfloat16>(), nullptr, y.as<__nv_bfloat16>(), l.T, l.K,
                            l.N, stream);
         }},
        {"dgrad", [&](CublasLtGemm& g) {
           g.linear_backward_input(dy.as<__nv_bfloat16>(), w.as<__nv_bfloat16>(), dx.as<__nv_bfloat16>(), l.T, l.K,
                                   l.N, stream);
         }},
        {"wgrad", [&](CublasLtGemm& g) {
           g.linear_backward_weight(dy.as<__nv_bfloat16>(), x.as<__nv_bfloat16>(), dw.as<float>(), l.T, l.K, l.N,
                                    stream);
         }}};
    for (const Kind& k : kinds) {
      CublasLtGemm tuned;  // a fresh cache: the first call below chooses
      const float ms = median_ms([&] { k.call(tuned); }, stream, 20);
      const auto first_choice = [] {
        const laoyao::ScopedRuntimeOptions no_autotune([](laoyao::RuntimeOptions& o) { o.gemm_autotune = false; });
        return std::make_unique<CublasLtGemm>();
      }();
      CublasLtGemm& first = *first_choice;
      const float first_ms = median_ms([&] { k.call(first); }, stream, 20);
      const auto t = tuned.tunings().at(0);
      std::printf("| %s %s (T=%lld K=%lld N=%lld) | %s | %.0f | %.0f | %.2f | %d | #%d |\n", l.model, l.name,
                  (long long)l.T, (long long)l.K, (long long)l.N, k.name, flops / ms / 1e9, flops / first_ms / 1e9,
                  first_ms / ms, t.candidates, t.chosen);
    }
  }
  return 0;
}
