// Reading Megatron-format training logs back into numbers: laoyao's own logs, Megatron-LM's
// (timestamp with microseconds) and Megatron-Bridge's (without), as they come out of a launcher:
// lines may carry a prefix ("[default0]:", "0: ", a Slurm job label), and other output
// (warnings, memory reports, timers) may sit between them.
//
// Compatibility floor: every line that the regexes of Megatron-Bridge's
// scripts/performance/utils/evaluate.py accept is accepted here, with the same numbers:
//   iteration\s+(\d+)/\s+\d+      elapsed time per iteration \(ms\):\s+([\d.]+)
//   lm loss:\s+([\d.E+\-]+)       grad norm:\s+([\d.]+|nan|inf)
//   Step Time :\s+([\d.]+)s       GPU utilization:\s+([\d.]+)
// and the validation block of evaluate_and_print_results.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "train/training_log.hpp"

namespace laoyao::train {

// One per-iteration training line (plus Bridge's "Step Time" line printed just before it).
struct IterationRecord {
  size_t line = 0;  // 1-based line number of the training line in the log
  std::string timestamp;  // "2026-11-30 05:34:22.661240" or "" when the line had none
  int64_t iteration = 0;
  int64_t train_iters = 0;
  std::optional<int64_t> consumed_samples;
  std::optional<int64_t> skipped_samples;
  std::optional<double> elapsed_ms;
  std::optional<double> throughput_tflops_per_gpu;
  std::optional<double> learning_rate;
  std::optional<double> decoupled_learning_rate;
  std::optional<int64_t> global_batch_size;
  std::vector<LossValue> losses;  // every "<key>: <number>" loss field, in line order
  std::optional<double> loss_scale;
  std::optional<double> grad_norm;  // may be nan or inf
  std::optional<double> num_zeros;
  std::optional<double> params_norm;
  std::optional<double> max_attention_logit;
  std::optional<int64_t> skipped_iterations;
  std::optional<int64_t> nan_iterations;
  // Bridge's "Step Time : {:.2f}s GPU utilization: {:.1f}MODEL_TFLOP/s/GPU" line.
  std::optional<double> step_time_s;
  std::optional<double> model_tflops_per_gpu;
  // Fields this parser does not model (energy, memory(GiB), elapsed/remaining time, ...).
  std::vector<std::pair<std::string, std::string>> other_fields;

  std::optional<double> loss(std::string_view name) const;
};

struct ValidationLoss {
  std::string name;  // "lm loss"
  std::optional<double> value;
  std::optional<double> ppl;
};

struct ValidationRecord {
  size_t line = 0;
  int64_t iteration = 0;
  EvalSet set = EvalSet::kDuringTraining;
  std::optional<int> validation_set_index;  // "validation-0 loss at ..."
  std::vector<ValidationLoss> losses;

  std::optional<double> loss(std::string_view name) const;
};

struct ParsedLog {
  std::vector<IterationRecord> iterations;  // in log order (a resumed run may repeat numbers)
  std::vector<ValidationRecord> validations;
  size_t lines = 0;
  // Each record holds its own iteration's values (TensorBoard events), not the mean since the
  // previous log line.
  bool per_iteration = false;
};

// Parse one line. nullopt when the line is not a training line.
std::optional<IterationRecord> parse_training_line(std::string_view line);
// nullopt when the line is not a validation line.
std::optional<ValidationRecord> parse_validation_line(std::string_view line);

// Parse a whole log. Lines end at '\n' or '\r' (progress bars rewrite lines with '\r').
ParsedLog parse_training_log(std::string_view text);
// Reads the file (laoyao::UsageError naming it when it cannot be read); does not require that
// it contains any iteration.
ParsedLog parse_training_log_file(const std::string& path);

// "during training", "on validation set", "on test set".
const char* eval_set_name(EvalSet set);

}  // namespace laoyao::train
