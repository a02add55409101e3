// Tensor parallelism on GPUs: two threads play the two ranks of TP=2, each with a GPU of its own
// and an NCCL group (with one GPU: both on it, meeting in a SharedDeviceGroup, whose collectives
// copy between their buffers), and train one micro-batch of a model split as Megatron-Core splits
// it. Every
// rank's per-token losses match the CPU reference model of the whole; the gradients, put back
// together from the shards, match the reference's; and every replicated tensor's gradient is the
// same bits on both ranks (the sums of finalize_grads). With dropout the ranks draw their slices
// of the whole model's masks, so the reference (one rank, on the CPU) draws the same masks.
// MoE layers (sequence parallel): every expert chosen, so that no near-tie can route a token
// differently from the reference and the comparison stays as tight as the dense one's; and top-2
// of 8 with a shared expert and a dense first layer, compared as the MoE model tests compare.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "core/runtime_options.hpp"
#include "core/device.hpp"
#include "dist/process_group.hpp"
#include "fp8_linear_keys.hpp"
#include "model/cuda/fp8_linears_cuda.hpp"
#include "model/cuda/gpt_model_cuda.hpp"
#include "model/gpt_layout.hpp"
#include "model/gpt_model.hpp"
#include "model/gpt_tp.hpp"
#include "model_cuda_test_util.hpp"
#include "moe_test_util.hpp"
#include "shared_device_group.hpp"

using namespace laoyao;
using namespace laoyao::model;
using namespace laoyao::model::test;

namespace {

struct TpCase {
  GptConfig config;
  bool dropout = false, sequence_parallel = false;
  int64_t b = 2, s = 48;
  bool routing_may_differ = false;  // MoE top-k < experts: a near-tie may route a token otherwise
};

void compare_tp(TpCase k) {
  constexpr int tp = 2;
  const bool shared_gpu = cuda_device_count() < tp;  // both ranks on GPU 0, copying between them
  if (!shared_gpu && !dist::gloo_built()) GTEST_SKIP() << "built without Gloo";
  GptConfig c = k.config;
  if (k.dropout) c.hidden_dropout = 0.1, c.attention_dropout = 0.1;
  c.sequence_parallel = k.sequence_parallel;

  GptModel cpu(c);
  random_weights(cpu, cpu.weights());
  const Batch x = random_batch(k.b, k.s, c.vocab);
  const std::vector<int32_t> key_start = c.document_attention ? documents_2x48() : std::vector<int32_t>{};
  const MicroBatch mb{x.b, x.s, x.tokens.data(), x.labels.data(), x.positions.data(),
                      key_start.empty() ? nullptr : key_start.data()};
  const DropoutKey key{1234, 5 * 1000003ull + 1, k.dropout};
  std::vector<float> cpu_loss(static_cast<size_t>(x.b * x.s));
  cpu.zero_grads();
  cpu.forward(mb, key, cpu_loss.data());
  cpu.backward(x.dloss.data());

  const ParameterTable local = build_gpt_parameters(tp_local_config(c, tp)).table;
  const auto dir = std::filesystem::temp_directory_path() / ("laoyao_tp_test_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const ScopedRuntimeOptions rendezvous([&](RuntimeOptions& o) { o.rendezvous_dir = dir.string(); });
  std::vector<std::vector<float>> losses(tp), grads(tp);
  std::vector<std::string> errors(tp);
  std::vector<std::string> paths(tp);
  std::vector<std::thread> ranks;
  auto meeting = std::make_shared<SharedDeviceGroup::Meeting>(tp);
  for (int r = 0; r < tp; ++r)
    ranks.emplace_back([&, r] {
      try {
        cuda_set_device(shared_gpu ? 0 : r);
        dist::RankEnv env;
        env.rank = r, env.world_size = tp, env.local_rank = r, env.local_world_size = tp;
        std::unique_ptr<dist::ProcessGroup> group;
        if (shared_gpu)
          group = std::make_unique<SharedDeviceGroup>(meeting, r);
        else
          group = dist::make_gpu_process_group(env, 1.0);
        std::vector<float> w(static_cast<size_t>(local.total));
        tp_shard(c, cpu.table(), cpu.weights(), local, w.data(), r, tp);
        CudaGptModel gpu(c, k.b, k.s, group.get());
        paths[r] = gpu.attention_path();
        gpu.upload_weights(w.data());
        gpu.zero_grads();
        gpu.forward(mb, x.mask.data(), key, x.dloss.data());
        gpu.backward();
        gpu.finalize_grads();
        losses[r] = gpu.download_losses();
        // At table offsets (PEFT's frozen base has no gradients: zeros).
        grads[r].assign(static_cast<size_t>(gpu.num_parameters()), 0.0f);
        gpu.download_grads(grads[r].data() + gpu.table().trainable_offset);
      } catch (const std::exception& e) {
        errors[r] = e.what();
        meeting->break_off();  // the other rank gives up rather than wait
      }
    });
  for (auto& t : ranks) t.join();
  std::filesystem::remove_all(dir);
  for (int r = 0; r < tp; ++r) ASSERT_EQ(errors[r], "") << "rank " << r;
  SCOPED_TRACE(std::string("attention: ") + paths[0]);

  // Every rank sees every token's loss (vocabulary-parallel cross entropy), the same bits.
  EXPECT_EQ(losses[0], losses[1]);
  int64_t off = 0;
  for (size_t t = 0; t < cpu_loss.size(); ++t)
    if (std::abs(losses[0][t] - cpu_loss[t]) > 3e-2) {
      ++off;
      if (!k.routing_may_differ) ADD_FAILURE() << "token " << t << ": " << losses[0][t] << " vs " << cpu_loss[t];
    }
  EXPECT_LE(off, static_cast<int64_t>(cpu_loss.size()) / 10) << "tokens off by more than 3e-2";

  for (const auto& p : local.specs) {
    if (tp_split_of(p.name, c) != TpSplit::Replicated) continue;
    for (int64_t i = 0; i < p.numel; ++i)
      ASSERT_EQ(grads[0][p.offset + i], grads[1][p.offset + i]) << p.name << " differs between the ranks at " << i;
  }
  std::vector<float> whole(static_cast<size_t>(cpu.num_parameters()));
  tp_unshard(c, cpu.table(), whole.data(), local, {grads[0].data(), grads[1].data()});
  // The trained parameters' (the CPU model's gradients start at its trainable_offset).
  const int64_t from = cpu.table().trainable_offset;
  EXPECT_LT(rel_err(whole.data() + from, cpu.grads(), cpu.num_trainable()), k.routing_may_differ ? 0.1 : 2e-2);
  // Where routing may differ, a token routed otherwise moves gradient between two experts: a few
  // routed tensors (an expert with few tokens) may be far off, not many; the rest stay close.
  int64_t routed = 0, routed_far = 0;
  for (const auto& p : cpu.table().specs) {
    if (p.frozen) continue;
    const double err = rel_err(whole.data() + p.offset, cpu.grads() + (p.offset - from), p.numel);
    const bool is_routed =
        p.name.find(".mlp.experts.") != std::string::npos || p.name.find(".mlp.router.") != std::string::npos;
    if (k.routing_may_differ && is_routed) {
      ++routed;
      if (err > 0.5) ++routed_far;
      EXPECT_LT(err, 1.0) << p.name;
    } else {
      EXPECT_LT(err, k.routing_may_differ ? 0.2 : 6e-2) << p.name;
    }
  }
  EXPECT_LE(routed_far, routed / 10) << "routed tensors more than 0.5 off";
}

// Llama's pieces with two query groups and head dim 64 (the flash kernels; cuDNN without dropout).
GptConfig llama_tp_config() {
  GptConfig c = llama_config();
  c.heads = 4, c.query_groups = 2, c.kv_channels = 64;
  return c;
}

}  // namespace

// GPT (LayerNorm, biases, learned positions, tied output), head dim 32: the unfused attention with
// the attention dropout of this rank's heads.
TEST(CudaGptModelTp, GptWithDropoutMatchesCpuModel) { compare_tp({small_config(4, 4), true, false}); }
TEST(CudaGptModelTp, GptSequenceParallelWithDropoutMatchesCpuModel) { compare_tp({small_config(4, 4), true, true}); }
TEST(CudaGptModelTp, GptWithoutDropoutMatchesCpuModel) { compare_tp({small_config(4, 4), false, true}); }  // cuDNN
// One sequence: the sequence-parallel collectives without the rearranging copies.
TEST(CudaGptModelTp, LlamaSequenceParallelOneSequenceFlashWithDropout) {
  compare_tp({llama_tp_config(), true, true, 1, 64});
}
TEST(CudaGptModelTp, LlamaSequenceParallelCudnn) { compare_tp({llama_tp_config(), false, true}); }
// --reset-attention-mask (documents_2x48): our flash kernels on each rank's heads.
TEST(CudaGptModelTp, LlamaDocumentsSequenceParallelFlashWithDropout) {
  GptConfig c = llama_tp_config();
  c.document_attention = true;
  compare_tp({c, true, true});
}
TEST(CudaGptModelTp, MoeEveryExpertSequenceParallel) {
  GptConfig c = moe_config(llama_tp_config(), 4, 4, 64, 0);
  c.moe.tensor_parallel = 2;
  compare_tp({c, false, true});
}
TEST(CudaGptModelTp, MoeTop2SharedExpertDenseFirstLayerWithDropout) {
  GptConfig c = moe_config(qwen3_config(), 8, 2, 64, 64);
  c.heads = 4, c.query_groups = 2, c.kv_channels = 64;
  c.num_layers = 3;
  c.moe.layers = {false, true, true};
  c.moe.tensor_parallel = 2;
  compare_tp({c, true, true, 2, 48, true});
}
// LoRA beside every linear (the whole adapter halves' gradients summed by finalize_grads), with its
// dropout on the sequence-parallel path.
TEST(CudaGptModelTp, LoraLlamaSequenceParallelWithDropout) {
  GptConfig c = llama_tp_config();
  LoraSpec lora;
  lora.dim = 8, lora.alpha = 16, lora.dropout = 0.1;
  c.lora = lora;
  compare_tp({c, true, true});
}
// Multi-latent attention: each rank's heads of the up projections, the down projections and
// latent norms whole on every rank (their gradients summed by finalize_grads).
TEST(CudaGptModelTp, MlaWithQueryLatentSequenceParallel) { compare_tp({mla_config(64), false, true}); }
TEST(CudaGptModelTp, MlaWithoutQueryLatent) { compare_tp({mla_config(0), false, false}); }
TEST(CudaGptModelTp, Qwen3QkLayernormWithFullRecomputation) {
  GptConfig c = qwen3_config();
  c.heads = 4, c.query_groups = 2, c.kv_channels = 64;
  c.recompute = Recompute::Uniform, c.recompute_num_layers = 1;
  compare_tp({c, false, true});
}

namespace {

// FP8 over TP=2 GPU ranks with sequence parallelism, the TP group also the amax group: each rank
// casts its own operands (the column-parallel linears' gathered inputs, the row-parallel ones' input
// columns, its weight shards, its output gradients; under MoE its experts' shards). Under delayed
// scaling the pass's amaxes are MAX-reduced over the ranks, so every weight's history holds the
// whole weight's amax, bit for bit the one-GPU FP8 model's, and both ranks hold the same state;
// under current (tensorwise) and block scaling each shard's scales are its own, as Transformer
// Engine's are. Losses and gradients against the one-GPU FP8 model's, and the delayed amaxes, within
// compare_fp8's bounds (fp8_model_cuda_test.cpp: a BF16 difference in a cast's input can move its
// FP8 value a whole step).
void compare_fp8_tp(GptConfig c, Fp8ScalingRecipe recipe) {
  constexpr int tp = 2;
  Fp8Spec fp8;
  fp8.recipe = recipe;
  if (recipe == Fp8ScalingRecipe::Delayed) fp8.amax_history_len = 4, fp8.amax_compute_algo = AmaxComputeAlgo::Max;
  c.fp8 = fp8;
  c.attention_backend = AttentionBackend::Flash;
  GptModel host(c);
  random_weights(host, host.weights());
  const Batch x = random_batch(2, 48, c.vocab);
  MicroBatch mb{x.b, x.s, x.tokens.data(), x.labels.data(), x.positions.data()};
  mb.is_first_microbatch = true;
  const DropoutKey key{1234, 1, false};
  GptConfig split = c;
  split.sequence_parallel = true;
  const GptParameterLayout local = build_gpt_parameters(tp_local_config(split, tp));
  // The FP8 linears of the whole model and of a rank's, in the same order.
  const std::vector<Fp8Key> whole_keys = fp8_linear_keys(c), local_keys = fp8_linear_keys(tp_local_config(split, tp));
  ASSERT_EQ(whole_keys.size(), local_keys.size());
  const bool delayed = recipe == Fp8ScalingRecipe::Delayed;

  CudaGptModel one(c, x.b, x.s);
  one.upload_weights(host.weights());
  one.zero_grads();
  one.forward(mb, x.mask.data(), key, x.dloss.data());
  one.backward();
  const std::vector<float> one_loss = one.download_losses();
  std::vector<float> one_grads(static_cast<size_t>(one.num_parameters()));
  one.download_grads(one_grads.data());

  std::vector<std::vector<float>> losses(tp), grads(tp);
  std::vector<std::vector<CudaFp8Linears::Scaling>> scaling(tp);
  const std::vector<std::string> errors = run_on_shared_gpu(tp, [&](int r, SharedDeviceGroup& group) {
    std::vector<float> w(static_cast<size_t>(local.table.total));
    tp_shard(split, host.table(), host.weights(), local.table, w.data(), r, tp);
    CudaGptModel gpu(split, x.b, x.s, &group);
    gpu.set_fp8_amax_group(&group);
    gpu.upload_weights(w.data());
    gpu.zero_grads();
    gpu.forward(mb, x.mask.data(), key, x.dloss.data());
    gpu.backward();
    gpu.finalize_grads();
    losses[size_t(r)] = gpu.download_losses();
    grads[size_t(r)].assign(static_cast<size_t>(gpu.num_parameters()), 0.0f);
    gpu.download_grads(grads[size_t(r)].data());
    for (const Fp8Key& k : local_keys)
      for (const bool backward : {false, true})
        if (delayed) scaling[size_t(r)].push_back(gpu.fp8_linears()->download_scaling(k.w, backward));
  });
  for (int r = 0; r < tp; ++r) ASSERT_EQ(errors[size_t(r)], "") << "rank " << r;

  EXPECT_EQ(losses[0], losses[1]);
  EXPECT_LT(rel_err(losses[0].data(), one_loss.data(), x.b * x.s), 1.5e-2);
  std::vector<float> unsharded(static_cast<size_t>(host.num_parameters()));
  tp_unshard(split, host.table(), unsharded.data(), local.table, {grads[0].data(), grads[1].data()});
  EXPECT_LT(rel_err(unsharded.data(), one_grads.data(), host.num_parameters()), 0.25);
  if (!delayed) return;
  size_t at = 0;
  for (const Fp8Key& k : whole_keys)
    for (const bool backward : {false, true}) {
      SCOPED_TRACE("linear at " + std::to_string(k.w) + (backward ? " backward" : " forward"));
      const CudaFp8Linears::Scaling want = one.fp8_linears()->download_scaling(k.w, backward);
      const CudaFp8Linears::Scaling& got = scaling[0][at];
      EXPECT_EQ(got.history, scaling[1][at].history) << "the ranks' reduced amaxes";
      EXPECT_EQ(got.scale, scaling[1][at].scale);
      ++at;
      ASSERT_EQ(got.history.size(), want.history.size());
      const size_t n = want.scale.size();
      const double tolerance = k.expert ? 0.5 : backward ? 0.3 : k.after_routing ? 0.15 : 0.08;
      for (size_t i = 0; i < got.history.size(); ++i) {
        const bool weight = !backward && i % n == 1;
        if (weight) {
          EXPECT_EQ(got.history[i], want.history[i]) << "the weight's amax, history entry " << i;
        } else if (want.history[i] != 0.0f) {
          EXPECT_LE(std::fabs(double(got.history[i]) - want.history[i]) / want.history[i], tolerance)
              << "history entry " << i << ": " << got.history[i] << " vs " << want.history[i];
        } else {
          EXPECT_EQ(got.history[i], 0.0f) << "history entry " << i;
        }
      }
    }
}

}  // namespace

TEST(CudaGptModelTp, Fp8DelayedScalingSequenceParallelMatchesOneGpu) {
  compare_fp8_tp(llama_tp_config(), Fp8ScalingRecipe::Delayed);
}
TEST(CudaGptModelTp, Fp8TensorwiseSequenceParallelMatchesOneGpu) {
  compare_fp8_tp(llama_tp_config(), Fp8ScalingRecipe::Tensorwise);
}
TEST(CudaGptModelTp, Fp8BlockwiseSequenceParallelMatchesOneGpu) {
  compare_fp8_tp(llama_tp_config(), Fp8ScalingRecipe::Blockwise);
}
// Every expert chosen (no near-tie can route a token otherwise), the experts and a shared expert
// split over the ranks: the experts' FP8 grouped GEMMs on each rank's shards.
TEST(CudaGptModelTp, Fp8MoeDelayedScalingSequenceParallelMatchesOneGpu) {
  GptConfig c = moe_config(llama_tp_config(), 4, 4, 64, 64);
  c.moe.tensor_parallel = 2;
  compare_fp8_tp(c, Fp8ScalingRecipe::Delayed);
}
// Whole experts under TP (--expert-tensor-parallel-size 1): each rank's sequence-parallel share of
// the tokens through every expert, the experts' amaxes reduced over the ranks.
TEST(CudaGptModelTp, Fp8MoeWholeExpertsDelayedScalingSequenceParallelMatchesOneGpu) {
  GptConfig c = moe_config(llama_tp_config(), 4, 4, 64, 64);
  c.moe.tensor_parallel = 2, c.moe.expert_tensor_parallel = 1;
  compare_fp8_tp(c, Fp8ScalingRecipe::Delayed);
}
