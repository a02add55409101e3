// Megatron's train_step: one iteration's micro-batches (forward and backward, gradient
// accumulation, Megatron's loss normalisation), the gradients' reductions, the norm, the clip and
// the update, or for a NaN/Inf iteration the skip.
#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <utility>

#include "core/error.hpp"
#include "train/training_run.hpp"

namespace laoyao::train {

MicroBatchData TrainBatchReader::take(int64_t consumed, int64_t m) {
  if (consumed_ == consumed && m_ == m) {
    consumed_ = -1;
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
    return std::move(mb_);
  }
  return read(consumed, m);
}

void TrainBatchReader::prefetch(int64_t consumed, int64_t m) {
  consumed_ = consumed, m_ = m, error_ = nullptr;
  try {
    mb_ = read(consumed, m);
  } catch (...) {
    error_ = std::current_exception();
  }
}

MicroBatchData TrainBatchReader::read(int64_t consumed, int64_t m) const {
  MicroBatchData mb =
      load_micro_batch(*data_.datasets[0], train_sample_indices(data_, consumed, m, dp_rank_), data_.vocab);
  return cp_size_ > 1 ? context_parallel_chunks(mb, cp_rank_, cp_size_) : mb;
}

// The gradient of each token's loss is mask / num_tokens / num_microbatches: the per-micro-batch
// token mean, averaged over micro-batches; with per_token (--calculate-per-token-loss) the mask
// alone, the trainer dividing the step's summed gradients by its tokens afterwards
// (Megatron-Core's finalize_model_grads). Returns the micro-batch's loss tokens (the mask's sum;
// 0 without a backward).
double run_micro_batch(Engine& engine, const MicroBatchData& mb, const model::DropoutKey& key, int64_t num_microbatches,
                       bool backward, std::vector<float>& dloss, bool per_token) {
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

StepResult train_step(TrainingRun& run) {
  const config::ConfigContainer& c = run.c;
  TrainProgress& p = run.progress;
  Engine& engine = *run.engine;
  StepTimers& timers = *run.timers;
  const int64_t M = p.M;
  // Megatron's MoEAuxLossAutoScaler: CP / num_microbatches (each context-parallel rank's aux and z
  // losses are its share of the whole sequences', and the gradients are averaged over dp_cp); with
  // a per-token loss 1, the router multiplying its aux and z losses by its tokens times the TP x CP
  // size (a micro-batch's) to undo the division by the step's tokens.
  engine.set_moe_aux_loss_scale(run.per_token ? run.router_tokens
                                              : static_cast<double>(run.cp_size) /
                                                    static_cast<double>(M));  // a no-op unless it changed
  engine.set_mtp_loss_scale({1.0 / static_cast<double>(M), run.per_token});
  engine.zero_grads();
  timers.start("forward-backward");
  double step_tokens = 0;  // this rank's loss tokens in the step
  for (int64_t m = 0; m < M; ++m) {
    timers.start("batch-generator");
    MicroBatchData mb = run.next_batch->take(p.consumed, m);
    mb.is_first_microbatch = m == 0;
    timers.stop("batch-generator");
    // Keyed by the micro-batch's index in the global batch (its samples' place), so data-parallel
    // ranks draw the masks a single rank would for the same samples.
    const int64_t global_m = m * run.data_size + run.data_rank;
    const model::DropoutKey key{run.seed,
                                static_cast<uint64_t>(p.iteration) * 1000003ull + static_cast<uint64_t>(global_m),
                                run.dropout};
    // --overlap-grad-reduce: the last micro-batch's backward starts the gradient reduction.
    if (m + 1 == M && c.ddp.overlap_grad_reduce && run.dp_size > 1) engine.start_grad_sync(*run.dp, run.dp_scale);
    step_tokens += run_micro_batch(engine, mb, key, M, true, run.dloss, run.per_token);
    // Read the next micro-batch while the device works on this one.
    if (m + 1 < M)
      run.next_batch->prefetch(p.consumed, m + 1);
    else if (p.iteration < run.d.train_iters)
      run.next_batch->prefetch(p.consumed + p.gbs, 0);  // (a ramp's next batch starts there too)
  }
  // The tensor-parallel sums: Megatron's non-tensor-parallel-grads-all-reduce, which its log omits.
  engine.finalize_grads();
  // Megatron's reduction of the embeddings between the first and last pipeline stages: nothing to
  // do with one stage, here as there (timed all the same, as Megatron times its no-op).
  timers.start("embedding-grads-all-reduce");
  timers.stop("embedding-grads-all-reduce");
  engine.finish_moe_step(run.dp_size > 1 ? run.dp : nullptr);
  LossSum iter_loss;
  StepResult r;
  // The data-parallel reduction (none with one rank, timed all the same, as Megatron's).
  timers.start("all-grads-sync");
  if (run.group) {
    iter_loss = run.reduce_loss(engine.take_loss_sum());
    if (run.dp_size > 1) engine.all_reduce_grads(*run.dp, run.dp_scale);
  }
  timers.stop("all-grads-sync");
  timers.stop("forward-backward");
  timers.start("optimizer");  // the norm, the clip and the update
  // Megatron's copy of the model's gradients to the fp32 main gradients: they are the same here
  // (as there, where main_grad already is fp32 and the copy hands the tensor over).
  timers.start("optimizer-copy-to-main-grad");
  timers.stop("optimizer-copy-to-main-grad");
  if (run.group) {  // gradients reduced over the data-parallel ranks, then the norm
    // A per-token loss: the summed gradients over every data-parallel rank's tokens (none:
    // left as they are, as Megatron's finalize_model_grads does).
    if (run.per_token && iter_loss.count > 0) engine.scale_grads(1.0 / iter_loss.count);
    r.norm = engine.grad_norm();
  } else {
    // One process: the step's tokens are the host's mask sums (the count the engine would
    // report), so the per-token division goes before the fused loss-and-norm read.
    if (run.per_token && step_tokens > 0) engine.scale_grads(1.0 / step_tokens);
    std::tie(iter_loss, r.norm) = engine.take_loss_sum_and_grad_norm();
  }
  r.lm_loss = iter_loss.sum / std::max(iter_loss.count, 1.0);
  if (run.moe_layers > 0) {
    const model::GptModel::MoeLosses moe = engine.take_moe_losses();
    double v[4] = {moe.aux, moe.seq_aux, moe.z, moe.global_aux};
    const double dp_size = static_cast<double>(run.dp_size);
    if (run.dp && run.dp_size > 1) run.dp->all_reduce_sum(v, 4);
    const double per = 1.0 / (static_cast<double>(M) * static_cast<double>(run.moe_layers) * dp_size);
    // The context-parallel ranks' aux losses are shares of their sequences': summed over CP (Megatron's
    // tp_cp reduce group), averaged over DP; their z-losses are means, averaged over both.
    const double cp = static_cast<double>(run.cp_size);
    r.moe.aux = v[0] * per * cp, r.moe.seq_aux = v[1] * per * cp, r.moe.z = v[2] * per;
    // Each rank's global aux loss already counts every data-parallel rank's tokens: summed, not averaged.
    r.moe.global_aux = v[3] * per * dp_size;
  }
  // Megatron's MTP losses: each micro-batch's, summed and scaled as the main loss, averaged over
  // the data-parallel ranks.
  r.mtp = engine.take_mtp_losses();
  if (!r.mtp.empty() && run.dp && run.dp_size > 1) {
    run.dp->all_reduce_sum(r.mtp.data(), r.mtp.size());
    for (double& x : r.mtp) x /= static_cast<double>(run.dp_size);
  }
  r.finite = std::isfinite(r.lm_loss) && std::isfinite(r.norm);
  if (!r.finite && c.ddp.check_for_nan_in_grad)
    throw Error("NaN or Inf in the loss or the gradients at iteration " + std::to_string(p.iteration) + " (loss " +
                std::to_string(r.lm_loss) + ", grad norm " + std::to_string(r.norm) +
                "); Megatron-LM stops here too. With --no-check-for-nan-in-loss-and-grad "
                "(ddp.check_for_nan_in_grad=false) such iterations are counted and skipped instead");
  if (c.logger.log_num_zeros_in_grad) r.zeros = engine.count_zero_grads();
  if (r.finite) {
    timers.start("optimizer-inner-step");
    engine.clip_and_step(r.norm, c.optimizer.clip_grad, optim::lr_at(run.schedule, p.sched_n),
                         optim::wd_at(run.schedule, p.sched_n), run.decoupled_lr_at(p.sched_n));
    timers.stop("optimizer-inner-step");
    p.sched_n += p.gbs;  // the scheduler steps only after a successful update
    p.consecutive_nan = 0;
  } else {
    // Counted, skipped (weights and schedule untouched), and fatal when it keeps happening.
    ++p.consecutive_nan, ++p.total_nan;
    if (p.consecutive_nan >= 10)
      throw Error("training stopped: the loss or the gradients were NaN/Inf in 10 consecutive iterations (last: "
                  "iteration " + std::to_string(p.iteration) + "); lower the learning rate or check the data");
  }
  timers.stop("optimizer");
  return r;
}

}  // namespace laoyao::train
