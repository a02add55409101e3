// Megatron's training log text, byte for byte, so that tools written for Megatron logs (the
// regexes of Megatron-Bridge's scripts/performance/utils/evaluate.py, users' grep/awk) read ours.
//
// Reproduced functions:
//   megatron/training/training.py::training_log            (MLM per-iteration line)
//   megatron/bridge/training/utils/train_utils.py::training_log   (Bridge line + "Step Time" line)
//   megatron/training/training.py::evaluate_and_print_results     (validation block; Bridge's
//                                                                  training/eval.py is identical)
// Formatting follows Python's format-spec semantics ({:.6E}, {:.3f}, {:8d}, str(float)), which
// differ from printf only for nan/inf: Python never prints a sign on nan and writes
// "nan"/"NAN", never "-nan".
#pragma once
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace laoyao::train {

// Which Megatron prints the line. MLM stamps `[%Y-%m-%d %H:%M:%S.%f]` (microseconds, since
// 2026), Bridge `[%Y-%m-%d %H:%M:%S]`. Bridge also computes throughput with a different
// expression order (see tflops_per_gpu).
enum class LogFlavor { kMegatronLM, kBridge };

// Wall-clock time as Python's datetime.now() gives it (local time).
struct Timestamp {
  int year = 1970, month = 1, day = 1, hour = 0, minute = 0, second = 0, microsecond = 0;
};
Timestamp now_timestamp();
// "[2026-11-30 05:34:22.661240]" (kMegatronLM) or "[2026-05-28 22:32:59]" (kBridge).
std::string format_timestamp(const Timestamp& t, LogFlavor flavor);

struct LossValue {
  std::string name;  // "lm loss", "load_balancing_loss", "mtp_1 loss", ...
  double value = 0.0;
};

// The values of one training_log line. Optional fields are printed only when set, as Megatron
// prints them only when the corresponding option is on (or the value exists).
struct TrainingLogValues {
  int64_t iteration = 0;
  int64_t train_iters = 0;
  int64_t consumed_samples = 0;
  int64_t skipped_samples = 0;  // " skipped samples: {:12d} |" only when > 0
  double elapsed_ms_per_iteration = 0.0;
  std::optional<double> throughput_tflops_per_gpu;  // --log-throughput / logger.log_throughput
  std::optional<double> energy_j_per_iter_per_gpu;  // --log-energy: energy and power together
  std::optional<double> power_w_per_gpu;
  std::optional<double> learning_rate;  // MLM omits it on ranks without trainable params
  std::optional<double> decoupled_learning_rate;  // older MLM, with --decoupled-lr
  int64_t global_batch_size = 0;
  // Every reported loss, in Megatron's dict order ("lm loss" first, then MoE/MTP keys). Each is
  // printed as " {name}: {:.6E} |" only if value >= 0.0 (Megatron's `if avg >= 0.0`, so a NaN
  // average is not printed at all).
  std::vector<LossValue> losses;
  double loss_scale = 1.0;  // 1.0 for bf16
  std::optional<double> grad_norm;
  std::optional<double> num_zeros;  // printed with Python str() of a float: "1234.0"
  std::optional<double> params_norm;
  std::optional<double> max_attention_logit;  // Bridge only (MLM logs it to TensorBoard)
  int64_t skipped_iterations = 0;
  int64_t nan_iterations = 0;
};

// The whole line, starting with the space before '[' and ending with "|" (no newline).
std::string format_training_line(const TrainingLogValues& v, const Timestamp& t, LogFlavor flavor);

// Bridge's extra line printed on rank 0 before each training line:
// "Step Time : {s:.2f}s GPU utilization: {tflops:.1f}MODEL_TFLOP/s/GPU".
std::string format_bridge_step_time_line(double seconds_per_iteration, double tflops_per_gpu);

// Per-GPU TFLOP/s as each flavor computes it (same value, different float expression order):
//   MLM:    flops / (elapsed_s * 10**12 * world_size)
//   Bridge: flops / elapsed_s / world_size / 1e12
double tflops_per_gpu(double flops_per_iteration, double elapsed_s_per_iteration, int64_t world_size,
                      LogFlavor flavor);

// The device memory line Megatron prints after the first logged iterations, on each rank of
// data-parallel rank 0, for `held_bytes` of device memory (laoyao allocates everything up front, so
// allocated, active and reserved, and their maxima, are all the bytes it holds):
//   MLM (report_memory):  "[Rank r] (after N iterations) memory (MB) | allocated: {:.2f} |
//                          max allocated: {:.2f} | reserved: {:.2f} | max reserved: {:.2f}" (MiB)
//   Bridge:               "[Rank r] (after N iterations) memory (GB) | mem-allocated-gigabytes: x |
//                          mem-active-gigabytes: x | mem-reserved-gigabytes: x | mem-max-allocated-
//                          gigabytes: x | mem-max-active-gigabytes: x | mem-max-reserved-gigabytes: x"
//                          (1e9 bytes, rounded to 5 significant digits, Python's str of the float;
//                          Bridge prints only the allocator's keys it finds: laoyao has no
//                          inactive blocks, allocation retries or allocation count to report).
std::string format_memory_report(int64_t iteration, int64_t rank, size_t held_bytes, LogFlavor flavor);

// --log-memory-to-tensorboard's scalars for `held_bytes` (tag, value), in Megatron's order:
//   MLM:    "mem-reserved-bytes", "mem-allocated-bytes", "mem-max-allocated-bytes" (bytes; torch's
//           "mem-allocated-count" has no counterpart here)
//   Bridge: "memory/mem-allocated-gigabytes", ... the memory line's six keys under "memory/", its
//           values (GB to 5 significant digits).
std::vector<std::pair<std::string, double>> memory_scalars(size_t held_bytes, LogFlavor flavor);

// Bridge's report_throughput (logger.log_throughput_to_tensorboard), from `history`: the
// wall-clock seconds after each of the latest iterations, oldest first, up to window_size + 1 of
// them (Bridge's deque). Once window_size are there: "throughput/batches_per_sec",
// "throughput/samples_per_sec", "throughput/device/batches_per_sec", "throughput/device/
// samples_per_sec", "throughput/micro_batch_size", "throughput/global_batch_size",
// "throughput/tokens_per_sec", "throughput/device/tokens_per_sec" (Bridge's order: window_size - 1
// batches over the history's whole span, per device over the world size). Empty before that;
// nullopt when the span is not positive (Bridge skips the scalars with a warning).
std::optional<std::vector<std::pair<std::string, double>>> throughput_report(const std::deque<double>& history,
                                                                              int64_t window_size,
                                                                              int64_t global_batch_size,
                                                                              int64_t micro_batch_size,
                                                                              int64_t seq_length, int64_t world_size);

// When that line follows a training line (Megatron's report_memory_flag): at the first logged
// line, and again at the next one if the first was the run's first iteration, so that a report
// counts the optimizer's state (`iteration > loaded_iteration + 1` turns it off). Megatron-LM's
// loaded iteration is the checkpoint's; Bridge's train loop passes none (0).
class MemoryReportSchedule {
 public:
  MemoryReportSchedule(LogFlavor flavor, int64_t loaded_iteration)
      : loaded_(flavor == LogFlavor::kMegatronLM ? loaded_iteration : 0) {}
  // At a printed training line of `iteration`: whether the report follows it.
  bool at_log_line(int64_t iteration) {
    if (!armed_) return false;
    if (iteration > loaded_ + 1) armed_ = false;
    return true;
  }

 private:
  int64_t loaded_;
  bool armed_ = true;
};

// Which evaluation printed a validation block.
enum class EvalSet {
  kDuringTraining,  // " validation loss at iteration N | ..."
  kValidationSet,   // " validation loss at iteration N on validation set | ..." (end of training)
  kTestSet,         // " validation loss at iteration N on test set | ..."
};

struct ValidationLogValues {
  int64_t iteration = 0;
  EvalSet set = EvalSet::kDuringTraining;
  // --multiple-validation-sets prints "validation-{index} loss at"; unset: "validation loss at".
  std::optional<int> validation_set_index;
  std::vector<LossValue> losses;  // each printed as "{name} value: ... | {name} PPL: ... | "
};

// exp(min(20, loss)) with Python's min(): min(20, nan) is 20, so a NaN loss prints PPL e^20.
double validation_ppl(double loss);

// The three lines of evaluate_and_print_results, each ending in '\n': a dash line of
// len(string)+1, the string (which ends in "| ", trailing space included), the dash line again.
std::string format_validation_block(const ValidationLogValues& v);
// Just the middle line (no newline).
std::string format_validation_line(const ValidationLogValues& v);

// Python format-spec equivalents used above (exposed for tests and for other log writers).
namespace pyfmt {
std::string fixed(double x, int precision);        // '{:.Nf}'.format(x)
std::string exp_upper(double x, int precision);    // '{:.NE}'.format(x)
std::string exp_lower(double x, int precision);    // '{:.Ne}'.format(x)
std::string integer(int64_t x, int width);         // '{:Wd}'.format(x)
std::string float_str(double x);                   // str(x) / f'{x}' for a Python float
}  // namespace pyfmt

}  // namespace laoyao::train
