// Where a BF16 training step's GPU time goes, op by op, for one GPT shape: each op of the CUDA model
// timed alone with CUDA events (median of 10 after warm-up), multiplied by how often a step runs it,
// with TFLOP/s for the GEMMs and attention.
//   laoyao_bench_step_breakdown [layers hidden heads ffn vocab seq micro_batch]   (GPT-2 124M default)
#include <cublasLt.h>
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
#include "kernels/cuda/bias_gelu.hpp"
#include "kernels/cuda/cross_entropy.hpp"
#include "bench/cuda_bench_util.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/device_buffer.hpp"
#include "kernels/cuda/elementwise.hpp"
#include "kernels/cuda/embedding.hpp"
#include "kernels/cuda/gemm_cublaslt.hpp"
#include "kernels/cuda/layernorm.hpp"
#include "kernels/cuda/optimizer.hpp"

using namespace laoyao;
using namespace laoyao::kernels::cuda;
using bf16 = __nv_bfloat16;
using laoyao::bench::random_bf16;

namespace {

cudaStream_t g_stream;



struct Row {
  std::string op;
  double ms_each;
  int64_t per_step;
  double flops_each;
};
std::vector<Row> g_rows;

void add(const std::string& op, int64_t per_step, double flops, const std::function<void()>& f) {
  g_rows.push_back({op, laoyao::bench::median_ms(f, g_stream, 10), per_step, flops});
}

}  // namespace

int main(int argc, char** argv) {
  laoyao::bench::read_runtime_options();
  int64_t L = 12, h = 768, H = 12, F = 3072, V = 50304, s = 1024, b = 16;
  if (argc == 8)
    L = std::atoll(argv[1]), h = std::atoll(argv[2]), H = std::atoll(argv[3]), F = std::atoll(argv[4]),
    V = std::atoll(argv[5]), s = std::atoll(argv[6]), b = std::atoll(argv[7]);
  const int64_t T = b * s, D = h / H;
  LAOYAO_CUDA_CHECK(cudaStreamCreate(&g_stream));
  CublasLtGemm gemm;
  DeviceBuffer x = random_bf16(T * std::max({h, F, 3 * h}), "x"), y = random_bf16(T * std::max({h, F, 3 * h}), "y");
  DeviceBuffer w = random_bf16(std::max(V, F) * std::max(h, F), "w", 0.02),
               bias = random_bf16(std::max({F, V, 3 * h}), "bias", 0.1);
  DeviceBuffer dw(sizeof(float) * std::max(V, F) * std::max(h, F));
  DeviceBuffer logits = random_bf16(T * V, "logits");
  DeviceBuffer scratch(sizeof(float) * std::max(bias_grad_scratch_floats(T, std::max(F, 3 * h)),
                                                layernorm_backward_scratch_floats(T, h)));
  DeviceBuffer stats(sizeof(float) * 4 * T), ids(sizeof(int64_t) * T);
  std::vector<int64_t> hid(T);
  for (int64_t t = 0; t < T; ++t) hid[t] = (t * 7919) % V;
  ids.upload(hid.data(), ids.bytes);
  auto X = x.as<bf16>(), Y = y.as<bf16>(), W = w.as<bf16>(), B = bias.as<bf16>();
  float* ST = stats.as<float>();

  struct Lin { const char* name; int64_t K, N; bool bias; int64_t per_step; };
  const Lin lins[] = {{"qkv", h, 3 * h, true, L}, {"proj", h, h, true, L}, {"fc1", h, F, false, L},
                      {"fc2", F, h, true, L}, {"logits", h, V, false, 1}};
  for (const Lin& l : lins) {
    const double fl = 2.0 * T * l.K * l.N;
    bf16* Y = l.N == V ? logits.as<bf16>() : y.as<bf16>();  // the logits need their own [T, V]
    // proj and fc2 add the residual in the GEMM (beta = 1), as the model does without dropout.
    const bool residual = l.N == h;
    add(std::string("gemm fwd ") + l.name, l.per_step, fl, [&] {
      gemm.linear_forward(X, W, l.bias ? B : nullptr, Y, T, l.K, l.N, g_stream, residual ? x.as<bf16>() : nullptr);
    });
    add(std::string("gemm dgrad ") + l.name, l.per_step, fl,
        [&] { gemm.linear_backward_input(Y, W, X, T, l.K, l.N, g_stream); });
    add(std::string("gemm wgrad ") + l.name, l.per_step, fl,
        [&] { gemm.linear_backward_weight(Y, X, dw.as<float>(), T, l.K, l.N, g_stream); });
    if (l.bias)
      add(std::string("bias grad ") + l.name, l.per_step, 0,
          [&] { bias_grad(Y, dw.as<float>(), scratch.as<float>(), T, l.N, g_stream); });
  }
  const AttentionShape a{b, s, H, H, D, 1.0f / std::sqrt(float(D))};
  const double attn_fwd = 4.0 * b * H * double(s) * s * D / 2;
  DeviceBuffer qkv = random_bf16(T * 3 * h, "qkv"), ctx = random_bf16(T * h, "ctx");
  DeviceBuffer dctx = random_bf16(T * h, "dctx");
  DeviceBuffer lse(sizeof(float) * b * H * s);
  // cuDNN's fused attention: the training path without attention dropout, as in this benchmark.
  CudnnAttention cudnn(a, g_stream);
  add("attention fwd (cudnn)", L, attn_fwd,
      [&] { cudnn.forward(qkv.as<bf16>(), ctx.as<bf16>(), lse.as<float>(), b); });
  add("attention bwd (cudnn)", L, 2.5 * attn_fwd, [&] {
    cudnn.backward(qkv.as<bf16>(), ctx.as<bf16>(), dctx.as<bf16>(), lse.as<float>(), x.as<bf16>(), b);
  });
  add("layernorm fwd", 2 * L + 1, 0,
      [&] { layernorm_forward(X, W, B, Y, ST, ST + T, T, h, 1e-5f, false, g_stream); });
  add("layernorm bwd (+ residual grad)", 2 * L + 1, 0, [&] {
    layernorm_backward(Y, X, W, ST, ST + T, X, dw.as<float>(), dw.as<float>() + h, scratch.as<float>(), T, h, false,
                       g_stream, true);
  });
  add("bias+gelu fwd", L, 0, [&] { bias_gelu_forward(X, B, Y, T, F, g_stream); });
  add("bias+gelu bwd", L, 0, [&] { bias_gelu_backward(Y, X, B, X, T, F, g_stream); });
  DeviceBuffer loss(sizeof(float) * T), dloss(sizeof(float) * T);
  LAOYAO_CUDA_CHECK(cudaMemset(dloss.ptr, 0, dloss.bytes));  // a zero gradient keeps the logits finite
  add("cross entropy fwd+bwd (fused)", 1, 0, [&] {
    cross_entropy_forward_backward(logits.as<bf16>(), ids.as<int64_t>(), dloss.as<float>(), loss.as<float>(), ST, T,
                                   V, g_stream);
  });
  const size_t emb_bytes = embedding_backward_scratch_bytes(T, V);
  DeviceBuffer emb_scratch(emb_bytes);
  add("embedding fwd", 1, 0,
      [&] { embedding_forward(ids.as<int64_t>(), W, ids.as<int64_t>(), W, Y, T, h, V, V, g_stream); });
  add("embedding bwd (word + position)", 2, 0, [&] {
    embedding_backward(ids.as<int64_t>(), Y, dw.as<float>(), T, h, V, emb_scratch.ptr, emb_bytes, g_stream);
  });
  const int64_t P = 12 * h * h * L + V * h + s * h;  // about the model's parameters
  DeviceBuffer p32(sizeof(float) * P), g32(sizeof(float) * P), m32(sizeof(float) * P), v32(sizeof(float) * P);
  DeviceBuffer pb(sizeof(bf16) * P), decay(P), red(sizeof(double) * (kReduceBlocks + 1));
  LAOYAO_CUDA_CHECK(cudaMemset(p32.ptr, 0, p32.bytes));
  LAOYAO_CUDA_CHECK(cudaMemset(g32.ptr, 0, g32.bytes));
  LAOYAO_CUDA_CHECK(cudaMemset(m32.ptr, 0, m32.bytes));
  LAOYAO_CUDA_CHECK(cudaMemset(v32.ptr, 0, v32.bytes));
  LAOYAO_CUDA_CHECK(cudaMemset(decay.ptr, 1, decay.bytes));
  add("zero grads", 1, 0, [&] { LAOYAO_CUDA_CHECK(cudaMemsetAsync(g32.ptr, 0, g32.bytes, g_stream)); });
  add("grad norm", 1, 0, [&] {
    sum_squares(g32.as<float>(), P, red.as<double>(), red.as<double>() + kReduceBlocks, g_stream);
  });
  AdamWStep st;
  st.lr = 1e-4, st.step_size = 1e-3, st.bc2_sqrt = 0.03;
  add("adamw", 1, 0, [&] {
    adamw_step(p32.as<float>(), g32.as<float>(), m32.as<float>(), v32.as<float>(), pb.as<bf16>(),
               decay.as<uint8_t>(), P, st, g_stream);
  });

  double total = 0;
  for (const Row& r : g_rows) total += r.ms_each * r.per_step;
  std::printf("step breakdown: L=%lld h=%lld H=%lld F=%lld V=%lld s=%lld b=%lld (ops timed alone)\n", (long long)L,
              (long long)h, (long long)H, (long long)F, (long long)V, (long long)s, (long long)b);
  std::printf("%-34s %9s %6s %9s %6s %8s\n", "op", "ms each", "x/step", "ms/step", "%", "TFLOP/s");
  std::vector<Row> rows = g_rows;
  std::sort(rows.begin(), rows.end(), [](const Row& p, const Row& q) { return p.ms_each * p.per_step > q.ms_each * q.per_step; });
  for (const Row& r : rows)
    std::printf("%-34s %9.3f %6lld %9.3f %5.1f%% %8.1f\n", r.op.c_str(), r.ms_each, (long long)r.per_step,
                r.ms_each * r.per_step, 100 * r.ms_each * r.per_step / total,
                r.flops_each > 0 ? r.flops_each / r.ms_each / 1e9 : 0.0);
  std::printf("%-34s %9s %6s %9.3f\n", "sum", "", "", total);
  return 0;
}
