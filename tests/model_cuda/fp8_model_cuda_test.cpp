// The CUDA model's FP8 linear layers (model/cuda/fp8_linears_cuda.hpp) against the CPU model's
// simulation of the same Fp8Spec (model/cpu/fp8_linears_cpu.hpp): three steps of two micro-batches,
// the weights cast on each step's first, through the CUDA graphs' warm-up, capture and replay.
//
// The GPU's activations are bf16 where the CPU's are fp32, and FP8's rounding magnifies that: a
// value near a rounding boundary takes the neighbouring FP8 value (E5M2's steps are 12-25%), and in
// these small models that moves the gradients about as far as FP8 itself does. Measured on the CPU
// model alone: nudging its word embedding by a bf16 rounding's size (0.1%) moves its FP8 gradients
// by 11-12% (FP8 against high precision: 13%), its losses by 0.5% (FP8's effect: 0.9%), its input
// amaxes by up to 2.3% and its output gradients' amaxes by up to 9.6%; the weights' amaxes not at
// all. So the checks are: what bf16 cannot move is equal bit for bit (every weight's delayed-scaling
// history and scale, and under tensorwise scaling, whose scales keep no state, every step's losses
// and gradients equal the first step's: eager, captured and replayed alike); the rest within those
// measured bounds; and FP8 visibly applied (the gradients' distance from the high-precision CPU
// model's well above bf16's own 1%). GPU only.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/runtime_options.hpp"
#include "fp8_linear_keys.hpp"
#include "model/cuda/fp8_linears_cuda.hpp"
#include "model/gpt_layout.hpp"
#include "model_cuda_test_util.hpp"
#include "moe_test_util.hpp"
#include "shared_device_group.hpp"

namespace laoyao::model::test {
namespace {

GptConfig with_fp8(GptConfig c, Fp8ScalingRecipe recipe) {
  Fp8Spec s;
  s.recipe = recipe;
  if (recipe == Fp8ScalingRecipe::Delayed) s.amax_history_len = 4, s.amax_compute_algo = AmaxComputeAlgo::Max;
  c.fp8 = s;
  return c;
}

// The relative difference of a GPU scaling value from the CPU's (an amax of 0 is equal only to 0).
void expect_within(float gpu, float cpu, double tolerance, const std::string& what) {
  if (cpu == 0.0f)
    EXPECT_EQ(gpu, 0.0f) << what;
  else
    EXPECT_LE(std::fabs(double(gpu) - cpu) / cpu, tolerance) << what << ": " << gpu << " vs " << cpu;
}

// Every FP8 linear's delayed-scaling state against the CPU model's: the weights' bit for bit, the
// inputs' and output gradients' within the bounds the header measured (with room for bf16 at every
// layer, not only the embedding). A routed expert's amaxes are maxima over its own rows, fewer,
// and a token whose top-k is a near-tie can take other experts on the GPU than on the CPU: its
// inputs' and output gradients' within 50% (measured on an H100: up to 36%). The tokens those
// other experts serve carry it into the next layers: their linears' inputs within 15% (measured on
// an H100: 8.0%, a linear of the second of two MoE layers).
void expect_scaling(const GptModel& cpu, const CudaGptModel& gpu, const GptConfig& c) {
  const int64_t len = c.fp8->amax_history_len;
  for (const auto& [w, expert, after_routing] : fp8_linear_keys(c))
    for (const bool backward : {false, true}) {
      SCOPED_TRACE("linear at " + std::to_string(w) + (backward ? " backward" : " forward"));
      const DelayedScaling* want =
          backward ? cpu.fp8_linears()->backward_scaling(w) : cpu.fp8_linears()->forward_scaling(w);
      ASSERT_NE(want, nullptr);
      const CudaFp8Linears::Scaling got = gpu.fp8_linears()->download_scaling(w, backward);
      const int64_t k = want->size();
      ASSERT_EQ(static_cast<int64_t>(got.scale.size()), k);
      for (int64_t i = 0; i < k; ++i) {
        const bool weight = !backward && i == 1;
        const double tolerance = weight ? 0.0 : expert ? 0.5 : backward ? 0.3 : after_routing ? 0.15 : 0.08;
        const std::string tensor = weight ? "weight" : backward ? "output gradient" : "input";
        EXPECT_GT(want->history(len - 1, i), 0.0f) << tensor;
        if (weight) {
          EXPECT_EQ(got.scale[static_cast<size_t>(i)], want->scale(i)) << "weight scale";
        } else {
          expect_within(got.scale[static_cast<size_t>(i)], want->scale(i), tolerance, tensor + " scale");
        }
        for (int64_t r = 0; r < len; ++r)
          expect_within(got.history[static_cast<size_t>(r * k + i)], want->history(r, i), tolerance,
                        tensor + " history row " + std::to_string(r));
      }
    }
}

void compare_fp8(const GptConfig& c) {
  CpuAndGpuModels models(c);
  GptModel& cpu = models.cpu;
  CudaGptModel& gpu = models.gpu;
  GptConfig high = c;
  high.fp8.reset();
  GptModel cpu_high(high);
  std::copy(cpu.weights(), cpu.weights() + cpu.num_parameters(), cpu_high.weights());
  const int64_t n = cpu.num_trainable();  // (the gradients: of the adapters alone under LoRA)
  ASSERT_EQ(gpu.num_trainable(), n);
  // (tensorwise and blockwise keep no scaling state: a replayed step repeats the first)
  const bool tensorwise = c.fp8->recipe != Fp8ScalingRecipe::Delayed;
  std::vector<Batch> batches = {random_batch(2, 48, c.vocab, 21), random_batch(2, 48, c.vocab, 22)};
  std::vector<std::vector<float>> first_losses, first_grads(1);
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    cpu.zero_grads(), cpu_high.zero_grads(), gpu.zero_grads();
    for (int m = 0; m < 2; ++m) {
      const Batch& x = batches[static_cast<size_t>(m)];
      MicroBatch mb{x.b, x.s, x.tokens.data(), x.labels.data(), x.positions.data()};
      mb.is_first_microbatch = m == 0;
      if (c.mtp_num_layers > 0) mb.loss_mask = x.mask.data();  // (MTP rolls it)
      const DropoutKey key{1234, static_cast<uint64_t>(step * 2 + m), true};
      std::vector<float> cpu_loss(static_cast<size_t>(x.b * x.s)), high_loss(cpu_loss.size());
      cpu.forward(mb, key, cpu_loss.data(), true);
      cpu.backward(x.dloss.data());
      cpu_high.forward(mb, key, high_loss.data(), true);
      cpu_high.backward(x.dloss.data());
      gpu.forward(mb, x.mask.data(), key, x.dloss.data());
      gpu.backward();
      const std::vector<float> gpu_loss = gpu.download_losses();
      double worst = 0;
      for (size_t t = 0; t < cpu_loss.size(); ++t) worst = std::max(worst, std::fabs(double(gpu_loss[t]) - cpu_loss[t]));
      EXPECT_LT(worst, 0.3) << "micro-batch " << m;
      EXPECT_LT(rel_err(gpu_loss.data(), cpu_loss.data(), x.b * x.s), 1.5e-2) << "micro-batch " << m;
      (void)gpu.take_loss_sum();
      if (step == 0) {
        first_losses.push_back(gpu_loss);
      } else if (tensorwise) {
        EXPECT_EQ(gpu_loss, first_losses[static_cast<size_t>(m)]) << "micro-batch " << m;
      }
    }
    std::vector<float> grads(static_cast<size_t>(n));
    gpu.download_grads(grads.data());
    const double to_fp8 = rel_err(grads.data(), cpu.grads(), n), to_high = rel_err(grads.data(), cpu_high.grads(), n);
    std::printf("step %d: the gradients' relative difference to the CPU's FP8 model %.3g, to its high-precision one "
                "%.3g\n", step, to_fp8, to_high);
    EXPECT_LT(to_fp8, 0.25);
    EXPECT_GT(to_high, 0.05) << "the GPU's gradients are the high-precision model's: FP8 did not run";
    if (step == 0) {
      first_grads[0] = grads;
    } else if (tensorwise) {
      EXPECT_EQ(grads, first_grads[0]) << "a replayed step's gradients";
    }
    if (!tensorwise) expect_scaling(cpu, gpu, c);
  }
}

}  // namespace

// Llama's pieces (RMSNorm, SwiGLU, no biases) under delayed scaling (history 4, max) and
// tensorwise; the tensorwise models attend through our flash kernels, whose backward adds no atomics
// (FP8 would magnify cuDNN's reordered sums past bit equality).
TEST(CudaFp8Model, LlamaDelayedScalingMatchesCpuModel) {
  compare_fp8(with_fp8(llama_config(), Fp8ScalingRecipe::Delayed));
}
TEST(CudaFp8Model, LlamaTensorwiseMatchesCpuModel) {
  GptConfig c = with_fp8(llama_config(), Fp8ScalingRecipe::Tensorwise);
  c.attention_backend = AttentionBackend::Flash;
  compare_fp8(c);
}
// GPT's (LayerNorm, GeLU through our bias-GeLU kernels, biases in the FP8 GEMMs' epilogues); the
// first layer kept in bf16 (--first-last-layers-bf16 with one layer at the start).
TEST(CudaFp8Model, GptDelayedScalingMatchesCpuModel) {
  compare_fp8(with_fp8(small_config(4, 4), Fp8ScalingRecipe::Delayed));
}
// What the GPU trains in FP8 (MLA, MTP and block scaling among it, checked by the tests below) and
// what it refuses by name.
TEST(CudaFp8Model, CombinationsTheGpuCannotTrainAreNamed) {
  EXPECT_EQ(cuda_unsupported_features(with_fp8(llama_config(), Fp8ScalingRecipe::Delayed)), "");
  EXPECT_EQ(cuda_unsupported_features(with_fp8(mla_config(32), Fp8ScalingRecipe::Delayed)), "");
  GptConfig mtp = with_fp8(llama_config(), Fp8ScalingRecipe::Delayed);
  mtp.mtp_num_layers = 1;
  EXPECT_EQ(cuda_unsupported_features(mtp), "");
  EXPECT_EQ(cuda_unsupported_features(with_fp8(llama_config(), Fp8ScalingRecipe::Blockwise)), "");
  EXPECT_NE(cuda_unsupported_features(with_fp8(moe_config(llama_config(), 4, 2, 64, 32), Fp8ScalingRecipe::Blockwise))
                .find("block scaling"),
            std::string::npos);
  GptConfig ep = with_fp8(moe_config(llama_config(), 4, 2, 64, 32), Fp8ScalingRecipe::Tensorwise);
  ep.moe.expert_parallel = 2;
  EXPECT_NE(cuda_unsupported_features(ep).find("FP8 experts under expert parallelism"), std::string::npos);
}
// Block scaling: the weights' 128 x 128 tiles, the inputs' and output gradients' 1 x 128 blocks
// (along the tokens for the weight gradient), cuBLASLt's block-scaled GEMMs; the flash kernels as
// for tensorwise (no atomics: a replayed step repeats the first bit for bit).
TEST(CudaFp8Model, BlockwiseMatchesCpuModel) {
  GptConfig c = with_fp8(llama_config(), Fp8ScalingRecipe::Blockwise);
  c.attention_backend = AttentionBackend::Flash;
  compare_fp8(c);
}
// DeepSeek's multi-latent attention: its projections (q's direct or through its latent, kv's down
// and up) as FP8 linears.
TEST(CudaFp8Model, MlaDelayedScalingMatchesCpuModel) {
  compare_fp8(with_fp8(mla_config(32), Fp8ScalingRecipe::Delayed));
  compare_fp8(with_fp8(mla_config(0), Fp8ScalingRecipe::Delayed));
}
// Multi-token prediction: the MTP layer's linears and its eh_proj in FP8 (Megatron's global FP8
// context), with the decoder's last layer kept in bf16 (which the MTP layer is not).
TEST(CudaFp8Model, MtpDelayedScalingMatchesCpuModel) {
  GptConfig c = with_fp8(llama_config(), Fp8ScalingRecipe::Delayed);
  c.mtp_num_layers = 1, c.mtp_loss_scaling_factor = 0.3;
  c.fp8->bf16_layers_at_end = 1;
  compare_fp8(c);
}
// MoE layers (Llama's pieces, 4 experts of ffn 64, top-2, a shared expert of 32): the routed
// experts through the FP8 grouped GEMMs with a scaling state per expert, the shared expert's FP8
// Linears; both recipes.
TEST(CudaFp8Model, MoeDelayedScalingMatchesCpuModel) {
  compare_fp8(with_fp8(moe_config(llama_config(), 4, 2, 64, 32), Fp8ScalingRecipe::Delayed));
}
TEST(CudaFp8Model, MoeTensorwiseMatchesCpuModel) {
  GptConfig c = with_fp8(moe_config(llama_config(), 4, 2, 64, 32), Fp8ScalingRecipe::Tensorwise);
  c.attention_backend = AttentionBackend::Flash;
  compare_fp8(c);
}
// LoRA beside the frozen base's FP8 linears, the adapters in BF16 (B drawn rather than zero, so
// that both halves have gradients from the first step): the adapters' gradients, and the base's
// scaling state (its output gradients' amaxes recorded without a weight gradient).
TEST(CudaFp8Model, LoraBesideTheFrozenBaseMatchesCpuModel) {
  GptConfig c = with_fp8(llama_config(), Fp8ScalingRecipe::Delayed);
  LoraSpec s;
  s.dim = 8, s.alpha = 16, s.b_init = LoraInit::Xavier;
  c.lora = s;
  compare_fp8(c);
}
TEST(CudaFp8Model, GptTensorwiseWithTheFirstLayerInBf16MatchesCpuModel) {
  GptConfig c = with_fp8(small_config(2, 2), Fp8ScalingRecipe::Tensorwise);
  c.attention_backend = AttentionBackend::Flash;
  c.fp8->bf16_layers_at_start = 1;
  compare_fp8(c);
}

// Delayed scaling over data-parallel GPU ranks (two threads sharing GPU 0, meeting in a
// SharedDeviceGroup): each rank steps on its own micro-batch, and each pass's amaxes are
// MAX-reduced over the ranks before the update, so both ranks end with every linear's history the
// element-wise maximum of what each micro-batch records alone, and its scales the smaller of the
// two (the same kernels: equal bit for bit; the flash kernels have no atomics, and with the GEMMs'
// autotuning off every model takes the same cuBLASLt algorithms whatever its timings).
TEST(CudaFp8Model, DelayedScalingReducesAmaxesOverDataParallelRanks) {
  const ScopedRuntimeOptions same_algorithms([](RuntimeOptions& o) { o.gemm_autotune = false; });
  GptConfig c = with_fp8(llama_config(), Fp8ScalingRecipe::Delayed);
  c.attention_backend = AttentionBackend::Flash;
  GptModel host(c);
  random_weights(host, host.weights());
  const std::vector<Batch> batches = {random_batch(2, 48, c.vocab, 31), random_batch(2, 48, c.vocab, 32)};
  const std::vector<Fp8Key> keys = fp8_linear_keys(c);
  using States = std::map<std::pair<int64_t, bool>, CudaFp8Linears::Scaling>;
  auto step = [&](CudaGptModel& gpu, const Batch& x, States& out) {
    gpu.upload_weights(host.weights());
    gpu.zero_grads();
    MicroBatch mb{x.b, x.s, x.tokens.data(), x.labels.data(), x.positions.data()};
    mb.is_first_microbatch = true;
    gpu.forward(mb, x.mask.data(), DropoutKey{1234, 0, true}, x.dloss.data());
    gpu.backward();
    (void)gpu.take_loss_sum();
    for (const Fp8Key& k : keys)
      for (const bool backward : {false, true}) out[{k.w, backward}] = gpu.fp8_linears()->download_scaling(k.w, backward);
  };
  std::vector<States> alone(2), ranks(2);
  for (size_t r = 0; r < 2; ++r) {
    CudaGptModel gpu(c, 2, 48);
    step(gpu, batches[r], alone[r]);
  }
  const std::vector<std::string> errors = run_on_shared_gpu(2, [&](int r, SharedDeviceGroup& group) {
    CudaGptModel gpu(c, 2, 48);
    gpu.set_fp8_amax_group(&group);
    gpu.set_data_parallel_group(&group);
    step(gpu, batches[static_cast<size_t>(r)], ranks[static_cast<size_t>(r)]);
  });
  for (size_t r = 0; r < 2; ++r) ASSERT_EQ(errors[r], "") << "rank " << r;
  size_t differing = 0;  // (the micro-batches' amaxes differ: the reduction has something to do)
  for (const auto& [key, a] : alone[0]) {
    SCOPED_TRACE("linear at " + std::to_string(key.first) + (key.second ? " backward" : " forward"));
    const CudaFp8Linears::Scaling& b = alone[1].at(key);
    for (size_t i = 0; i < a.history.size(); ++i) differing += a.history[i] != b.history[i];
    for (size_t r = 0; r < 2; ++r) {
      const CudaFp8Linears::Scaling& got = ranks[r].at(key);
      ASSERT_EQ(got.history.size(), a.history.size());
      for (size_t i = 0; i < a.history.size(); ++i)
        EXPECT_EQ(got.history[i], std::max(a.history[i], b.history[i])) << "rank " << r << " history " << i;
      for (size_t i = 0; i < a.scale.size(); ++i)
        EXPECT_EQ(got.scale[i], std::min(a.scale[i], b.scale[i])) << "rank " << r << " scale " << i;
    }
  }
  EXPECT_GT(differing, 0u);
}

}  // namespace laoyao::model::test
