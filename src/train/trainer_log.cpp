// Megatron's training_log: after each iteration the interval's sums grow; at log lines Megatron's
// line, its timers block, its memory report, TensorBoard's scalars and the metrics file's line.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "train/theoretical_memory.hpp"
#include "train/training_run.hpp"

namespace laoyao::train {
namespace {

// A value as Megatron logs it after a float32 tensor's all-reduce (.item() of a float32).
double as_float32(double v) { return static_cast<double>(static_cast<float>(v)); }

// Megatron's MTP tracker key of layer k (0-based): "mtp_1 loss", ...
std::string mtp_loss_name(size_t k) { return "mtp_" + std::to_string(k + 1) + " loss"; }

}  // namespace

void training_log(TrainingRun& run, const StepResult& step) {
  const config::ConfigContainer& c = run.c;
  const TrainOptions& opt = run.opt;
  const TrainProgress& p = run.progress;
  LogInterval& interval = run.interval;
  const int64_t iteration = p.iteration;
  ++interval.since_print;
  interval.ms += step.elapsed_ms;
  if (step.finite) {
    interval.loss += step.lm_loss, ++interval.iters;
  } else {
    ++interval.skipped, ++interval.nan_iters;
  }
  interval.moe.aux += step.moe.aux, interval.moe.seq_aux += step.moe.seq_aux, interval.moe.z += step.moe.z;
  interval.moe.global_aux += step.moe.global_aux;
  interval.mtp.resize(step.mtp.size(), 0.0);
  for (size_t k = 0; k < step.mtp.size(); ++k) interval.mtp[k] += step.mtp[k];
  // Megatron logs every log_interval iterations. Megatron-LM (core 0.20, the reference's
  // snapshot: `is_first_iteration`) also logs the first iteration this process runs, a resumed
  // run's included, without resetting anything (its next line averages from that iteration on,
  // and times it too); Megatron-Bridge has no first-iteration line.
  const int64_t log_interval = c.logger.log_interval;
  const bool at_interval = iteration % log_interval == 0;
  const bool first = iteration == run.loaded_iteration + 1;
  const bool log_line = at_interval || (first && opt.flavor == LogFlavor::kMegatronLM);
  // The post-step rates the log and TensorBoard show, as Megatron's training_log gets them: through
  // reduce_max_stat_across_model_parallel_group, a float32 tensor (the grad norm and zero count too).
  const double logged_lr = as_float32(optim::lr_at(run.schedule, p.sched_n));
  const std::optional<double> logged_decoupled_lr =
      run.decoupled_schedule ? std::optional<double>(as_float32(*run.decoupled_lr_at(p.sched_n))) : std::nullopt;
  const int64_t tb_interval = std::max<int64_t>(c.logger.tensorboard_log_interval, 1);
  const bool tb_step = c.logger.tensorboard_dir && iteration % tb_interval == 0;
  const auto& m = run.model_cfg.moe;
  // Once for the log line and TensorBoard, on every rank alike: the norm may be a collective.
  std::optional<double> params_norm;
  if (c.logger.log_params_norm && (log_line || tb_step)) params_norm = run.engine->params_norm();
  if (run.tb && tb_step) {
    IterationScalars s;
    s.iteration = iteration, s.consumed_samples = p.consumed;
    if (c.logger.log_throughput_to_tensorboard) {
      const auto report = throughput_report(run.history_wct, c.logger.throughput_window_size,
                                            c.train.global_batch_size.value_or(p.gbs),
                                            run.data.train_layout.micro_batch_size, run.data.seq_length,
                                            run.d.world_size);
      if (report)
        s.throughput = *report;
      else
        run.print_line("Warning: elapsed_wct is " +
                       pyfmt::float_str(run.history_wct.back() - run.history_wct.front()) +
                       ", skipping throughput calculation at iteration " + std::to_string(iteration));
    }
    s.learning_rate = logged_lr;  // the value the log line prints
    s.decoupled_learning_rate = logged_decoupled_lr;
    s.batch_size = static_cast<double>(p.gbs);
    s.losses.push_back({"lm loss", step.lm_loss});
    if (c.logger.log_loss_scale_to_tensorboard) s.loss_scale = 1.0;  // bf16 and fp32: no loss scaling
    if (c.logger.log_world_size_to_tensorboard) s.world_size = static_cast<double>(run.d.world_size);
    if (c.optimizer.clip_grad > 0) s.grad_norm = as_float32(step.norm);
    if (c.logger.log_num_zeros_in_grad) s.num_zeros = as_float32(static_cast<double>(step.zeros));
    s.params_norm = params_norm;
    if (c.logger.log_memory_to_tensorboard)
      if (const size_t bytes = run.engine->peak_device_bytes()) s.memory = memory_scalars(bytes, opt.flavor);
    if (run.moe_layers > 0) {
      if (m.aux_loss_coeff > 0) s.moe_losses.push_back({"load_balancing_loss", step.moe.aux});
      if (m.seq_aux_loss_coeff > 0) s.moe_losses.push_back({"seq_load_balancing_loss", step.moe.seq_aux});
      if (m.global_aux_loss_coeff > 0) s.moe_losses.push_back({"global_load_balancing_loss", step.moe.global_aux});
      if (m.z_loss_coeff > 0) s.moe_losses.push_back({"z_loss", step.moe.z});
    }
    for (size_t k = 0; k < step.mtp.size(); ++k) s.moe_losses.push_back({mtp_loss_name(k), step.mtp[k]});
    write_iteration_scalars(*run.tb, s);
  }
  // Bridge writes its timers to TensorBoard at every TensorBoard step, per iteration since the last
  // log line, and (through its W&B writer, called with or without W&B) resets them there: its
  // printed block then shows only what ran after the last TensorBoard step (nothing at the
  // recipes' tensorboard_log_interval 1).
  if (opt.flavor == LogFlavor::kBridge && !run.timer_names.empty() && c.logger.log_timers_to_tensorboard &&
      iteration % tb_interval == 0) {
    const auto seconds = gather_timer_seconds(run.timers->elapsed(run.timer_names, true), run.group);
    if (run.tb) {
      for (const auto& [tag, value] :
           timer_scalars(run.timer_names, seconds, static_cast<double>(interval.since_print)))
        run.tb->add_scalar(tag, value, iteration);
      run.tb->flush();
    }
  }
  if (!log_line) return;

  const double elapsed_ms = interval.ms / static_cast<double>(interval.since_print);
  const double tflops = tflops_per_gpu(num_floating_point_operations(run.flops_shape), elapsed_ms / 1000.0,
                                       run.d.world_size, opt.flavor);
  TrainingLogValues v;
  v.iteration = iteration;
  v.train_iters = run.d.train_iters;
  v.consumed_samples = p.consumed;
  v.elapsed_ms_per_iteration = elapsed_ms;
  if (c.logger.log_throughput) v.throughput_tflops_per_gpu = tflops;
  v.learning_rate = logged_lr;  // the post-step value, as Megatron prints it
  if (opt.flavor == LogFlavor::kMegatronLM) v.decoupled_learning_rate = logged_decoupled_lr;
  v.global_batch_size = p.gbs;
  v.losses.push_back({"lm loss", interval.iters > 0 ? interval.loss / static_cast<double>(interval.iters) : NAN});
  if (run.moe_layers > 0) {  // Megatron's MoE tracker keys, averaged over the interval like the loss
    const double n = static_cast<double>(std::max<int64_t>(interval.since_print, 1));
    if (m.aux_loss_coeff > 0) v.losses.push_back({"load_balancing_loss", interval.moe.aux / n});
    if (m.seq_aux_loss_coeff > 0) v.losses.push_back({"seq_load_balancing_loss", interval.moe.seq_aux / n});
    if (m.global_aux_loss_coeff > 0) v.losses.push_back({"global_load_balancing_loss", interval.moe.global_aux / n});
    if (m.z_loss_coeff > 0) v.losses.push_back({"z_loss", interval.moe.z / n});
  }
  for (size_t k = 0; k < interval.mtp.size(); ++k)  // after the MoE losses, as Megatron's tracker order
    v.losses.push_back({mtp_loss_name(k), interval.mtp[k] / static_cast<double>(std::max<int64_t>(interval.since_print, 1))});
  // Megatron computes no norm when clipping is off (clip_grad 0) and prints 0.000.
  v.grad_norm = c.optimizer.clip_grad > 0 ? as_float32(step.norm) : 0.0;
  if (c.logger.log_num_zeros_in_grad) v.num_zeros = as_float32(static_cast<double>(step.zeros));
  v.params_norm = params_norm;
  v.skipped_iterations = interval.skipped;
  v.nan_iterations = interval.nan_iters;
  if (opt.flavor == LogFlavor::kBridge) run.print_line(format_bridge_step_time_line(elapsed_ms / 1000.0, tflops));
  run.print_line(format_training_line(v, now_timestamp(), opt.flavor));
  // Megatron's memory report after the first logged iterations, on each rank of data-parallel
  // rank 0 (the theoretical estimate first, Bridge's or Megatron-LM's, on rank 0); with
  // --log-memory-interval also at the log lines that are its multiples, once. CUDA only: the
  // CPU backend holds no device memory.
  const bool at_memory_report = run.memory_report->at_log_line(iteration);
  const bool at_memory_interval = opt.flavor == LogFlavor::kMegatronLM && c.logger.log_memory_interval &&
                                  iteration % *c.logger.log_memory_interval == 0;  // Bridge ignores it
  if (at_memory_report || at_memory_interval)
    if (const size_t held_bytes = run.engine->peak_device_bytes()) {
      if (at_memory_report && run.global_rank == 0)
        for (const std::string& line : opt.flavor == LogFlavor::kBridge
                                           ? bridge_theoretical_memory_lines(c, run.d, run.model_cfg)
                                           : mlm_theoretical_memory_lines(c, run.d, run.model_cfg))
          std::fprintf(opt.out, "%s\n", line.c_str());
      if (run.dp_rank == 0)
        std::fprintf(opt.out, "%s\n", format_memory_report(iteration, run.global_rank, held_bytes, opt.flavor).c_str());
      std::fflush(opt.out);
    }
  // Megatron's timer block (per iteration of the interval), printed by the last rank;
  // Megatron-LM writes the same values to TensorBoard first. Both keep their sums where the
  // interval's sums are kept (Megatron-LM's first line).
  if (!run.timer_names.empty()) {
    const bool keep = first && opt.flavor == LogFlavor::kMegatronLM;
    const auto seconds = gather_timer_seconds(run.timers->elapsed(run.timer_names, !keep), run.group);
    const double per = static_cast<double>(log_interval);
    if (run.tb && opt.flavor == LogFlavor::kMegatronLM && c.logger.log_timers_to_tensorboard) {
      for (const auto& [tag, value] : timer_scalars(run.timer_names, seconds, per))
        run.tb->add_scalar(tag, value, iteration);
      run.tb->flush();
    }
    if (const auto block = format_timers_block(run.timer_names, seconds, per, run.timing_option))
      run.print_line(*block);
  }
  // Seconds per iteration (and Megatron-LM's TFLOP/s per GPU): Megatron-LM writes no
  // iteration time at its first line (its throughput it does); Bridge writes the iteration time
  // at every log line and has no "throughput" tag.
  const bool bridge = opt.flavor == LogFlavor::kBridge;
  if (run.tb && c.logger.log_timers_to_tensorboard) {
    if (bridge || !first) run.tb->add_scalar("iteration-time", elapsed_ms / 1000.0, iteration);
    if (!bridge && v.throughput_tflops_per_gpu) run.tb->add_scalar("throughput", *v.throughput_tflops_per_gpu, iteration);
    run.tb->flush();
  }
  run.write_metrics({{"iteration", iteration},
                     {"consumed_samples", p.consumed},
                     {"lm_loss", v.losses[0].value},
                     {"iteration_lm_loss", step.lm_loss},
                     {"learning_rate", *v.learning_rate},
                     {"grad_norm", step.norm},
                     {"elapsed_ms_per_iteration", elapsed_ms},
                     {"skipped_iterations", interval.skipped},
                     {"nan_iterations", interval.nan_iters}});
  if (!(first && opt.flavor == LogFlavor::kMegatronLM)) interval = {};
}

}  // namespace laoyao::train
