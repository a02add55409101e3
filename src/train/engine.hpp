// What the training loop asks of a backend: run micro-batches, report the loss, norm and update.
// The CPU engine computes in place on the host GptModel and AdamW. The CUDA engine keeps the
// parameters, gradients and Adam state on its device only: it initialises them there, and the host
// model/AdamW hold no copy: checkpoints stream the state through the host a part at a time
// (download_state / upload_state).
#pragma once
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "dist/process_group.hpp"
#include "train/dist_optimizer.hpp"
#include "model/gpt_model.hpp"
#include "optim/adamw.hpp"
#include "train/data_pipeline.hpp"

namespace laoyao::train {

// Megatron's loss report over micro-batches: masked loss sum and token count.
struct LossSum {
  double sum = 0;
  double count = 0;
};

class Engine {
 public:
  virtual ~Engine() = default;
  virtual std::string name() const = 0;  // "cpu" or "cuda:0 (NVIDIA H200, ...)"
  virtual void zero_grads() = 0;
  // Forward of one micro-batch, and backward when `dloss` (per-token loss gradients) is given.
  // The micro-batch's masked loss sum is added to a running sum that take_loss_sum() returns.
  virtual void run_micro_batch(const MicroBatchData& mb, const model::DropoutKey& key, const float* dloss) = 0;
  virtual LossSum take_loss_sum() = 0;
  virtual double grad_norm() = 0;
  // Both, with one wait for the device (the training step's only one before the update).
  virtual std::pair<LossSum, double> take_loss_sum_and_grad_norm() {
    const LossSum loss = take_loss_sum();
    return {loss, grad_norm()};
  }
  virtual int64_t count_zero_grads() = 0;
  virtual double params_norm() = 0;
  // Megatron's clip (coefficient max_norm / (norm + 1e-6) when below 1, none when max_norm <= 0)
  // and one AdamW step (decoupled_lr: the word embeddings' and output layer's rate, --decoupled-lr).
  virtual void clip_and_step(double norm, double max_norm, double lr, double wd,
                             std::optional<double> decoupled_lr = {}) = 0;
  // After a step's micro-batches, before any gradient is read: sums over the tensor-parallel
  // group what each rank computed from its share of the sequence (sequence parallelism).
  virtual void finalize_grads() {}
  // Data parallelism: gradients summed over the group's ranks, then scaled (1 / data-parallel
  // size: Megatron's gradient averaging).
  virtual void all_reduce_grads(dist::ProcessGroup& group, double scale) = 0;
  // Every gradient times s (--calculate-per-token-loss: 1 / the step's tokens, after the sums).
  virtual void scale_grads(double s) = 0;
  // --overlap-grad-reduce: called before the step's last micro-batch, so that its backward starts
  // reducing each part of the gradients as soon as it is final; all_reduce_grads(group, scale)
  // then reduces the rest and waits. An engine that cannot overlap ignores it.
  virtual void start_grad_sync(dist::ProcessGroup& /*group*/, double /*scale*/) {}
  // Mixture of Experts: the gradient scale of the load-balancing and z losses (Megatron's
  // MoEAuxLossAutoScaler: 1 / num_microbatches), and those losses over the training micro-batches
  // since the last call (model::GptModel::take_moe_losses). Dense models: nothing.
  virtual void set_moe_aux_loss_scale(double /*scale*/) {}
  // How multi-token prediction's losses are weighed and logged (model::MtpLossScale).
  virtual void set_mtp_loss_scale(const model::MtpLossScale& /*scale*/) {}
  virtual model::GptModel::MoeLosses take_moe_losses() { return {}; }
  // Multi-token prediction: each layer's logged loss since the last call
  // (model::GptModel::take_mtp_losses); empty without MTP layers.
  virtual std::vector<double> take_mtp_losses() { return {}; }
  // After a step's micro-batches (model::GptModel::finish_moe_step): aux-loss-free balancing moves
  // the experts' biases (dp: the data-parallel group whose tokens count), global_aux_loss's running
  // counts start over. Without them: nothing.
  virtual void finish_moe_step(dist::ProcessGroup* /*dp*/) {}
  // --profile: cudaProfilerStart (true) or, once the device has finished the work so far,
  // cudaProfilerStop (false), Nsight Systems' capture range (nsys --capture-range=cudaProfilerApi).
  // The CPU engine has nothing to capture.
  virtual void cuda_profiler(bool /*start*/) {}
  // The run's initial weights (train/tp_state.hpp init_model_weights' values) and zero moments,
  // where the engine keeps them: the start of a run. Only the parameters `drawn` picks (when given)
  // are drawn; the others, which a checkpoint is about to overwrite, are left zero.
  virtual void initialize_weights(uint64_t seed, bool bf16, const model::ParamFilter& drawn = {}) = 0;
  // A range of the state, through the host a part at a time (checkpoints): the fp32 main parameters
  // at offsets of the model's buffer (an upload refreshes their bf16 copies; under the distributed
  // optimizer a rank's are up to date in its owned segments only), Adam's moments at offsets of
  // AdamW's buffers. Downloads may come from several threads at once.
  enum class StateBuffer { kWeights, kExpAvg, kExpAvgSq };
  virtual void download_state(StateBuffer b, int64_t offset, int64_t count, float* out) = 0;
  virtual void upload_state(StateBuffer b, int64_t offset, int64_t count, const float* in) = 0;
  // AdamW's step count (bias correction), wherever the engine keeps it.
  virtual int64_t optimizer_steps() const = 0;
  virtual void set_optimizer_steps(int64_t t) = 0;
  // The whole state at once into the host model and AdamW (held: tp_state.hpp HostStateHold) and
  // back (tests; under the distributed optimizer pull_state gathers the weights, collective).
  virtual void pull_state() {}
  virtual void push_state() {}
  // Peak device memory in bytes (0 on the CPU).
  virtual size_t peak_device_bytes() const { return 0; }
  // Waits until the device has done all the work queued so far (Megatron's timers' CUDA
  // synchronize; nothing to wait for on the CPU).
  virtual void synchronize() {}
};

// shards: the distributed optimizer's shares of this rank (train/dist_optimizer.hpp; adam then is
// make_shard_adam's); null steps the whole model.
std::unique_ptr<Engine> make_cpu_engine(model::GptModel& model, optim::AdamW& adam,
                                        const OptimizerShards* shards = nullptr);

// The CUDA engine on the current device for micro-batches of up to max_b sequences of s tokens.
// Throws UsageError when the CUDA backend is not built or the model has features it lacks.
// shards: as make_cpu_engine's.
std::unique_ptr<Engine> make_cuda_engine(model::GptModel& model, optim::AdamW& adam, const optim::AdamWSettings& s,
                                         int64_t max_b, int64_t seq, const OptimizerShards* shards = nullptr);

// Which backend a run of `model` uses: LAOYAO_DEVICE=cpu|cuda, or (unset) the GPU when one is
// visible and the CUDA backend can train the model (else the CPU, with a note saying why).
// Throws UsageError for another value, for cuda without a GPU or for a model it cannot train.
struct BackendChoice {
  bool cuda = false;
  std::string note;  // "" or one line for the user (why a visible GPU is not used)
};
BackendChoice choose_backend(const model::GptConfig& model);

// What the CUDA backend cannot train in `model` ("" when it can; "not built" without it).
std::string cuda_backend_gaps(const model::GptConfig& model);

}  // namespace laoyao::train
