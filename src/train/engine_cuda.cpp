// The CUDA engine: a CudaGptModel plus the Adam state on the device (fp32 exp_avg/exp_avg_sq and a
// weight-decay flag per parameter). Built only with the CUDA backend.
#include <cmath>
#include <string>
#include <vector>

#include "core/device.hpp"
#include "core/error.hpp"
#include "train/engine.hpp"

#if LAOYAO_HAVE_CUDA
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/device_buffer.hpp"
#include "kernels/cuda/optimizer.hpp"
#include "model/cuda/gpt_model_cuda.hpp"
#endif

namespace laoyao::train {

#if LAOYAO_HAVE_CUDA
namespace {

namespace kc = laoyao::kernels::cuda;

class CudaEngine final : public Engine {
 public:
  CudaEngine(model::GptModel& host, optim::AdamW& adam, const optim::AdamWSettings& s, int64_t max_b, int64_t seq)
      : host_(host), adam_(adam), settings_(s), gpu_(host.config(), max_b, seq) {
    const int64_t n = gpu_.num_parameters();
    m_ = kc::DeviceBuffer(sizeof(float) * n);
    v_ = kc::DeviceBuffer(sizeof(float) * n);
    decay_ = kc::DeviceBuffer(static_cast<size_t>(n));
    std::vector<uint8_t> flags(static_cast<size_t>(n), 0);
    for (const auto& p : gpu_.table().specs)
      std::fill(flags.begin() + p.offset, flags.begin() + p.offset + p.numel, p.weight_decay ? 1 : 0);
    decay_.upload(flags.data(), flags.size());
    scratch_ = kc::DeviceBuffer(sizeof(double) * (kc::kReduceBlocks + 1));
    int dev = 0;
    LAOYAO_CUDA_CHECK(cudaGetDevice(&dev));
    name_ = "cuda:" + std::to_string(dev) + " (" + cuda_device_summary(dev) + "), " + gpu_.attention_path() +
            " attention";
  }

  std::string name() const override { return name_; }
  void zero_grads() override { gpu_.zero_grads(); }
  void run_micro_batch(const MicroBatchData& mb, const model::DropoutKey& key, const float* dloss) override {
    model::MicroBatch in{mb.b, mb.s, mb.tokens.data(), mb.labels.data(), mb.positions.data()};
    gpu_.forward(in, mb.loss_mask.data(), key, dloss);
    if (dloss) gpu_.backward();
  }
  LossSum take_loss_sum() override {
    auto [sum, count] = gpu_.take_loss_sum();
    return {sum, count};
  }
  std::pair<LossSum, double> take_loss_sum_and_grad_norm() override {
    kc::sum_squares(gpu_.main_grads(), gpu_.num_parameters(), scratch(), result(), gpu_.stream());
    double sum_sq = 0;
    const auto [sum, count] = gpu_.take_loss_sum(result(), &sum_sq);
    return {{sum, count}, std::sqrt(sum_sq)};
  }
  double grad_norm() override {
    kc::sum_squares(gpu_.main_grads(), gpu_.num_parameters(), scratch(), result(), gpu_.stream());
    return std::sqrt(read_result());
  }
  int64_t count_zero_grads() override {
    kc::count_zeros(gpu_.main_grads(), gpu_.num_parameters(), scratch(), result(), gpu_.stream());
    return static_cast<int64_t>(read_result());
  }
  double params_norm() override {
    kc::sum_squares(gpu_.main_params(), gpu_.num_parameters(), scratch(), result(), gpu_.stream());
    return std::sqrt(read_result());
  }
  void clip_and_step(double norm, double max_norm, double lr, double wd) override {
    ++steps_;
    kc::AdamWStep s;
    s.beta1 = static_cast<float>(settings_.beta1);
    s.beta2 = static_cast<float>(settings_.beta2);
    s.eps = settings_.eps;
    s.lr = lr;
    s.wd = wd;
    s.step_size = lr / (1.0 - std::pow(settings_.beta1, static_cast<double>(steps_)));
    s.bc2_sqrt = std::sqrt(1.0 - std::pow(settings_.beta2, static_cast<double>(steps_)));
    if (max_norm > 0) {  // optim::clip_grads' rule
      const double coeff = max_norm / (norm + 1e-6);
      if (coeff < 1.0) s.grad_scale = static_cast<float>(coeff);
    }
    kc::adamw_step(gpu_.main_params(), gpu_.main_grads(), m_.as<float>(), v_.as<float>(), gpu_.params(),
                   decay_.as<uint8_t>(), gpu_.num_parameters(), s, gpu_.stream());
  }
  // The fp32 main gradients averaged over the data-parallel ranks by NCCL, on the model's stream
  // (the next read of the gradients, the norm, waits for it there).
  void all_reduce_grads(dist::ProcessGroup& group, double scale) override {
    group.all_reduce_sum_device(gpu_.main_grads(), static_cast<size_t>(gpu_.num_parameters()), gpu_.stream(), scale);
  }
  void pull_state() override {
    gpu_.download_weights(host_.weights());
    m_.download(adam_.exp_avg().data(), m_.bytes);
    v_.download(adam_.exp_avg_sq().data(), v_.bytes);
    adam_.set_steps(steps_);
  }
  void push_state() override {
    LAOYAO_CUDA_CHECK(cudaStreamSynchronize(gpu_.stream()));
    gpu_.upload_weights(host_.weights());
    m_.upload(adam_.exp_avg().data(), m_.bytes);
    v_.upload(adam_.exp_avg_sq().data(), v_.bytes);
    steps_ = adam_.steps();
  }
  size_t peak_device_bytes() const override {
    // Every device allocation is made up front, so the peak is what is held (cuBLASLt's workspace
    // and the CUDA context aside).
    return gpu_.device_bytes() + m_.bytes + v_.bytes + decay_.bytes + scratch_.bytes;
  }

 private:
  double* scratch() { return scratch_.as<double>(); }
  double* result() { return scratch_.as<double>() + kc::kReduceBlocks; }
  double read_result() {
    double v = 0;
    LAOYAO_CUDA_CHECK(cudaMemcpyAsync(&v, result(), sizeof v, cudaMemcpyDeviceToHost, gpu_.stream()));
    LAOYAO_CUDA_CHECK(cudaStreamSynchronize(gpu_.stream()));
    return v;
  }

  model::GptModel& host_;
  optim::AdamW& adam_;
  optim::AdamWSettings settings_;
  model::CudaGptModel gpu_;
  kc::DeviceBuffer m_, v_, decay_, scratch_;
  int64_t steps_ = 0;
  std::string name_;
};

}  // namespace

std::unique_ptr<Engine> make_cuda_engine(model::GptModel& model, optim::AdamW& adam, const optim::AdamWSettings& s,
                                         int64_t max_b, int64_t seq) {
  return std::make_unique<CudaEngine>(model, adam, s, max_b, seq);
}

std::string cuda_backend_gaps(const model::GptConfig& model) { return model::cuda_unsupported_features(model); }
#else
std::string cuda_backend_gaps(const model::GptConfig&) { return "the CUDA backend is not built"; }

std::unique_ptr<Engine> make_cuda_engine(model::GptModel&, optim::AdamW&, const optim::AdamWSettings&, int64_t,
                                         int64_t) {
  throw UsageError("this laoyao was built without the CUDA backend");
}
#endif

}  // namespace laoyao::train
