// The training loop's load_checkpoint and save_checkpoint: what the run's ranks restore and write,
// and which rank writes (run_checkpoint.hpp holds the files' side).
#include <memory>
#include <optional>

#include "train/run_checkpoint.hpp"
#include "train/tp_state.hpp"
#include "train/training_run.hpp"

namespace laoyao::train {

void load_checkpoint(TrainingRun& run) {
  const config::ConfigContainer& c = run.c;
  model::GptModel& model = *run.model;
  const bool loads = c.checkpoint.load || c.checkpoint.pretrained_checkpoint;
  if (loads && run.dist_opt) {
    // Checkpoints hold the whole moments: restore them whole (and, under tensor or expert
    // parallelism, the whole model: below), keep this rank's share. Nothing has stepped yet: the
    // whole moments start at zero, no gather needed.
    auto local = make_whole_adam(model.table(), run.adam_settings);
    if (split_model(model)) {
      WholeState whole = gather_whole_state(model, *local, run.adam_settings);
      run.resumed = restore_run_checkpoint(c, run.d, *whole.model, *whole.adam, run.opt.out);
      keep_shards(whole, model, *local);
    } else {
      run.resumed = restore_run_checkpoint(c, run.d, model, *local, run.opt.out);
    }
    keep_moment_share(*local, run.shards, *run.adam);
  } else if (loads && split_model(model)) {
    // Checkpoints hold whole tensors: restore the whole model (from this run's initial weights, for
    // what the checkpoint does not hold), keep this rank's shards.
    WholeState whole = gather_whole_state(model, *run.adam, run.adam_settings);
    run.resumed = restore_run_checkpoint(c, run.d, *whole.model, *whole.adam, run.opt.out);
    keep_shards(whole, model, *run.adam);
  } else {
    run.resumed = restore_run_checkpoint(c, run.d, model, *run.adam, run.opt.out);
  }
}

namespace {

void write_checkpoint(TrainingRun& run, const model::GptModel& m, const optim::AdamW& a, const TrainStateRecord& st) {
  const int64_t iteration = run.progress.iteration;
  if (run.c.checkpoint.async_save) {
    run.async_save.finalize(true);  // one save in flight: the last one is written and reported first
    run.async_save.start(copy_run_checkpoint(run.c, run.d, iteration, m, a, st, run.opt.out), run.opt.out);
  } else {
    save_run_checkpoint(run.c, run.d, iteration, m, a, st, run.opt.out);
  }
}

}  // namespace

void save_checkpoint(TrainingRun& run) {
  TrainProgress& p = run.progress;
  if (!run.c.checkpoint.save || p.last_saved == p.iteration) return;
  const model::GptModel& model = *run.model;
  // The device's state to the host model and AdamW, on every rank, for the save (an engine that
  // keeps it on its device gets it back after): with the distributed optimizer on GPUs this gathers
  // the main parameters over the data-parallel group.
  const HostStateHold hold(*run.model, *run.adam);
  run.engine->pull_state();
  // The distributed optimizer's moments are spread over the data-parallel ranks: all of them
  // gather the whole, rank 0 writes it.
  std::unique_ptr<optim::AdamW> whole_moments;
  if (run.dist_opt) whole_moments = gather_moments(model.table(), *run.adam, run.shards, run.adam_settings);
  const optim::AdamW& local_adam = whole_moments ? *whole_moments : *run.adam;
  // Expert parallelism spreads the experts over data-parallel ranks: each group gathers them.
  std::optional<WholeState> ep_whole;
  if (model.ep_size() > 1) ep_whole = gather_whole_state(model, local_adam, run.adam_settings);
  if (run.dp_rank != 0) {  // every rank holds the same state: rank 0 writes it
    p.last_saved = p.iteration;
    return;
  }
  TrainStateRecord st;
  st.consumed_train_samples = p.consumed;
  st.consumed_valid_samples = p.consumed_valid;
  st.scheduler_num_steps = p.sched_n;
  st.nan_iterations = p.total_nan;
  st.floating_point_operations_so_far = p.flops_so_far;
  if (ep_whole) {  // (with tensor parallelism too: every rank of the TP group has it, the first writes)
    if (model.tp_rank() == 0) write_checkpoint(run, *ep_whole->model, *ep_whole->adam, st);
  } else if (model.tp_size() > 1) {  // whole tensors: the group gathers them, its first rank writes
    const WholeState whole = gather_whole_state(model, local_adam, run.adam_settings);
    if (model.tp_rank() == 0) write_checkpoint(run, *whole.model, *whole.adam, st);
  } else {
    write_checkpoint(run, model, local_adam, st);
  }
  p.last_saved = p.iteration;
}

}  // namespace laoyao::train
