// The MoE layers of a GPT model on the CPU backend: each layer's router, token dispatch, experts
// and shared expert (kernels/cpu/moe.hpp), its saved state between forward and backward, the
// expert-parallel or folded stages the routed tokens go through (model/moe_expert_parallel.hpp,
// model/moe_share_stage.hpp), and the losses and expert loads the trainer logs and balances by.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "dist/process_group.hpp"
#include "kernels/cpu/moe.hpp"
#include "model/backend.hpp"
#include "model/cpu/fp8_linears_cpu.hpp"
#include "model/gpt_config.hpp"
#include "model/gpt_layout.hpp"

namespace laoyao::model {

// The MoE losses, each divided by its coefficient (as Megatron logs them), summed over the layers.
struct MoeLosses {
  double aux = 0, seq_aux = 0, z = 0, global_aux = 0;
};

class CpuMoeLayers {
 public:
  // whole / local: the model and this rank's part of it (tp_size ranks of tensor parallelism);
  // ep: the expert-parallel group (ep_size ranks, null for one); folded: whole experts under
  // tensor parallelism (model/moe_share_stage.hpp). weights/grads: the table's buffers (the stages
  // keep pointers to the experts' parameters in them).
  CpuMoeLayers(const GptConfig& whole, const GptConfig& local, const GptParameterLayout& layout, int64_t tp_rank,
               int64_t tp_size, dist::ProcessGroup* ep, bool folded, float* weights, float* grads);
  ~CpuMoeLayers();

  // Layer l on x[T, h] into y[T, h] (batch: the micro-batch's shape, this rank's context-parallel
  // chunks among it; train_step: a training forward).
  void forward(int64_t l, const float* weights, const float* x, float* y, const BatchShape& batch, bool train_step,
               uint64_t random_logits_key);
  void backward(int64_t l, const float* weights, float* grads, const float* x, const float* dy, float* dx, int64_t T,
                float aux_loss_scale);

  MoeLosses last_losses() const;
  // A training forward's backward ran: its losses are logged and (aux-loss-free balancing) its
  // tokens per expert counted, until take_losses / update_expert_bias.
  void count_training_forward();
  MoeLosses take_losses();
  // GptModel::update_expert_bias / finish_moe_step / set_data_parallel_group / expert_load.
  void update_expert_bias(float* weights, dist::ProcessGroup* dp);
  void reset_global_aux();
  void set_data_parallel_group(dist::ProcessGroup* dp);
  // Context parallelism: the aux losses' tokens per expert summed over cp, the z-loss's
  // coefficient divided by its size (null or one rank: none).
  void set_context_parallel_group(dist::ProcessGroup* cp);
  std::vector<double> expert_load(int64_t layer) const;
  // The backend's FP8 linear layers (null: none): where the current layer runs in FP8, the experts'
  // and the shared expert's GEMMs do.
  void set_fp8(CpuFp8Linears* fp8);

 private:
  // grads: null in a forward (PEFT's adapters' gradients are pointed at in the backward).
  kernels::cpu::MoeLayerWeights weights_of(int64_t l, const float* weights, float* grads = nullptr) const;
  kernels::cpu::MoeLayerGrads grads_of(int64_t l, float* grads) const;

  const GptConfig& whole_;
  const GptParameterLayout& layout_;
  bool folded_;
  kernels::cpu::MoeLayerConfig cfg_;
  std::vector<kernels::cpu::MoeLayerState> states_;  // per layer (unused for dense layers)
  // Each MoE layer's routed-experts stage under expert parallelism or with whole experts under TP
  // (null for dense layers, or neither: kernels/cpu/moe runs the experts itself).
  std::vector<std::unique_ptr<kernels::cpu::MoeExpertsStage>> stages_;
  std::vector<std::vector<double>> expert_load_;  // per layer [E]: tokens since update_expert_bias
  std::vector<int64_t> random_logits_rows_;        // [T] under context parallelism (force_load_balancing)
  // PEFT: each layer's adapters on the routed experts and on the shared expert (weights_of's).
  mutable std::vector<std::pair<kernels::cpu::MoeAdapters, kernels::cpu::MoeAdapters>> lora_;
  CpuFp8Linears* fp8_ = nullptr;
  // FP8: each MoE layer's routed experts' and shared expert's casts (null: none), 2 a layer.
  std::vector<std::unique_ptr<CpuFp8Experts>> fp8_experts_;
  MoeLosses losses_;
};

}  // namespace laoyao::model
