// The training loop's load_checkpoint and save_checkpoint: every rank restores and writes its own
// parts of the state (run_checkpoint.hpp holds the files' side, rank_checkpoint.hpp the parts).
#include "train/run_checkpoint.hpp"
#include "train/tp_state.hpp"
#include "train/training_run.hpp"

namespace laoyao::train {

void load_checkpoint(TrainingRun& run) {
  run.resumed = restore_run_checkpoint(run.c, run.d, *run.model, *run.adam, run.shards, run.opt.out);
}

void save_checkpoint(TrainingRun& run) {
  TrainProgress& p = run.progress;
  if (!run.c.checkpoint.save || p.last_saved == p.iteration) return;
  // The device's state to the host model and AdamW, on every rank, for the save (an engine that
  // keeps it on its device gets it back after): with the distributed optimizer on GPUs this gathers
  // the main parameters over the data-parallel group.
  const HostStateHold hold(*run.model, *run.adam);
  run.engine->pull_state();
  TrainStateRecord st;
  st.consumed_train_samples = p.consumed;
  st.consumed_valid_samples = p.consumed_valid;
  st.scheduler_num_steps = p.sched_n;
  st.nan_iterations = p.total_nan;
  st.floating_point_operations_so_far = p.flops_so_far;
  const RankState rank{*run.model, *run.adam, run.shards, run.group};
  if (run.c.checkpoint.async_save) {
    run.async_save.finalize(true);  // one save in flight: the last one is finished and reported first
    run.async_save.start(begin_run_checkpoint(run.c, run.d, p.iteration, rank, st, true, run.opt.out), run.opt.out);
  } else {
    save_run_checkpoint(run.c, run.d, p.iteration, rank, st, run.opt.out);
  }
  p.last_saved = p.iteration;
}

}  // namespace laoyao::train
