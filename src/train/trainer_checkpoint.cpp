// The training loop's load_checkpoint and save_checkpoint: every rank restores and writes its own
// parts of the state, streamed between the engine and the files a part at a time
// (run_checkpoint.hpp holds the files' side, rank_checkpoint.hpp the parts).
#include <exception>

#include "train/run_checkpoint.hpp"
#include "train/training_run.hpp"

namespace laoyao::train {

void load_checkpoint(TrainingRun& run) {
  run.resumed = restore_run_checkpoint(run.c, run.d, *run.model, run.shards, *run.engine, run.opt.out);
}

void save_checkpoint(TrainingRun& run) {
  TrainProgress& p = run.progress;
  if (!run.c.checkpoint.save || p.last_saved == p.iteration) return;
  const bool async = run.c.checkpoint.async_save;
  if (async) run.async_save.finalize(true);  // one save in flight: the last one is finished and reported first
  TrainStateRecord st;
  st.consumed_train_samples = p.consumed;
  st.consumed_valid_samples = p.consumed_valid;
  st.scheduler_num_steps = p.sched_n;
  st.nan_iterations = p.total_nan;
  st.floating_point_operations_so_far = p.flops_so_far;
  st.optimizer_steps = run.engine->optimizer_steps();
  std::unique_ptr<RunCheckpointSave> save =
      begin_run_checkpoint(run.c, run.d, p.iteration, {*run.model, run.shards, run.group}, st, run.opt.out);
  attach_run_checkpoint_state(*save, *run.engine, async);
  if (async) {
    run.async_save.start(std::move(save), run.opt.out);
  } else {
    std::exception_ptr error;
    try {
      write_run_checkpoint(*save);
    } catch (...) {
      error = std::current_exception();
    }
    finish_run_checkpoint(*save, error, run.opt.out);
  }
  p.last_saved = p.iteration;
}

}  // namespace laoyao::train
