// The CPU reference engine: the host GptModel and AdamW do the work.
#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "core/device.hpp"
#include "core/error.hpp"
#include "core/runtime_options.hpp"
#include "train/engine.hpp"
#include "train/tp_state.hpp"

namespace laoyao::train {
namespace {

class CpuEngine final : public Engine {
 public:
  CpuEngine(model::GptModel& m, optim::AdamW& a, OptimizerShards shards)
      : model_(m), adam_(a), shards_(std::move(shards)) {}
  std::string name() const override { return "cpu"; }
  int64_t optimizer_steps() const override { return adam_.steps(); }
  void set_optimizer_steps(int64_t t) override { adam_.set_steps(t); }
  void download_state(StateBuffer b, int64_t offset, int64_t count, float* out) override {
    const float* from = buffer(b) + offset;
    std::copy(from, from + count, out);
  }
  void upload_state(StateBuffer b, int64_t offset, int64_t count, const float* in) override {
    std::copy(in, in + count, buffer(b) + offset);
  }
  void initialize_weights(uint64_t seed, bool bf16, const model::ParamFilter& drawn) override {
    init_model_weights(model_, seed, bf16, drawn);
  }
  void zero_grads() override { model_.zero_grads(); }
  void finalize_grads() override { model_.finalize_grads(); }
  void set_moe_aux_loss_scale(double scale) override { model_.set_moe_aux_loss_scale(static_cast<float>(scale)); }
  void set_mtp_loss_scale(const model::MtpLossScale& scale) override { model_.set_mtp_loss_scale(scale); }
  model::GptModel::MoeLosses take_moe_losses() override { return model_.take_moe_losses(); }
  std::vector<double> take_mtp_losses() override { return model_.take_mtp_losses(); }
  void finish_moe_step(dist::ProcessGroup* dp) override { model_.finish_moe_step(dp); }

  void run_micro_batch(const MicroBatchData& mb, const model::DropoutKey& key, const float* dloss) override {
    const int64_t T = mb.b * mb.s;
    losses_.resize(static_cast<size_t>(T));
    model::MicroBatch in{mb.b,    mb.s, mb.tokens.data(), mb.labels.data(), mb.positions.data(), mb.key_start_or_null(),
                         mb.loss_mask.data(), mb.cp_places_or_null(), mb.is_first_microbatch};
    model_.forward(in, key, losses_.data(), dloss != nullptr);
    for (int64_t t = 0; t < T; ++t) {
      acc_.sum += static_cast<double>(losses_[t]) * mb.loss_mask[t];
      acc_.count += mb.loss_mask[t];
    }
    if (dloss) model_.backward(dloss);
  }
  LossSum take_loss_sum() override { return std::exchange(acc_, LossSum{}); }
  double grad_norm() override {
    if (model_.tp_size() > 1 || model_.ep_size() > 1) return model_.grad_norm();  // parts summed over the group
    return optim::grad_norm(model_.grads(), model_.num_trainable());
  }
  int64_t count_zero_grads() override { return model_.count_zero_grads(); }
  // Over the parameters (buffers left out), split parts summed over their group.
  double params_norm() override { return model_.params_norm(); }
  void all_reduce_grads(dist::ProcessGroup& group, double scale) override {
    float* g = model_.grads();
    const int64_t n = model_.num_trainable();
    if (model_.ep_size() > 1) {
      // Expert parallelism: a rank's experts hold every rank's tokens already; they are summed
      // only over the ranks that hold the same experts (if any), the rest over all the
      // data-parallel ranks; both then take the data-parallel average's scale (Megatron's
      // expert data-parallel reduction).
      int64_t at = 0;
      for (const auto& [offset, count] : model_.routed_expert_ranges()) {
        if (offset > at) group.all_reduce_sum(g + at, static_cast<size_t>(offset - at));
        if (dist::ProcessGroup* edp = model_.expert_dp_group())
          edp->all_reduce_sum(g + offset, static_cast<size_t>(count));
        at = offset + count;
      }
      if (n > at) group.all_reduce_sum(g + at, static_cast<size_t>(n - at));
    } else {
      group.all_reduce_sum(g, static_cast<size_t>(n));
    }
    scale_grads(scale);
  }
  void scale_grads(double scale) override {
    float* g = model_.grads();
    const float s = static_cast<float>(scale);
    if (s == 1.0f) return;  // a per-token loss's sum: nothing to scale
    const int64_t n = model_.num_trainable();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) g[i] *= s;
  }
  // With the distributed optimizer this rank steps its share (every rank holds the whole averaged
  // gradients here: the all-reduce above), then the shares are gathered.
  void clip_and_step(double norm, double max_norm, double lr, double wd, std::optional<double> decoupled_lr) override {
    // (The shards cover the trained parameters: the weights from the table's trainable_offset on.)
    float* trained = model_.weights() + model_.table().trainable_offset;
    step_owned(adam_, shards_, trained, model_.grads(), norm, max_norm, lr, wd, decoupled_lr, step_scratch_);
    if (shards_.sharded()) gather_shares(trained, shards_, gather_);
  }

 private:
  float* buffer(StateBuffer b) {
    if (b == StateBuffer::kWeights) return model_.weights();
    return b == StateBuffer::kExpAvg ? adam_.exp_avg().data() : adam_.exp_avg_sq().data();
  }
  model::GptModel& model_;
  optim::AdamW& adam_;
  OptimizerShards shards_;
  std::vector<float> gather_, step_scratch_;  // the distributed optimizer's all-gather and step buffers
  std::vector<float> losses_;
  LossSum acc_;
};

}  // namespace

std::unique_ptr<Engine> make_cpu_engine(model::GptModel& model, optim::AdamW& adam, const OptimizerShards* shards) {
  return std::make_unique<CpuEngine>(model, adam, shards ? *shards : whole_model_shards(model.num_trainable()));
}

BackendChoice choose_backend(const model::GptConfig& model) {
  using Device = RuntimeOptions::Device;
  const Device want = runtime_options().device;
  if (want == Device::kCpu) return {false, ""};
  if (want == Device::kCuda) {
    if (!cuda_backend_built()) throw UsageError("LAOYAO_DEVICE=cuda: this laoyao was built without the CUDA backend");
    if (cuda_device_count() == 0) throw UsageError("LAOYAO_DEVICE=cuda: no CUDA device is visible");
  } else if (cuda_device_count() == 0) {
    return {false, ""};
  }
  const std::string gaps = cuda_backend_gaps(model);
  if (gaps.empty()) return {true, ""};
  if (want == Device::kCuda)
    throw UsageError("LAOYAO_DEVICE=cuda: the CUDA backend cannot train this model yet: " + gaps +
                     " (LAOYAO_DEVICE=cpu trains it on the CPU)");
  return {false, "laoyao: a GPU is visible, but the CUDA backend cannot train this model yet (" + gaps +
                     "): training on the CPU"};
}

}  // namespace laoyao::train
