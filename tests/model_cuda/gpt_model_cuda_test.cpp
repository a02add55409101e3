// The CUDA GPT model (BF16, fp32 main grads) against the CPU reference model (fp32) from the same
// weights and micro-batch: per-token losses and every parameter's gradient agree within BF16
// tolerance, with and without dropout (the masks are the same elements on both), for MHA and GQA.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/rng.hpp"
#include "core/runtime_options.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/device_buffer.hpp"
#include "model/cuda/gpt_model_cuda.hpp"
#include "model/gpt_model.hpp"
#include "model_cuda_test_util.hpp"

using namespace laoyao;
using namespace laoyao::model;
using namespace laoyao::model::test;

namespace {

// training: dropout on (hidden, and attention unless attention_dropout is false), as a training step.
void compare(GptConfig c, bool training, bool attention_dropout = true) {
  if (training) c.hidden_dropout = 0.1, c.attention_dropout = attention_dropout ? 0.1 : 0.0;
  CpuAndGpuModels models(c);
  GptModel& cpu = models.cpu;
  CudaGptModel& gpu = models.gpu;
  const Batch& x = models.x;
  const MicroBatch& mb = models.mb;
  const DropoutKey key{1234, 5 * 1000003ull + 1, training};
  std::vector<float> cpu_loss(static_cast<size_t>(x.b * x.s));
  cpu.zero_grads();
  cpu.forward(mb, key, cpu_loss.data());
  cpu.backward(x.dloss.data());
  gpu.zero_grads();
  gpu.forward(mb, x.mask.data(), key, x.dloss.data());
  gpu.backward();
  const std::vector<float> gpu_loss = gpu.download_losses();

  // Losses ~6 (ln 384): bf16 activations through two layers leave ~1e-2 absolute.
  double cpu_sum = 0, cpu_count = 0;
  for (size_t t = 0; t < cpu_loss.size(); ++t) {
    EXPECT_NEAR(gpu_loss[t], cpu_loss[t], 3e-2) << "token " << t;
    cpu_sum += double(cpu_loss[t]) * x.mask[t], cpu_count += x.mask[t];
  }
  const auto [sum, count] = gpu.take_loss_sum();
  EXPECT_EQ(count, cpu_count);
  EXPECT_NEAR(sum / count, cpu_sum / cpu_count, 1e-2);
  EXPECT_EQ(gpu.take_loss_sum().second, 0.0) << "take_loss_sum resets the running sum";

  // The trained parameters' gradients (PEFT: the adapters', from the table's trainable_offset on).
  const int64_t from = cpu.table().trainable_offset;
  ASSERT_EQ(gpu.num_trainable(), cpu.num_trainable());
  std::vector<float> grads(static_cast<size_t>(gpu.num_trainable()));
  gpu.download_grads(grads.data());
  EXPECT_LT(rel_err(grads.data(), cpu.grads(), gpu.num_trainable()), 2e-2);
  for (const auto& p : cpu.table().specs) {
    if (p.frozen) continue;
    EXPECT_LT(rel_err(grads.data() + (p.offset - from), cpu.grads() + (p.offset - from), p.numel), 6e-2) << p.name;
  }
}

GptConfig with_lora(GptConfig c, double dropout = 0.0) {
  LoraSpec s;
  s.dim = 8, s.alpha = 16, s.dropout = dropout;
  c.lora = s;
  return c;
}

}  // namespace

// n training calls of the same micro-batch and dropout key: each call's losses and gradients.
void training_calls(CudaGptModel& gpu, const Batch& x, int n, std::vector<std::vector<float>>& losses,
                    std::vector<std::vector<float>>& grads) {
  const MicroBatch mb{x.b, x.s, x.tokens.data(), x.labels.data(), x.positions.data()};
  for (int call = 0; call < n; ++call) {
    gpu.zero_grads();
    gpu.forward(mb, x.mask.data(), {1234, 7, true}, x.dloss.data());
    gpu.backward();
    losses.push_back(gpu.download_losses());
    grads.emplace_back(static_cast<size_t>(gpu.num_parameters()));
    gpu.download_grads(grads.back().data());
    (void)gpu.take_loss_sum();
  }
}

// One model for each of two runtime options, choose(o, 0) and choose(o, 1) (gemm_autotune off in
// both: the same GEMM algorithms, so only the option differs), n training calls each; `check`
// sees each model after its calls.
void calls_under_options(const GptConfig& c, const std::function<void(RuntimeOptions&, int)>& choose, int n,
                         std::vector<std::vector<float>> (&losses)[2], std::vector<std::vector<float>> (&grads)[2],
                         const std::function<void(const CudaGptModel&, int)>& check = nullptr) {
  for (int i = 0; i < 2; ++i) {
    const ScopedRuntimeOptions options([&](RuntimeOptions& o) {
      o.gemm_autotune = false;
      choose(o, i);
    });
    CpuAndGpuModels models(c);
    training_calls(models.gpu, models.x, n, losses[i], grads[i]);
    if (check) check(models.gpu, i);
  }
}

GptConfig with_attention(GptConfig c, AttentionBackend a) {
  c.attention_backend = a;
  return c;
}

// Head dim 32 (128 / 4): cuDNN and the unfused path; the flash kernels take 64 (128 / 2 heads).
// Without attention dropout auto picks cuDNN's fused attention.
TEST(CudaGptModel, MatchesCpuModelWithoutDropout) { compare(small_config(4, 4), false); }
TEST(CudaGptModel, UnfusedMatchesCpuModelWithoutDropout) {
  compare(with_attention(small_config(4, 4), AttentionBackend::Unfused), false);
}
// GeLU MLPs run fc1's GELU_AUX epilogue and fc2's DGELU epilogue by default; the fused bias-GeLU
// kernels with LAOYAO_GELU_EPILOGUE=0.
TEST(CudaGptModel, BiasGeluKernelPathMatchesCpuModel) {
  const ScopedRuntimeOptions kernels([](RuntimeOptions& o) { o.gelu_epilogue = false; });
  compare(small_config(2, 2), true);
}
TEST(CudaGptModel, FusedMatchesCpuModelWithoutDropout) {
  compare(with_attention(small_config(2, 2), AttentionBackend::Fused), false);
}
TEST(CudaGptModel, FusedMatchesCpuModelWithGqaAndHiddenDropout) {
  GptConfig c = with_attention(small_config(8, 2), AttentionBackend::Fused);
  c.tied_embeddings = false;
  compare(c, true, false);  // hidden dropout on, attention dropout off: what cuDNN's path takes
}
TEST(CudaGptModel, FusedRefusesAttentionDropoutByName) {
  GptConfig c = with_attention(small_config(2, 2), AttentionBackend::Fused);
  c.attention_dropout = 0.1;
  try {
    CudaGptModel m(c, 1, 16);
    ADD_FAILURE() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--attention-dropout"), std::string::npos) << e.what();
  }
}
TEST(CudaGptModel, AutoPicksCudnnWithoutAttentionDropoutElseFlash) {
  GptConfig c = small_config(2, 2);
  EXPECT_STREQ(CudaGptModel(c, 1, 16).attention_path(), "cudnn");
  c.attention_dropout = 0.1;
  EXPECT_STREQ(CudaGptModel(c, 1, 16).attention_path(), "flash");
  EXPECT_STREQ(CudaGptModel(small_config(4, 4), 1, 16).attention_path(), "cudnn");
  c = small_config(4, 4);
  c.attention_dropout = 0.1;
  EXPECT_STREQ(CudaGptModel(c, 1, 16).attention_path(), "unfused");
}
TEST(CudaGptModel, MatchesCpuModelWithDropout) { compare(small_config(4, 4), true); }
// --reset-attention-mask and packed fine-tuning rows: attention within documents (documents_2x48)
// on our kernels (auto: flash for head dim 64, unfused else), or through cuDNN's attention over
// documents (--attention-backend fused).
GptConfig with_documents(GptConfig c, AttentionBackend a) {
  c.document_attention = true;
  return with_attention(c, a);
}
TEST(CudaGptModel, DocumentsCudnnMatchesCpuModel) {
  compare(with_documents(small_config(2, 2), AttentionBackend::Fused), false);       // head dim 64
  compare(with_documents(small_config(4, 4), AttentionBackend::Fused), false);       // head dim 32
  compare(with_documents(small_config(2, 2), AttentionBackend::Fused), true, false);  // hidden dropout
}
TEST(CudaGptModel, DocumentsQwen3CudnnWithGqaMatchesCpuModel) {  // split rows: the QK norm writes them
  GptConfig c = with_documents(qwen3_config(), AttentionBackend::Fused);
  c.heads = 4, c.query_groups = 2, c.kv_channels = 64;
  compare(c, false);
}
TEST(CudaGptModel, DocumentsFlashMatchesCpuModel) {
  compare(with_documents(small_config(2, 2), AttentionBackend::Flash), false);
  compare(with_documents(small_config(2, 2), AttentionBackend::Flash), true);
}
TEST(CudaGptModel, DocumentsUnfusedMatchesCpuModel) {
  compare(with_documents(small_config(4, 4), AttentionBackend::Unfused), false);
  compare(with_documents(small_config(2, 2), AttentionBackend::Unfused), true);
}
TEST(CudaGptModel, DocumentsQwen3FlashWithGqaMatchesCpuModel) {
  GptConfig c = with_documents(qwen3_config(), AttentionBackend::Flash);
  c.heads = 4, c.query_groups = 2, c.kv_channels = 64;
  compare(c, false);
}
// Documents (packed sequences) take cuDNN's attention over documents under auto, as rows without
// them do; attention dropout takes our kernels.
TEST(CudaGptModel, DocumentsTakeCudnnUnlessDropoutNeedsOurKernels) {
  EXPECT_STREQ(CudaGptModel(with_documents(small_config(2, 2), AttentionBackend::Auto), 1, 16).attention_path(),
               "cudnn");
  EXPECT_STREQ(CudaGptModel(with_documents(small_config(2, 2), AttentionBackend::Fused), 1, 16).attention_path(),
               "cudnn");
  EXPECT_STREQ(CudaGptModel(with_documents(small_config(2, 2), AttentionBackend::Flash), 1, 16).attention_path(),
               "flash");
  GptConfig auto_dropout = with_documents(small_config(2, 2), AttentionBackend::Auto);
  auto_dropout.attention_dropout = 0.1;
  EXPECT_STREQ(CudaGptModel(auto_dropout, 1, 16).attention_path(), "flash");
  GptConfig head_dim_32 = with_documents(small_config(4, 4), AttentionBackend::Auto);  // no flash kernel
  head_dim_32.attention_dropout = 0.1;
  EXPECT_STREQ(CudaGptModel(head_dim_32, 1, 16).attention_path(), "unfused");
  GptConfig dropout = with_documents(small_config(2, 2), AttentionBackend::Fused);
  dropout.attention_dropout = 0.1;
  try {
    CudaGptModel m(dropout, 1, 16);
    ADD_FAILURE() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--attention-dropout"), std::string::npos) << e.what();
  }
  // A micro-batch's documents must be what a dataset makes: non-decreasing first keys, none after its query.
  CudaGptModel gpu(with_documents(small_config(2, 2), AttentionBackend::Flash), 1, 4);
  std::vector<int64_t> ids{1, 2, 3, 4};
  std::vector<float> mask(4, 1.0f);
  const std::vector<int32_t> bad{0, 0, 3, 2};
  EXPECT_THROW(gpu.forward({1, 4, ids.data(), ids.data(), ids.data(), bad.data()}, mask.data(), {}, nullptr), Error);
  EXPECT_THROW(gpu.forward({1, 4, ids.data(), ids.data(), ids.data()}, mask.data(), {}, nullptr), Error);
}
TEST(CudaGptModel, FlashMatchesCpuModelWithoutDropout) {
  compare(with_attention(small_config(2, 2), AttentionBackend::Flash), false);
}
TEST(CudaGptModel, FlashMatchesCpuModelWithDropout) {
  compare(with_attention(small_config(2, 2), AttentionBackend::Flash), true);
}
TEST(CudaGptModel, UnfusedWithHeadDim64MatchesCpuModel) {
  compare(with_attention(small_config(2, 2), AttentionBackend::Unfused), true);
}
TEST(CudaGptModel, FlashRefusesHeadDim32ByName) {
  EXPECT_THROW(CudaGptModel(with_attention(small_config(4, 4), AttentionBackend::Flash), 1, 16), UsageError);
}
TEST(CudaGptModel, MatchesCpuModelWithGqaAndUntiedOutput) {
  GptConfig c = small_config(8, 2);
  c.tied_embeddings = false;
  c.add_bias_linear = false;
  c.add_qkv_bias = false;
  compare(c, true);
}

TEST(CudaGptModel, FlashMatchesCpuModelWithGqaAndUntiedOutput) {
  GptConfig c = with_attention(small_config(2, 1), AttentionBackend::Flash);
  c.tied_embeddings = false;
  c.add_bias_linear = false;
  c.add_qkv_bias = false;
  compare(c, true);
}

// The step's first backward writes the weight-gradient GEMMs' outputs; the second adds (tied
// embeddings with biases and the GeLU epilogue; Llama's untied output layer).
TEST(CudaGptModel, MicroBatchGradientsAddUp) {
  expect_micro_batches_add_up(small_config(4, 4));
  expect_micro_batches_add_up(llama_config());
}

TEST(CudaGptModel, RefusesWhatItCannotTrainByName) {
  GptConfig c = small_config(4, 4);
  c.qk_layernorm = true;  // trains on the GPU (head dim 32)
  c.norm = Norm::RMSNorm;
  c.hidden = 100, c.kv_channels = 32;  // RMSNorm rows of 100 elements: not 16-byte packs
  EXPECT_EQ(cuda_unsupported_features(c).find("QK layernorm"), std::string::npos);
  EXPECT_NE(cuda_unsupported_features(c).find("RMSNorm with a hidden size"), std::string::npos);
  EXPECT_THROW(CudaGptModel(c, 1, 16), UsageError);
  EXPECT_EQ(cuda_unsupported_features(small_config(4, 4)), "");
  // QK layernorm's kernels take head dims that are multiples of 8 up to 256.
  GptConfig odd = small_config(4, 4);
  odd.qk_layernorm = true;
  odd.kv_channels = 36;
  EXPECT_NE(cuda_unsupported_features(odd).find("QK layernorm with a head dim (kv_channels 36)"), std::string::npos)
      << cuda_unsupported_features(odd);
}

// Bridge's vanilla GPT (no bias-GeLU fusion): F.gelu, the exact erf form, after fc1 with its bias.
TEST(CudaGptModel, ErfGeluMatchesCpuModel) {
  GptConfig c = small_config(4, 4);
  c.activation = Activation::GeluErf;
  EXPECT_EQ(cuda_unsupported_features(c), "");
  compare(c, true);
}

TEST(CudaGptModel, LlamaMatchesCpuModel) {
  EXPECT_EQ(cuda_unsupported_features(llama_config()), "");
  compare(llama_config(), false);
}
TEST(CudaGptModel, LlamaWithDropoutMatchesCpuModel) { compare(llama_config(), true); }
TEST(CudaGptModel, LlamaUnfusedAttentionMatchesCpuModel) {
  compare(with_attention(llama_config(), AttentionBackend::Unfused), true);
}

TEST(CudaGptModel, Qwen3QkLayernormMatchesCpuModel) {
  EXPECT_EQ(cuda_unsupported_features(qwen3_config()), "");
  compare(qwen3_config(), false);  // auto: cuDNN's fused attention
}
TEST(CudaGptModel, Qwen3QkLayernormWithDropoutMatchesCpuModel) { compare(qwen3_config(), true); }  // flash
TEST(CudaGptModel, Qwen3QkLayernormUnfusedWithGqaAndZeroCenteredGammaMatchesCpuModel) {
  GptConfig c = with_attention(qwen3_config(), AttentionBackend::Unfused);
  c.heads = 4, c.query_groups = 2, c.kv_channels = 32;  // GQA with two groups, head dim 32
  c.zero_centered_gamma = true;
  compare(c, true);
}
TEST(CudaGptModel, Qwen3QkLayernormFlashWithGqaMatchesCpuModel) {
  GptConfig c = with_attention(qwen3_config(), AttentionBackend::Flash);
  c.heads = 4, c.query_groups = 2, c.kv_channels = 64;  // hidden 128, q heads 4 x 64 (Qwen3: heads x D != hidden)
  compare(c, false);
}

// GQA with the QK norm on cuDNN: the norm writes q, k and v in the split rows cuDNN reads in place
// (qkv_rows.hpp) and reads its gradient there. Against the CPU model, and against the fused rows
// (LAOYAO_QKV_SPLIT=0: the query heads gathered before and scattered after cuDNN) from the same
// weights: the same kernels read the same values, so the two agree to far below BF16 tolerance.
TEST(CudaGptModel, Qwen3CudnnSplitRowsMatchCpuAndFusedRows) {
  GptConfig c = with_attention(qwen3_config(), AttentionBackend::Fused);
  c.heads = 4, c.query_groups = 2, c.kv_channels = 64;
  compare(c, false);
  std::vector<std::vector<float>> losses[2], grads[2];
  const auto split_then_fused = [](RuntimeOptions& o, int fused) { o.qkv_split = fused == 0; };
  calls_under_options(c, split_then_fused, 1, losses, grads, [](const CudaGptModel& gpu, int fused) {
    using laoyao::kernels::cuda::QkvRows;
    EXPECT_EQ(gpu.qkv_rows(), fused ? QkvRows::Fused : QkvRows::Split);
  });
  const int64_t n = static_cast<int64_t>(grads[0][0].size());
  EXPECT_LT(rel_err(grads[0][0].data(), grads[1][0].data(), n), 1e-5);
  for (size_t t = 0; t < losses[0][0].size(); ++t) ASSERT_NEAR(losses[0][0][t], losses[1][0][t], 1e-5) << t;
}

// The projection's and fc2's bias gradients are the column sums of the residual stream's gradient;
// without hidden dropout the norms' backward kernels sum them as they write it (the default), else
// bias_grad reads it again (LAOYAO_BIAS_GRAD_IN_NORM=0): the same bf16 values summed in another
// fixed order. LayerNorm with the GeLU epilogues, and RMSNorm with SwiGLU and biases (the RMSNorm
// kernel's sums, fc2's bias through linear_backward); eager and graph-captured calls; against the
// CPU model too.
TEST(CudaGptModel, BiasGradientsSummedInTheNormsMatchBiasGradKernel) {
  GptConfig rms = small_config(4, 4);
  rms.norm = Norm::RMSNorm;
  rms.activation = Activation::SwiGLU;
  for (const GptConfig& c : {small_config(4, 4), rms}) {
    SCOPED_TRACE(c.norm == Norm::RMSNorm ? "RMSNorm, SwiGLU" : "LayerNorm, GeLU");
    ASSERT_TRUE(c.add_bias_linear);
    compare(c, false);
    std::vector<std::vector<float>> losses[2], grads[2];
    const auto in_norm_then_reread = [](RuntimeOptions& o, int reread) { o.bias_grad_in_norm = reread == 0; };
    calls_under_options(c, in_norm_then_reread, 2, losses, grads,
                        [](const CudaGptModel& gpu, int reread) { EXPECT_EQ(gpu.bias_grad_in_norm(), reread == 0); });
    const GptModel shapes(c);
    int summed = 0;
    for (size_t call = 0; call < 2; ++call) {
      EXPECT_EQ(losses[0][call], losses[1][call]) << "call " << call;  // the backward changes no loss
      for (const auto& p : shapes.table().specs) {
        const float* a = grads[0][call].data() + p.offset;
        const float* b = grads[1][call].data() + p.offset;
        if (p.name.find("linear_proj.bias") == std::string::npos && p.name.find("linear_fc2.bias") == std::string::npos) {
          // Every other gradient is computed the same way in both: the same bits.
          EXPECT_TRUE(std::equal(a, a + p.numel, b)) << p.name << ", call " << call;
          continue;
        }
        ++summed;
        EXPECT_GT(std::count_if(a, a + p.numel, [](float v) { return v != 0.0f; }), 0) << p.name;  // written
        EXPECT_LT(rel_err(a, b, p.numel), 1e-5) << p.name << ", call " << call;
      }
    }
    EXPECT_EQ(summed, 2 * 2 * 2);  // two calls, two layers, two biases
  }
  GptConfig dropout = small_config(2, 2);  // hidden dropout: the residual gradient is not the biases'
  dropout.hidden_dropout = 0.1;
  EXPECT_FALSE(CudaGptModel(dropout, 1, 16).bias_grad_in_norm());
}

// Without dropout the second call of a shape captures a CUDA graph and later calls replay it: the
// losses and gradients of the eager, captured and replayed steps are the same bits.
TEST(CudaGptModel, GraphReplayGivesTheEagerStepsBits) {
  GptConfig c = with_attention(small_config(2, 2), AttentionBackend::Flash);
  GptModel cpu(c);
  random_weights(cpu, cpu.weights());
  CudaGptModel gpu(c, 2, 48);
  gpu.upload_weights(cpu.weights());
  const Batch x = random_batch(2, 48, c.vocab);
  const MicroBatch mb{x.b, x.s, x.tokens.data(), x.labels.data(), x.positions.data()};
  std::vector<std::vector<float>> losses, grads;
  training_calls(gpu, x, 3, losses, grads);
  EXPECT_EQ(losses[0], losses[1]);
  EXPECT_EQ(losses[0], losses[2]);
  EXPECT_EQ(grads[0], grads[1]);
  EXPECT_EQ(grads[0], grads[2]);
  // Evaluation (no backward) is its own graph: the same bits every call, and the training
  // forward's losses up to the two cross-entropy kernels' exp rounding.
  std::vector<float> first_eval;
  for (int call = 0; call < 3; ++call) {
    gpu.forward(mb, x.mask.data(), {1234, 7, false});
    const auto eval = gpu.download_losses();
    if (call == 0) first_eval = eval;
    EXPECT_EQ(eval, first_eval) << "evaluation call " << call;
    for (size_t t = 0; t < eval.size(); ++t) ASSERT_NEAR(eval[t], losses[0][t], 1e-5) << "token " << t;
  }
}

// A model of c replaying its captured step with two sets of documents in turn (key_start staged
// with the other inputs every micro-batch) against an eager model on the same two: each replay
// gives the eager step's losses, and its gradients bit for bit (exact_grads) or within 1e-3.
void expect_graph_replays_give_the_eager_steps(const GptConfig& c, const std::vector<int32_t> (&docs)[2],
                                               bool exact_grads) {
  GptModel cpu(c);
  random_weights(cpu, cpu.weights());
  const Batch x = random_batch(2, 48, c.vocab);
  auto step = [&](CudaGptModel& gpu, const std::vector<int32_t>& ks) {
    gpu.zero_grads();
    gpu.forward({x.b, x.s, x.tokens.data(), x.labels.data(), x.positions.data(), ks.data()}, x.mask.data(),
                {1234, 7, true}, x.dloss.data());
    gpu.backward();
    std::vector<float> grads(static_cast<size_t>(gpu.num_parameters()));
    gpu.download_grads(grads.data());
    (void)gpu.take_loss_sum();
    return std::make_pair(gpu.download_losses(), grads);
  };
  // Two models that must give the same bits: both take cuBLASLt's first heuristic choice, not the
  // fastest-timed one.
  const ScopedRuntimeOptions same_algorithms([](RuntimeOptions& o) { o.gemm_autotune = false; });
  const auto eager_model = [&] {
    const ScopedRuntimeOptions no_graphs([](RuntimeOptions& o) { o.cuda_graphs = false; });
    return std::make_unique<CudaGptModel>(c, 2, 48);
  }();
  CudaGptModel& eager = *eager_model;
  CudaGptModel graphed(c, 2, 48);
  eager.upload_weights(cpu.weights());
  graphed.upload_weights(cpu.weights());
  const auto want0 = step(eager, docs[0]), want1 = step(eager, docs[1]);
  EXPECT_NE(want0.first, want1.first) << "the two sets of documents give different losses";
  for (int call = 0; call < 6; ++call) {  // eager warm-up, capture, then replays, alternating documents
    const auto got = step(graphed, docs[call % 2]);
    const auto& want = call % 2 == 0 ? want0 : want1;
    EXPECT_EQ(got.first, want.first) << "call " << call;
    if (exact_grads)
      EXPECT_EQ(got.second, want.second) << "call " << call;
    else
      EXPECT_LT(rel_err(got.second.data(), want.second.data(), graphed.num_parameters()), 1e-3) << "call " << call;
  }
}

// Our flash kernels' documents in captured graphs: the eager bits.
TEST(CudaGptModel, DocumentsChangingBetweenGraphReplaysGiveTheEagerBits) {
  std::vector<int32_t> other;  // the first sequence cut at 20, the second at 5 and 40
  for (int i = 0; i < 48; ++i) other.push_back(i < 20 ? 0 : 20);
  for (int i = 0; i < 48; ++i) other.push_back(i < 5 ? 0 : i < 40 ? 5 : 40);
  expect_graph_replays_give_the_eager_steps(with_documents(small_config(2, 2), AttentionBackend::Flash),
                                            {documents_2x48(), other}, true);
}

// cuDNN's attention over documents in captured graphs, the documents' count changing bucket between
// replays (6 documents -> 32, 36 -> 64): the gradients up to the order of cuDNN's dQ accumulation.
TEST(CudaGptModel, CudnnDocumentsChangingBetweenGraphReplaysGiveTheEagerStep) {
  std::vector<int32_t> many;  // 18 documents of 2 and 3 tokens in each sequence
  for (int r = 0; r < 2; ++r)
    for (int i = 0, start = 0; i < 48; ++i) {
      if (i == start + 2 + (start / 2) % 2 && i + 1 < 48) start = i;
      many.push_back(start);
    }
  expect_graph_replays_give_the_eager_steps(with_documents(small_config(2, 2), AttentionBackend::Fused),
                                            {documents_2x48(), many}, false);
}

// cuDNN's attention inside the captured graph: replay gives the eager step's losses, and gradients
// equal up to the order of cuDNN's dQ accumulation (it adds with atomics).
TEST(CudaGptModel, FusedAttentionGraphReplayMatchesEagerStep) {
  GptConfig c = with_attention(small_config(2, 2), AttentionBackend::Fused);
  GptModel cpu(c);
  random_weights(cpu, cpu.weights());
  CudaGptModel gpu(c, 2, 48);
  gpu.upload_weights(cpu.weights());
  const Batch x = random_batch(2, 48, c.vocab);
  std::vector<std::vector<float>> losses, grads;
  training_calls(gpu, x, 3, losses, grads);
  for (int call = 1; call < 3; ++call) {
    EXPECT_EQ(losses[call], losses[0]) << "call " << call;
    EXPECT_LT(rel_err(grads[call].data(), grads[0].data(), gpu.num_parameters()), 1e-3) << "call " << call;
  }
}

// Full recomputation changes memory, not the numbers: uniform chunks of one and two layers and
// block recomputation of the first one or two layers give the bits of the run that keeps every
// activation, with dropout (eager steps) and without (the second call replays a captured graph).
// Block recomputation of one layer saves nothing: that layer's pool set plus its kept input
// replace its own activations.
TEST(CudaGptModel, FullRecomputationGivesTheSameBitsInLessMemory) {
  for (const bool dropout : {true, false}) {
    SCOPED_TRACE(dropout ? "dropout" : "no dropout (graph replay)");
    GptConfig base = with_attention(small_config(2, 2), AttentionBackend::Flash);
    base.num_layers = 3;
    if (dropout) base.hidden_dropout = 0.1, base.attention_dropout = 0.1;
    GptModel cpu(base);
    random_weights(cpu, cpu.weights());
    const Batch x = random_batch(2, 48, base.vocab);
    const MicroBatch mb{x.b, x.s, x.tokens.data(), x.labels.data(), x.positions.data()};
    struct Run {
      std::vector<float> losses, grads;
      size_t bytes;
    };
    auto run = [&](Recompute r, int64_t n) {
      GptConfig c = base;
      c.recompute = r;
      c.recompute_num_layers = n;
      CudaGptModel gpu(c, 2, 48);
      gpu.upload_weights(cpu.weights());
      Run out;
      for (int call = 0; call < 2; ++call) {
        gpu.zero_grads();
        gpu.forward(mb, x.mask.data(), {1234, 9, true}, x.dloss.data());
        gpu.backward();
        (void)gpu.take_loss_sum();
      }
      out.losses = gpu.download_losses();
      out.grads.resize(static_cast<size_t>(gpu.num_parameters()));
      gpu.download_grads(out.grads.data());
      out.bytes = gpu.device_bytes();
      return out;
    };
    const Run keep = run(Recompute::None, 0);
    for (const auto& [mode, n] : {std::pair{Recompute::Uniform, int64_t{1}}, std::pair{Recompute::Uniform, int64_t{2}},
                                  std::pair{Recompute::Block, int64_t{1}}, std::pair{Recompute::Block, int64_t{2}}}) {
      SCOPED_TRACE(std::string(mode == Recompute::Block ? "block " : "uniform ") + std::to_string(n));
      const Run r = run(mode, n);
      EXPECT_EQ(r.losses, keep.losses);
      EXPECT_EQ(r.grads, keep.grads);
      if (!(mode == Recompute::Block && n == 1)) {
        EXPECT_LT(r.bytes, keep.bytes);
      }
    }
  }
}

// --overlap-grad-reduce's hook: each reported range is final when it is reported (a copy taken
// then, on the model's stream, equals the gradient once the backward is done), the ranges come
// head first (final norm, untied output layer) and then layer by layer from the last, and with
// the embeddings they cover every parameter once; the gradients are those of a run without it.
TEST(CudaGptModel, GradsReadyHookReportsFinalRangesInBackwardOrder) {
  const GptConfig c = llama_config();  // untied: the output layer is part of the head
  GptModel cpu(c);
  random_weights(cpu, cpu.weights());
  const Batch x = random_batch(2, 48, c.vocab);
  const MicroBatch mb{x.b, x.s, x.tokens.data(), x.labels.data(), x.positions.data()};
  auto run = [&](bool hook, std::vector<float>& snapshot, std::vector<CudaGptModel::Range>& seen) {
    CudaGptModel gpu(c, 2, 48);
    gpu.upload_weights(cpu.weights());
    const int64_t n = gpu.num_parameters();
    kernels::cuda::DeviceBuffer snap(sizeof(float) * static_cast<size_t>(n));
    if (hook)
      gpu.set_grads_ready_hook([&](int64_t offset, int64_t count) {
        seen.push_back({offset, count});
        LAOYAO_CUDA_CHECK(cudaMemcpyAsync(snap.as<float>() + offset, gpu.main_grads() + offset, sizeof(float) * count,
                                          cudaMemcpyDeviceToDevice, gpu.stream()));
      });
    gpu.zero_grads();
    for (int micro = 0; micro < 2; ++micro) {  // the second accumulates onto the first
      gpu.forward(mb, x.mask.data(), {1234, 9, false}, x.dloss.data());
      gpu.backward();
    }
    std::vector<float> grads(static_cast<size_t>(n));
    gpu.download_grads(grads.data());
    snapshot.resize(static_cast<size_t>(n));
    snap.download(snapshot.data(), sizeof(float) * static_cast<size_t>(n));
    return std::make_pair(grads, gpu.grad_sync_ranges());
  };
  std::vector<float> snapshot, unused;
  std::vector<CudaGptModel::Range> seen, none;
  const auto [grads, ranges] = run(true, snapshot, seen);
  const auto [plain, plain_ranges] = run(false, unused, none);
  EXPECT_EQ(grads, plain) << "the hook changes nothing";
  ASSERT_EQ(seen.size(), 2 * ranges.size()) << "every range, once per micro-batch";
  for (const auto& r : ranges)
    for (int64_t i = r.offset; i < r.offset + r.count; ++i)
      ASSERT_EQ(snapshot[i], grads[i]) << "element " << i << " changed after its range was reported";
  // Order and coverage, by the names of the parameters in each range.
  const ParameterTable& table = cpu.table();
  auto names_in = [&](const CudaGptModel::Range& r) {
    std::vector<std::string> out;
    for (const auto& p : table.specs)
      if (p.offset >= r.offset && p.offset + p.numel <= r.offset + r.count) out.push_back(p.name);
    return out;
  };
  std::vector<std::string> order;
  for (size_t i = 0; i < ranges.size(); ++i)
    for (const auto& name : names_in(seen[i])) order.push_back(name);
  ASSERT_FALSE(order.empty());
  EXPECT_EQ(order.front().rfind("decoder.final_layernorm.", 0), 0u) << order.front();
  EXPECT_EQ(order.back().rfind("decoder.layers.0.", 0), 0u) << order.back();
  // Each range is one group's: no range holds two layers, and the layers come last to first.
  int64_t last_layer = c.num_layers;
  for (size_t i = 0; i < ranges.size(); ++i) {
    int64_t layer = -1;
    for (const auto& name : names_in(seen[i])) {
      if (name.rfind("decoder.layers.", 0) != 0) continue;
      const int64_t l = std::stoll(name.substr(15));
      if (layer < 0) layer = l;
      EXPECT_EQ(l, layer) << "range " << i << " holds two layers";
    }
    if (layer < 0) continue;
    EXPECT_LE(layer, last_layer) << "range " << i;
    last_layer = layer;
  }
  EXPECT_EQ(last_layer, 0);
  int64_t covered = 0;
  for (const auto& r : ranges) covered += r.count;
  int64_t embeddings = 0;
  for (const auto& p : table.specs) {
    const bool reported = std::find(order.begin(), order.end(), p.name) != order.end();
    EXPECT_NE(reported, p.name.rfind("embedding.", 0) == 0) << p.name;
    if (!reported) embeddings += p.numel;
  }
  EXPECT_EQ(covered + embeddings, table.total);
}

// Multi-latent attention: mla_prepare's kernels and cuDNN over separate q, k, v (head dims 48 and
// 32), the latent norms of their own widths (with DeepSeek's MoE layers: moe_model_cuda_test.cpp).
TEST(CudaGptModel, MlaWithoutQueryLatentMatchesCpuModel) { compare(mla_config(0), false); }
TEST(CudaGptModel, MlaWithQueryLatentAndHiddenDropoutMatchesCpuModel) {
  compare(mla_config(64), true, /*attention_dropout=*/false);
}
TEST(CudaGptModel, MlaRefusesAttentionDropoutAndOurOwnAttentionKernelsByName) {
  GptConfig c = mla_config(0);
  c.attention_dropout = 0.1;
  EXPECT_NE(cuda_unsupported_features(c).find("multi-latent attention with attention dropout"), std::string::npos);
  c.attention_dropout = 0;
  c.attention_backend = AttentionBackend::Flash;
  try {
    CudaGptModel m(c, 1, 16);
    ADD_FAILURE() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("cuDNN's fused attention only"), std::string::npos) << e.what();
  }
}

// Multi-token prediction: one and two MTP layers on Llama's pieces (untied: the output layer's
// gradient from the main loss and every MTP layer's), with DeepSeek's MLA.
TEST(CudaGptModel, MtpMatchesCpuModel) {
  GptConfig c = llama_config();
  c.mtp_num_layers = 1, c.mtp_loss_scaling_factor = 0.1;
  compare_mtp(c);
  c.mtp_num_layers = 2, c.mtp_loss_scaling_factor = 0.3;
  compare_mtp(c);
}
TEST(CudaGptModel, MtpWithMlaMatchesCpuModel) {
  GptConfig c = mla_config(64);
  c.mtp_num_layers = 1, c.mtp_loss_scaling_factor = 0.3;
  compare_mtp(c);
}

// LoRA (peft.scheme lora): the adapters beside every linear, the base frozen (no gradients).
TEST(CudaGptModel, LoraMatchesCpuModel) { compare(with_lora(small_config(4, 4)), false); }
TEST(CudaGptModel, LoraLlamaWithDropoutMatchesCpuModel) { compare(with_lora(llama_config(), 0.1), true); }
// PEFT with multi-token prediction: the MTP layer's linears carry adapters too.
TEST(CudaGptModel, LoraWithMtpMatchesCpuModel) {
  GptConfig c = with_lora(llama_config());
  c.mtp_num_layers = 1, c.mtp_loss_scaling_factor = 0.3;
  compare_mtp(c);
}
TEST(CudaGptModel, LoraOnAttentionAloneMatchesCpuModel) {
  GptConfig c = with_lora(qwen3_config());
  c.lora->fc1 = c.lora->fc2 = false;
  compare(c, false);
}
