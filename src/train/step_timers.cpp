#include "train/step_timers.hpp"

#include <algorithm>
#include <utility>

#include "core/error.hpp"
#include "train/training_log.hpp"

namespace laoyao::train {
namespace {

// Megatron-LM core 0.20's training_log list, with the log level each timer is created at (the
// schedules' forward-backward, finalize_model_grads' reductions and the optimizer's at 1; the
// data iterator and the per-micro-batch forward and backward at 2; the pipeline's sends and
// receives, never run here, left out).
struct NamedLevel {
  const char* name;
  int64_t level;
};
constexpr NamedLevel kTimersToLog[] = {
    {"forward-backward", 1},
    {"layernorm-grads-all-reduce", 1},
    {"embedding-grads-all-reduce", 1},
    {"all-grads-sync", 1},
    {"params-all-gather", 1},
    {"optimizer-copy-to-main-grad", 1},
    {"optimizer-unscale-and-check-inf", 1},
    {"optimizer-clip-main-grad", 1},
    {"optimizer-count-zeros", 1},
    {"optimizer-inner-step", 1},
    {"optimizer-copy-main-to-model-params", 1},
    {"optimizer", 1},
    {"batch-generator", 2},
    {"forward-compute", 2},
    {"backward-compute", 2},
};

int64_t level_of(std::string_view name) {
  for (const auto& t : kTimersToLog)
    if (name == t.name) return t.level;
  throw Error("StepTimers: no Megatron timer named '" + std::string(name) + "'");
}

// Python's (name + ' ').ljust(48, '.').
std::string dotted(const std::string& name) {
  std::string s = name + ' ';
  if (s.size() < 48) s.append(48 - s.size(), '.');
  return s;
}

}  // namespace

TimingLogOption parse_timing_log_option(const std::string& s) {
  if (s == "max") return TimingLogOption::kMax;
  if (s == "minmax") return TimingLogOption::kMinMax;
  if (s == "all") return TimingLogOption::kAll;
  throw UsageError("--timing-log-option (logger.timing_log_option) must be max, minmax or all, got '" + s + "'");
}

std::vector<std::string> megatron_timers_to_log(int64_t level) {
  std::vector<std::string> names;
  for (const auto& t : kTimersToLog)
    if (t.level <= level) names.emplace_back(t.name);
  return names;
}

StepTimers::StepTimers(int64_t level, std::function<void()> sync, std::function<void()> barrier)
    : level_(level), sync_(std::move(sync)), barrier_(std::move(barrier)) {}

bool StepTimers::enabled(std::string_view name) const { return level_ >= 1 && level_of(name) <= level_; }

StepTimers::Timer& StepTimers::timer(std::string_view name) {
  auto it = timers_.find(name);
  return it != timers_.end() ? it->second : timers_.emplace(std::string(name), Timer{}).first->second;
}

void StepTimers::start(std::string_view name) {
  if (!enabled(name)) return;
  Timer& t = timer(name);
  if (t.started) throw Error("StepTimers: timer '" + std::string(name) + "' started twice");
  if (barrier_ && level_of(name) == 1) barrier_();
  if (sync_) sync_();
  t.started = Clock::now();
}

void StepTimers::stop(std::string_view name) {
  if (!enabled(name)) return;
  Timer& t = timer(name);
  if (!t.started) throw Error("StepTimers: timer '" + std::string(name) + "' stopped without a start");
  if (sync_) sync_();
  t.seconds += std::chrono::duration<double>(Clock::now() - *t.started).count();
  t.started.reset();
}

std::vector<double> StepTimers::elapsed(const std::vector<std::string>& names, bool reset) {
  std::vector<double> out;
  out.reserve(names.size());
  for (const std::string& name : names) {
    auto it = timers_.find(name);
    out.push_back(it == timers_.end() ? 0.0 : it->second.seconds);
    if (reset && it != timers_.end()) it->second.seconds = 0.0;
  }
  return out;
}

std::vector<std::vector<double>> gather_timer_seconds(const std::vector<double>& mine, dist::ProcessGroup* world) {
  if (!world || world->size() == 1) return {mine};
  const size_t n = mine.size(), ranks = static_cast<size_t>(world->size()), me = static_cast<size_t>(world->rank());
  std::vector<double> all(ranks * n, 0.0);  // each rank fills its row; the sum is the gather
  std::copy(mine.begin(), mine.end(), all.begin() + static_cast<std::ptrdiff_t>(me * n));
  if (!all.empty()) world->all_reduce_sum(all.data(), all.size());
  std::vector<std::vector<double>> out(ranks);
  for (size_t r = 0; r < ranks; ++r)
    out[r].assign(all.begin() + static_cast<std::ptrdiff_t>(r * n), all.begin() + static_cast<std::ptrdiff_t>((r + 1) * n));
  return out;
}

std::optional<std::string> format_timers_block(const std::vector<std::string>& names,
                                               const std::vector<std::vector<double>>& seconds, double normalizer,
                                               TimingLogOption option) {
  const double to_ms = 1000.0 / normalizer;  // Megatron passes normalizer / 1000
  std::string out;
  bool any = false;
  for (size_t i = 0; i < names.size(); ++i) {
    std::vector<std::pair<size_t, double>> timed;  // (rank, seconds) with time, as Megatron filters > 0
    for (size_t r = 0; r < seconds.size(); ++r)
      if (seconds[r][i] > 0.0) timed.emplace_back(r, seconds[r][i]);
    if (timed.empty()) continue;
    any = true;
    if (option == TimingLogOption::kAll) {
      out += "\n  " + names[i] + ":";
      for (const auto& [r, s] : timed)
        out += "\n     rank " + pyfmt::integer(static_cast<int64_t>(r), 2) + ": " + pyfmt::fixed(s * to_ms, 2);
      continue;
    }
    double lo = timed[0].second, hi = lo;
    for (const auto& [r, s] : timed) lo = std::min(lo, s), hi = std::max(hi, s);
    out += "\n    " + dotted(names[i]) + ": ";
    if (option == TimingLogOption::kMax) {
      out += pyfmt::fixed(hi * to_ms, 2);
    } else {
      out += '(';
      out += pyfmt::fixed(lo * to_ms, 2) + ", " + pyfmt::fixed(hi * to_ms, 2) + ")";
    }
  }
  if (!any) return std::nullopt;
  const char* header = option == TimingLogOption::kAll      ? "times across ranks (ms):"
                       : option == TimingLogOption::kMax    ? "max time across ranks (ms):"
                                                            : "(min, max) time across ranks (ms):";
  return std::string(header) + out;
}

std::vector<std::pair<std::string, double>> timer_scalars(const std::vector<std::string>& names,
                                                          const std::vector<std::vector<double>>& seconds,
                                                          double normalizer) {
  std::vector<std::pair<std::string, double>> out;
  for (size_t i = 0; i < names.size(); ++i) {
    double hi = 0.0;
    for (const auto& rank : seconds) hi = std::max(hi, rank[i]);
    if (hi > 0.0) out.emplace_back(names[i] + "-time", hi / normalizer);
  }
  return out;
}

}  // namespace laoyao::train
