// One training run's state, and the functions of Megatron's training loop over it (training.py):
// train_step, training_log, evaluate, save_checkpoint. train() (trainer.cpp) builds the run and
// runs the loop that calls them; each lives in its own file.
#pragma once
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/config_container.hpp"
#include "data/batch_rampup.hpp"
#include "dist/process_group.hpp"
#include "model/gpt_model.hpp"
#include "optim/adamw.hpp"
#include "optim/param_scheduler.hpp"
#include "train/async_save.hpp"
#include "train/checkpoint.hpp"
#include "train/data_pipeline.hpp"
#include "train/dist_optimizer.hpp"
#include "train/engine.hpp"
#include "train/flops.hpp"
#include "train/step_timers.hpp"
#include "train/tensorboard_writer.hpp"
#include "train/trainer.hpp"
#include "train/training_log.hpp"

namespace laoyao::train {

// Training micro-batches, with one read ahead: the next micro-batch is read from the dataset while
// the device works on the current one. A read error is raised where the micro-batch is used, so a
// run fails at the same iteration as without the read-ahead.
class TrainBatchReader {
 public:
  // data_rank: the data-parallel rank whose samples this rank reads (its chunks of them under
  // context parallelism: cp_rank of cp_size).
  TrainBatchReader(const RunData& data, int64_t data_rank, int64_t cp_rank = 0, int64_t cp_size = 1)
      : data_(data), dp_rank_(data_rank), cp_rank_(cp_rank), cp_size_(cp_size) {}
  MicroBatchData take(int64_t consumed, int64_t m);
  void prefetch(int64_t consumed, int64_t m);

 private:
  MicroBatchData read(int64_t consumed, int64_t m) const;
  const RunData& data_;
  int64_t dp_rank_, cp_rank_, cp_size_;
  int64_t consumed_ = -1, m_ = -1;
  MicroBatchData mb_;
  std::exception_ptr error_;
};

// What the run has done: the counters a checkpoint's train_state.json keeps, and where it stands.
struct TrainProgress {
  int64_t iteration = 0;
  int64_t consumed = 0, consumed_valid = 0;  // samples
  int64_t sched_n = 0;                       // the scheduler's steps (samples of successful updates)
  int64_t total_nan = 0, consecutive_nan = 0;
  double flops_so_far = 0;  // Megatron's num_floating_point_operations_so_far
  int64_t last_saved = -1, resumed_from = -1;
  int64_t gbs = 0, M = 0;  // this iteration's global batch and micro-batches on this rank
};

// One iteration's outcome (train_step's).
struct StepResult {
  double lm_loss = 0;  // token-weighted over the global batch
  double norm = 0;     // the gradients' norm before clipping
  bool finite = true;  // the update was made (else counted and skipped)
  int64_t zeros = 0;   // --log-num-zeros-in-grad
  model::GptModel::MoeLosses moe;  // this iteration's, averaged as the log line's
  std::vector<double> mtp;         // each multi-token prediction layer's loss, the same way
  double elapsed_ms = 0;           // the step's time (the loop's, for the log)
};

// Sums over the log interval, reset at each log line (Megatron-LM's first line excepted).
struct LogInterval {
  double loss = 0, ms = 0;  // training time only: evaluation is not counted
  int64_t iters = 0;        // finite iterations (the loss average's)
  int64_t since_print = 0, skipped = 0, nan_iters = 0;
  // Megatron's MoE and MTP tracker values: each iteration's, summed.
  model::GptModel::MoeLosses moe;
  std::vector<double> mtp;
};

struct TrainingRun {
  // Builds everything the loop needs, restores what the config asks for (the device holds the
  // initial, pretrained or resumed state afterwards), takes the save folder and writes
  // run_config.yaml, the metrics file and TensorBoard's once the run's checks pass.
  TrainingRun(const config::ConfigContainer& c, const config::Derived& d, const TrainOptions& opt);
  TrainingRun(const TrainingRun&) = delete;
  TrainingRun& operator=(const TrainingRun&) = delete;

  const config::ConfigContainer& c;
  const config::Derived& d;
  const TrainOptions& opt;

  // The world (decisions every rank takes together; the last rank prints, as Megatron's
  // print_rank_last), and the data-parallel group: this rank's data slice, the loss and gradient
  // reductions. Tensor-parallel ranks of one data-parallel rank read the same samples.
  dist::ProcessGroup* group = nullptr;
  dist::ProcessGroup* dp = nullptr;
  int64_t dp_rank = 0, dp_size = 1, global_rank = 0;
  // Under context parallelism dp is the dp_cp group: the samples are those of data-parallel rank
  // data_rank of data_size, of which this rank reads its chunks (cp_rank of cp_size).
  dist::ProcessGroup* cp = nullptr;
  int64_t cp_rank = 0, cp_size = 1, data_rank = 0, data_size = 1;
  bool log_rank = true;

  // Output, on the rank that prints the log: the metrics lines and Megatron's TensorBoard scalars.
  struct FileCloser {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  std::unique_ptr<std::FILE, FileCloser> metrics;
  std::unique_ptr<TensorBoardWriter> tb;

  RunData data;
  model::GptConfig model_cfg;
  std::unique_ptr<model::GptModel> model;
  int64_t moe_layers = 0;
  optim::AdamWSettings adam_settings;
  // The distributed optimizer: this data-parallel rank keeps Adam's moments for its share only.
  bool dist_opt = false;
  OptimizerShards shards;
  std::unique_ptr<optim::AdamW> adam;
  std::unique_ptr<Engine> engine;

  optim::ParamSchedule schedule;
  // --decoupled-lr: the word embeddings' and output layer's own schedule.
  std::optional<optim::ParamSchedule> decoupled_schedule;
  FlopShape flops_shape;
  data::BatchRampup ramp;
  uint64_t seed = 0;
  bool dropout = false;
  // --calculate-per-token-loss: the data-parallel reduction sums, the step's tokens divide after.
  bool per_token = false;
  double dp_scale = 1;
  // The tokens a Megatron router sees in a micro-batch (its TP x CP share) times the TP x CP size.
  double router_tokens = 0;

  TrainProgress progress;
  std::optional<TrainStateRecord> resumed;
  int64_t loaded_iteration = 0;  // 0: a fresh run
  LogInterval interval;
  TrainSummary summary;
  std::vector<float> dloss;  // the micro-batches' per-token loss gradients (reused)

  // Megatron's timers (--timing-log-level 1 or 2), each start and stop waiting for the device.
  std::vector<std::string> timer_names;
  TimingLogOption timing_option = TimingLogOption::kMinMax;
  std::unique_ptr<StepTimers> timers;
  std::optional<MemoryReportSchedule> memory_report;  // from the loaded iteration on
  // Bridge's history_wct: seconds since the start after each of the latest window + 1 steps.
  std::deque<double> history_wct;
  std::chrono::steady_clock::time_point train_start;
  std::unique_ptr<TrainBatchReader> next_batch;

  // The save folder is this run's until it ends (the first rank holds the lock).
  std::optional<SaveDirLock> save_lock;
  // --async-save: the writing rank's save in flight (declared last: it finishes first).
  AsyncCheckpointSave async_save;

  // Helpers every function of the loop uses.
  void print_line(const std::string& s) const;
  // Megatron's print_datetime: "[message] datetime: YYYY-MM-DD HH:MM:SS ".
  void print_datetime(const std::string& message) const;
  void write_metrics(const nlohmann::ordered_json& j) const;
  LossSum reduce_loss(LossSum s) const;  // over the data-parallel group
  // A decision every rank must take together (an early exit): true when it holds on any rank.
  bool on_any_rank(bool v) const;
  std::optional<double> decoupled_lr_at(int64_t n) const;
};

// Forward (and, when training, backward) of one micro-batch: train_step.cpp.
double run_micro_batch(Engine& engine, const MicroBatchData& mb, const model::DropoutKey& key, int64_t num_microbatches,
                       bool backward, std::vector<float>& dloss, bool per_token = false);

// One iteration (progress.iteration, already advanced): the micro-batches' forward and backward,
// the gradients' reductions, the norm, the clip and the update (or, for NaN/Inf, the skip).
StepResult train_step(TrainingRun& run);

// After each iteration: the interval's sums, and at log lines Megatron's line, timers, memory
// report, TensorBoard scalars and the metrics file.
void training_log(TrainingRun& run, const StepResult& step);

// Megatron's evaluate_and_print_results on the split `set` names (test for kTestSet, else
// validation; none or --eval-iters 0: NaN, nothing printed): the stream continues across
// evaluations through consumed_eval.
double evaluate(TrainingRun& run, int64_t& consumed_eval, EvalSet set);

// Restores what the config asks for (--load, --pretrained-checkpoint) into the host model and
// AdamW, which hold the run's initial weights: called once, before the state goes to the engine.
void load_checkpoint(TrainingRun& run);
// Writes the checkpoint of the current iteration to checkpoint.save (nothing without one, or
// when this iteration was just saved). Every rank calls it: the state may be gathered.
void save_checkpoint(TrainingRun& run);

}  // namespace laoyao::train
