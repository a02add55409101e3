// Megatron's timers (megatron/core/timers.py) as training_log uses them with --timing-log-level 1
// or 2 (logger.timing_log_level): named regions of a step timed on the wall clock with the device
// synchronized at each start and stop (Megatron's Timer synchronizes CUDA there too), summed until
// read with a reset; after the log line, the last rank prints Megatron's block
//   (min, max) time across ranks (ms):
//       forward-backward ...............................: (12.34, 12.56)
// and --log-timers-to-tensorboard writes each as the scalar "<name>-time" (the maximum over ranks,
// seconds per iteration).
//
// Which regions laoyao times (the names of Megatron-LM core 0.20's training_log list whose step
// exists here): forward-backward (the micro-batches' forward and backward through the gradient
// reductions, as Megatron's schedule times finalize_model_grads inside it), all-grads-sync (the
// data-parallel reduction), embedding-grads-all-reduce (nothing to do with one pipeline stage, as
// in Megatron, which times its no-op too), optimizer (the gradient norm, clip and update),
// optimizer-copy-to-main-grad (nothing: the gradients are the fp32 main gradients, as Megatron's
// main_grad is) and optimizer-inner-step (the update), and at level 2 batch-generator (reading a
// micro-batch). Megatron's tensor-parallel sums are its non-tensor-parallel-grads-all-reduce, which
// its log leaves out (so does this one). Not printed, as nothing here corresponds:
// optimizer-copy-main-to-model-params (the update writes the bf16 weights itself),
// params-all-gather (inside the distributed optimizer's update), forward-compute and
// backward-compute (one CUDA graph runs a micro-batch's forward and backward).
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dist/process_group.hpp"

namespace laoyao::train {

// --timing-log-option: which ranks' times the block shows.
enum class TimingLogOption { kMax, kMinMax, kAll };
// "max", "minmax" or "all"; anything else is a UsageError naming the flag.
TimingLogOption parse_timing_log_option(const std::string& s);

// The timer names training_log logs at `level` (Megatron-LM core 0.20's timers_to_log: level 1's
// names, then level 2's), in its order. Empty at level 0 or below.
std::vector<std::string> megatron_timers_to_log(int64_t level);

class StepTimers {
 public:
  // level: --timing-log-level; a timer whose Megatron log level is above it is never started.
  // sync: waits for the device's queued work (nothing on the CPU backend); barrier: waits for every
  // rank, at the start of level-1 timers (Megatron's barrier_with_L1_time, on by default). Every
  // rank must start the same timers in the same order.
  StepTimers(int64_t level, std::function<void()> sync, std::function<void()> barrier = nullptr);
  // Names are Megatron's (at levels 1 and 2 an unknown one is an Error). Below level 1 these return
  // at once: the untimed step pays no lookup, allocation or wait.
  bool enabled(std::string_view name) const;  // timed at this level
  void start(std::string_view name);
  void stop(std::string_view name);
  // Seconds summed per name (0 for one never stopped), zeroed afterwards when reset.
  std::vector<double> elapsed(const std::vector<std::string>& names, bool reset);

 private:
  using Clock = std::chrono::steady_clock;
  struct Timer {
    double seconds = 0.0;
    std::optional<Clock::time_point> started;
  };
  int64_t level_;
  std::function<void()> sync_, barrier_;
  Timer& timer(std::string_view name);
  std::map<std::string, Timer, std::less<>> timers_;
};

// Every rank's seconds, rank-major, as Megatron's timers all-gather them: a collective over `world`
// that every rank calls (without a group, this rank's alone).
std::vector<std::vector<double>> gather_timer_seconds(const std::vector<double>& mine, dist::ProcessGroup* world);

// The block Timers.log prints: seconds[r][i] is rank r's time for names[i]; each shown divided by
// `normalizer` (--log-interval) in ms, names without time on any rank left out. nullopt when none
// has any (Megatron then prints nothing).
std::optional<std::string> format_timers_block(const std::vector<std::string>& names,
                                               const std::vector<std::vector<double>>& seconds, double normalizer,
                                               TimingLogOption option);

// Timers.write's scalars: ("<name>-time", the maximum over ranks / normalizer, in seconds) for each
// name with time on some rank.
std::vector<std::pair<std::string, double>> timer_scalars(const std::vector<std::string>& names,
                                                          const std::vector<std::vector<double>>& seconds,
                                                          double normalizer);

}  // namespace laoyao::train
