// Megatron's pretrain() and train(): the run is built (TrainingRun's constructor: data, model,
// optimizer, backend, restore), then the loop runs train_step, training_log, evaluate and
// save_checkpoint (training_run.hpp) until the iterations are done or an exit condition holds.
#include "train/trainer.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <string>

#include "core/error.hpp"
#include "core/file_io.hpp"
#include "train/memory_estimate.hpp"
#include "train/run_setup.hpp"
#include "train/tp_state.hpp"
#include "train/training_run.hpp"

namespace laoyao::train {
namespace {

using Clock = std::chrono::steady_clock;

// --exit-signal-handler: SIGTERM asks the loop to stop after the current iteration.
std::atomic<bool> g_sigterm{false};
extern "C" void on_sigterm(int) { g_sigterm.store(true); }

}  // namespace

TrainingRun::TrainingRun(const config::ConfigContainer& c_in, const config::Derived& d_in, const TrainOptions& opt_in)
    : c(c_in), d(d_in), opt(opt_in) {
  group = opt.group;
  dp = opt.dp_group ? opt.dp_group : group;
  dp_rank = dp ? dp->rank() : 0, dp_size = dp ? dp->size() : 1;
  cp = opt.cp_group && opt.cp_group->size() > 1 ? opt.cp_group : nullptr;
  cp_rank = cp ? cp->rank() : 0, cp_size = cp ? cp->size() : 1;
  data_rank = dp_rank / cp_size, data_size = dp_size / cp_size;  // (the dp_cp group is cp-minor)
  global_rank = group ? group->rank() : 0;
  log_rank = !group || group->rank() == group->size() - 1;

  // Megatron's two setup timers (its model-and-optimizer-setup includes the checkpoint load; the
  // datasets are built first here, before the model's memory is taken).
  const auto data_start = Clock::now();
  print_line("> building train, validation, and test datasets for GPT ...");
  data = build_run_data(c, d);
  print_line("> finished creating GPT datasets ...");
  double data_seconds = std::chrono::duration<double>(Clock::now() - data_start).count();
  const auto model_start = Clock::now();

  model_cfg = model_config(c, d);
  // A GPU rank's weights, gradients and moments live on its GPU: the host model and AdamW then hold
  // none (checkpoints stream them through the host a part at a time).
  const bool host_state = !opt.use_cuda;
  model = std::make_unique<model::GptModel>(model_cfg, opt.tp_group, opt.ep_group, opt.expert_dp_group, host_state);
  model->set_data_parallel_group(dp);
  model->set_context_parallel_group(cp);
  // Megatron's amax reduction group is the tensor-, data- and context-parallel ranks: with FP8
  // there is no pipeline or expert parallelism (refused), so every rank.
  model->set_fp8_amax_group(group);
  seed = static_cast<uint64_t>(c.rng.seed);
  summary.parameters = model->num_parameters() - model->num_buffer_elements();
  print_line(" > number of parameters on (tensor, gtp_remat, pipeline) model parallel rank (" +
             std::to_string(model->tp_rank()) + ", 0, 0): " + std::to_string(summary.parameters));
  moe_layers = model->num_moe_layers();
  if (moe_layers > 0)
    print_line("laoyao: Mixture of Experts: " + std::to_string(model->num_whole_parameters()) + " parameters, " +
               std::to_string(model->num_active_parameters()) + " active per token (top-" +
               std::to_string(model_cfg.moe.topk) + " of " + std::to_string(model_cfg.moe.num_experts) +
               " routed experts; routers, shared experts and the rest whole)");

  adam_settings = {c.optimizer.adam_beta1, c.optimizer.adam_beta2, c.optimizer.adam_eps};
  // Under expert parallelism the experts' share is over the ranks holding the same experts. With
  // --overlap-grad-reduce the shares' runs follow the model's parts, each reduced as the backward
  // finishes it (engine_cuda; the CPU engine reduces them after the backward).
  dist_opt = c.ddp.use_distributed_optimizer && dp_size > 1;
  shards = dist_opt ? plan_optimizer_shards(model->num_parameters(),
                                            model->ep_size() > 1 ? model->routed_expert_ranges()
                                                                 : std::vector<std::pair<int64_t, int64_t>>{},
                                            shard_group(dp), shard_group(model->expert_dp_group()),
                                            c.ddp.overlap_grad_reduce ? overlap_bucket_cuts(model->table())
                                                                      : std::vector<int64_t>{})
                    : whole_model_shards(model->num_trainable());
  adam = dist_opt ? make_shard_adam(model->table(), shards, adam_settings, host_state)
                  : make_whole_adam(model->table(), adam_settings, host_state);
  if (opt.use_cuda)
    engine = make_cuda_engine(*model, *adam, adam_settings,
                              std::max(data.train_layout.micro_batch_size, data.eval_layout.micro_batch_size),
                              data.seq_length, &shards);
  else
    engine = make_cpu_engine(*model, *adam, &shards);
  print_line("> laoyao backend: " + engine->name());

  schedule = param_schedule(c);
  // Megatron-Core's param groups: max_lr decoupled_lr, min_lr decoupled_min_lr or else min_lr.
  if (c.optimizer.decoupled_lr) {
    decoupled_schedule = schedule;
    decoupled_schedule->max_lr = *c.optimizer.decoupled_lr;
    decoupled_schedule->min_lr = c.optimizer.decoupled_min_lr.value_or(schedule.min_lr);
  }
  flops_shape = flop_shape(c, d);
  // The global batch and its micro-batches on this rank: fixed, or with --rampup-batch-size a
  // function of the consumed samples (Megatron updates them before every iteration).
  ramp = config::batch_rampup(c, d);
  dropout = c.model.hidden_dropout > 0 || c.model.attention_dropout > 0;
  per_token = c.model.calculate_per_token_loss;
  dp_scale = per_token ? 1.0 : 1.0 / static_cast<double>(dp_size);
  // Megatron's router tokens (a rank's sequence-parallel, context-parallel share) times the TP x CP
  // size: the micro-batch's.
  router_tokens = static_cast<double>(data.train_layout.micro_batch_size * data.seq_length);

  // The run's initial state where the engine keeps it; a checkpoint's parts over it (streamed).
  engine->initialize_weights(seed, c.model.bf16, initial_params_drawn(c.checkpoint, *model));
  if (c.checkpoint.load || c.checkpoint.pretrained_checkpoint) load_checkpoint(*this);
  const double model_seconds = std::chrono::duration<double>(Clock::now() - model_start).count();
  print_datetime("after model, optimizer, and learning rate scheduler are built");
  if (resumed) {
    progress.iteration = progress.last_saved = progress.resumed_from = resumed->iteration;
    progress.consumed = resumed->consumed_train_samples;
    progress.consumed_valid = resumed->consumed_valid_samples;
    // Megatron restores the scheduler with the optimizer: --no-load-optim restarts both.
    progress.sched_n = c.checkpoint.load_optim ? resumed->scheduler_num_steps : 0;
    progress.total_nan = resumed->nan_iterations;
    progress.flops_so_far = resumed->floating_point_operations_so_far;
  }
  check_data_covers_run(data, c, d.train_iters,
                        {progress.iteration, progress.consumed, progress.consumed_valid,
                         resumed ? resumed->loaded_from : std::string()});
  loaded_iteration = std::max<int64_t>(progress.resumed_from, 0);

  // The save folder is this run's until it ends: every rank stops when another run holds it.
  std::string lock_error;
  if (c.checkpoint.save && global_rank == 0) {
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
  if (!opt.run_config_path.empty() && global_rank == 0) {
    write_file_atomic(opt.run_config_path, opt.run_config_yaml);
    std::fprintf(opt.out, "resolved configuration written to %s\n", opt.run_config_path.c_str());
    std::fflush(opt.out);
  }
  if (!opt.metrics_path.empty() && log_rank) {
    const std::string dir = opt.metrics_path.substr(0, opt.metrics_path.find_last_of('/'));
    if (dir != opt.metrics_path) make_dirs(dir);
    metrics.reset(std::fopen(opt.metrics_path.c_str(), progress.resumed_from >= 0 ? "a" : "w"));  // a resume appends
    if (!metrics) throw Error("cannot write the metrics file " + opt.metrics_path);
  }
  if (c.logger.tensorboard_dir && log_rank) tb = std::make_unique<TensorBoardWriter>(*c.logger.tensorboard_dir);

  const auto iterators_start = Clock::now();
  next_batch = std::make_unique<TrainBatchReader>(data, data_rank, cp_rank, cp_size);
  data_seconds += std::chrono::duration<double>(Clock::now() - iterators_start).count();
  print_datetime("after dataloaders are built");
  progress.M = ramp.running(progress.consumed) / ramp.micro_times_dp;
  memory_report.emplace(opt.flavor, loaded_iteration);
  timer_names = megatron_timers_to_log(c.logger.timing_log_level);
  timing_option = parse_timing_log_option(c.logger.timing_log_option);
  // Both front ends' setup report: its timers at any --timing-log-level (Megatron's log level 0).
  print_line("done with setup ...");
  const std::vector<std::string> setup_timers = {"model-and-optimizer-setup", "train/valid/test-data-iterators-setup"};
  if (const auto block = format_timers_block(setup_timers, gather_timer_seconds({model_seconds, data_seconds}, group),
                                             1.0, timing_option))
    print_line(*block);
  timers = std::make_unique<StepTimers>(
      c.logger.timing_log_level, [this] { engine->synchronize(); },
      [this] {
        if (group) group->barrier();
      });
}

void TrainingRun::print_line(const std::string& s) const {
  if (!log_rank) return;
  std::fputs(s.c_str(), opt.out);
  std::fputc('\n', opt.out);
  std::fflush(opt.out);
}

void TrainingRun::print_datetime(const std::string& message) const {
  const std::string stamp = format_timestamp(now_timestamp(), LogFlavor::kBridge);  // "[YYYY-MM-DD HH:MM:SS]"
  print_line("[" + message + "] datetime: " + stamp.substr(1, stamp.size() - 2) + " ");
}

void TrainingRun::write_metrics(const nlohmann::ordered_json& j) const {
  if (!metrics) return;
  std::fputs((j.dump() + "\n").c_str(), metrics.get());
  std::fflush(metrics.get());
}

LossSum TrainingRun::reduce_loss(LossSum s) const {
  if (!dp || dp_size == 1) return s;
  double v[2] = {s.sum, s.count};
  dp->all_reduce_sum(v, 2);
  return LossSum{v[0], v[1]};
}

bool TrainingRun::on_any_rank(bool v) const {
  if (!group) return v;
  double x = v ? 1.0 : 0.0;
  group->all_reduce_sum(&x, 1);
  return x > 0;
}

std::optional<double> TrainingRun::decoupled_lr_at(int64_t n) const {
  if (!decoupled_schedule) return std::nullopt;
  return optim::lr_at(*decoupled_schedule, n);
}

TrainSummary train(const config::ConfigContainer& c, const config::Derived& d, const TrainOptions& opt) {
  TrainingRun run(c, d, opt);
  TrainProgress& p = run.progress;
  Engine& engine = *run.engine;
  if (c.train.exit_signal_handler) std::signal(SIGTERM, on_sigterm);
  run.train_start = Clock::now();
  // --profile on this rank (Megatron's profile_ranks are global ranks): Nsight Systems' capture
  // range starts before iteration profile_step_start + 1 and stops after iteration
  // profile_step_end, as Megatron's loop does with the iterations completed so far.
  const auto& prof = c.profiling;
  const bool profiling = prof.use_nsys_profiler && std::find(prof.profile_ranks.begin(), prof.profile_ranks.end(),
                                                             run.global_rank) != prof.profile_ranks.end();
  const std::string nothing_to_capture = opt.use_cuda ? "" : " (the CPU backend: no GPU work to capture)";
  if (opt.flavor == LogFlavor::kMegatronLM) {  // (Bridge's train prints neither)
    run.print_line("training ...");
    run.print_datetime("before the start of training step");
  }
  while (p.iteration < d.train_iters) {
    run.async_save.finalize(false);  // a save in flight that has finished: reported
    if (profiling && p.iteration == prof.profile_step_start) {
      engine.cuda_profiler(true);
      std::fprintf(opt.out, "laoyao: --profile: cudaProfilerStart before iteration %lld on rank %lld%s\n",
                   static_cast<long long>(p.iteration + 1), static_cast<long long>(run.global_rank),
                   nothing_to_capture.c_str());
    }
    // A ramp's batch that takes more micro-batches: Megatron-LM saves a checkpoint first (with
    // --save), at the iterations done so far.
    p.gbs = run.ramp.running(p.consumed);
    if (p.gbs / run.ramp.micro_times_dp != p.M && p.iteration != 0) save_checkpoint(run);
    p.M = p.gbs / run.ramp.micro_times_dp;
    ++p.iteration;
    const auto step_start = Clock::now();
    run.flops_shape.global_batch_size = p.gbs;
    StepResult step = train_step(run);
    p.consumed += p.gbs;  // consumed samples advance even for a skipped iteration
    if (c.logger.log_throughput_to_tensorboard) {
      run.history_wct.push_back(std::chrono::duration<double>(Clock::now() - run.train_start).count());
      if (static_cast<int64_t>(run.history_wct.size()) > c.logger.throughput_window_size + 1)
        run.history_wct.pop_front();
    }
    p.flops_so_far += num_floating_point_operations(run.flops_shape);
    step.elapsed_ms = std::chrono::duration<double, std::milli>(Clock::now() - step_start).count();
    run.summary.lm_loss.push_back(step.lm_loss);
    run.summary.grad_norm.push_back(step.norm);
    training_log(run, step);
    if (c.validation.eval_interval && p.iteration % *c.validation.eval_interval == 0 &&
        p.iteration >= c.validation.start_eval_at_iter.value_or(0))
      run.summary.valid_loss.push_back(
          evaluate(run, p.consumed_valid, EvalSet::kDuringTraining));
    if (profiling && p.iteration == prof.profile_step_end) {
      engine.cuda_profiler(false);
      std::fprintf(opt.out, "laoyao: --profile: cudaProfilerStop after iteration %lld on rank %lld\n",
                   static_cast<long long>(p.iteration), static_cast<long long>(run.global_rank));
      std::fflush(opt.out);
    }
    if (c.checkpoint.save_interval && p.iteration % *c.checkpoint.save_interval == 0) save_checkpoint(run);
    // Megatron's early exits, checked after each iteration: a signal, a duration, an interval.
    // Each saves a checkpoint first (when the run saves at all).
    if (c.train.exit_signal_handler && run.on_any_rank(g_sigterm.load())) {
      save_checkpoint(run);
      run.print_datetime("exiting program after receiving SIGTERM.");
      run.summary.exit_reason = "signal";
      break;
    }
    const double train_minutes = std::chrono::duration<double>(Clock::now() - run.train_start).count() / 60.0;
    if (c.train.exit_duration_in_mins && *c.train.exit_duration_in_mins > 0 &&
        run.on_any_rank(train_minutes > static_cast<double>(*c.train.exit_duration_in_mins))) {
      save_checkpoint(run);
      run.print_datetime("exiting program after " + pyfmt::float_str(train_minutes) + " minutes");
      run.summary.exit_reason = "duration";
      break;
    }
    if (c.train.exit_interval && *c.train.exit_interval > 0 && p.iteration % *c.train.exit_interval == 0) {
      save_checkpoint(run);
      run.print_datetime("exiting program at iteration " + std::to_string(p.iteration));
      run.summary.exit_reason = "interval";
      break;
    }
  }
  save_checkpoint(run);  // the end of training saves unless the last iteration was just saved
  run.async_save.finalize(true);
  // Megatron exits right after an early stop; the final evaluations run only after a full run.
  if (run.summary.exit_reason.empty()) {
    run.summary.valid_loss.push_back(
        evaluate(run, p.consumed_valid, EvalSet::kValidationSet));
    int64_t consumed_test = 0;
    run.summary.test_loss = evaluate(run, consumed_test, EvalSet::kTestSet);
  }
  if (const size_t bytes = engine.peak_device_bytes())
    run.print_line("> laoyao device memory held: " + pyfmt::fixed(static_cast<double>(bytes) / 1e9, 2) + " GB");
  // The host's share (a GPU rank keeps its state on the GPU): the process's peak, per parameter of
  // this rank (ranks as threads of one process share it).
  if (const long double host = peak_resident_bytes(); host > 0)
    run.print_line("> laoyao host memory peak: " + pyfmt::fixed(static_cast<double>(host) / 1e9, 2) + " GB, " +
                   pyfmt::fixed(static_cast<double>(host) / static_cast<double>(run.model->num_parameters()), 2) +
                   " bytes a parameter of this rank");
  run.summary.iterations = p.iteration;
  run.summary.consumed_samples = p.consumed;
  run.summary.nan_iterations = p.total_nan;
  return run.summary;
}

}  // namespace laoyao::train
