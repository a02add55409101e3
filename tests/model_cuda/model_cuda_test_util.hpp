// What the CUDA model tests share: small configs (GPT, Llama, Qwen3), random bf16-exact weights, a
// random micro-batch with its loss mask and loss gradients, and a relative error.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/rng.hpp"
#include "model/cuda/gpt_model_cuda.hpp"
#include "model/gpt_config.hpp"
#include "model/gpt_model.hpp"

namespace laoyao::model::test {

inline GptConfig small_config(int64_t heads, int64_t groups) {
  GptConfig c;
  c.num_layers = 2, c.hidden = 128, c.heads = heads, c.query_groups = groups, c.kv_channels = 128 / heads;
  c.ffn = 384, c.vocab = 384, c.max_positions = 64;
  return c;
}

// Random weights everywhere (biases and norm parameters too: a zero bias would hide a bug),
// rounded to bf16 so both models start from the same values.
inline void random_weights(const GptModel& m, float* w) {
  Rng rng(7, "weights");
  for (const auto& p : m.table().specs) {
    const bool vector = p.shape.size() == 1;
    for (int64_t i = 0; i < p.numel; ++i) {
      const double x = rng.normal();
      w[p.offset + i] = round_to_bf16(static_cast<float>(vector ? (p.init == Init::Ones ? 1.0 + 0.1 * x : 0.05 * x)
                                                                : 0.05 * x));
    }
  }
}

struct Batch {
  int64_t b, s;
  std::vector<int64_t> tokens, labels, positions;
  std::vector<float> mask, dloss;
};

inline Batch random_batch(int64_t b, int64_t s, int64_t vocab, uint64_t seed = 11) {
  Batch x{b, s, {}, {}, {}, {}, {}};
  Rng rng(seed, "batch");
  for (int64_t t = 0; t < b * s; ++t) {
    x.tokens.push_back(static_cast<int64_t>(rng.next_u64() % vocab));
    x.labels.push_back(static_cast<int64_t>(rng.next_u64() % vocab));
    x.positions.push_back(t % s);
    x.mask.push_back(rng.uniform() < 0.9 ? 1.0f : 0.0f);
  }
  double count = 0;
  for (float m : x.mask) count += m;
  for (float m : x.mask) x.dloss.push_back(static_cast<float>(m / count));
  return x;
}

// Documents for 2 sequences of 48 tokens (c.document_attention): the first cut at 10, 11 (a
// one-token document) and 30, the second at 25; each query's first key.
inline std::vector<int32_t> documents_2x48() {
  std::vector<int32_t> ks;
  for (int i = 0; i < 48; ++i) ks.push_back(i < 10 ? 0 : i < 11 ? 10 : i < 30 ? 11 : 30);
  for (int i = 0; i < 48; ++i) ks.push_back(i < 25 ? 0 : 25);
  return ks;
}

// The CPU model of c with random weights, the CUDA model (micro-batches up to 2 x 48) holding the
// same weights, and a random batch of 2 sequences of 48 tokens (with documents_2x48() when the
// model attends within documents).
struct CpuAndGpuModels {
  GptModel cpu;
  CudaGptModel gpu;
  Batch x;
  std::vector<int32_t> key_start;
  MicroBatch mb;
  explicit CpuAndGpuModels(const GptConfig& c)
      : cpu(c), gpu(c, 2, 48), x(random_batch(2, 48, c.vocab)),
        key_start(c.document_attention ? documents_2x48() : std::vector<int32_t>{}),
        mb{x.b, x.s, x.tokens.data(), x.labels.data(), x.positions.data(),
           key_start.empty() ? nullptr : key_start.data()} {
    random_weights(cpu, cpu.weights());
    gpu.upload_weights(cpu.weights());
  }
};

inline double rel_err(const float* a, const float* ref, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) num += std::pow(double(a[i]) - ref[i], 2), den += std::pow(double(ref[i]), 2);
  return std::sqrt(num / std::max(den, 1e-30));
}

// Llama's pieces: RMSNorm, SwiGLU, RoPE with Llama 3 scaling, GQA, no biases, untied output.
inline GptConfig llama_config() {
  GptConfig c = small_config(2, 1);  // head dim 64: the flash kernels
  c.norm = Norm::RMSNorm;
  c.activation = Activation::SwiGLU;
  c.ffn = 192;
  c.positions = Positions::Rope;
  c.rotary_base = 500000;
  c.rope_scaling = true;
  c.rope_scaling_factor = 32;
  c.tied_embeddings = false;
  c.add_bias_linear = false;
  c.add_qkv_bias = false;
  return c;
}

// Qwen3's addition to Llama: QK layernorm (RMSNorm over each q head and k, before RoPE).
inline GptConfig qwen3_config() {
  GptConfig c = llama_config();
  c.qk_layernorm = true;
  c.rotary_base = 1000000;
  c.rope_scaling = false;
  return c;
}

// DeepSeek's attention: multi-latent attention (with a query latent of q_lora_rank, or none) on
// Llama's pieces, YaRN positions on the decoupled dims (mscale in the softmax scale as
// MLATransformerConfig computes it), 4 heads of 32 + 16 query/key and 32 value dims.
inline GptConfig mla_config(int64_t q_lora_rank) {
  GptConfig c = llama_config();
  c.heads = c.query_groups = 4;
  c.rope_scaling = false;
  kernels::cpu::YarnParams y;
  y.scaling_factor = 40, y.original_max_position_embeddings = 16, y.mscale = y.mscale_all_dim = 0.707;
  c.yarn = y;
  MlaSpec m;
  m.q_lora_rank = q_lora_rank, m.kv_lora_rank = 32, m.qk_head_dim = 32, m.qk_pos_emb_head_dim = 16, m.v_head_dim = 32;
  const double mscale = 0.1 * y.mscale_all_dim * std::log(y.scaling_factor) + 1.0;
  m.softmax_scale = mscale * mscale / std::sqrt(48.0);
  c.mla = m;
  c.kv_channels = m.v_head_dim;
  return c;
}

// Multi-token prediction (Megatron-Core's MTP block) against the CPU model: the main per-token
// losses, the logged MTP losses (each layer's masked mean, scaled as the main loss) and every
// gradient (the shared output layer's and word embedding's from every layer), in three calls:
// eager, the CUDA graphs' warm-up and their replay. loose: MoE routing, where bf16 can flip a
// near-tie for a token (moe_model_cuda_test.cpp's compare_model says how much that moves).
inline void compare_mtp(const GptConfig& c, bool loose = false) {
  CpuAndGpuModels models(c);
  GptModel& cpu = models.cpu;
  CudaGptModel& gpu = models.gpu;
  const Batch& x = models.x;
  MicroBatch mb = models.mb;
  mb.loss_mask = x.mask.data();  // (the GPU's forward takes it apart; MTP rolls it)
  const DropoutKey key{1234, 17, false};
  cpu.set_moe_aux_loss_scale(0.5f);
  gpu.set_moe_aux_loss_scale(0.5f);
  std::vector<float> cpu_loss(static_cast<size_t>(x.b * x.s));
  cpu.zero_grads();
  cpu.forward(mb, key, cpu_loss.data(), /*train_step=*/true);
  cpu.backward(x.dloss.data());
  const std::vector<double> cpu_mtp = cpu.take_mtp_losses();
  ASSERT_EQ(cpu_mtp.size(), static_cast<size_t>(c.mtp_num_layers));
  for (int call = 0; call < 3; ++call) {
    SCOPED_TRACE("call " + std::to_string(call));
    gpu.zero_grads();
    gpu.forward(mb, x.mask.data(), key, x.dloss.data());
    gpu.backward();
    const std::vector<float> gpu_loss = gpu.download_losses();
    double diff = 0;
    for (size_t t = 0; t < cpu_loss.size(); ++t) diff = std::max(diff, double(std::abs(gpu_loss[t] - cpu_loss[t])));
    EXPECT_LT(diff, loose ? 0.15 : 3e-2) << "the main loss, token by token";
    (void)gpu.take_loss_sum();
    const std::vector<double> gpu_mtp = gpu.take_mtp_losses();
    ASSERT_EQ(gpu_mtp.size(), cpu_mtp.size());
    for (size_t k = 0; k < cpu_mtp.size(); ++k) EXPECT_NEAR(gpu_mtp[k], cpu_mtp[k], 1e-2 * cpu_mtp[k]) << "mtp_" << k + 1;
    // The trained parameters' gradients (PEFT: the adapters', from the table's trainable_offset on).
    const int64_t from = cpu.table().trainable_offset;
    ASSERT_EQ(gpu.num_trainable(), cpu.num_trainable());
    std::vector<float> grads(static_cast<size_t>(gpu.num_trainable()));
    gpu.download_grads(grads.data());
    EXPECT_LT(rel_err(grads.data(), cpu.grads(), gpu.num_trainable()), loose ? 0.1 : 2e-2);
    for (const auto& p : cpu.table().specs) {
      const bool routed = p.name.find(".mlp.experts.") != std::string::npos ||
                          p.name.find(".mlp.router.") != std::string::npos;
      if ((loose && routed) || p.frozen) continue;
      EXPECT_LT(rel_err(grads.data() + (p.offset - from), cpu.grads() + (p.offset - from), p.numel), loose ? 0.15 : 6e-2)
          << p.name;
    }
  }
}

// A step of two micro-batches: the first backward after zero_grads() writes the GEMMs' weight
// gradients and zeroes the rest, the second adds to them, so the step's gradients must be each
// micro-batch's alone, summed (to fp32 rounding). Three such steps: eager, the CUDA graphs' warm-up
// and their replay (a graph for the writing backward, one for the adding one).
inline void expect_micro_batches_add_up(const GptConfig& c) {
  GptModel cpu(c);
  std::vector<float> w(static_cast<size_t>(cpu.num_parameters()));
  random_weights(cpu, w.data());
  CudaGptModel gpu(c, 2, 48);
  gpu.upload_weights(w.data());
  const Batch x1 = random_batch(2, 48, c.vocab, 11), x2 = random_batch(2, 48, c.vocab, 12);
  const size_t n = static_cast<size_t>(gpu.num_parameters());
  auto step = [&](std::initializer_list<const Batch*> mbs) {
    gpu.zero_grads();
    for (const Batch* x : mbs) {
      const MicroBatch mb{x->b, x->s, x->tokens.data(), x->labels.data(), x->positions.data()};
      gpu.forward(mb, x->mask.data(), {1234, 3, false}, x->dloss.data());
      gpu.backward();
    }
    std::vector<float> g(n);
    gpu.download_grads(g.data());
    (void)gpu.take_loss_sum();
    return g;
  };
  for (int rep = 0; rep < 3; ++rep) {
    const std::vector<float> g1 = step({&x1}), g2 = step({&x2}), both = step({&x1, &x2});
    int64_t off = 0;
    for (size_t i = 0; i < n; ++i) {
      const double want = double(g1[i]) + g2[i];
      if (std::abs(both[i] - want) > 1e-5 * (std::abs(g1[i]) + std::abs(g2[i])) + 1e-12 && off++ < 5)
        ADD_FAILURE() << "gradient " << i << ": " << both[i] << " after both micro-batches, " << g1[i] << " + " << g2[i]
                      << " alone (step " << rep << ")";
    }
    EXPECT_EQ(off, 0) << "gradients that are not the sum of the micro-batches' (step " << rep << ")";
    double norm1 = 0;
    for (float v : g1) norm1 += double(v) * v;
    EXPECT_GT(norm1, 0.0) << "a micro-batch with gradients";
  }
}

}  // namespace laoyao::model::test
