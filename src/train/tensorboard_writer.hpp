// TensorBoard event files for the scalars Megatron writes through its SummaryWriter
// (--tensorboard-dir): one file per run, events.out.tfevents.<seconds>.<host>.<pid>.0, in TFRecord
// framing (length, masked CRC-32C of the length, the record, masked CRC-32C of the record) holding
// Event protos: first file_version "brain.Event:2", then one Event per scalar (wall_time, step and a
// Summary of one Value {tag, simple_value}). Flushed after each step's scalars, so TensorBoard sees
// them while the run goes; a resumed run writes a new file beside the old (TensorBoard reads both).
#pragma once
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace laoyao::train {

class TensorBoardWriter {
 public:
  // Creates `dir` if needed; laoyao::Error naming the file when it cannot be written.
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // SummaryWriter.add_scalar(tag, value, step): the value as a float.
  void add_scalar(const std::string& tag, double value, int64_t step);
  void flush();
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& record);
  std::FILE* f_ = nullptr;
  std::string path_;
};

// One training iteration's scalars as Megatron's training_log writes them, in its order, each at
// step `iteration` and again as "<tag> vs samples" at step `consumed_samples`: learning-rate,
// batch-size, each loss (lm loss), loss-scale, world-size, grad-norm, num-zeros, params-norm (the
// optional ones when set; decoupled-learning-rate, with --decoupled-lr, at the iteration alone).
// Then the MoE losses (load_balancing_loss, ...) at the iteration alone, as its MoE tracker writes
// them.
struct IterationScalars {
  int64_t iteration = 0, consumed_samples = 0;
  double learning_rate = 0, batch_size = 0;
  std::optional<double> decoupled_learning_rate;
  std::vector<std::pair<std::string, double>> losses;
  std::optional<double> loss_scale, world_size, grad_norm, num_zeros, params_norm;
  std::vector<std::pair<std::string, double>> moe_losses;
  // Bridge's logger.log_throughput_to_tensorboard: (tag, value) at the iteration (training_log.hpp
  // throughput_report).
  std::vector<std::pair<std::string, double>> throughput;
  // --log-memory-to-tensorboard: (tag, value) at the iteration (training_log.hpp memory_scalars).
  std::vector<std::pair<std::string, double>> memory;
};
void write_iteration_scalars(TensorBoardWriter& tb, const IterationScalars& s);
// An evaluation during training (evaluate_and_print_results): "<key> validation" at the iteration
// and "<key> validation vs samples" at the consumed training samples; with_ppl adds the same for
// "<key> validation ppl" (--log-validation-ppl-to-tensorboard).
void write_validation_scalars(TensorBoardWriter& tb, const std::string& key, double loss, int64_t iteration,
                              int64_t consumed_samples, bool with_ppl);

// The serialised Event protos the writer frames (for tests): a scalar's, and the file's first.
std::string tensorboard_scalar_event(double wall_time, int64_t step, const std::string& tag, float value);
std::string tensorboard_version_event(double wall_time);
// One TFRecord: the framing around `record`.
std::string tfrecord(const std::string& record);

}  // namespace laoyao::train
