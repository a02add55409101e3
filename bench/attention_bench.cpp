// Causal attention forward+backward TFLOP/s of laoyao's flash kernels on the shapes of
// shared/device.md, timed with CUDA events (median of 20 after warm-up). bench/attention_sdpa.py
// times PyTorch's scaled_dot_product_attention on the same shapes; bench/gpu_train_bench.sh prints
// both. FLOPs as FlashAttention counts them: forward 4*b*H*s*s*D/2 (causal), backward 2.5x that.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "core/rng.hpp"
#include "kernels/cuda/attention_cudnn.hpp"
#include "kernels/cuda/attention_flash.hpp"
#include "bench/cuda_bench_util.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/device_buffer.hpp"
#include "kernels/cuda/gemm_cublaslt.hpp"

using namespace laoyao;
using namespace laoyao::kernels::cuda;

int main(int argc, char** argv) {
  laoyao::bench::read_runtime_options();
  // G: query groups (G < H: grouped-query attention, the cuDNN path only; printed with G= so
  // bench/gpu_train_bench.sh's MHA rows beside SDPA stay as they were): the flagship MoE's and
  // Llama-3.2-1B's shapes after the MHA ones.
  struct Case { int64_t b, H, G, s, D; };
  const Case cases[] = {{16, 16, 16, 1024, 128}, {2, 16, 16, 8192, 128}, {16, 32, 32, 1024, 64},
                        {2, 32, 32, 8192, 64},   {2, 16, 4, 4096, 64},    {1, 32, 8, 8192, 64},
                        // The flagship at micro-batch 8, the same with every head its own k and v,
                        // and at micro-batch 4.
                        {8, 16, 4, 4096, 64},    {8, 16, 16, 4096, 64},   {4, 16, 4, 4096, 64}};
  cudaStream_t stream;
  LAOYAO_CUDA_CHECK(cudaStreamCreate(&stream));
  // --under-load: the cuDNN calls also timed one by one after an 8192^3 GEMM
  // (cudnn_after_gemm rows), to tell the GPU's state inside a step (clocks under sustained GEMM
  // load, caches) from the attention itself: the model's attention runs 10-12% under this bench.
  const bool under_load = argc > 1 && std::string(argv[1]) == "--under-load";
  constexpr int64_t kLoad = 8192;
  DeviceBuffer load_a = under_load ? laoyao::bench::random_bf16(kLoad * kLoad, "load.a") : DeviceBuffer();
  DeviceBuffer load_b = under_load ? laoyao::bench::random_bf16(kLoad * kLoad, "load.b", 0.01) : DeviceBuffer();
  DeviceBuffer load_c(under_load ? sizeof(__nv_bfloat16) * kLoad * kLoad : 0);
  CublasLtGemm gemm;
  const std::function<void()> load = [&] {
    gemm.linear_forward(load_a.as<__nv_bfloat16>(), load_b.as<__nv_bfloat16>(), nullptr, load_c.as<__nv_bfloat16>(),
                        kLoad, kLoad, kLoad, stream);
  };
  for (const Case& c : cases) {
    AttentionShape a{c.b, c.s, c.H, c.G, c.D, 1.0f / std::sqrt(static_cast<float>(c.D))};
    const int64_t T = c.b * c.s, row = (c.H + 2 * c.G) * c.D;
    const std::string shape = c.G == c.H ? "" : " G=" + std::to_string(c.G);
    DeviceBuffer qkv = laoyao::bench::random_bf16(T * row, "qkv");
    DeviceBuffer dctx = laoyao::bench::random_bf16(T * c.H * c.D, "dctx");
    DeviceBuffer ctx(sizeof(__nv_bfloat16) * T * c.H * c.D), dqkv(sizeof(__nv_bfloat16) * T * row);
    DeviceBuffer lse(sizeof(float) * c.b * c.H * c.s), delta(sizeof(float) * c.b * c.H * c.s);
    auto fwd = [&] {
      attention_flash_forward(qkv.as<__nv_bfloat16>(), ctx.as<__nv_bfloat16>(), lse.as<float>(), a, {}, stream);
    };
    auto bwd = [&] {
      attention_flash_backward(qkv.as<__nv_bfloat16>(), ctx.as<__nv_bfloat16>(), dctx.as<__nv_bfloat16>(),
                               lse.as<float>(), delta.as<float>(), dqkv.as<__nv_bfloat16>(), a, {}, stream);
    };
    const double fwd_flops = 4.0 * c.b * c.H * double(c.s) * c.s * c.D / 2;
    if (c.G == c.H) {
      const float f_ms = laoyao::bench::median_ms(fwd, stream, 20);
      const float fb_ms = laoyao::bench::median_ms([&] { fwd(); bwd(); }, stream, 20);
      std::printf("ATTN laoyao b=%lld H=%lld s=%lld D=%lld fwd_TFLOPs=%.1f fwdbwd_TFLOPs=%.1f\n", (long long)c.b,
                  (long long)c.H, (long long)c.s, (long long)c.D, fwd_flops / f_ms / 1e9,
                  3.5 * fwd_flops / fb_ms / 1e9);
      if (c.s >= 4096) {  // --reset-attention-mask: documents of 1024 tokens; FLOPs of their causal blocks
        constexpr int64_t kDoc = 1024;
        std::vector<int32_t> first(T);
        for (int64_t t = 0; t < T; ++t) first[t] = static_cast<int32_t>((t % c.s) / kDoc * kDoc);
        DeviceBuffer key_start(sizeof(int32_t) * T);
        LAOYAO_CUDA_CHECK(cudaMemcpy(key_start.ptr, first.data(), sizeof(int32_t) * T, cudaMemcpyHostToDevice));
        AttentionShape whole = a;
        a.key_start = key_start.as<int32_t>();
        const float df_ms = laoyao::bench::median_ms(fwd, stream, 20);
        const float dfb_ms = laoyao::bench::median_ms([&] { fwd(); bwd(); }, stream, 20);
        const double doc_flops = fwd_flops * kDoc / c.s;
        std::printf("ATTN_DOCS laoyao b=%lld H=%lld s=%lld D=%lld documents=%lld fwd_TFLOPs=%.1f fwdbwd_TFLOPs=%.1f "
                    "(fwd+bwd %.3f ms, %.1fx faster than the whole sequence)\n",
                    (long long)c.b, (long long)c.H, (long long)c.s, (long long)c.D, (long long)kDoc,
                    doc_flops / df_ms / 1e9, 3.5 * doc_flops / dfb_ms / 1e9, dfb_ms, fb_ms / dfb_ms);
        a = whole;
      }
    }
    // The same through cuDNN's fused attention (our graphs), the `--attention-backend fused` path.
    CudnnAttention cudnn(a, stream);
    auto cfwd = [&] { cudnn.forward(qkv.as<__nv_bfloat16>(), ctx.as<__nv_bfloat16>(), lse.as<float>(), c.b); };
    auto cbwd = [&] {
      cudnn.backward(qkv.as<__nv_bfloat16>(), ctx.as<__nv_bfloat16>(), dctx.as<__nv_bfloat16>(), lse.as<float>(),
                     dqkv.as<__nv_bfloat16>(), c.b);
    };
    const float cf_ms = laoyao::bench::median_ms(cfwd, stream, 20);
    const float cfb_ms = laoyao::bench::median_ms([&] { cfwd(); cbwd(); }, stream, 20);
    std::printf("ATTN cudnn b=%lld H=%lld%s s=%lld D=%lld fwd_TFLOPs=%.1f fwdbwd_TFLOPs=%.1f (%s)\n", (long long)c.b,
                (long long)c.H, shape.c_str(), (long long)c.s, (long long)c.D, fwd_flops / cf_ms / 1e9,
                3.5 * fwd_flops / cfb_ms / 1e9, cudnn.engines().c_str());
    if (under_load) {  // each call timed alone after a large GEMM, as inside a training step
      const float lf_ms = laoyao::bench::median_ms(cfwd, stream, 20, load);
      const float lb_ms = laoyao::bench::median_ms(cbwd, stream, 20, [&] { load(); cfwd(); });
      const float b_ms = laoyao::bench::median_ms(cbwd, stream, 20, cfwd);
      std::printf("ATTN cudnn_after_gemm b=%lld H=%lld%s s=%lld D=%lld fwd_TFLOPs=%.1f bwd_TFLOPs=%.1f "
                  "(bwd after its forward alone: %.1f)\n",
                  (long long)c.b, (long long)c.H, shape.c_str(), (long long)c.s, (long long)c.D,
                  fwd_flops / lf_ms / 1e9, 2.5 * fwd_flops / lb_ms / 1e9, 2.5 * fwd_flops / b_ms / 1e9);
    }
  }
  return 0;
}
