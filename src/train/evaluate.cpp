// Megatron's evaluate_and_print_results: --eval-iters iterations of forward-only micro-batches on
// one split, the loss averaged over its tokens and data-parallel ranks, Megatron's validation
// block, TensorBoard's validation scalars and the metrics file's line.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "train/training_run.hpp"

namespace laoyao::train {

double evaluate(TrainingRun& run, int64_t& consumed_eval, EvalSet set) {
  const config::ConfigContainer& c = run.c;
  const int split = set == EvalSet::kTestSet ? 2 : 1;
  const data::SampleDataset* ds = run.data.datasets[static_cast<size_t>(split)].get();
  if (!ds || c.validation.eval_iters <= 0) return NAN;
  const auto& L = run.data.eval_layout;
  for (int64_t it = 0; it < c.validation.eval_iters; ++it) {
    for (int64_t m = 0; m < L.num_microbatches; ++m) {
      MicroBatchData mb =
          load_micro_batch(*ds, eval_sample_indices(run.data, split, consumed_eval, m, run.data_rank), run.data.vocab);
      if (run.cp_size > 1) mb = context_parallel_chunks(mb, run.cp_rank, run.cp_size);
      mb.is_first_microbatch = m == 0;
      run_micro_batch(*run.engine, mb, {run.seed, 0, false}, L.num_microbatches, false, run.dloss);
    }
    consumed_eval += eval_round_samples(run.data, 1);  // the validation stream continues across evaluations
  }
  const LossSum total = run.reduce_loss(run.engine->take_loss_sum());
  ValidationLogValues v;
  v.iteration = run.progress.iteration;
  v.set = set;
  v.losses.push_back({"lm loss", total.sum / std::max(total.count, 1.0)});
  if (run.log_rank) {
    std::fputs(format_validation_block(v).c_str(), run.opt.out);
    std::fflush(run.opt.out);
  }
  // The end of training's evaluations too, to the same tags at the last iteration (Megatron's
  // write_to_tensorboard = not skip_train).
  if (run.tb)
    write_validation_scalars(*run.tb, "lm loss", v.losses[0].value, v.iteration, run.progress.consumed,
                             c.logger.log_validation_ppl_to_tensorboard);
  run.write_metrics({{"iteration", v.iteration},
                     {"split", set == EvalSet::kTestSet ? "test" : "valid"},
                     {"final", set != EvalSet::kDuringTraining},
                     {"lm_loss", v.losses[0].value},
                     {"ppl", validation_ppl(v.losses[0].value)}});
  return v.losses[0].value;
}

}  // namespace laoyao::train
