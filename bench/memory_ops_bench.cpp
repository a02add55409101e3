// The flagship MoE's memory-bound kernels, each alone, at its shapes (hidden 1024, 16 heads and 4
// query groups of 64, 64 experts, top-8, expert FFN 384 with SwiGLU; T = 2 x 4096 tokens, so
// N = 65536 permuted rows): the norms (RMSNorm forward and the fused backward adding into dx, and
// GPT-2 124M's LayerNorm both ways and its bias gradients at 16384 x 768 and x 3072; the QK norm
// with RoPE both ways), the permutation (the device sort, permute, combine with the residual, and
// their backward), SwiGLU both ways, the residual add, the optimizer's gradient norm and AdamW
// over fp32 parameters, and the cross entropy's training form (the flagship's and GPT-2's
// logits). Each is timed with CUDA events (3 warm-up calls, median of 20) and its traffic counted
// as each tensor read or written once (rows a kernel gathers several times are counted once: what
// a perfect kernel would move). Beside each,
// a device-to-device cudaMemcpyAsync moving the same bytes (half read, half written) in the same
// process: the ratio says how far the kernel is from the memory's speed. The model's phase timings
// (LAOYAO_MODEL_PHASES) run without CUDA graphs and include launch gaps; these do not.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <string>
#include <tuple>
#include <vector>

#include "bench/cuda_bench_util.hpp"
#include "core/rng.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/cuda/cross_entropy.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/device_buffer.hpp"
#include "kernels/cuda/elementwise.hpp"
#include "kernels/cuda/layernorm.hpp"
#include "kernels/cuda/moe.hpp"
#include "kernels/cuda/optimizer.hpp"
#include "kernels/cuda/qk_norm.hpp"
#include "kernels/cuda/rope.hpp"
#include "kernels/cuda/swiglu.hpp"

using namespace laoyao::kernels::cuda;
using laoyao::bench::median_ms;
using laoyao::bench::random_bf16;
using bf16 = __nv_bfloat16;

namespace {

constexpr int64_t kT = 8192, kH = 1024, kHeads = 16, kGroups = 4, kD = 64, kE = 64, kK = 8, kF = 384;
constexpr int64_t kN = kT * kK, kSeq = 4096;
constexpr int kReps = 20;

struct Row {
  std::string op;
  double bytes, ms;
};

// Top-8 of 64 distinct experts a token, uniformly at random (laoyao's generator), and the counts.
void random_routing(std::vector<int32_t>& topk, std::vector<int32_t>& counts) {
  laoyao::Rng rng(5, "bench.memory_ops.routing");
  topk.assign(size_t(kN), 0);
  counts.assign(size_t(kE), 0);
  std::vector<int32_t> experts(static_cast<size_t>(kE));
  for (int64_t t = 0; t < kT; ++t) {
    std::iota(experts.begin(), experts.end(), 0);
    for (int64_t j = 0; j < kK; ++j) {  // a partial Fisher-Yates shuffle
      const int64_t pick = j + int64_t(rng.next_u64() % uint64_t(kE - j));
      std::swap(experts[size_t(j)], experts[size_t(pick)]);
      topk[size_t(t * kK + j)] = experts[size_t(j)];
      ++counts[size_t(experts[size_t(j)])];
    }
  }
}

template <class T>
DeviceBuffer upload(const std::vector<T>& v) {
  DeviceBuffer d(sizeof(T) * v.size());
  d.upload(v.data(), d.bytes);
  return d;
}

}  // namespace

int main() {
  laoyao::bench::read_runtime_options();
  cudaStream_t stream = nullptr;
  LAOYAO_CUDA_CHECK(cudaStreamCreate(&stream));
  const int64_t slots = kHeads + 2 * kGroups, qkv_width = slots * kD;
  // Activations and parameters.
  DeviceBuffer x = random_bf16(kT * kH, "bench.memory_ops.x"), y(sizeof(bf16) * kT * kH),
               dy = random_bf16(kT * kH, "bench.memory_ops.dy"), dx = random_bf16(kT * kH, "bench.memory_ops.dx"),
               gamma = random_bf16(kH, "bench.memory_ops.gamma"), rstd(sizeof(float) * kT),
               dgamma(sizeof(float) * kH), norm_scratch(sizeof(float) * layernorm_backward_scratch_floats(kT, kH));
  DeviceBuffer qkv = random_bf16(kT * qkv_width, "bench.memory_ops.qkv"), qkv_out(sizeof(bf16) * kT * qkv_width),
               dqkv = random_bf16(kT * qkv_width, "bench.memory_ops.dqkv"),
               qg = random_bf16(kD, "bench.memory_ops.qg"), kg = random_bf16(kD, "bench.memory_ops.kg"),
               qk_rstd(sizeof(float) * kT * (kHeads + kGroups)), dqg(sizeof(float) * kD), dkg(sizeof(float) * kD),
               qk_scratch(sizeof(float) * qk_rmsnorm_backward_scratch_floats(kT, kHeads, kGroups, kD));
  LAOYAO_CUDA_CHECK(cudaMemset(dgamma.ptr, 0, dgamma.bytes));
  LAOYAO_CUDA_CHECK(cudaMemset(dqg.ptr, 0, dqg.bytes));
  LAOYAO_CUDA_CHECK(cudaMemset(dkg.ptr, 0, dkg.bytes));
  // RoPE as the flagship's (base 1e6, the whole head dim), its table on the device.
  laoyao::kernels::cpu::RopeParams rp;
  rp.rotary_base = 1000000.0;
  const laoyao::kernels::cpu::RopeTable table = laoyao::kernels::cpu::rope_table(kD, kSeq, rp);
  std::vector<float> cos_sin(table.cos);
  cos_sin.insert(cos_sin.end(), table.sin.begin(), table.sin.end());
  const DeviceBuffer rope_buf = upload(cos_sin);
  const RopeDeviceTable rope{rope_buf.as<float>(), rope_buf.as<float>() + table.cos.size(), table.rot_dim,
                             table.max_positions};
  // The routing, its permutation on the device, and the experts' buffers.
  std::vector<int32_t> topk, counts;
  random_routing(topk, counts);
  std::vector<float> probs(static_cast<size_t>(kN));
  {
    laoyao::Rng rng(6, "bench.memory_ops.probs");
    for (auto& p : probs) p = static_cast<float>(0.05 + 0.2 * rng.uniform());
  }
  const DeviceBuffer d_topk = upload(topk), d_counts = upload(counts), d_probs = upload(probs);
  DeviceBuffer offsets(sizeof(int32_t) * (kE + 1)), sorted_token(sizeof(int32_t) * kN),
      permuted_row(sizeof(int32_t) * kN), perm_scratch(moe_permutation_scratch_bytes(kT, kE)),
      permuted(sizeof(bf16) * kN * kH), expert_out = random_bf16(kN * kH, "bench.memory_ops.expert_out"),
      dexpert(sizeof(bf16) * kN * kH), dprobs(sizeof(float) * kN),
      u = random_bf16(kN * 2 * kF, "bench.memory_ops.u"), act(sizeof(bf16) * kN * kF),
      dact = random_bf16(kN * kF, "bench.memory_ops.dact"), du(sizeof(bf16) * kN * 2 * kF);
  auto permutation = [&] {
    moe_permutation(d_topk.as<int32_t>(), d_counts.as<int32_t>(), kT, kE, kK, offsets.as<int32_t>(),
                    sorted_token.as<int32_t>(), permuted_row.as<int32_t>(), perm_scratch.ptr, stream);
  };
  permutation();

  const double act_bytes = double(sizeof(bf16)) * kT * kH, rows_bytes = double(sizeof(bf16)) * kN * kH;
  const double qkv_bytes = double(sizeof(bf16)) * kT * qkv_width;
  const double u_bytes = double(sizeof(bf16)) * kN * 2 * kF, g_bytes = double(sizeof(bf16)) * kN * kF;
  std::vector<Row> rows;
  auto time = [&](const std::string& op, double bytes, const std::function<void()>& f) {
    rows.push_back({op, bytes, median_ms(f, stream, kReps)});
  };
  time("rmsnorm forward", 2 * act_bytes, [&] {
    rmsnorm_forward(x.as<bf16>(), gamma.as<bf16>(), y.as<bf16>(), rstd.as<float>(), kT, kH, 1e-6f, false, stream);
  });
  time("rmsnorm backward (+= dx)", 4 * act_bytes, [&] {
    rmsnorm_backward(dy.as<bf16>(), x.as<bf16>(), gamma.as<bf16>(), rstd.as<float>(), dx.as<bf16>(),
                     dgamma.as<float>(), norm_scratch.as<float>(), kT, kH, false, stream, true);
  });
  // GPT-2 124M's LayerNorm (#5's shape: 16 x 1024 tokens, hidden 768), both ways.
  constexpr int64_t kGptT = 16384, kGptH = 768;
  const double gpt_bytes = double(sizeof(bf16)) * kGptT * kGptH;
  DeviceBuffer gx = random_bf16(kGptT * kGptH, "bench.memory_ops.gpt2.x"), gy(sizeof(bf16) * kGptT * kGptH),
               gdy = random_bf16(kGptT * kGptH, "bench.memory_ops.gpt2.dy"),
               gdx = random_bf16(kGptT * kGptH, "bench.memory_ops.gpt2.dx"),
               ggamma = random_bf16(kGptH, "bench.memory_ops.gpt2.gamma"),
               gbeta = random_bf16(kGptH, "bench.memory_ops.gpt2.beta"), gmean(sizeof(float) * kGptT),
               grstd(sizeof(float) * kGptT), gdgamma(sizeof(float) * kGptH), gdbeta(sizeof(float) * kGptH),
               gscratch(sizeof(float) * layernorm_backward_scratch_floats(kGptT, kGptH));
  LAOYAO_CUDA_CHECK(cudaMemset(gdgamma.ptr, 0, gdgamma.bytes));
  LAOYAO_CUDA_CHECK(cudaMemset(gdbeta.ptr, 0, gdbeta.bytes));
  time("GPT-2 layernorm forward", 2 * gpt_bytes, [&] {
    layernorm_forward(gx.as<bf16>(), ggamma.as<bf16>(), gbeta.as<bf16>(), gy.as<bf16>(), gmean.as<float>(),
                      grstd.as<float>(), kGptT, kGptH, 1e-5f, false, stream);
  });
  time("GPT-2 layernorm backward (+= dx)", 4 * gpt_bytes, [&] {
    layernorm_backward(gdy.as<bf16>(), gx.as<bf16>(), ggamma.as<bf16>(), gmean.as<float>(), grstd.as<float>(),
                       gdx.as<bf16>(), gdgamma.as<float>(), gdbeta.as<float>(), gscratch.as<float>(), kGptT, kGptH,
                       false, stream, true);
  });
  // GPT-2's bias gradients: proj and fc2 (768 wide), fc1 (3072 wide).
  constexpr int64_t kGptF = 3072;
  DeviceBuffer gwide = random_bf16(kGptT * kGptF, "bench.memory_ops.gpt2.dwide"), gdb(sizeof(float) * kGptF),
               gbias_scratch(sizeof(float) * bias_grad_scratch_floats(kGptT, kGptF));
  LAOYAO_CUDA_CHECK(cudaMemset(gdb.ptr, 0, gdb.bytes));
  time("GPT-2 bias gradient, 768 wide", gpt_bytes, [&] {
    bias_grad(gdy.as<bf16>(), gdb.as<float>(), gbias_scratch.as<float>(), kGptT, kGptH, stream);
  });
  time("GPT-2 bias gradient, 3072 wide", gpt_bytes * kGptF / kGptH, [&] {
    bias_grad(gwide.as<bf16>(), gdb.as<float>(), gbias_scratch.as<float>(), kGptT, kGptF, stream);
  });
  time("QK norm + RoPE forward", 2 * qkv_bytes, [&] {
    qk_rmsnorm_forward(qkv.as<bf16>(), qg.as<bf16>(), kg.as<bf16>(), qkv_out.as<bf16>(), qk_rstd.as<float>(), kT,
                       kHeads, kGroups, kD, 1e-6f, false, stream, &rope, kSeq);
  });
  time("QK norm + RoPE backward (in place)", 3 * qkv_bytes, [&] {
    qk_rmsnorm_backward(dqkv.as<bf16>(), qkv.as<bf16>(), qg.as<bf16>(), kg.as<bf16>(), qk_rstd.as<float>(),
                        dqkv.as<bf16>(), dqg.as<float>(), dkg.as<float>(), qk_scratch.as<float>(), kT, kHeads, kGroups,
                        kD, false, stream, &rope, kSeq);
  });
  time("MoE permutation (device sort)", double(sizeof(int32_t)) * 3 * kN, permutation);
  time("MoE permute forward", act_bytes + rows_bytes, [&] {
    moe_permute_forward(x.as<bf16>(), sorted_token.as<int32_t>(), permuted.as<bf16>(), kN, kH, stream);
  });
  time("MoE combine + residual", rows_bytes + 2 * act_bytes, [&] {
    moe_unpermute_forward(expert_out.as<bf16>(), permuted_row.as<int32_t>(), d_probs.as<float>(), nullptr,
                          y.as<bf16>(), kT, kK, kH, stream, x.as<bf16>());
  });
  time("MoE combine backward (+ dprobs)", 2 * rows_bytes + act_bytes, [&] {
    moe_unpermute_backward(expert_out.as<bf16>(), permuted_row.as<int32_t>(), d_probs.as<float>(), dy.as<bf16>(),
                           dexpert.as<bf16>(), dprobs.as<float>(), kT, kK, kH, stream);
  });
  time("MoE permute backward (+= dx)", rows_bytes + 2 * act_bytes, [&] {
    moe_permute_backward(dexpert.as<bf16>(), permuted_row.as<int32_t>(), dx.as<bf16>(), kT, kK, kH, true, stream);
  });
  time("SwiGLU forward", u_bytes + g_bytes, [&] { swiglu_forward(u.as<bf16>(), act.as<bf16>(), kN, kF, stream); });
  time("SwiGLU backward", 2 * u_bytes + g_bytes,
       [&] { swiglu_backward(u.as<bf16>(), dact.as<bf16>(), du.as<bf16>(), kN, kF, stream); });
  // The optimizer's passes over fp32 parameters (Llama-3.2-1B has 1.5B: its step reads them twice):
  // the gradient norm over 64M gradients, and AdamW over 16M parameters (reads the parameter,
  // gradient and both moments, writes them back but the gradient, and the bf16 copy).
  constexpr int64_t kNormN = int64_t{64} << 20, kAdamN = int64_t{16} << 20;
  DeviceBuffer grads(sizeof(float) * kNormN), sum_scratch(sizeof(double) * (kReduceBlocks + 1));
  LAOYAO_CUDA_CHECK(cudaMemset(grads.ptr, 0x3c, grads.bytes));  // 0.0116 each, none zero
  time("grad norm (sum of squares), 64M fp32", double(sizeof(float)) * kNormN, [&] {
    sum_squares(grads.as<float>(), kNormN, sum_scratch.as<double>(), sum_scratch.as<double>() + kReduceBlocks,
                stream);
  });
  DeviceBuffer adam_p(sizeof(float) * kAdamN), adam_m(sizeof(float) * kAdamN), adam_v(sizeof(float) * kAdamN),
      adam_pb(sizeof(bf16) * kAdamN), adam_decay(static_cast<size_t>(kAdamN));
  for (DeviceBuffer* b : {&adam_p, &adam_m, &adam_v, &adam_decay}) LAOYAO_CUDA_CHECK(cudaMemset(b->ptr, 0, b->bytes));
  AdamWStep adam;
  adam.lr = 1e-4, adam.wd = 0.1, adam.step_size = 1e-3;
  time("AdamW step, 16M parameters", double(kAdamN) * (7 * sizeof(float) + sizeof(bf16) + 1), [&] {
    adamw_step(adam_p.as<float>(), grads.as<float>(), adam_m.as<float>(), adam_v.as<float>(), adam_pb.as<bf16>(),
               adam_decay.as<uint8_t>(), kAdamN, adam, stream);
  });
  // The cross entropy's training form in place over the logits (one read, one write counted): the
  // flagship's 8192 x 151936 and GPT-2's 16384 x 50304 (50257 padded), the row held by a cluster
  // of blocks and, with LAOYAO_CE_CLUSTER=0, read twice by one block.
  for (const auto& [name, rows_ce, vocab] : {std::tuple<const char*, int64_t, int64_t>{"flagship", kT, 151936},
                                             std::tuple<const char*, int64_t, int64_t>{"GPT-2", 16384, 50304}}) {
    // Constant logits (bf16 0x3c3c, 0.0115): drawing 1.2G random values on the host would take most
    // of the bench's time, and the kernel's work does not depend on them.
    DeviceBuffer logits(sizeof(bf16) * rows_ce * vocab), ce_loss(sizeof(float) * rows_ce),
                 ce_lse(sizeof(float) * rows_ce), ce_dloss(sizeof(float) * rows_ce),
                 ce_targets(sizeof(int64_t) * rows_ce);
    LAOYAO_CUDA_CHECK(cudaMemset(logits.ptr, 0x3c, logits.bytes));
    LAOYAO_CUDA_CHECK(cudaMemset(ce_targets.ptr, 0, ce_targets.bytes));
    LAOYAO_CUDA_CHECK(cudaMemset(ce_dloss.ptr, 0, ce_dloss.bytes));
    for (const bool cluster : {true, false}) {
      const laoyao::ScopedRuntimeOptions path([&](laoyao::RuntimeOptions& o) { o.ce_cluster = cluster; });
      time(std::string("cross entropy + gradient, ") + name + (cluster ? " (cluster)" : " (one block a row)"),
           2.0 * sizeof(bf16) * rows_ce * vocab, [&] {
             cross_entropy_forward_backward(logits.as<bf16>(), ce_targets.as<int64_t>(), ce_dloss.as<float>(),
                                            ce_loss.as<float>(), ce_lse.as<float>(), rows_ce, vocab, stream);
           });
    }
  }
  time("residual add", 3 * act_bytes,
       [&] { residual_dropout_add(dy.as<bf16>(), x.as<bf16>(), y.as<bf16>(), kT * kH, DropoutSpec{}, stream); });

  // The memory's speed here: a device-to-device copy of each row's bytes (half read, half written).
  double largest = 0;
  for (const Row& r : rows) largest = std::max(largest, r.bytes / 2);
  DeviceBuffer copy_src(size_t(largest) + 16), copy_dst(size_t(largest) + 16);
  LAOYAO_CUDA_CHECK(cudaMemset(copy_src.ptr, 0, copy_src.bytes));
  std::printf("| op | bytes moved (MB) | ms | GB/s | cudaMemcpy of the same bytes, GB/s | ours / memcpy |\n");
  std::printf("|---|---|---|---|---|---|\n");
  double total_ms = 0;
  for (const Row& r : rows) {
    const size_t half = size_t(r.bytes / 2) & ~size_t(15);
    const float copy_ms = median_ms(
        [&] { LAOYAO_CUDA_CHECK(cudaMemcpyAsync(copy_dst.ptr, copy_src.ptr, half, cudaMemcpyDeviceToDevice, stream)); },
        stream, kReps);
    const double gbs = r.bytes / (r.ms * 1e6), copy_gbs = 2.0 * double(half) / (double(copy_ms) * 1e6);
    std::printf("| %s | %.1f | %.4f | %.0f | %.0f | %.2f |\n", r.op.c_str(), r.bytes / 1e6, r.ms, gbs, copy_gbs,
                gbs / copy_gbs);
    total_ms += r.ms;
  }
  std::printf("\nSum of one call of each: %.3f ms (a flagship layer runs each of these once or twice a step)\n",
              total_ms);
  LAOYAO_CUDA_CHECK(cudaStreamDestroy(stream));
  return 0;
}
