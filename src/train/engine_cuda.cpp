// The CUDA engine: a CudaGptModel plus the Adam state on the device (fp32 exp_avg/exp_avg_sq and a
// weight-decay flag per parameter). Built only with the CUDA backend.
//
// With the distributed optimizer (train/dist_optimizer.hpp) the gradients of each run are
// reduce-scattered (averaged) into the ranks' pieces in place, each rank keeps Adam's moments and
// steps the fp32 main parameters of its owned segments only, and the updated bf16 pieces are
// all-gathered in place (Megatron's scheme, megatron-lm.md §8.3). The main parameters outside the
// share are stale on the device; a checkpoint gathers them over the groups.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/device.hpp"
#include "core/error.hpp"
#include "core/runtime_options.hpp"
#include "train/engine.hpp"

#if LAOYAO_HAVE_CUDA
#include <cuda_profiler_api.h>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/device_buffer.hpp"
#include "kernels/cuda/elementwise.hpp"
#include "kernels/cuda/optimizer.hpp"
#include "kernels/cuda/stream_wait.hpp"
#include "model/cuda/gpt_model_cuda.hpp"
#include "model/gpt_ep.hpp"
#include "model/parameters.hpp"
#include "train/tp_state.hpp"
#endif

namespace laoyao::train {

#if LAOYAO_HAVE_CUDA
namespace {

namespace kc = laoyao::kernels::cuda;

// The ranks each sequence is split over (a rank's micro-batches hold seq / CP tokens of each).
int64_t context_parallel_size(const model::GptModel& m) {
  return m.context_parallel_group() ? m.context_parallel_group()->size() : 1;
}

// LAOYAO_STEP_PHASES=1: where each step's GPU time goes, printed on stderr at the start of the
// next step (the events have completed by then: the step ends with a wait on the device):
// forward+backward, the wait for the host between the backward and the gradient reduction, the
// reduction (what is left of it after the backward with --overlap-grad-reduce), and the norm and
// optimizer step. For finding data-parallel overheads; off by default (no events recorded).
class StepPhases {
 public:
  enum Mark { kBegin, kBackwardDone, kReduceEnqueued, kReduced, kStepped, kMarks };
  StepPhases() {
    if (!runtime_options().step_phases) return;
    for (auto& e : events_) LAOYAO_CUDA_CHECK(cudaEventCreate(&e));
  }
  ~StepPhases() {
    for (cudaEvent_t e : events_)
      if (e) (void)cudaEventDestroy(e);
  }
  StepPhases(const StepPhases&) = delete;
  StepPhases& operator=(const StepPhases&) = delete;
  void mark(Mark m, cudaStream_t stream) {
    if (!events_[m]) return;
    LAOYAO_CUDA_CHECK(cudaEventRecord(events_[m], stream));
    marked_[m] = true;
  }
  void report_and_begin(cudaStream_t stream) {
    if (!events_[kBegin]) return;
    if (marked_[kBegin] && marked_[kStepped]) {
      auto ms = [&](Mark a, Mark b) {
        float t = 0;
        if (!marked_[a] || !marked_[b]) return -1.0f;
        LAOYAO_CUDA_CHECK(cudaEventSynchronize(events_[b]));
        LAOYAO_CUDA_CHECK(cudaEventElapsedTime(&t, events_[a], events_[b]));
        return t;
      };
      std::fprintf(stderr,
                   "laoyao: step phases (ms): forward+backward %.2f | host gap %.2f | gradient reduction %.2f | "
                   "norm+optimizer %.2f | step %.2f\n",
                   ms(kBegin, kBackwardDone), ms(kBackwardDone, kReduceEnqueued), ms(kReduceEnqueued, kReduced),
                   ms(marked_[kReduced] ? kReduced : kBackwardDone, kStepped), ms(kBegin, kStepped));
    }
    marked_.fill(false);
    mark(kBegin, stream);
  }

 private:
  std::array<cudaEvent_t, kMarks> events_{};
  std::array<bool, kMarks> marked_{};
};

class CudaEngine final : public Engine {
 public:
  CudaEngine(model::GptModel& host, optim::AdamW& adam, const optim::AdamWSettings& s, int64_t max_b, int64_t seq,
             OptimizerShards shards)
      : host_(host),
        adam_(adam),
        settings_(s),
        shards_(std::move(shards)),
        gpu_(host.config(), max_b, seq / context_parallel_size(host), host.tp_group(), host.ep_group(),
             host.folded_expert_dp_group(), host.context_parallel_group()) {
    gpu_.set_fp8_amax_group(host.fp8_amax_group());
    gpu_.set_data_parallel_group(host.data_parallel_group());
    const int64_t n = shards_.owned_total;  // the moments and decay flags of the owned segments
    if (adam_.num_params() != n) throw Error("CudaEngine: the AdamW's moments do not match the optimizer shares");
    m_ = kc::DeviceBuffer(sizeof(float) * n);
    v_ = kc::DeviceBuffer(sizeof(float) * n);
    decay_ = kc::DeviceBuffer(static_cast<size_t>(n));
    // The host AdamW's ranges tile its moments with their weight-decay multipliers (make_shard_adam's
    // for a share): one flag per moment, set range by range on the device (no host copy of the size
    // of the model).
    std::vector<ByteRun> decay;
    for (const optim::ParamRange& r : adam_.ranges())
      if (r.wd_mult != 0.0) decay.push_back({r.offset, r.numel, 1});
    kc::upload_byte_runs(decay_.as<uint8_t>(), n, decay);
    if (shards_.sharded()) count_owned();
    step_runs_ = plan_step_runs(shards_, adam_.ranges());
    scratch_ = kc::DeviceBuffer(sizeof(double) * (kc::kReduceBlocks + 1));
    // --overlap-grad-reduce: the gradient ranges the backward reports go through this stream
    // (highest priority, so its NCCL kernels are scheduled beside the backward's), and what is
    // left after the backward: every parameter outside the reported ranges (the embeddings).
    int lo = 0, hi = 0;
    LAOYAO_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    LAOYAO_CUDA_CHECK(cudaStreamCreateWithPriority(&comm_, cudaStreamNonBlocking, hi));
    LAOYAO_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    LAOYAO_CUDA_CHECK(cudaEventCreateWithFlags(&synced_, cudaEventDisableTiming));
    // Under expert parallelism the experts are neither reported nor in the rest: they have their own group.
    std::vector<model::CudaGptModel::Range> reported = gpu_.grad_sync_ranges();
    if (host_.ep_size() > 1)
      for (const auto& [offset, count] : host_.routed_expert_ranges()) reported.push_back({offset, count});
    std::sort(reported.begin(), reported.end(), [](const auto& a, const auto& b) { return a.offset < b.offset; });
    int64_t at = 0;
    for (const auto& r : reported) {
      if (r.offset > at) rest_.push_back({at, r.offset - at});
      at = std::max(at, r.offset + r.count);
    }
    if (at < gpu_.num_trainable()) rest_.push_back({at, gpu_.num_trainable() - at});
    // The distributed optimizer's runs the backward reports whole (overlap_bucket_cuts made them
    // follow its parts): how many of each run's elements the reported ranges cover.
    run_reported_.assign(shards_.runs.size(), 0);
    for (const auto& r : gpu_.grad_sync_ranges())
      for_runs_in(r.offset, r.count, [&](size_t i, int64_t n) { run_reported_[i] += n; });
    int dev = 0;
    LAOYAO_CUDA_CHECK(cudaGetDevice(&dev));
    name_ = "cuda:" + std::to_string(dev) + " (" + cuda_device_summary(dev) + "), " + gpu_.attention_path() +
            " attention";
  }

  ~CudaEngine() override {
    if (comm_) {
      (void)cudaStreamSynchronize(comm_);
      (void)cudaStreamDestroy(comm_);
    }
    for (cudaEvent_t e : {ready_, synced_})
      if (e) (void)cudaEventDestroy(e);
  }
  CudaEngine(const CudaEngine&) = delete;
  CudaEngine& operator=(const CudaEngine&) = delete;

  std::string name() const override { return name_; }
  void zero_grads() override {
    phases_.report_and_begin(gpu_.stream());
    gpu_.zero_grads();
  }
  void run_micro_batch(const MicroBatchData& mb, const model::DropoutKey& key, const float* dloss) override {
    model::MicroBatch in{mb.b, mb.s, mb.tokens.data(), mb.labels.data(), mb.positions.data(),
                         mb.key_start_or_null()};
    in.is_first_microbatch = mb.is_first_microbatch;
    gpu_.forward(in, mb.loss_mask.data(), key, dloss);
    if (dloss) gpu_.backward();
  }
  void set_moe_aux_loss_scale(double scale) override { gpu_.set_moe_aux_loss_scale(static_cast<float>(scale)); }
  void set_mtp_loss_scale(const model::MtpLossScale& scale) override { gpu_.set_mtp_loss_scale(scale); }
  model::GptModel::MoeLosses take_moe_losses() override { return gpu_.take_moe_losses(); }
  std::vector<double> take_mtp_losses() override { return gpu_.take_mtp_losses(); }
  void finish_moe_step(dist::ProcessGroup* dp) override { gpu_.finish_moe_step(dp); }
  LossSum take_loss_sum() override {
    auto [sum, count] = gpu_.take_loss_sum();
    return {sum, count};
  }
  std::pair<LossSum, double> take_loss_sum_and_grad_norm() override {
    model_sum(kc::sum_squares, gpu_.main_grads(), gpu_.table().trainable_offset);
    double sum_sq = 0;
    const auto [sum, count] = gpu_.take_loss_sum(result(), &sum_sq);
    return {{sum, count}, std::sqrt(sum_sq)};
  }
  double grad_norm() override {
    model_sum(kc::sum_squares, gpu_.main_grads(), gpu_.table().trainable_offset);
    return std::sqrt(read_result());
  }
  int64_t count_zero_grads() override {
    model_sum(kc::count_zeros, gpu_.main_grads(), gpu_.table().trainable_offset);
    return static_cast<int64_t>(read_result());
  }
  double params_norm() override {
    model_sum(kc::sum_squares, gpu_.main_params(), gpu_.table().trainable_offset);
    return std::sqrt(read_result() + frozen_sum_squares());
  }
  void finalize_grads() override {
    phases_.mark(StepPhases::kBackwardDone, gpu_.stream());
    gpu_.finalize_grads();
  }
  void clip_and_step(double norm, double max_norm, double lr, double wd, std::optional<double> decoupled_lr) override {
    cudaStream_t stream = gpu_.stream();
    ++steps_;
    const double bc1 = 1.0 - std::pow(settings_.beta1, static_cast<double>(steps_));
    kc::AdamWStep s;
    s.beta1 = static_cast<float>(settings_.beta1);
    s.beta2 = static_cast<float>(settings_.beta2);
    s.eps = settings_.eps;
    s.lr = lr;
    s.wd = wd;
    s.step_size = lr / bc1;
    s.bc2_sqrt = std::sqrt(1.0 - std::pow(settings_.beta2, static_cast<double>(steps_)));
    if (max_norm > 0) {  // optim::clip_grads' rule
      const double coeff = max_norm / (norm + 1e-6);
      if (coeff < 1.0) s.grad_scale = static_cast<float>(coeff);
    }
    // (Offsets in the main weights' and gradients' buffers: the bf16 parameters' are trainable_offset
    // further, PEFT's frozen base before them.)
    const int64_t at = gpu_.table().trainable_offset;
    auto step = [&](int64_t offset, int64_t moment, int64_t count, const kc::AdamWStep& with) {
      kc::adamw_step(gpu_.main_params() + offset, gpu_.main_grads() + offset, m_.as<float>() + moment,
                     v_.as<float>() + moment, gpu_.params() + at + offset, decay_.as<uint8_t>() + moment, count, with,
                     stream);
    };
    if (!decoupled_lr) {
      for (const OwnedSegment& seg : shards_.owned) step(seg.offset, seg.moment, seg.count, s);
    } else {  // --decoupled-lr: the word embeddings' and output layer's runs at their own rate
      kc::AdamWStep d = s;
      d.lr = *decoupled_lr;
      d.step_size = *decoupled_lr / bc1;
      for (const StepRun& r : step_runs_) step(r.offset, r.moment, r.count, r.decoupled ? d : s);
    }
    for (const ShardRun& run : shards_.runs)  // every rank's updated pieces of the bf16 parameters, in place
      if (run.over.size > 1 && run.piece() > 0)
        run.over.group->all_gather_device(gpu_.params() + run.own_offset(), gpu_.params() + run.offset,
                                          static_cast<size_t>(run.piece()), dist::DeviceType::BF16, stream);
    phases_.mark(StepPhases::kStepped, stream);
  }
  // The fp32 main gradients averaged over the data-parallel ranks by NCCL, on the model's stream
  // (the next read of the gradients, the norm, waits for it there); with the distributed optimizer
  // only this rank's pieces of the average (and the tails), reduce-scattered in place.
  void all_reduce_grads(dist::ProcessGroup& group, double scale) override {
    phases_.mark(StepPhases::kReduceEnqueued, gpu_.stream());
    if (sync_group_) {  // the backward reduced the reported ranges already: the rest, then wait
      gpu_.set_grads_ready_hook(nullptr);
      if (shards_.sharded()) {
        for (size_t i = 0; i < shards_.runs.size(); ++i)
          if (!run_started_[i]) start_run(i);
      } else {
        for (const auto& r : rest_) reduce_range(r.offset, r.count);
        if (host_.ep_size() > 1) reduce_experts(comm_, scale);
      }
      LAOYAO_CUDA_CHECK(cudaEventRecord(synced_, comm_));
      LAOYAO_CUDA_CHECK(cudaStreamWaitEvent(gpu_.stream(), synced_, 0));
      sync_group_ = nullptr;
    } else if (shards_.sharded()) {
      reduce_scatter_shares(scale);
    } else if (host_.ep_size() > 1) {
      reduce_with_experts_apart(group, scale);
    } else {
      group.all_reduce_sum_device(gpu_.main_grads(), static_cast<size_t>(gpu_.num_trainable()), gpu_.stream(), scale);
    }
    phases_.mark(StepPhases::kReduced, gpu_.stream());
  }
  // Overlap reduces what the backward reports final as it goes: whole ranges all-reduced, or with
  // the distributed optimizer each run reduce-scattered once all of it is reported; not under
  // tensor parallelism (finalize_grads still adds to them). Under expert parallelism the ranges
  // leave the experts out; all_reduce_grads does them, and whatever was not reported.
  void start_grad_sync(dist::ProcessGroup& group, double scale) override {
    if (gpu_.tp_group()) return;
    sync_group_ = &group;
    sync_scale_ = scale;
    if (shards_.sharded()) {
      run_left_ = run_reported_;
      run_started_.assign(shards_.runs.size(), false);
      gpu_.set_grads_ready_hook([this](int64_t offset, int64_t count) {
        for_runs_in(offset, count, [&](size_t i, int64_t n) {
          run_left_[i] -= n;
          if (run_left_[i] == 0 && run_reported_[i] == shards_.runs[i].count) start_run(i);
        });
      });
    } else {
      gpu_.set_grads_ready_hook([this](int64_t offset, int64_t count) { reduce_range(offset, count); });
    }
  }
  void scale_grads(double s) override {
    kc::scale_inplace(gpu_.main_grads(), static_cast<float>(s), gpu_.num_trainable(), gpu_.stream());
  }
  void synchronize() override { LAOYAO_CUDA_CHECK(cudaDeviceSynchronize()); }
  void cuda_profiler(bool start) override {
    if (start) {
      LAOYAO_CUDA_CHECK(cudaProfilerStart());
    } else {  // the profiled iterations' last kernels inside the range
      kc::stream_wait(gpu_.stream(), "the profiled iterations (--profile)");
      LAOYAO_CUDA_CHECK(cudaProfilerStop());
    }
  }
  // A split model's parts are cut from the whole model's tensors, one at a time on the host
  // (train/tp_state.hpp); a whole model's parameters come in chunks through a bounded host buffer
  // per thread.
  void initialize_weights(uint64_t seed, bool bf16, const model::ParamFilter& drawn) override {
    LAOYAO_CUDA_CHECK(cudaStreamSynchronize(gpu_.stream()));
    const int64_t n = gpu_.num_parameters();
    kc::fill_bytes(gpu_.main_params(), 0, gpu_.num_trainable() * static_cast<int64_t>(sizeof(float)));  // gaps too
    kc::fill_bytes(gpu_.params(), 0, n * static_cast<int64_t>(sizeof(*gpu_.params())));
    frozen_sq_.reset();
    if (split_model(host_)) {
      for_each_initial_part(host_, seed, bf16, [&](const model::ParamSpec& p, const float* values) {
        gpu_.upload_weights(values, p.offset, p.numel);
      }, drawn);
    } else {
      constexpr int64_t kChunk = int64_t(1) << 22;  // 16 MB of fp32 a thread
      const auto& specs = gpu_.table().specs;
      int device = 0;
      LAOYAO_CUDA_CHECK(cudaGetDevice(&device));
      std::vector<std::string> errors(specs.size());
#pragma omp parallel
      {
        (void)cudaSetDevice(device);  // each thread's current device: this rank's
        std::vector<float> chunk;
#pragma omp for schedule(dynamic, 1)
        for (int64_t k = 0; k < static_cast<int64_t>(specs.size()); ++k) {
          const model::ParamSpec& p = specs[static_cast<size_t>(k)];
          if (drawn && !drawn(p)) continue;
          try {
            model::ParameterInit values(p, seed, bf16);
            for (int64_t done = 0; done < p.numel;) {
              const int64_t count = std::min(p.numel - done, kChunk);
              chunk.resize(static_cast<size_t>(count));
              values.next(chunk.data(), count);
              gpu_.upload_weights(chunk.data(), p.offset + done, count);
              done += count;
            }
          } catch (const std::exception& e) {
            errors[static_cast<size_t>(k)] = e.what();
          }
        }
      }
      for (const std::string& e : errors)
        if (!e.empty()) throw Error("initialising the weights on the GPU: " + e);
    }
    kc::fill_bytes(m_.ptr, 0, static_cast<int64_t>(m_.bytes));
    kc::fill_bytes(v_.ptr, 0, static_cast<int64_t>(v_.bytes));
    steps_ = 0;
  }
  int64_t optimizer_steps() const override { return steps_; }
  void set_optimizer_steps(int64_t t) override { steps_ = t; }
  void download_state(StateBuffer b, int64_t offset, int64_t count, float* out) override {
    const std::lock_guard<std::mutex> lock(state_io_);
    LAOYAO_CUDA_CHECK(cudaSetDevice(m_.device));  // (a checkpoint writer's thread may not have it current)
    if (b == StateBuffer::kWeights) {  // (the frozen base from its bf16 weights)
      gpu_.download_weights(out, offset, count);
      return;
    }
    kc::stream_wait(gpu_.stream(), "the step before the state is read");
    LAOYAO_CUDA_CHECK(cudaMemcpy(out, device_state(b, offset, count), sizeof(float) * static_cast<size_t>(count),
                                 cudaMemcpyDeviceToHost));
  }
  void upload_state(StateBuffer b, int64_t offset, int64_t count, const float* in) override {
    const std::lock_guard<std::mutex> lock(state_io_);
    LAOYAO_CUDA_CHECK(cudaSetDevice(m_.device));
    if (b == StateBuffer::kWeights) {  // with their bf16 copies
      gpu_.upload_weights(in, offset, count);
      if (offset < gpu_.table().trainable_offset) frozen_sq_.reset();
      return;
    }
    LAOYAO_CUDA_CHECK(cudaStreamSynchronize(gpu_.stream()));
    LAOYAO_CUDA_CHECK(cudaMemcpy(device_state(b, offset, count), in, sizeof(float) * static_cast<size_t>(count),
                                 cudaMemcpyHostToDevice));
  }
  void pull_state() override {
    gpu_.download_weights(host_.weights());
    if (shards_.sharded()) {  // the device holds this rank's share of the main parameters up to date
      gather_shares(host_.weights(), shards_, gather_);
      std::vector<float>().swap(gather_);  // held only while a checkpoint passes through
    }
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
    return gpu_.device_bytes() + m_.bytes + v_.bytes + decay_.bytes + scratch_.bytes + counted_.bytes;
  }

 private:
  double* scratch() { return scratch_.as<double>(); }
  float* device_state(StateBuffer b, int64_t offset, int64_t count) {  // Adam's moments
    float* base = b == StateBuffer::kExpAvg ? m_.as<float>() : v_.as<float>();
    const int64_t n = static_cast<int64_t>(m_.bytes / sizeof(float));
    if (offset < 0 || count < 0 || offset + count > n)
      throw Error("CudaEngine: state elements [" + std::to_string(offset) + ", " + std::to_string(offset + count) +
                  ") of " + std::to_string(n));
    return base + offset;
  }
  // The distributed optimizer's model-wide sums: over the span of this rank's counted segments,
  // with a flag per element when they are several (expert parallelism) or when tensor parallelism
  // counts a replicated tensor on one rank of its group only; summed over the data-parallel group
  // (and the tensor-parallel one; under expert parallelism the data-parallel group spans the EP ranks).
  void count_owned() {
    std::vector<const OwnedSegment*> counted;
    for (const OwnedSegment& seg : shards_.owned)
      if (seg.counted) counted.push_back(&seg);
    if (counted.empty()) return;
    counted_begin_ = counted.front()->offset;
    counted_end_ = counted.back()->offset + counted.back()->count;
    if (counted.size() == 1 && !gpu_.tp_group() && !gpu_.table().has_buffers()) return;
    counted_ = kc::DeviceBuffer(static_cast<size_t>(counted_end_ - counted_begin_));
    std::vector<ByteRun> flags;  // offsets from counted_begin_
    for (const OwnedSegment* seg : counted) flags.push_back({seg->offset - counted_begin_, seg->count, 1});
    // And the model's own rule within the tensor-parallel group (which leaves the buffers out too);
    // the data-parallel sum counts every EP rank's experts already. Whole experts with EP groups
    // inside a TP group are whole on every data-parallel rank (finalize_grads sums them over the
    // ranks holding the same experts): data-parallel rank 0 counts them.
    const bool leave_out_experts = host_.folded_expert_dp_group() && shards_.sum_group->rank() != 0;
    for (const auto& p : gpu_.table().specs) {
      if (gpu_.counts(p, false) && !(leave_out_experts && model::is_routed_expert(p.name))) continue;
      const int64_t lo = std::max(p.offset, counted_begin_), hi = std::min(p.offset + p.numel, counted_end_);
      if (lo < hi) flags.push_back({lo - counted_begin_, hi - lo, 0});
    }
    kc::upload_byte_runs(counted_.as<uint8_t>(), counted_end_ - counted_begin_, flags);
  }
  // The distributed optimizer's reduction: each run's gradients averaged over its group into the
  // ranks' pieces (and the tail whole); a run of one rank (its experts) only takes the scale.
  void reduce_scatter_shares(double scale) {
    for (const ShardRun& run : shards_.runs) reduce_run(run, scale, gpu_.stream());
  }
  void reduce_run(const ShardRun& run, double scale, cudaStream_t stream) {
    float* g = gpu_.main_grads();
    if (run.over.size <= 1) return kc::scale_inplace(g + run.offset, static_cast<float>(scale), run.count, stream);
    if (run.piece() > 0)
      run.over.group->reduce_scatter_device(g + run.offset, g + run.own_offset(), static_cast<size_t>(run.piece()),
                                            dist::DeviceType::F32, stream, scale);
    if (run.tail() > 0)
      run.over.group->all_reduce_sum_device(g + run.tail_offset(), static_cast<size_t>(run.tail()), stream, scale);
  }
  // Run i reduced on comm_ once the model's stream has written its gradients (overlap).
  void start_run(size_t i) {
    LAOYAO_CUDA_CHECK(cudaEventRecord(ready_, gpu_.stream()));
    LAOYAO_CUDA_CHECK(cudaStreamWaitEvent(comm_, ready_, 0));
    reduce_run(shards_.runs[i], sync_scale_, comm_);
    run_started_[i] = true;
  }
  // fn(i, n) for each run i that [offset, offset + count) overlaps by n elements (runs in buffer order).
  template <class Fn>
  void for_runs_in(int64_t offset, int64_t count, Fn fn) const {
    const auto& runs = shards_.runs;
    auto it = std::upper_bound(runs.begin(), runs.end(), offset,
                               [](int64_t o, const ShardRun& r) { return o < r.offset + r.count; });
    for (; it != runs.end() && it->offset < offset + count; ++it) {
      const int64_t lo = std::max(offset, it->offset), hi = std::min(offset + count, it->offset + it->count);
      if (lo < hi) fn(static_cast<size_t>(it - runs.begin()), hi - lo);
    }
  }
  // Expert parallelism (engine_cpu's rule, Megatron's expert data-parallel reduction): a rank's
  // experts hold every EP rank's tokens already, so they are summed only over the ranks holding the
  // same experts (if any); the rest over all data-parallel ranks; both take the average's scale.
  void reduce_with_experts_apart(dist::ProcessGroup& group, double scale) {
    float* g = gpu_.main_grads();
    cudaStream_t st = gpu_.stream();
    int64_t at = 0;
    for (const auto& [offset, count] : host_.routed_expert_ranges()) {
      if (offset > at) group.all_reduce_sum_device(g + at, static_cast<size_t>(offset - at), st, scale);
      at = offset + count;
    }
    const int64_t n = gpu_.num_trainable();
    if (n > at) group.all_reduce_sum_device(g + at, static_cast<size_t>(n - at), st, scale);
    reduce_experts(st, scale);
  }
  // The routed experts' part of the above, on `stream` once the model's stream has written them.
  void reduce_experts(cudaStream_t stream, double scale) {
    if (stream != gpu_.stream()) {
      LAOYAO_CUDA_CHECK(cudaEventRecord(ready_, gpu_.stream()));
      LAOYAO_CUDA_CHECK(cudaStreamWaitEvent(stream, ready_, 0));
    }
    float* g = gpu_.main_grads();
    for (const auto& [offset, count] : host_.routed_expert_ranges()) {
      if (dist::ProcessGroup* edp = host_.expert_dp_group())
        edp->all_reduce_sum_device(g + offset, static_cast<size_t>(count), stream, scale);
      else
        kc::scale_inplace(g + offset, static_cast<float>(scale), count, stream);
    }
  }
  // One range of the gradients averaged over sync_group_ on comm_, once the model's stream has
  // written it.
  void reduce_range(int64_t offset, int64_t count) {
    LAOYAO_CUDA_CHECK(cudaEventRecord(ready_, gpu_.stream()));
    LAOYAO_CUDA_CHECK(cudaStreamWaitEvent(comm_, ready_, 0));
    sync_group_->all_reduce_sum_device(gpu_.main_grads() + offset, static_cast<size_t>(count), comm_, sync_scale_);
  }
  // result() = a reduction over the whole model (sum_squares or count_zeros): with tensor or expert
  // parallelism every rank's split tensors (experts) and one rank's replicated ones, summed over the
  // groups;
  // with the distributed optimizer each rank's counted segments, summed over the data-parallel group.
  template <class Reduction>
  // x: the parameters (or their gradients) from table offset `from` on (the gradients: from the
  // table's trainable_offset).
  void model_sum(Reduction reduce, const float* x, int64_t from) {
    cudaStream_t stream = gpu_.stream();
    if (shards_.sharded()) {
      reduce(x + counted_begin_, counted_end_ - counted_begin_, scratch(), result(), stream,
             counted_.bytes ? counted_.as<uint8_t>() : nullptr);
      shards_.sum_group->all_reduce_device(result(), 1, dist::DeviceType::F64, stream);
      if (dist::ProcessGroup* tp = gpu_.tp_group()) tp->all_reduce_device(result(), 1, dist::DeviceType::F64, stream);
      return;
    }
    const uint8_t* counted = gpu_.counted_flags();
    reduce(x, gpu_.num_parameters() - from, scratch(), result(), stream, counted ? counted + from : nullptr);
    for (dist::ProcessGroup* split : gpu_.split_groups())
      split->all_reduce_device(result(), 1, dist::DeviceType::F64, stream);
  }
  double* result() { return scratch_.as<double>() + kc::kReduceBlocks; }
  // PEFT's frozen base in the parameters' norm, from its bf16 weights (Megatron's calc_params_l2_norm
  // reads a parameter without a main copy as it is): this rank's counted elements, summed over the
  // groups that split the model (data-parallel replicas hold the same base). Kept until the base is
  // written again: it never trains.
  double frozen_sum_squares() {
    if (frozen_sq_) return *frozen_sq_;
    const int64_t base = gpu_.table().trainable_offset;
    constexpr int64_t kChunk = int64_t{1} << 24;
    std::vector<float> w;
    std::vector<uint8_t> counted;
    double local = 0;
    for (int64_t lo = 0; lo < base; lo += kChunk) {
      const int64_t n = std::min(kChunk, base - lo);
      w.resize(static_cast<size_t>(n));
      gpu_.download_weights(w.data(), lo, n);
      if (const uint8_t* flags = gpu_.counted_flags()) {
        counted.resize(w.size());
        LAOYAO_CUDA_CHECK(cudaMemcpy(counted.data(), flags + lo, counted.size(), cudaMemcpyDeviceToHost));
      }
      for (size_t i = 0; i < w.size(); ++i)
        if (counted.empty() || counted[i]) local += static_cast<double>(w[i]) * w[i];
    }
    if (!gpu_.split_groups().empty()) {
      LAOYAO_CUDA_CHECK(cudaMemcpyAsync(result(), &local, sizeof local, cudaMemcpyHostToDevice, gpu_.stream()));
      for (dist::ProcessGroup* split : gpu_.split_groups())
        split->all_reduce_device(result(), 1, dist::DeviceType::F64, gpu_.stream());
      local = read_result();
    }
    frozen_sq_ = local;
    return local;
  }
  double read_result() {
    double v = 0;
    LAOYAO_CUDA_CHECK(cudaMemcpyAsync(&v, result(), sizeof v, cudaMemcpyDeviceToHost, gpu_.stream()));
    kc::stream_wait(gpu_.stream(), "the step (a norm or count over the model)");
    return v;
  }

  model::GptModel& host_;
  optim::AdamW& adam_;
  optim::AdamWSettings settings_;
  OptimizerShards shards_;      // this rank's share (the whole model without the distributed optimizer)
  std::vector<float> gather_;   // host scratch for a checkpoint's gather of the main parameters
  model::CudaGptModel gpu_;
  kc::DeviceBuffer m_, v_, decay_, scratch_;
  int64_t counted_begin_ = 0, counted_end_ = 0;  // see count_owned
  std::optional<double> frozen_sq_;               // see frozen_sum_squares
  std::vector<StepRun> step_runs_;  // --decoupled-lr's runs (train/dist_optimizer.hpp)
  kc::DeviceBuffer counted_;
  cudaStream_t comm_ = nullptr;
  cudaEvent_t ready_ = nullptr, synced_ = nullptr;
  dist::ProcessGroup* sync_group_ = nullptr;  // set between start_grad_sync and all_reduce_grads
  double sync_scale_ = 1.0;
  std::vector<model::CudaGptModel::Range> rest_;
  // Overlap with the distributed optimizer: per run, the elements the backward reports, those still
  // to come this step, and whether its reduction has started.
  std::vector<int64_t> run_reported_, run_left_;
  std::vector<bool> run_started_;
  std::mutex state_io_;  // download_state / upload_state (a checkpoint's writers run in parallel)
  int64_t steps_ = 0;
  std::string name_;
  StepPhases phases_;
};

}  // namespace

std::unique_ptr<Engine> make_cuda_engine(model::GptModel& model, optim::AdamW& adam, const optim::AdamWSettings& s,
                                         int64_t max_b, int64_t seq, const OptimizerShards* shards) {
  return std::make_unique<CudaEngine>(model, adam, s, max_b, seq,
                                      shards ? *shards : whole_model_shards(model.num_trainable()));
}

std::string cuda_backend_gaps(const model::GptConfig& model) { return model::cuda_unsupported_features(model); }
#else
std::string cuda_backend_gaps(const model::GptConfig&) { return "the CUDA backend is not built"; }

std::unique_ptr<Engine> make_cuda_engine(model::GptModel&, optim::AdamW&, const optim::AdamWSettings&, int64_t,
                                         int64_t, const OptimizerShards*) {
  throw UsageError("this laoyao was built without the CUDA backend");
}
#endif

}  // namespace laoyao::train
