// The CPU backend of the model's ops (model/backend.hpp): fp32 activations, the reference ops of
// kernels/cpu (each checked against an fp64 twin and by finite differences), the tensor-parallel
// collectives over a Gloo group (model/tensor_parallel.hpp). What an op's backward needs beyond
// its arguments (attention's probabilities, per layer) it keeps here.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "dist/process_group.hpp"
#include "kernels/cpu/ops.hpp"
#include "model/backend.hpp"
#include "model/cpu/fp8_linears_cpu.hpp"
#include "model/cpu/moe_layers_cpu.hpp"
#include "model/gpt_config.hpp"

namespace laoyao::model {

class CpuBackend final : public Backend {
 public:
  // local: this rank's shapes; tp: the tensor-parallel group (null for one rank).
  CpuBackend(const GptConfig& local, dist::ProcessGroup* tp, int64_t tp_rank, int64_t tp_size);
  // The table's weights and gradients the ops read and accumulate into (again after they move):
  // grads holds the trained parameters from trainable_offset on (ParameterTable), the frozen ones
  // before it have none.
  void bind(const float* weights, float* grads, int64_t trainable_offset = 0) {
    w_ = weights, g_ = grads, trainable_offset_ = trainable_offset;
  }
  // The MoE layers' ops (null for a dense model); their experts' GEMMs take this backend's FP8 state.
  void set_moe(CpuMoeLayers* moe) {
    moe_ = moe;
    if (moe_) moe_->set_fp8(fp8_.get());
  }
  // FP8 delayed scaling's amax reduction group (CpuFp8Linears::set_amax_group).
  void set_fp8_amax_group(dist::ProcessGroup* group) {
    if (fp8_) fp8_->set_amax_group(group);
  }
  // Context parallelism: the group whose ranks hold the other chunks of each sequence.
  void set_context_parallel(dist::ProcessGroup* cp) { cp_ = cp; }

  size_t activation_bytes() const override { return sizeof(float); }
  void* reserve_activations(size_t bytes) override;

  void embedding(const int64_t* ids, int64_t table, Act out, int64_t T, int64_t h, tp::Shard vocab,
                 bool accumulate) override;
  void embedding_backward(const int64_t* ids, Act dout, int64_t table, int64_t T, int64_t h, tp::Shard vocab) override;
  void linear(Act x, int64_t w, int64_t b, Act y, int64_t rows, int64_t K, int64_t N) override;
  void linear_backward(Act x, int64_t w, int64_t b, Act dy, Act dx, int64_t rows, int64_t K, int64_t N) override;
  void linear_bias_dropout_add(Act x, int64_t w, int64_t b, Act residual, Act out, int64_t rows, int64_t K, int64_t N,
                               const DropoutSpec& drop) override;
  void bias_dropout_add(Act x, int64_t b, Act residual, Act out, int64_t rows, int64_t N,
                        const DropoutSpec& drop) override;
  void dropout(Act x, Act y, int64_t n, const DropoutSpec& drop) override;
  void norm(Act x, int64_t w, int64_t b, Act y, float* mean, float* rstd, int64_t rows, int64_t width) override;
  void norm_backward(Act dy, Act x, int64_t w, int64_t b, const float* mean, const float* rstd, Act dx, int64_t rows,
                     int64_t width, bool accumulate, int64_t dx_bias) override;
  bool sums_bias_grad_in_norm() const override { return false; }  // linear_backward sums them
  void copy_columns(Act src, int64_t src_ld, Act dst, int64_t dst_ld, int64_t rows, int64_t cols) override;
  void mlp_fc1(Act x, int64_t fc1_w, int64_t fc1_b, Act u, Act g, int64_t rows, int64_t ffn) override;
  void mlp_fc2_backward(Act dy, Act g, Act u, int64_t fc2_w, int64_t fc2_b, Act du, int64_t rows,
                        int64_t ffn) override;
  void mlp_activation(Act u, Act g, int64_t rows, int64_t ffn) override;
  void mlp_activation_backward(Act dg, Act u, Act du, int64_t rows, int64_t ffn) override;
  void lora_forward(Act x, int64_t lora_a, int64_t lora_b, float scale, Act a, Act y, int64_t rows, int64_t K,
                    int64_t r, int64_t N) override;
  void lora_backward(Act x, int64_t lora_a, int64_t lora_b, float scale, Act a, Act dy, Act da, Act dx, int64_t rows,
                     int64_t K, int64_t r, int64_t N, bool accumulate) override;
  void qkv_prepare(Act qkv, int64_t q_norm, int64_t k_norm, Act qkv_attn, float* qk_rstd,
                   const BatchShape& batch) override;
  void qkv_prepare_backward(Act dqkv, Act qkv, int64_t q_norm, int64_t k_norm, const float* qk_rstd,
                            const BatchShape& batch) override;
  void core_attention(int64_t layer, Act qkv_attn, Act ctx, const BatchShape& batch, const DropoutSpec& drop) override;
  void core_attention_backward(int64_t layer, Act qkv_attn, Act dctx, Act dqkv, const BatchShape& batch,
                               const DropoutSpec& drop) override;
  void mla_prepare(Act q, Act kv, Act k_pe, int64_t k_pe_ld, Act query, Act key, Act value,
                   const BatchShape& batch) override;
  void mla_prepare_backward(Act dquery, Act dkey, Act dvalue, Act dq, Act dkv, Act dk_pe, int64_t dk_pe_ld,
                            const BatchShape& batch) override;
  void separate_core_attention(int64_t layer, Act q, Act k, Act v, Act ctx, int64_t dqk, int64_t dv, float scale,
                               const BatchShape& batch, const DropoutSpec& drop) override;
  void separate_core_attention_backward(int64_t layer, Act q, Act k, Act v, Act dctx, Act dquery, Act dkey,
                                        Act dvalue, int64_t dqk, int64_t dv, float scale, const BatchShape& batch,
                                        const DropoutSpec& drop) override;
  void moe_layer(int64_t layer, Act x, Act y, const BatchShape& batch, MoePass pass, uint64_t random_logits_key,
                 Act residual) override;
  void moe_layer_backward(int64_t layer, Act x, Act dy, Act dx, const BatchShape& batch,
                          float aux_loss_scale) override;
  void cross_entropy(Act logits, const int64_t* labels, float* losses, float* stats, int64_t T, tp::Shard vocab,
                     const float* dloss) override;
  void cross_entropy_backward(Act logits, const int64_t* labels, const float* stats, const float* dloss, int64_t T,
                              tp::Shard vocab) override;
  void tp_all_reduce(Act x, int64_t n) override;
  void sp_gather(Act local, Act full, const BatchShape& batch, int64_t h) override;
  void sp_reduce_scatter(Act full, Act local, const BatchShape& batch, int64_t h) override;
  void sp_slice(Act full, Act local, const BatchShape& batch, int64_t h) override;
  void fp8_layer(int64_t layer, Fp8Pass pass) override;
  void fp8_pass_done(Fp8Pass pass) override;
  void fp8_new_weights() override;
  // The FP8 linear layers' state (null without GptConfig::fp8).
  const CpuFp8Linears* fp8_linears() const { return fp8_.get(); }

 private:
  const float* W(int64_t off) const { return off >= 0 ? w_ + off : nullptr; }
  float* G(int64_t off) const { return off >= trainable_offset_ ? g_ + (off - trainable_offset_) : nullptr; }
  static float* F(Act a) { return static_cast<float*>(a.p); }
  float* scratch(std::vector<float>& v, int64_t n);
  // A linear layer's GEMMs, y = x w^T + b and its gradients (as kernels/cpu's linear_forward and
  // linear_backward): on FP8 operands inside a layer that runs in FP8, else in fp32.
  void gemm(const float* x, int64_t w, int64_t b, float* y, int64_t rows, int64_t K, int64_t N);
  void gemm_backward(const float* x, int64_t w, int64_t b, const float* dy, float* dx, int64_t rows, int64_t K,
                     int64_t N);
  // The attention dropout mask of this shape (0 or 1/(1-p) per probability), or null without dropout.
  const float* attention_mask(const DropoutSpec& drop, const BatchShape& batch);
  const int64_t* rope_positions(const BatchShape& batch);
  // Context parallelism: each local token's place in its sequence, and the whole sequences' fused
  // QKV rows gathered from the group's ranks into full [b * s * cp, row].
  const int32_t* cp_positions(const BatchShape& batch);
  void cp_gather_rows(const float* local, float* full, const BatchShape& batch, int64_t row);

  const GptConfig& lc_;
  dist::ProcessGroup* tp_;
  int64_t tp_rank_, tp_size_;
  const float* w_ = nullptr;
  float* g_ = nullptr;
  int64_t trainable_offset_ = 0;
  CpuMoeLayers* moe_ = nullptr;
  std::vector<float> arena_;
  kernels::cpu::RopeTable rope_;
  std::vector<int64_t> rope_positions_;           // t % s: Megatron builds RoPE for positions 0..s-1
  std::vector<std::vector<float>> probs_;         // per layer [b, heads, s, s]
  std::vector<float> mask_, norm_dx_, dg_, dqk_;  // scratch
  std::unique_ptr<CpuFp8Linears> fp8_;
  dist::ProcessGroup* cp_ = nullptr;
  std::vector<int32_t> cp_positions_;
  std::vector<float> cp_full_, cp_dfull_;
};

}  // namespace laoyao::model
