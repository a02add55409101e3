// The training loop of Megatron's pretrain(): iterations of micro-batches with gradient
// accumulation and Megatron's loss normalisation, global-norm clipping, AdamW, the sample-based
// LR/WD schedule, Megatron's log lines, periodic evaluation and the final validation and test
// evaluations. CPU reference backend, one rank.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "config/config_container.hpp"
#include "dist/process_group.hpp"
#include "train/training_log.hpp"

namespace laoyao::train {

struct TrainOptions {
  LogFlavor flavor = LogFlavor::kMegatronLM;
  std::FILE* out = stdout;  // where the log lines go
  // A JSON-lines metrics file written beside the log ("" = none): one object per logged
  // iteration and per evaluation.
  std::string metrics_path;
  // The resolved config, written by the first rank to this path ("" = none) once the run has
  // passed its checks and holds its save folder, so that a refused run writes nothing.
  std::string run_config_path, run_config_yaml;
  // Train on the CUDA backend (the current device); the CLI decides (train/engine.hpp choose_backend).
  bool use_cuda = false;
  // Data-parallel ranks (null: one rank). Each rank reads its slice of every global batch; the
  // gradients and the reported losses are reduced over the group; the last rank prints the log
  // (Megatron's print_rank_last) and writes the metrics, rank 0 saves checkpoints.
  dist::ProcessGroup* group = nullptr;
  // With tensor parallelism (Megatron's layout: TP ranks innermost): the rank's data-parallel group
  // (its data slice, the loss and gradient reductions) and tensor-parallel group (the model's).
  // Null: the data-parallel group is `group`, and there is no tensor parallelism.
  dist::ProcessGroup* dp_group = nullptr;
  dist::ProcessGroup* tp_group = nullptr;
  // Expert parallelism (--expert-model-parallel-size > 1): the expert-parallel group and the
  // expert data-parallel group (the ranks holding the same experts; nullptr when just one).
  dist::ProcessGroup* ep_group = nullptr;
  dist::ProcessGroup* expert_dp_group = nullptr;
  // Context parallelism (--context-parallel-size > 1): the ranks holding the other chunks of this
  // rank's sequences; dp_group is then Megatron's dp_cp group (data- and context-parallel ranks),
  // cp-minor, over which the losses and gradients are reduced.
  dist::ProcessGroup* cp_group = nullptr;
};

struct TrainSummary {
  int64_t iterations = 0;
  int64_t consumed_samples = 0;
  int64_t parameters = 0;         // this rank's (the log's "number of parameters" line)
  int64_t nan_iterations = 0;
  std::vector<double> lm_loss;    // per iteration, token-weighted over the global batch
  std::vector<double> grad_norm;  // per iteration, before clipping
  std::vector<double> valid_loss; // every evaluation on the validation set, in order (final one last)
  double test_loss = 0;
  std::string exit_reason;        // "" (all iterations ran), "signal", "duration" or "interval"
};

// Prints Megatron's log lines on stdout as it goes.
TrainSummary train(const config::ConfigContainer& c, const config::Derived& d, const TrainOptions& opt);

}  // namespace laoyao::train
