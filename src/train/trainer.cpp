#include "train/trainer.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <deque>
#include <exception>
#include <memory>
#include <optional>
#include <tuple>
#include <utility>

#include <nlohmann/json.hpp>

#include "config/validate.hpp"
#include "core/error.hpp"
#include "core/file_io.hpp"
#include "model/gpt_ep.hpp"
#include "model/gpt_layout.hpp"
#include "model/gpt_model.hpp"
#include "model/gpt_tp.hpp"
#include "optim/adamw.hpp"
#include "optim/param_scheduler.hpp"
#include "train/async_save.hpp"
#include "train/data_pipeline.hpp"
#include "train/engine.hpp"
#include "train/run_checkpoint.hpp"
#include "train/run_setup.hpp"
#include "train/step_timers.hpp"
#include "train/tensorboard_writer.hpp"
#include "train/theoretical_memory.hpp"
#include "train/tp_state.hpp"

namespace laoyao::train {
namespace {

using Clock = std::chrono::steady_clock;

// --exit-signal-handler: SIGTERM asks the loop to stop after the current iteration.
std::atomic<bool> g_sigterm{false};
extern "C" void on_sigterm(int) { g_sigterm.store(true); }

// A value as Megatron logs it after a float32 tensor's all-reduce (.item() of a float32).
double as_float32(double v) { return static_cast<double>(static_cast<float>(v)); }

// Forward (and, when training, backward) of one micro-batch. The gradient of each token's loss is
// mask / num_tokens / num_microbatches: the per-micro-batch token mean, averaged over micro-batches;
// with per_token (--calculate-per-token-loss) the mask alone, the trainer dividing the step's
// summed gradients by its tokens afterwards (Megatron-Core's finalize_model_grads). Returns the
// micro-batch's loss tokens (the mask's sum; 0 without a backward).
double run_micro_batch(Engine& engine, const MicroBatchData& mb, const model::DropoutKey& key, int64_t num_microbatches,
                       bool backward, std::vector<float>& dloss, bool per_token = false) {
  if (!backward) {
    engine.run_micro_batch(mb, key, nullptr);
    return 0;
  }
  double count = 0;
  for (float m : mb.loss_mask) count += m;
  const double scale = per_token ? 1.0 : 1.0 / std::max(count, 1.0) / static_cast<double>(num_microbatches);
  dloss.resize(mb.loss_mask.size());
  for (size_t t = 0; t < dloss.size(); ++t) dloss[t] = static_cast<float>(mb.loss_mask[t] * scale);
  engine.run_micro_batch(mb, key, dloss.data());
  return count;
}

// Training micro-batches, with one read ahead: the next micro-batch is read from the dataset while
// the device works on the current one. A read error is raised where the micro-batch is used, so a
// run fails at the same iteration as without the read-ahead.
class TrainBatchReader {
 public:
  TrainBatchReader(const RunData& data, int64_t dp_rank) : data_(data), dp_rank_(dp_rank) {}
  MicroBatchData take(int64_t consumed, int64_t m) {
    if (consumed_ == consumed && m_ == m) {
      consumed_ = -1;
      if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
      return std::move(mb_);
    }
    return read(consumed, m);
  }
  void prefetch(int64_t consumed, int64_t m) {
    consumed_ = consumed, m_ = m, error_ = nullptr;
    try {
      mb_ = read(consumed, m);
    } catch (...) {
      error_ = std::current_exception();
    }
  }

 private:
  MicroBatchData read(int64_t consumed, int64_t m) const {
    return load_micro_batch(*data_.datasets[0], train_sample_indices(data_, consumed, m, dp_rank_), data_.vocab);
  }
  const RunData& data_;
  int64_t dp_rank_;
  int64_t consumed_ = -1, m_ = -1;
  MicroBatchData mb_;
  std::exception_ptr error_;
};

}  // namespace

TrainSummary train(const config::ConfigContainer& c, const config::Derived& d, const TrainOptions& opt) {
  // The world (decisions every rank takes together; the last rank prints, as Megatron's
  // print_rank_last), and the data-parallel group: this rank's data slice, the loss and gradient
  // reductions. Tensor-parallel ranks of one data-parallel rank read the same samples and compute
  // the same losses.
  dist::ProcessGroup* const group = opt.group;
  dist::ProcessGroup* const dp = opt.dp_group ? opt.dp_group : group;
  const int64_t dp_rank = dp ? dp->rank() : 0, dp_size = dp ? dp->size() : 1;
  const bool log_rank = !group || group->rank() == group->size() - 1;
  auto reduce_loss = [&](LossSum s) {
    if (!dp || dp_size == 1) return s;
    double v[2] = {s.sum, s.count};
    dp->all_reduce_sum(v, 2);
    return LossSum{v[0], v[1]};
  };
  // A decision every rank must take together (an early exit): true when it holds on any rank.
  auto on_any_rank = [&](bool v) {
    if (!group) return v;
    double x = v ? 1.0 : 0.0;
    group->all_reduce_sum(&x, 1);
    return x > 0;
  };
  auto print_line = [&](const std::string& s) {
    if (!log_rank) return;
    std::fputs(s.c_str(), opt.out);
    std::fputc('\n', opt.out);
    std::fflush(opt.out);
  };
  // Megatron's print_datetime: "[message] datetime: YYYY-MM-DD HH:MM:SS ".
  auto print_datetime = [&](const std::string& message) {
    std::string stamp = format_timestamp(now_timestamp(), LogFlavor::kBridge);  // "[YYYY-MM-DD HH:MM:SS]"
    print_line("[" + message + "] datetime: " + stamp.substr(1, stamp.size() - 2) + " ");
  };
  // --tensorboard-dir: Megatron's TensorBoard scalars, on the rank that prints the log.
  std::unique_ptr<TensorBoardWriter> tb;
  std::FILE* metrics = nullptr;
  struct CloseMetrics {
    std::FILE* f;
    ~CloseMetrics() {
      if (f) std::fclose(f);
    }
  } close_metrics{nullptr};
  auto write_metrics = [&](const nlohmann::ordered_json& j) {
    if (!metrics) return;
    std::fputs((j.dump() + "\n").c_str(), metrics);
    std::fflush(metrics);
  };
  print_line("> building train, validation, and test datasets for GPT ...");
  RunData data = build_run_data(c, d);
  print_line("> finished creating GPT datasets ...");

  const model::GptConfig model_cfg = model_config(c, d);
  model::GptModel model(model_cfg, opt.tp_group, opt.ep_group, opt.expert_dp_group);
  model.set_data_parallel_group(dp);
  // bf16 runs start from bf16-rounded weights (Megatron initialises the bf16 params; the fp32
  // main copy is made from them). With tensor or expert parallelism every rank initialises the
  // whole model from the same seed and keeps its part (Megatron's --use-cpu-initialization): the
  // weights do not depend on the TP or EP size.
  if (split_model(model)) {
    const model::GptParameterLayout full = model::build_gpt_parameters(model::ep_whole_config(model_cfg));
    std::vector<float> w(static_cast<size_t>(full.table.total));
    model::init_parameters(full.table, w.data(), static_cast<uint64_t>(c.rng.seed), c.model.bf16);
    keep_part(full.table, w.data(), model, model.weights());
  } else {
    model::init_parameters(model.table(), model.weights(), static_cast<uint64_t>(c.rng.seed), c.model.bf16);
  }
  print_line(" > number of parameters on (tensor, gtp_remat, pipeline) model parallel rank (" +
             std::to_string(model.tp_rank()) + ", 0, 0): " +
             std::to_string(model.num_parameters() - model.num_buffer_elements()));
  if (model.num_moe_layers() > 0)
    print_line("laoyao: Mixture of Experts: " + std::to_string(model.num_whole_parameters()) + " parameters, " +
               std::to_string(model.num_active_parameters()) + " active per token (top-" +
               std::to_string(model_cfg.moe.topk) + " of " + std::to_string(model_cfg.moe.num_experts) +
               " routed experts; routers, shared experts and the rest whole)");

  const optim::AdamWSettings adam_settings{c.optimizer.adam_beta1, c.optimizer.adam_beta2, c.optimizer.adam_eps};
  // The distributed optimizer: this data-parallel rank keeps Adam's moments for its share only
  // (under expert parallelism the experts' share is over the ranks holding the same experts).
  // With --overlap-grad-reduce its runs follow the model's parts, each reduced as the backward
  // finishes it (engine_cuda; the CPU engine reduces them after the backward).
  const bool dist_opt = c.ddp.use_distributed_optimizer && dp_size > 1;
  const OptimizerShards shards =
      dist_opt ? plan_optimizer_shards(model.num_parameters(),
                                       model.ep_size() > 1 ? model.routed_expert_ranges()
                                                           : std::vector<std::pair<int64_t, int64_t>>{},
                                       shard_group(dp), shard_group(model.expert_dp_group()),
                                       c.ddp.overlap_grad_reduce ? overlap_bucket_cuts(model.table())
                                                                 : std::vector<int64_t>{})
               : whole_model_shards(model.num_parameters());
  std::unique_ptr<optim::AdamW> adam_owner =
      dist_opt ? make_shard_adam(model.table(), shards, adam_settings)
               : make_whole_adam(model.table(), adam_settings);
  optim::AdamW& adam = *adam_owner;
  std::unique_ptr<Engine> engine;
  if (opt.use_cuda)
    engine = make_cuda_engine(model, adam, adam_settings,
                              std::max(data.train_layout.micro_batch_size, data.eval_layout.micro_batch_size),
                              data.seq_length, &shards);
  else
    engine = make_cpu_engine(model, adam, &shards);
  print_line("> laoyao backend: " + engine->name());
  const optim::ParamSchedule schedule = param_schedule(c);
  // --decoupled-lr: the word embeddings' and output layer's own schedule (Megatron-Core's param
  // groups: max_lr decoupled_lr, min_lr decoupled_min_lr or else min_lr; the rest alike).
  std::optional<optim::ParamSchedule> decoupled_schedule;
  if (c.optimizer.decoupled_lr) {
    decoupled_schedule = schedule;
    decoupled_schedule->max_lr = *c.optimizer.decoupled_lr;
    decoupled_schedule->min_lr = c.optimizer.decoupled_min_lr.value_or(schedule.min_lr);
  }
  auto decoupled_lr_at = [&](int64_t n) -> std::optional<double> {
    if (!decoupled_schedule) return std::nullopt;
    return optim::lr_at(*decoupled_schedule, n);
  };
  FlopShape flops_shape = flop_shape(c, d);

  const int64_t train_iters = d.train_iters;
  // The global batch and its micro-batches on this rank: fixed, or with --rampup-batch-size a
  // function of the consumed samples (Megatron updates them before every iteration).
  const data::BatchRampup ramp = config::batch_rampup(c, d);
  const int64_t micro_times_dp = ramp.micro_times_dp;
  int64_t gbs = 0, M = 0;  // set before each iteration
  const int64_t log_interval = c.logger.log_interval;
  const uint64_t seed = static_cast<uint64_t>(c.rng.seed);
  const bool dropout = c.model.hidden_dropout > 0 || c.model.attention_dropout > 0;
  std::vector<float> dloss;

  TrainSummary summary;
  int64_t consumed = 0, consumed_valid = 0, sched_n = 0, skipped = 0, nan_iters = 0, consecutive_nan = 0;
  double flops_so_far = 0;  // Megatron's num_floating_point_operations_so_far: each iteration's, summed
  int64_t iters_since_print = 0, total_nan = 0;
  double interval_loss = 0, interval_ms = 0;  // training time only: evaluation is not counted
  int64_t interval_iters = 0;
  // Mixture of Experts: the load-balancing / z losses Megatron logs after the lm loss, summed over
  // the interval's iterations (each iteration's: per layer and micro-batch loss / coeff, averaged
  // over micro-batches, layers and data-parallel ranks).
  model::GptModel::MoeLosses interval_moe;
  const int64_t moe_layers = model.num_moe_layers();

  auto evaluate = [&](const data::SampleDataset* ds, int64_t& consumed_eval, int64_t iteration,
                      EvalSet set) -> double {
    if (!ds || c.validation.eval_iters <= 0) return NAN;
    const auto& L = data.eval_layout;
    for (int64_t it = 0; it < c.validation.eval_iters; ++it) {
      for (int64_t m = 0; m < L.num_microbatches; ++m) {
        MicroBatchData mb = load_micro_batch(*ds, eval_sample_indices(data, consumed_eval, m, dp_rank), data.vocab);
        run_micro_batch(*engine, mb, {seed, 0, false}, L.num_microbatches, false, dloss);
      }
      consumed_eval += eval_round_samples(data, 1);  // the validation stream continues across evaluations
    }
    const LossSum total = reduce_loss(engine->take_loss_sum());
    ValidationLogValues v;
    v.iteration = iteration;
    v.set = set;
    v.losses.push_back({"lm loss", total.sum / std::max(total.count, 1.0)});
    if (log_rank) {
      std::fputs(format_validation_block(v).c_str(), opt.out);
      std::fflush(opt.out);
    }
    // The end of training's evaluations too, to the same tags at the last iteration (Megatron's
    // write_to_tensorboard = not skip_train).
    if (tb)
      write_validation_scalars(*tb, "lm loss", v.losses[0].value, iteration, consumed,
                               c.logger.log_validation_ppl_to_tensorboard);
    write_metrics({{"iteration", iteration},
                   {"split", set == EvalSet::kTestSet ? "test" : "valid"},
                   {"final", set != EvalSet::kDuringTraining},
                   {"lm_loss", v.losses[0].value},
                   {"ppl", validation_ppl(v.losses[0].value)}});
    return v.losses[0].value;
  };

  int64_t iteration = 0, last_saved = -1, resumed_from = -1;
  std::optional<TrainStateRecord> resumed;
  if (dist_opt && (c.checkpoint.load || c.checkpoint.pretrained_checkpoint)) {
    // Checkpoints hold the whole moments: restore them whole (and, under tensor or expert
    // parallelism, the whole model: below), keep this rank's share. Nothing has stepped yet: the
    // whole moments start at zero, no gather needed.
    auto local = make_whole_adam(model.table(), adam_settings);
    if (split_model(model)) {
      WholeState whole = gather_whole_state(model, *local, adam_settings);
      resumed = restore_run_checkpoint(c, d, *whole.model, *whole.adam, opt.out);
      keep_shards(whole, model, *local);
    } else {
      resumed = restore_run_checkpoint(c, d, model, *local, opt.out);
    }
    keep_moment_share(*local, shards, adam);
  } else if (split_model(model) && (c.checkpoint.load || c.checkpoint.pretrained_checkpoint)) {
    // Checkpoints hold whole tensors: restore the whole model (from this run's initial weights, for
    // what the checkpoint does not hold), keep this rank's shards.
    WholeState whole = gather_whole_state(model, adam, adam_settings);
    resumed = restore_run_checkpoint(c, d, *whole.model, *whole.adam, opt.out);
    keep_shards(whole, model, adam);
  } else {
    resumed = restore_run_checkpoint(c, d, model, adam, opt.out);
  }
  engine->push_state();  // initial, pretrained or resumed weights (and Adam state) to the device
  if (resumed) {
    iteration = last_saved = resumed_from = resumed->iteration;
    consumed = resumed->consumed_train_samples;
    consumed_valid = resumed->consumed_valid_samples;
    // Megatron restores the scheduler with the optimizer: --no-load-optim restarts both.
    sched_n = c.checkpoint.load_optim ? resumed->scheduler_num_steps : 0;
    total_nan = resumed->nan_iterations;
    flops_so_far = resumed->floating_point_operations_so_far;
  }
  check_data_covers_run(data, c, train_iters,
                        {iteration, consumed, consumed_valid, resumed ? resumed->loaded_from : std::string()});
  // The save folder is this run's until it ends (the first rank holds the lock for the run): every
  // rank stops when another run holds it.
  std::optional<SaveDirLock> save_lock;
  std::string lock_error;
  if (c.checkpoint.save && (!group || group->rank() == 0)) {
    try {
      save_lock.emplace(*c.checkpoint.save);
    } catch (const UsageError& e) {
      lock_error = e.what();
    }
  }
  if (on_any_rank(!lock_error.empty()))
    throw UsageError(lock_error.empty() ? "another run holds checkpoint.save / --save '" + *c.checkpoint.save +
                                              "' (rank 0 names it)"
                                        : lock_error);
  if (!opt.run_config_path.empty() && (!group || group->rank() == 0)) {
    write_file_atomic(opt.run_config_path, opt.run_config_yaml);
    std::fprintf(opt.out, "resolved configuration written to %s\n", opt.run_config_path.c_str());
    std::fflush(opt.out);
  }
  if (!opt.metrics_path.empty() && log_rank) {
    std::string dir = opt.metrics_path.substr(0, opt.metrics_path.find_last_of('/'));
    if (dir != opt.metrics_path) make_dirs(dir);
    metrics = std::fopen(opt.metrics_path.c_str(), resumed_from >= 0 ? "a" : "w");  // a resume appends
    if (!metrics) throw Error("cannot write the metrics file " + opt.metrics_path);
    close_metrics.f = metrics;
  }
  if (c.logger.tensorboard_dir && log_rank) tb = std::make_unique<TensorBoardWriter>(*c.logger.tensorboard_dir);
  // --async-save: the writing rank's save in flight (train/async_save.hpp).
  AsyncCheckpointSave async_save;
  auto write_checkpoint = [&](const model::GptModel& m, const optim::AdamW& a, const TrainStateRecord& st) {
    if (c.checkpoint.async_save) {
      async_save.finalize(true);  // one save in flight: the last one is written and reported first
      async_save.start(copy_run_checkpoint(c, d, iteration, m, a, st, opt.out), opt.out);
    } else {
      save_run_checkpoint(c, d, iteration, m, a, st, opt.out);
    }
  };
  auto save = [&] {
    if (!c.checkpoint.save || last_saved == iteration) return;
    // The device's state to the host model and AdamW, on every rank: with the distributed
    // optimizer on GPUs this gathers the main parameters over the data-parallel group.
    engine->pull_state();
    // The distributed optimizer's moments are spread over the data-parallel ranks: all of them
    // gather the whole, rank 0 writes it.
    std::unique_ptr<optim::AdamW> whole_moments;
    if (dist_opt) whole_moments = gather_moments(model.table(), adam, shards, adam_settings);
    const optim::AdamW& local_adam = whole_moments ? *whole_moments : adam;
    // Expert parallelism spreads the experts over data-parallel ranks: each group gathers them.
    std::optional<WholeState> ep_whole;
    if (model.ep_size() > 1) ep_whole = gather_whole_state(model, local_adam, adam_settings);
    if (dp_rank != 0) {  // every rank holds the same state: rank 0 writes it
      last_saved = iteration;
      return;
    }
    TrainStateRecord st;
    st.consumed_train_samples = consumed;
    st.consumed_valid_samples = consumed_valid;
    st.scheduler_num_steps = sched_n;
    st.nan_iterations = total_nan;
    st.floating_point_operations_so_far = flops_so_far;
    if (ep_whole) {  // (with tensor parallelism too: every rank of the TP group has it, the first writes)
      if (model.tp_rank() == 0) write_checkpoint(*ep_whole->model, *ep_whole->adam, st);
    } else if (model.tp_size() > 1) {  // whole tensors: the group gathers them, its first rank writes
      const WholeState whole = gather_whole_state(model, local_adam, adam_settings);
      if (model.tp_rank() == 0) write_checkpoint(*whole.model, *whole.adam, st);
    } else {
      write_checkpoint(model, local_adam, st);
    }
    last_saved = iteration;
  };
  if (c.train.exit_signal_handler) std::signal(SIGTERM, on_sigterm);
  TrainBatchReader next_batch(data, dp_rank);
  const auto train_start = Clock::now();
  M = ramp.running(consumed) / micro_times_dp;
  // --profile on this rank (Megatron's profile_ranks are global ranks): Nsight Systems' capture
  // range starts before iteration profile_step_start + 1 and stops after iteration
  // profile_step_end, as Megatron's loop does with the iterations completed so far.
  const auto& prof = c.profiling;
  const int64_t global_rank = group ? group->rank() : 0;
  const bool profiling = prof.use_nsys_profiler && std::find(prof.profile_ranks.begin(), prof.profile_ranks.end(),
                                                             global_rank) != prof.profile_ranks.end();
  const std::string nothing_to_capture = opt.use_cuda ? "" : " (the CPU backend: no GPU work to capture)";
  // --calculate-per-token-loss: the data-parallel reduction sums (Megatron-Core's DDP scaling
  // factor 1), and the step's tokens divide the gradients after it.
  const bool per_token = c.model.calculate_per_token_loss;
  const double dp_scale = per_token ? 1.0 : 1.0 / static_cast<double>(dp_size);
  // The tokens a Megatron router sees in a micro-batch: its sequence-parallel share under TP.
  const double router_tokens = static_cast<double>(data.train_layout.micro_batch_size * data.seq_length) /
                               static_cast<double>(model.tp_size());
  const int64_t loaded_iteration = std::max<int64_t>(resumed_from, 0);  // 0: a fresh run
  MemoryReportSchedule memory_report(opt.flavor, loaded_iteration);
  // Megatron's timers (--timing-log-level 1 or 2), each start and stop waiting for the device.
  const std::vector<std::string> timer_names = megatron_timers_to_log(c.logger.timing_log_level);
  const TimingLogOption timing_option = parse_timing_log_option(c.logger.timing_log_option);
  StepTimers timers(c.logger.timing_log_level, [&] { engine->synchronize(); }, [&] {
    if (group) group->barrier();
  });
  // Bridge's history_wct: seconds since the start after each of the latest window + 1 steps.
  std::deque<double> history_wct;
  while (iteration < train_iters) {
    async_save.finalize(false);  // a save in flight that has finished: reported
    if (profiling && iteration == prof.profile_step_start) {
      engine->cuda_profiler(true);
      std::fprintf(opt.out, "laoyao: --profile: cudaProfilerStart before iteration %lld on rank %lld%s\n",
                   static_cast<long long>(iteration + 1), static_cast<long long>(global_rank),
                   nothing_to_capture.c_str());
    }
    // A ramp's batch that takes more micro-batches: Megatron-LM saves a checkpoint first (with
    // --save), at the iterations done so far.
    gbs = ramp.running(consumed);
    if (gbs / micro_times_dp != M && iteration != 0) save();
    M = gbs / micro_times_dp;
    ++iteration;
    const auto step_start = Clock::now();
    flops_shape.global_batch_size = gbs;
    // Megatron's MoEAuxLossAutoScaler: 1 / num_microbatches; with a per-token loss 1, the router
    // multiplying its aux and z losses by the tokens it sees (a rank's share of the micro-batch)
    // to undo the division by the step's tokens.
    engine->set_moe_aux_loss_scale(per_token ? router_tokens : 1.0 / static_cast<double>(M));  // a no-op unless it changed
    engine->zero_grads();
    timers.start("forward-backward");
    double step_tokens = 0;  // this rank's loss tokens in the step
    for (int64_t m = 0; m < M; ++m) {
      timers.start("batch-generator");
      MicroBatchData mb = next_batch.take(consumed, m);
      timers.stop("batch-generator");
      // Keyed by the micro-batch's index in the global batch (its samples' place), so data-parallel
      // ranks draw the masks a single rank would for the same samples.
      const int64_t global_m = m * dp_size + dp_rank;
      model::DropoutKey key{seed, static_cast<uint64_t>(iteration) * 1000003ull + static_cast<uint64_t>(global_m),
                            dropout};
      // --overlap-grad-reduce: the last micro-batch's backward starts the gradient reduction.
      if (m + 1 == M && c.ddp.overlap_grad_reduce && dp_size > 1) engine->start_grad_sync(*dp, dp_scale);
      step_tokens += run_micro_batch(*engine, mb, key, M, true, dloss, per_token);
      // Read the next micro-batch while the device works on this one.
      if (m + 1 < M)
        next_batch.prefetch(consumed, m + 1);
      else if (iteration < train_iters)
        next_batch.prefetch(consumed + gbs, 0);  // (a ramp's next batch starts there too)
    }
    // The tensor-parallel sums: Megatron's non-tensor-parallel-grads-all-reduce, which its log omits.
    engine->finalize_grads();
    // Megatron's reduction of the embeddings between the first and last pipeline stages: nothing to
    // do with one stage, here as there (timed all the same, as Megatron times its no-op).
    timers.start("embedding-grads-all-reduce");
    timers.stop("embedding-grads-all-reduce");
    engine->finish_moe_step(dp_size > 1 ? dp : nullptr);
    LossSum iter_loss;
    double norm = 0;
    // The data-parallel reduction (none with one rank, timed all the same, as Megatron's).
    timers.start("all-grads-sync");
    if (group) {
      iter_loss = reduce_loss(engine->take_loss_sum());
      if (dp_size > 1) engine->all_reduce_grads(*dp, dp_scale);
    }
    timers.stop("all-grads-sync");
    timers.stop("forward-backward");
    timers.start("optimizer");  // the norm, the clip and the update
    // Megatron's copy of the model's gradients to the fp32 main gradients: they are the same here
    // (as there, where main_grad already is fp32 and the copy hands the tensor over).
    timers.start("optimizer-copy-to-main-grad");
    timers.stop("optimizer-copy-to-main-grad");
    if (group) {  // gradients reduced over the data-parallel ranks, then the norm
      // A per-token loss: the summed gradients over every data-parallel rank's tokens (none:
      // left as they are, as Megatron's finalize_model_grads does).
      if (per_token && iter_loss.count > 0) engine->scale_grads(1.0 / iter_loss.count);
      norm = engine->grad_norm();
    } else {
      // One process: the step's tokens are the host's mask sums (the count the engine would
      // report), so the per-token division goes before the fused loss-and-norm read.
      if (per_token && step_tokens > 0) engine->scale_grads(1.0 / step_tokens);
      std::tie(iter_loss, norm) = engine->take_loss_sum_and_grad_norm();
    }
    const double lm_loss = iter_loss.sum / std::max(iter_loss.count, 1.0);
    model::GptModel::MoeLosses iter_moe;  // this iteration's, averaged as the log line's
    if (moe_layers > 0) {
      model::GptModel::MoeLosses moe = engine->take_moe_losses();
      double v[4] = {moe.aux, moe.seq_aux, moe.z, moe.global_aux};
      if (dp && dp_size > 1) dp->all_reduce_sum(v, 4);
      const double per = 1.0 / (static_cast<double>(M) * static_cast<double>(moe_layers) * static_cast<double>(dp_size));
      iter_moe.aux = v[0] * per, iter_moe.seq_aux = v[1] * per, iter_moe.z = v[2] * per;
      // Each rank's global aux loss already counts every data-parallel rank's tokens: summed, not averaged.
      iter_moe.global_aux = v[3] * per * static_cast<double>(dp_size);
      interval_moe.aux += iter_moe.aux, interval_moe.seq_aux += iter_moe.seq_aux, interval_moe.z += iter_moe.z;
      interval_moe.global_aux += iter_moe.global_aux;
    }
    const bool finite = std::isfinite(lm_loss) && std::isfinite(norm);
    if (!finite && c.ddp.check_for_nan_in_grad)
      throw Error("NaN or Inf in the loss or the gradients at iteration " + std::to_string(iteration) +
                  " (loss " + std::to_string(lm_loss) + ", grad norm " + std::to_string(norm) +
                  "); Megatron-LM stops here too. With --no-check-for-nan-in-loss-and-grad "
                  "(ddp.check_for_nan_in_grad=false) such iterations are counted and skipped instead");
    int64_t zeros = 0;
    if (c.logger.log_num_zeros_in_grad) zeros = engine->count_zero_grads();
    if (finite) {
      timers.start("optimizer-inner-step");
      engine->clip_and_step(norm, c.optimizer.clip_grad, optim::lr_at(schedule, sched_n),
                            optim::wd_at(schedule, sched_n), decoupled_lr_at(sched_n));
      timers.stop("optimizer-inner-step");
      sched_n += gbs;  // the scheduler steps only after a successful update
      consecutive_nan = 0;
    } else {
      // Counted, skipped (weights and schedule untouched), and fatal when it keeps happening.
      ++skipped, ++nan_iters, ++consecutive_nan, ++total_nan;
      if (consecutive_nan >= 10)
        throw Error("training stopped: the loss or the gradients were NaN/Inf in 10 consecutive iterations (last: "
                    "iteration " + std::to_string(iteration) + "); lower the learning rate or check the data");
    }
    timers.stop("optimizer");
    consumed += gbs;  // consumed samples advance even for a skipped iteration
    if (c.logger.log_throughput_to_tensorboard) {
      history_wct.push_back(std::chrono::duration<double>(Clock::now() - train_start).count());
      if (static_cast<int64_t>(history_wct.size()) > c.logger.throughput_window_size + 1) history_wct.pop_front();
    }
    flops_so_far += num_floating_point_operations(flops_shape);
    ++iters_since_print;
    interval_ms += std::chrono::duration<double, std::milli>(Clock::now() - step_start).count();
    if (finite) interval_loss += lm_loss, ++interval_iters;
    summary.lm_loss.push_back(lm_loss);
    summary.grad_norm.push_back(norm);
    // Megatron logs every log_interval iterations. Megatron-LM (core 0.20, the reference's
    // snapshot: `is_first_iteration`) also logs the first iteration this process runs, a resumed
    // run's included, without resetting anything (its next line averages from that iteration on,
    // and times it too); Megatron-Bridge has no first-iteration line.
    const bool at_interval = iteration % log_interval == 0;
    const bool first = iteration == loaded_iteration + 1;
    const bool log_line = at_interval || (first && opt.flavor == LogFlavor::kMegatronLM);
    // The post-step rates the log and TensorBoard show, as Megatron's training_log gets them: through
    // reduce_max_stat_across_model_parallel_group, a float32 tensor (the grad norm and zero count too).
    const double logged_lr = as_float32(optim::lr_at(schedule, sched_n));
    const std::optional<double> logged_decoupled_lr =
        decoupled_schedule ? std::optional<double>(as_float32(*decoupled_lr_at(sched_n))) : std::nullopt;
    const bool tb_step =
        c.logger.tensorboard_dir && iteration % std::max<int64_t>(c.logger.tensorboard_log_interval, 1) == 0;
    // Once for the log line and TensorBoard, on every rank alike: the norm may be a collective.
    std::optional<double> params_norm;
    if (c.logger.log_params_norm && (log_line || tb_step)) params_norm = engine->params_norm();
    if (tb && tb_step) {
      IterationScalars s;
      s.iteration = iteration, s.consumed_samples = consumed;
      if (c.logger.log_throughput_to_tensorboard) {
        const auto report = throughput_report(history_wct, c.logger.throughput_window_size,
                                              c.train.global_batch_size.value_or(gbs),
                                              data.train_layout.micro_batch_size, data.seq_length, d.world_size);
        if (report)
          s.throughput = *report;
        else
          print_line("Warning: elapsed_wct is " + pyfmt::float_str(history_wct.back() - history_wct.front()) +
                     ", skipping throughput calculation at iteration " + std::to_string(iteration));
      }
      s.learning_rate = logged_lr;  // the value the log line prints
      s.decoupled_learning_rate = logged_decoupled_lr;
      s.batch_size = static_cast<double>(gbs);
      s.losses.push_back({"lm loss", lm_loss});
      if (c.logger.log_loss_scale_to_tensorboard) s.loss_scale = 1.0;  // bf16 and fp32: no loss scaling
      if (c.logger.log_world_size_to_tensorboard) s.world_size = static_cast<double>(d.world_size);
      if (c.optimizer.clip_grad > 0) s.grad_norm = as_float32(norm);
      if (c.logger.log_num_zeros_in_grad) s.num_zeros = as_float32(static_cast<double>(zeros));
      s.params_norm = params_norm;
      if (c.logger.log_memory_to_tensorboard)
        if (const size_t bytes = engine->peak_device_bytes()) s.memory = memory_scalars(bytes, opt.flavor);
      const auto& m = model_cfg.moe;
      if (moe_layers > 0) {
        if (m.aux_loss_coeff > 0) s.moe_losses.push_back({"load_balancing_loss", iter_moe.aux});
        if (m.seq_aux_loss_coeff > 0) s.moe_losses.push_back({"seq_load_balancing_loss", iter_moe.seq_aux});
        if (m.global_aux_loss_coeff > 0) s.moe_losses.push_back({"global_load_balancing_loss", iter_moe.global_aux});
        if (m.z_loss_coeff > 0) s.moe_losses.push_back({"z_loss", iter_moe.z});
      }
      write_iteration_scalars(*tb, s);
    }
    // Bridge writes its timers to TensorBoard at every TensorBoard step, per iteration since the last
    // log line, and (through its W&B writer, called with or without W&B) resets them there: its
    // printed block then shows only what ran after the last TensorBoard step (nothing at the
    // recipes' tensorboard_log_interval 1).
    if (opt.flavor == LogFlavor::kBridge && !timer_names.empty() && c.logger.log_timers_to_tensorboard &&
        iteration % std::max<int64_t>(c.logger.tensorboard_log_interval, 1) == 0) {
      const auto seconds = gather_timer_seconds(timers.elapsed(timer_names, true), group);
      if (tb) {
        for (const auto& [tag, value] : timer_scalars(timer_names, seconds, static_cast<double>(iters_since_print)))
          tb->add_scalar(tag, value, iteration);
        tb->flush();
      }
    }

    if (log_line) {
      const double elapsed_ms = interval_ms / static_cast<double>(iters_since_print);
      TrainingLogValues v;
      v.iteration = iteration;
      v.train_iters = train_iters;
      v.consumed_samples = consumed;
      v.elapsed_ms_per_iteration = elapsed_ms;
      if (c.logger.log_throughput)
        v.throughput_tflops_per_gpu =
            tflops_per_gpu(num_floating_point_operations(flops_shape), elapsed_ms / 1000.0, d.world_size, opt.flavor);
      v.learning_rate = logged_lr;  // the post-step value, as Megatron prints it
      if (opt.flavor == LogFlavor::kMegatronLM) v.decoupled_learning_rate = logged_decoupled_lr;
      v.global_batch_size = gbs;
      v.losses.push_back({"lm loss", interval_iters > 0 ? interval_loss / static_cast<double>(interval_iters) : NAN});
      if (moe_layers > 0) {  // Megatron's MoE tracker keys, averaged over the interval like the loss
        const double n = static_cast<double>(std::max<int64_t>(iters_since_print, 1));
        const auto& m = model_cfg.moe;
        if (m.aux_loss_coeff > 0) v.losses.push_back({"load_balancing_loss", interval_moe.aux / n});
        if (m.seq_aux_loss_coeff > 0) v.losses.push_back({"seq_load_balancing_loss", interval_moe.seq_aux / n});
        if (m.global_aux_loss_coeff > 0)
          v.losses.push_back({"global_load_balancing_loss", interval_moe.global_aux / n});
        if (m.z_loss_coeff > 0) v.losses.push_back({"z_loss", interval_moe.z / n});
      }
      // Megatron computes no norm when clipping is off (clip_grad 0) and prints 0.000.
      v.grad_norm = c.optimizer.clip_grad > 0 ? as_float32(norm) : 0.0;
      if (c.logger.log_num_zeros_in_grad) v.num_zeros = as_float32(static_cast<double>(zeros));
      v.params_norm = params_norm;
      v.skipped_iterations = skipped;
      v.nan_iterations = nan_iters;
      if (opt.flavor == LogFlavor::kBridge)
        print_line(format_bridge_step_time_line(
            elapsed_ms / 1000.0, tflops_per_gpu(num_floating_point_operations(flops_shape), elapsed_ms / 1000.0,
                                                d.world_size, opt.flavor)));
      print_line(format_training_line(v, now_timestamp(), opt.flavor));
      // Megatron's memory report after the first logged iterations, on each rank of data-parallel
      // rank 0 (the theoretical estimate first, Bridge's or Megatron-LM's, on rank 0); with
      // --log-memory-interval also at the log lines that are its multiples, once. CUDA only: the
      // CPU backend holds no device memory.
      const bool at_memory_report = memory_report.at_log_line(iteration);
      const bool at_memory_interval = opt.flavor == LogFlavor::kMegatronLM && c.logger.log_memory_interval &&
                                      iteration % *c.logger.log_memory_interval == 0;  // Bridge ignores it
      if (at_memory_report || at_memory_interval)
        if (const size_t held_bytes = engine->peak_device_bytes()) {
          if (at_memory_report && global_rank == 0)
            for (const std::string& line : opt.flavor == LogFlavor::kBridge
                                               ? bridge_theoretical_memory_lines(c, d, model_cfg)
                                               : mlm_theoretical_memory_lines(c, d, model_cfg))
              std::fprintf(opt.out, "%s\n", line.c_str());
          if (dp_rank == 0)
            std::fprintf(opt.out, "%s\n", format_memory_report(iteration, global_rank, held_bytes, opt.flavor).c_str());
          std::fflush(opt.out);
        }
      // Megatron's timer block (per iteration of the interval), printed by the last rank;
      // Megatron-LM writes the same values to TensorBoard first. Both keep their sums where the
      // interval's sums are kept (Megatron-LM's first line).
      if (!timer_names.empty()) {
        const bool keep = first && opt.flavor == LogFlavor::kMegatronLM;
        const auto seconds = gather_timer_seconds(timers.elapsed(timer_names, !keep), group);
        const double per = static_cast<double>(log_interval);
        if (tb && opt.flavor == LogFlavor::kMegatronLM && c.logger.log_timers_to_tensorboard) {
          for (const auto& [tag, value] : timer_scalars(timer_names, seconds, per)) tb->add_scalar(tag, value, iteration);
          tb->flush();
        }
        if (const auto block = format_timers_block(timer_names, seconds, per, timing_option)) print_line(*block);
      }
      // Seconds per iteration (and Megatron-LM's TFLOP/s per GPU): Megatron-LM writes no
      // iteration time at its first line (its throughput it does); Bridge writes the iteration time
      // at every log line and has no "throughput" tag.
      const bool bridge = opt.flavor == LogFlavor::kBridge;
      if (tb && c.logger.log_timers_to_tensorboard) {
        if (bridge || !first) tb->add_scalar("iteration-time", elapsed_ms / 1000.0, iteration);
        if (!bridge && v.throughput_tflops_per_gpu)
          tb->add_scalar("throughput", *v.throughput_tflops_per_gpu, iteration);
        tb->flush();
      }
      write_metrics({{"iteration", iteration},
                     {"consumed_samples", consumed},
                     {"lm_loss", v.losses[0].value},
                     {"iteration_lm_loss", lm_loss},
                     {"learning_rate", *v.learning_rate},
                     {"grad_norm", norm},
                     {"elapsed_ms_per_iteration", elapsed_ms},
                     {"skipped_iterations", skipped},
                     {"nan_iterations", nan_iters}});
      if (!(first && opt.flavor == LogFlavor::kMegatronLM)) {
        interval_loss = 0, interval_iters = 0, skipped = 0, nan_iters = 0;
        interval_moe = {};
        interval_ms = 0, iters_since_print = 0;
      }
    }
    if (c.validation.eval_interval && iteration % *c.validation.eval_interval == 0 &&
        iteration >= c.validation.start_eval_at_iter.value_or(0))
      summary.valid_loss.push_back(
          evaluate(data.datasets[1].get(), consumed_valid, iteration, EvalSet::kDuringTraining));
    if (profiling && iteration == prof.profile_step_end) {
      engine->cuda_profiler(false);
      std::fprintf(opt.out, "laoyao: --profile: cudaProfilerStop after iteration %lld on rank %lld\n",
                   static_cast<long long>(iteration), static_cast<long long>(global_rank));
      std::fflush(opt.out);
    }
    if (c.checkpoint.save_interval && iteration % *c.checkpoint.save_interval == 0) save();
    // Megatron's early exits, checked after each iteration: a signal, a duration, an interval.
    // Each saves a checkpoint first (when the run saves at all).
    if (c.train.exit_signal_handler && on_any_rank(g_sigterm.load())) {
      save();
      print_datetime("exiting program after receiving SIGTERM.");
      summary.exit_reason = "signal";
      break;
    }
    const double train_minutes = std::chrono::duration<double>(Clock::now() - train_start).count() / 60.0;
    if (c.train.exit_duration_in_mins && *c.train.exit_duration_in_mins > 0 &&
        on_any_rank(train_minutes > static_cast<double>(*c.train.exit_duration_in_mins))) {
      save();
      print_datetime("exiting program after " + pyfmt::float_str(train_minutes) + " minutes");
      summary.exit_reason = "duration";
      break;
    }
    if (c.train.exit_interval && *c.train.exit_interval > 0 && iteration % *c.train.exit_interval == 0) {
      save();
      print_datetime("exiting program at iteration " + std::to_string(iteration));
      summary.exit_reason = "interval";
      break;
    }
  }
  save();  // the end of training saves unless the last iteration was just saved
  async_save.finalize(true);
  // Megatron exits right after an early stop; the final evaluations run only after a full run.
  if (summary.exit_reason.empty()) {
    summary.valid_loss.push_back(
        evaluate(data.datasets[1].get(), consumed_valid, iteration, EvalSet::kValidationSet));
    int64_t consumed_test = 0;
    summary.test_loss = evaluate(data.datasets[2].get(), consumed_test, iteration, EvalSet::kTestSet);
  }
  if (const size_t bytes = engine->peak_device_bytes())
    print_line("> laoyao device memory held: " + pyfmt::fixed(static_cast<double>(bytes) / 1e9, 2) + " GB");
  summary.iterations = iteration;
  summary.consumed_samples = consumed;
  summary.nan_iterations = total_nan;
  return summary;
}

}  // namespace laoyao::train
