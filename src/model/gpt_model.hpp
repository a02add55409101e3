// Megatron-Core's GPTModel on the CPU reference backend: embedding (word + learned positions),
// pre-norm TransformerLayers (fused-QKV causal attention, MLP), final norm, output layer (tied to
// the word embedding by default), per-token cross entropy over the padded vocabulary. Forward
// keeps what backward needs; backward is hand-written and accumulates into the gradient buffer.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/cpu/ops.hpp"
#include "model/gpt_config.hpp"
#include "model/gpt_layout.hpp"
#include "model/parameters.hpp"

namespace laoyao::model {

// One micro-batch: b sequences of s tokens, batch-major (token t = batch*s + position).
struct MicroBatch {
  int64_t b = 0, s = 0;
  const int64_t* tokens = nullptr;
  const int64_t* labels = nullptr;
  const int64_t* positions = nullptr;
};

// Where dropout masks come from: keyed by seed and a per-call counter, so a run is reproducible
// and the same micro-batch gets the same masks however the work is split.
struct DropoutKey {
  uint64_t seed = 0;
  uint64_t call = 0;  // e.g. iteration * 1e6 + micro-batch index
  bool training = false;
};

class GptModel {
 public:
  explicit GptModel(const GptConfig& cfg);

  const GptConfig& config() const { return cfg_; }
  const ParameterTable& table() const { return table_; }
  float* weights() { return weights_.data(); }
  const float* weights() const { return weights_.data(); }
  float* grads() { return grads_.data(); }
  int64_t num_parameters() const { return table_.total; }
  void zero_grads();

  // Per-token losses [b*s] (fp32, unmasked: the caller applies the loss mask).
  void forward(const MicroBatch& mb, const DropoutKey& key, float* losses);
  // d(sum_t dloss[t] * loss[t]) accumulated into grads(); call right after forward() of the same batch.
  void backward(const float* dloss);

 private:
  using LayerParams = GptLayerOffsets;
  struct LayerActs {  // offsets into acts_
    int64_t x_in, ln1, ln1_mean, ln1_rstd, qkv, qkv_attn, qk_rstd, probs, attn_mask, ctx, drop1, x_mid, ln2, ln2_mean,
        ln2_rstd, u, g, drop2;
  };
  void build_parameter_table();
  void allocate_activations(int64_t b, int64_t s);
  float* P(int64_t off) { return weights_.data() + off; }
  float* G(int64_t off) { return grads_.data() + off; }
  float* A(int64_t off) { return acts_.data() + off; }
  // An optional parameter (a bias, a LayerNorm beta): offset -1 when the model has none.
  float* opt(int64_t off) { return off >= 0 ? P(off) : nullptr; }
  float* gopt(int64_t off) { return off >= 0 ? G(off) : nullptr; }

  GptConfig cfg_;
  ParameterTable table_;
  std::vector<float> weights_, grads_;
  int64_t word_emb_ = -1, pos_emb_ = -1, final_w_ = -1, final_b_ = -1, output_w_ = -1;
  std::vector<LayerParams> layers_;

  // Activations of the last forward (allocated once per micro-batch shape).
  int64_t b_ = 0, s_ = 0;
  std::vector<float> acts_;
  std::vector<LayerActs> layer_acts_;
  int64_t emb_drop_ = 0, x_final_in_ = 0, xf_ = 0, xf_mean_ = 0, xf_rstd_ = 0, logits_ = 0, lse_ = 0;
  std::vector<float> work_;  // backward scratch
  std::vector<int64_t> tokens_, labels_, positions_, rope_positions_;
  kernels::cpu::RopeTable rope_;
  bool training_ = false;
};

}  // namespace laoyao::model
