#include "train/training_log.hpp"

#include <sys/time.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <deque>
#include <string>

namespace laoyao::train {

// ---- Python format-spec equivalents ------------------------------------------------------------
namespace pyfmt {
namespace {

// Python's float formatting (PyOS_double_to_string) writes nan without a sign and inf with one,
// in the case of the presentation type; glibc's printf would write "-nan" for a negative NaN.
bool non_finite(double x, bool upper, std::string* out) {
  if (std::isnan(x)) {
    *out = upper ? "NAN" : "nan";
    return true;
  }
  if (std::isinf(x)) {
    *out = x < 0 ? (upper ? "-INF" : "-inf") : (upper ? "INF" : "inf");
    return true;
  }
  return false;
}

std::string printf_double(const char* spec, int precision, double x) {
  char buf[512];
  int n = std::snprintf(buf, sizeof buf, spec, precision, x);
  if (n < 0) return {};
  if (static_cast<size_t>(n) < sizeof buf) return std::string(buf, static_cast<size_t>(n));
  std::string big(static_cast<size_t>(n) + 1, '\0');
  std::snprintf(big.data(), big.size(), spec, precision, x);
  big.resize(static_cast<size_t>(n));
  return big;
}

}  // namespace

// glibc's printf rounds the exact binary value correctly (ties to even), as Python's dtoa does,
// so finite values format identically.
std::string fixed(double x, int precision) {
  std::string s;
  if (non_finite(x, false, &s)) return s;
  return printf_double("%.*f", precision, x);
}

std::string exp_upper(double x, int precision) {
  std::string s;
  if (non_finite(x, true, &s)) return s;
  return printf_double("%.*E", precision, x);
}

std::string exp_lower(double x, int precision) {
  std::string s;
  if (non_finite(x, false, &s)) return s;
  return printf_double("%.*e", precision, x);
}

std::string integer(int64_t x, int width) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%*lld", width, static_cast<long long>(x));
  return buf;
}

// Python's repr(float): the shortest digit string that reads back to the same double, in
// positional notation when the decimal exponent is in (-4, 16], else as d.ddde+XX; a whole
// number in positional notation gains ".0".
std::string float_str(double x) {
  std::string s;
  if (non_finite(x, false, &s)) return s;
  char buf[64];
  int digits = 1;
  for (; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*e", digits - 1, x);
    if (std::strtod(buf, nullptr) == x) break;
  }
  // buf = [-]d[.ddd]e[+-]XX
  std::string text(buf);
  bool negative = text[0] == '-';
  if (negative) text.erase(0, 1);
  size_t e = text.find('e');
  int exponent = std::atoi(text.c_str() + e + 1);
  std::string mantissa;
  for (size_t i = 0; i < e; ++i)
    if (text[i] != '.') mantissa += text[i];
  while (mantissa.size() > 1 && mantissa.back() == '0') mantissa.pop_back();
  int decpt = exponent + 1;  // digits are 0.d1d2... x 10^decpt
  std::string out = negative ? "-" : "";
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out.append("0.").append(static_cast<size_t>(-decpt), '0').append(mantissa);
    } else if (static_cast<size_t>(decpt) >= mantissa.size()) {
      out += mantissa + std::string(static_cast<size_t>(decpt) - mantissa.size(), '0') + ".0";
    } else {
      out.append(mantissa, 0, static_cast<size_t>(decpt))
          .append(".")
          .append(mantissa, static_cast<size_t>(decpt), std::string::npos);
    }
  } else {
    out += mantissa.substr(0, 1);
    if (mantissa.size() > 1) out.append(".").append(mantissa, 1, std::string::npos);
    char ebuf[16];
    std::snprintf(ebuf, sizeof ebuf, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    out += ebuf;
  }
  return out;
}

}  // namespace pyfmt

// ---- timestamps ---------------------------------------------------------------------------------

Timestamp now_timestamp() {
  struct timeval tv;
  ::gettimeofday(&tv, nullptr);
  std::time_t secs = tv.tv_sec;
  std::tm tm{};
  ::localtime_r(&secs, &tm);
  Timestamp t;
  t.year = tm.tm_year + 1900;
  t.month = tm.tm_mon + 1;
  t.day = tm.tm_mday;
  t.hour = tm.tm_hour;
  t.minute = tm.tm_min;
  t.second = tm.tm_sec;
  t.microsecond = static_cast<int>(tv.tv_usec);
  return t;
}

std::string format_timestamp(const Timestamp& t, LogFlavor flavor) {
  char buf[64];
  if (flavor == LogFlavor::kMegatronLM) {
    std::snprintf(buf, sizeof buf, "[%04d-%02d-%02d %02d:%02d:%02d.%06d]", t.year, t.month, t.day,
                  t.hour, t.minute, t.second, t.microsecond);
  } else {
    std::snprintf(buf, sizeof buf, "[%04d-%02d-%02d %02d:%02d:%02d]", t.year, t.month, t.day,
                  t.hour, t.minute, t.second);
  }
  return buf;
}

// ---- the training line --------------------------------------------------------------------------

// Field order and specs of training.py::training_log (MLM) and train_utils.py::training_log
// (Bridge); they agree except for the timestamp and Bridge's extra " max attention logit".
std::string format_training_line(const TrainingLogValues& v, const Timestamp& t, LogFlavor flavor) {
  using namespace pyfmt;
  std::string s = " ";
  s += format_timestamp(t, flavor);
  s += " iteration " + integer(v.iteration, 8) + "/" + integer(v.train_iters, 8) + " |";
  s += " consumed samples: " + integer(v.consumed_samples, 12) + " |";
  if (v.skipped_samples > 0) s += " skipped samples: " + integer(v.skipped_samples, 12) + " |";
  s += " elapsed time per iteration (ms): " + fixed(v.elapsed_ms_per_iteration, 1) + " |";
  if (v.throughput_tflops_per_gpu)
    s += " throughput per GPU (TFLOP/s/GPU): " + fixed(*v.throughput_tflops_per_gpu, 1) + " |";
  if (v.energy_j_per_iter_per_gpu) {
    s += " energy per GPU (J/iter/GPU): " + fixed(*v.energy_j_per_iter_per_gpu, 1) + " |";
    if (v.power_w_per_gpu) s += " power per GPU (W/GPU): " + fixed(*v.power_w_per_gpu, 1) + " |";
  }
  if (v.learning_rate) s += " learning rate: " + exp_upper(*v.learning_rate, 6) + " |";
  if (v.decoupled_learning_rate)
    s += " decoupled learning rate: " + exp_upper(*v.decoupled_learning_rate, 6) + " |";
  s += " global batch size: " + integer(v.global_batch_size, 5) + " |";
  for (const auto& loss : v.losses)
    if (loss.value >= 0.0) s += " " + loss.name + ": " + exp_upper(loss.value, 6) + " |";
  s += " loss scale: " + fixed(v.loss_scale, 1) + " |";
  if (v.grad_norm) s += " grad norm: " + fixed(*v.grad_norm, 3) + " |";
  if (v.num_zeros) s += " num zeros: " + float_str(*v.num_zeros) + " |";
  if (v.params_norm) s += " params norm: " + fixed(*v.params_norm, 3) + " |";
  if (v.max_attention_logit)
    s += " max attention logit: " + fixed(*v.max_attention_logit, 3) + " |";
  s += " number of skipped iterations: " + integer(v.skipped_iterations, 3) + " |";
  s += " number of nan iterations: " + integer(v.nan_iterations, 3) + " |";
  return s;
}

std::string format_bridge_step_time_line(double seconds_per_iteration, double tflops_per_gpu) {
  return "Step Time : " + pyfmt::fixed(seconds_per_iteration, 2) +
         "s GPU utilization: " + pyfmt::fixed(tflops_per_gpu, 1) + "MODEL_TFLOP/s/GPU";
}

namespace {

// Python's round(x, -floor(log10(x)) + 4) (Bridge's report_memory): x to 5 significant digits,
// correctly rounded from its exact binary value as Python's round does.
double round_5_significant(double x) {
  if (!(x > 0) || !std::isfinite(x)) return x;
  const int digits = 4 - static_cast<int>(std::floor(std::log10(x)));
  if (digits < 0) return x;  // 100000 GB and more: not a device's memory
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, x);
  return std::strtod(buf, nullptr);
}

// Bridge's report_memory keys laoyao can fill (its MEMORY_KEYS order, "bytes" named "gigabytes").
constexpr const char* kBridgeMemoryKeys[] = {"mem-allocated-gigabytes",     "mem-active-gigabytes",
                                             "mem-reserved-gigabytes",      "mem-max-allocated-gigabytes",
                                             "mem-max-active-gigabytes",    "mem-max-reserved-gigabytes"};

}  // namespace

std::string format_memory_report(int64_t iteration, int64_t rank, size_t held_bytes, LogFlavor flavor) {
  std::string s = "[Rank " + std::to_string(rank) + "] (after " + std::to_string(iteration) + " iterations) memory ";
  const double bytes = static_cast<double>(held_bytes);
  if (flavor == LogFlavor::kMegatronLM) {
    const std::string mb = pyfmt::fixed(bytes / (1024.0 * 1024.0), 2);
    return s + "(MB) | allocated: " + mb + " | max allocated: " + mb + " | reserved: " + mb + " | max reserved: " + mb;
  }
  const std::string gb = pyfmt::float_str(round_5_significant(bytes / 1.0e9));
  s += "(GB)";
  for (const char* key : kBridgeMemoryKeys) s += std::string(" | ") + key + ": " + gb;
  return s;
}

std::vector<std::pair<std::string, double>> memory_scalars(size_t held_bytes, LogFlavor flavor) {
  const double bytes = static_cast<double>(held_bytes);
  std::vector<std::pair<std::string, double>> out;
  if (flavor == LogFlavor::kMegatronLM) {
    for (const char* tag : {"mem-reserved-bytes", "mem-allocated-bytes", "mem-max-allocated-bytes"})
      out.emplace_back(tag, bytes);
    return out;
  }
  for (const char* key : kBridgeMemoryKeys)
    out.emplace_back(std::string("memory/") + key, round_5_significant(bytes / 1.0e9));
  return out;
}

std::optional<std::vector<std::pair<std::string, double>>> throughput_report(const std::deque<double>& history,
                                                                              int64_t window_size,
                                                                              int64_t global_batch_size,
                                                                              int64_t micro_batch_size,
                                                                              int64_t seq_length, int64_t world_size) {
  std::vector<std::pair<std::string, double>> out;
  if (window_size <= 0 || static_cast<int64_t>(history.size()) < window_size) return out;
  const double batches = static_cast<double>(window_size - 1);
  const double samples = batches * static_cast<double>(global_batch_size);
  const double tokens = samples * static_cast<double>(seq_length);
  const double wct = history.back() - history.front(), world = static_cast<double>(world_size);
  if (!(wct > 0)) return std::nullopt;
  out = {{"throughput/batches_per_sec", batches / wct},
         {"throughput/samples_per_sec", samples / wct},
         {"throughput/device/batches_per_sec", batches / wct / world},
         {"throughput/device/samples_per_sec", samples / wct / world},
         {"throughput/micro_batch_size", static_cast<double>(micro_batch_size)},
         {"throughput/global_batch_size", static_cast<double>(global_batch_size)}};
  if (tokens > 0) {
    out.emplace_back("throughput/tokens_per_sec", tokens / wct);
    out.emplace_back("throughput/device/tokens_per_sec", tokens / wct / world);
  }
  return out;
}

double tflops_per_gpu(double flops_per_iteration, double elapsed_s_per_iteration, int64_t world_size,
                      LogFlavor flavor) {
  const double w = static_cast<double>(world_size);
  if (flavor == LogFlavor::kMegatronLM) return flops_per_iteration / (elapsed_s_per_iteration * 1e12 * w);
  return flops_per_iteration / elapsed_s_per_iteration / w / 1e12;
}

// ---- validation block ---------------------------------------------------------------------------

double validation_ppl(double loss) {
  // Python's min(20, x) keeps 20 unless x < 20 (false for NaN).
  return std::exp(loss < 20.0 ? loss : 20.0);
}

std::string format_validation_line(const ValidationLogValues& v) {
  std::string prefix = "iteration " + std::to_string(v.iteration);
  if (v.set == EvalSet::kValidationSet) prefix += " on validation set";
  if (v.set == EvalSet::kTestSet) prefix += " on test set";
  std::string suffix;
  if (v.validation_set_index) suffix.append("-").append(std::to_string(*v.validation_set_index));
  std::string s = " validation" + suffix + " loss at " + prefix + " | ";
  for (const auto& loss : v.losses) {
    s += loss.name + " value: " + pyfmt::exp_upper(loss.value, 6) + " | ";
    s += loss.name + " PPL: " + pyfmt::exp_upper(validation_ppl(loss.value), 6) + " | ";
  }
  return s;
}

std::string format_validation_block(const ValidationLogValues& v) {
  std::string line = format_validation_line(v);
  std::string dashes(line.size() + 1, '-');
  return dashes + "\n" + line + "\n" + dashes + "\n";
}

}  // namespace laoyao::train
