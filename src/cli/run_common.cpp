#include "cli/run_common.hpp"

#include <cstdio>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "config/yaml_io.hpp"
#include "core/device.hpp"
#include "core/error.hpp"
#include "core/file_io.hpp"
#include "core/runtime_options.hpp"
#include "dist/process_group.hpp"
#include "dist/rank_env.hpp"
#include "train/capabilities.hpp"
#include "train/engine.hpp"
#include "train/memory_estimate.hpp"
#include "train/rank_groups.hpp"
#include "train/run_setup.hpp"
#include "train/trainer.hpp"

#ifdef LAOYAO_HAVE_CUDA
#include "kernels/cuda/stream_wait.hpp"
#endif

namespace laoyao::cli {

void print_messages(const config::Resolved& r) {
  for (const auto& n : r.notes) std::printf("%s\n", n.c_str());
  for (const auto& n : r.validated.notes) std::printf("%s\n", n.c_str());
  for (const auto& w : r.validated.warnings) std::fprintf(stderr, "WARNING: %s\n", w.c_str());
}

namespace {

// Where the resolved config goes: logger.save_config_filepath, else beside the run's outputs
// (the checkpoint directory, else the TensorBoard directory); "" when the run has no outputs.
std::string run_config_path(const config::ConfigContainer& c) {
  if (c.logger.save_config_filepath) return *c.logger.save_config_filepath;
  if (c.checkpoint.save) return *c.checkpoint.save + "/run_config.yaml";
  if (c.logger.tensorboard_dir) return *c.logger.tensorboard_dir + "/run_config.yaml";
  return "";
}

// GPU ranks: the deadline of the host's waits on the device (kernels/cuda/stream_wait.hpp), set
// while the groups it aborts live and cleared with them.
class GpuWaitDeadline {
 public:
  GpuWaitDeadline() = default;
  GpuWaitDeadline(const GpuWaitDeadline&) = delete;
  GpuWaitDeadline& operator=(const GpuWaitDeadline&) = delete;
  ~GpuWaitDeadline() {
#ifdef LAOYAO_HAVE_CUDA
    if (set_) kernels::cuda::set_wait_deadline({});
#endif
  }
  void set(double seconds, std::function<void()> on_timeout) {
#ifdef LAOYAO_HAVE_CUDA
    kernels::cuda::set_wait_deadline({seconds, std::move(on_timeout), "--distributed-timeout-minutes"});
    set_ = true;
#else
    (void)seconds, (void)on_timeout;
#endif
  }

 private:
  bool set_ = false;
};

}  // namespace

int start_training(config::Resolved& r) {
  train::load_tokenizer_vocab(r.cfg, r.validated.derived, r.front_end);
  auto missing = train::missing_features(r.cfg, r.validated.derived.world_size);
  if (!missing.empty()) {
    std::fprintf(stderr, "laoyao: cannot train this configuration yet; it resolved and validated, but this build lacks:\n");
    for (const auto& m : missing) std::fprintf(stderr, "  - %s\n", m.c_str());
    std::fprintf(stderr, "Nothing was written.\n");
    return 2;
  }
  // The backend depends on the architecture only; a vocabulary read later from tokenizer files
  // does not change it, so a placeholder stands in for one not known yet.
  config::Derived shape = r.validated.derived;
  if (shape.padded_vocab_size <= 0) shape.padded_vocab_size = 1;
  const train::BackendChoice backend = train::choose_backend(train::model_config(r.cfg, shape));
  if (!backend.note.empty()) std::printf("%s\n", backend.note.c_str());
  // Absurd sizes are refused here, naming the settings, before the datasets or the model allocate.
  train::MemoryLimits limits{train::physical_memory_bytes(), 0};
  if (backend.cuda) limits.device = static_cast<long double>(cuda_device_memory_bytes(0));  // every rank's GPU alike
  train::check_memory_fits(r.cfg, shape, r.front_end, backend.cuda, limits);
  // Megatron reads torch.cuda.memory_stats(): a device's memory, which the CPU backend does not hold.
  if (r.cfg.logger.log_memory_to_tensorboard && !backend.cuda) {
    std::fprintf(stderr, "laoyao: cannot train this configuration on the CPU backend: memory scalars in TensorBoard "
                         "(--log-memory-to-tensorboard / logger.log_memory_to_tensorboard) are the CUDA backend's "
                         "device memory. Nothing was written.\n");
    return 2;
  }
  // bf16 main gradients (Bridge's mixed_precision grad_reduce_in_fp32=false, the Qwen3 cohort's):
  // laoyao accumulates and reduces them in fp32, which changes their rounding only.
  if (r.cfg.model.bf16 && !r.cfg.ddp.grad_reduce_in_fp32)
    std::printf("laoyao: grad_reduce_in_fp32 is false (Megatron: bf16 main gradients, accumulated and reduced in "
                "bf16); laoyao accumulates and reduces the gradients in fp32, a difference of rounding only\n");
  // Megatron-LM's pure-PyTorch path (--no-gradient-accumulation-fusion) rounds each micro-batch's
  // weight gradients to bf16 before adding them to the fp32 main gradients; laoyao's GEMMs write
  // or add fp32 straight away (Megatron's fused path).
  if (r.cfg.model.bf16 && !r.cfg.model.gradient_accumulation_fusion)
    std::printf("laoyao: --no-gradient-accumulation-fusion (Megatron: each micro-batch's weight gradients rounded "
                "to bf16, then added in fp32); laoyao accumulates them in fp32 directly, a difference of rounding "
                "only\n");
  // --reset-attention-mask where Megatron's attention ignores the mask: the same here, said once.
  if (const std::string why = train::document_mask(r.cfg).ignored; !why.empty())
    std::printf("laoyao: --reset-attention-mask: %s; laoyao's attention stays causal as Megatron's does "
                "(documents are kept apart with --transformer-impl local --no-masked-softmax-fusion)\n",
                why.c_str());
  // Recomputation changes memory, never the numbers: say what this run does with the flags.
  if (r.cfg.model.recompute_granularity == "selective")
    std::printf("laoyao: --recompute-granularity selective recomputes core attention in Megatron; laoyao's fused "
                "attention (cuDNN, flash) keeps no s x s scores, so there is nothing to recompute\n");
  else if (r.cfg.model.recompute_granularity == "full" && !backend.cuda)
    std::printf("laoyao: the CPU backend keeps every activation (full recomputation is done on the CUDA backend; "
                "it changes memory, not the numbers)\n");
  // Several ranks: data and tensor parallelism, over CPU ranks (Gloo) or GPU ranks (one GPU each,
  // LOCAL_RANK's, as torch.cuda.set_device(local_rank) in Megatron; device collectives over NCCL).
  train::RankGroups groups;
  GpuWaitDeadline deadline;  // after the groups: cleared before they go
  if (r.validated.derived.world_size > 1) {
    const dist::RankEnv env = dist::rank_env_from_environment();
    const double timeout = static_cast<double>(r.cfg.dist.distributed_timeout_minutes);
    std::unique_ptr<dist::ProcessGroup> world;
    if (backend.cuda) {
      const int gpus = cuda_device_count();
      if (env.local_rank >= gpus)
        throw UsageError("local rank " + std::to_string(env.local_rank) + " has no GPU of its own: " +
                         std::to_string(gpus) + " visible on this node (one GPU per rank; --nproc-per-node at most " +
                         std::to_string(gpus) + ")");
      cuda_set_device(static_cast<int>(env.local_rank));
      world = dist::make_gpu_process_group(env, timeout);
    } else {
      world = dist::make_cpu_process_group(env, timeout);
    }
    groups = train::make_rank_groups(r.cfg, env.world_size, env.rank, std::move(world),
                                     [&](const std::vector<int64_t>& members, const std::string& name) {
                                       return backend.cuda ? dist::make_gpu_process_group(env, timeout, members, name)
                                                           : dist::make_cpu_process_group(env, timeout, members, name);
                                     });
    // A GPU rank that waits on a collective another rank never joins fails after the timeout,
    // as a Gloo collective does, aborting its NCCL communicators so that it can exit.
    if (backend.cuda)
      deadline.set(timeout * 60.0, [all = groups.all()] {
        for (dist::ProcessGroup* g : all) g->abort();
      });
  }
  const std::string path = run_config_path(r.cfg);
  train::TrainOptions opt;
  if (!path.empty())
    opt.run_config_path = path,
    opt.run_config_yaml = config::to_yaml(r.cfg) + runtime_options_yaml_comment(runtime_options());
  opt.use_cuda = backend.cuda;
  groups.fill(opt);
  if (!path.empty()) opt.metrics_path = path.substr(0, path.find_last_of('/') + 1) + "metrics.jsonl";
  opt.flavor = r.front_end == config::FrontEnd::MegatronLM ? train::LogFlavor::kMegatronLM : train::LogFlavor::kBridge;
  std::printf("laoyao: runtime options: %s\n", describe_runtime_options(runtime_options()).c_str());
  train::train(r.cfg, r.validated.derived, opt);
  return 0;
}

}  // namespace laoyao::cli
