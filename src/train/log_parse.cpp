#include "train/log_parse.hpp"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "core/error.hpp"
#include "core/file_io.hpp"

namespace laoyao::train {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

std::string_view trim_view(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// A whole field value as a double: "1.042071E+01", "0.651", "nan", "inf", "-inf", "NAN".
std::optional<double> to_double(std::string_view s) {
  s = trim_view(s);
  if (s.empty()) return std::nullopt;
  std::string buf(s);
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(buf.c_str(), &end);
  if (end == buf.c_str() || *end != '\0') return std::nullopt;
  return v;
}

std::optional<int64_t> to_int(std::string_view s) {
  s = trim_view(s);
  if (s.empty()) return std::nullopt;
  std::string buf(s);
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(buf.c_str(), &end, 10);
  if (end == buf.c_str() || *end != '\0' || errno == ERANGE) {
    // Some forks print counters as floats ("0.0"); accept whole numbers.
    // (In int64's range first: casting a double past it is undefined.)
    auto d = to_double(s);
    if (d && *d >= -9.2e18 && *d <= 9.2e18 && *d == std::trunc(*d)) return static_cast<int64_t>(*d);
    return std::nullopt;
  }
  return static_cast<int64_t>(v);
}

// Reads digits at s[*i]; advances *i. False when there are none, or more than int64 holds.
bool read_digits(std::string_view s, size_t* i, int64_t* out) {
  size_t start = *i;
  int64_t v = 0;
  bool fits = true;
  while (*i < s.size() && is_digit(s[*i])) {
    fits = fits && !__builtin_mul_overflow(v, 10, &v) && !__builtin_add_overflow(v, s[*i] - '0', &v);
    ++*i;
  }
  if (*i == start || !fits) return false;
  *out = v;
  return true;
}

void skip_spaces(std::string_view s, size_t* i) {
  while (*i < s.size() && is_space(s[*i])) ++*i;
}

// Splits "key: value" at the first ": " (keys never contain it; values such as "01:02:03" may
// contain ':'), else at the last ':'.
bool split_field(std::string_view piece, std::string_view* key, std::string_view* value) {
  size_t colon = piece.find(": ");
  if (colon == std::string_view::npos) colon = piece.rfind(':');
  if (colon == std::string_view::npos) return false;
  *key = trim_view(piece.substr(0, colon));
  *value = trim_view(piece.substr(colon + 1));
  return !key->empty();
}

std::vector<std::string_view> split_pipes(std::string_view s) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t bar = s.find('|', start);
    if (bar == std::string_view::npos) bar = s.size();
    out.push_back(s.substr(start, bar - start));
    start = bar + 1;
  }
  return out;
}

// Position just past "iteration <N>/ <T>" and the two numbers; the match must start a word.
struct IterationMatch {
  size_t begin = 0, end = 0;
  int64_t iteration = 0, train_iters = 0;
};

std::optional<IterationMatch> find_iteration(std::string_view line) {
  static constexpr std::string_view kWord = "iteration";
  size_t from = 0;
  while (true) {
    size_t pos = line.find(kWord, from);
    if (pos == std::string_view::npos) return std::nullopt;
    from = pos + 1;
    if (pos > 0 && (std::isalnum(static_cast<unsigned char>(line[pos - 1])) || line[pos - 1] == '_'))
      continue;
    size_t i = pos + kWord.size();
    if (i >= line.size() || !is_space(line[i])) continue;
    skip_spaces(line, &i);
    IterationMatch m;
    m.begin = pos;
    if (!read_digits(line, &i, &m.iteration)) continue;
    if (i >= line.size() || line[i] != '/') continue;
    ++i;
    skip_spaces(line, &i);
    if (!read_digits(line, &i, &m.train_iters)) continue;
    m.end = i;
    return m;
  }
}

// "[2026-11-30 05:34:22.661240] " just before the word "iteration".
std::string timestamp_before(std::string_view line, size_t pos) {
  size_t i = pos;
  while (i > 0 && is_space(line[i - 1])) --i;
  if (i == 0 || line[i - 1] != ']') return {};
  size_t close = i - 1;
  size_t open = line.rfind('[', close);
  if (open == std::string_view::npos) return {};
  std::string_view inside = line.substr(open + 1, close - open - 1);
  // YYYY-MM-DD HH:MM:SS[.ffffff]
  if (inside.size() < 19 || !is_digit(inside[0]) || inside[4] != '-' || inside[10] != ' ') return {};
  return std::string(inside);
}

// Bridge's "Step Time : 1.23s GPU utilization: 456.7MODEL_TFLOP/s/GPU" (also the later
// "Step Time: 0.50s , ... GPU utilization: 257.1 MODEL_TFLOP/s/GPU").
bool parse_step_time(std::string_view line, std::optional<double>* step_s,
                     std::optional<double>* tflops) {
  size_t pos = line.find("Step Time");
  if (pos == std::string_view::npos) return false;
  size_t i = pos + 9;
  skip_spaces(line, &i);
  if (i >= line.size() || line[i] != ':') return false;
  ++i;
  skip_spaces(line, &i);
  size_t start = i;
  while (i < line.size() && (is_digit(line[i]) || line[i] == '.')) ++i;
  if (i == start || i >= line.size() || line[i] != 's') return false;
  *step_s = to_double(line.substr(start, i - start));
  if (!*step_s) return false;
  size_t g = line.find("GPU utilization:", i);
  if (g != std::string_view::npos) {
    size_t j = g + 16;
    skip_spaces(line, &j);
    size_t s0 = j;
    while (j < line.size() && (is_digit(line[j]) || line[j] == '.')) ++j;
    if (j > s0) *tflops = to_double(line.substr(s0, j - s0));
  }
  return true;
}

}  // namespace

std::optional<double> IterationRecord::loss(std::string_view name) const {
  for (const auto& l : losses)
    if (l.name == name) return l.value;
  return std::nullopt;
}

std::optional<double> ValidationRecord::loss(std::string_view name) const {
  for (const auto& l : losses)
    if (l.name == name) return l.value;
  return std::nullopt;
}

const char* eval_set_name(EvalSet set) {
  switch (set) {
    case EvalSet::kDuringTraining: return "during training";
    case EvalSet::kValidationSet: return "on validation set";
    case EvalSet::kTestSet: return "on test set";
  }
  return "?";
}

std::optional<IterationRecord> parse_training_line(std::string_view line) {
  auto m = find_iteration(line);
  if (!m) return std::nullopt;
  IterationRecord r;
  r.iteration = m->iteration;
  r.train_iters = m->train_iters;
  r.timestamp = timestamp_before(line, m->begin);

  bool seen_lr_or_gbs = false, seen_loss_scale = false;
  for (std::string_view piece : split_pipes(line.substr(m->end))) {
    piece = trim_view(piece);
    if (piece.empty()) continue;
    std::string_view key, value;
    if (!split_field(piece, &key, &value)) continue;
    auto number = to_double(value);
    auto other = [&] { r.other_fields.emplace_back(std::string(key), std::string(value)); };
    if (key == "consumed samples") {
      r.consumed_samples = to_int(value);
    } else if (key == "skipped samples") {
      r.skipped_samples = to_int(value);
    } else if (key == "elapsed time per iteration (ms)") {
      r.elapsed_ms = number;
    } else if (key == "throughput per GPU (TFLOP/s/GPU)" || key == "throughput (tflops/sec/GPU)") {
      r.throughput_tflops_per_gpu = number;
    } else if (key == "learning rate") {
      r.learning_rate = number;
      seen_lr_or_gbs = true;
    } else if (key == "decoupled learning rate") {
      r.decoupled_learning_rate = number;
    } else if (key == "global batch size") {
      r.global_batch_size = to_int(value);
      seen_lr_or_gbs = true;
    } else if (key == "loss scale") {
      r.loss_scale = number;
      seen_loss_scale = true;
    } else if (key == "grad norm") {
      r.grad_norm = number;
    } else if (key == "num zeros") {
      r.num_zeros = number;
    } else if (key == "params norm") {
      r.params_norm = number;
    } else if (key == "max attention logit") {
      r.max_attention_logit = number;
    } else if (key == "number of skipped iterations") {
      r.skipped_iterations = to_int(value);
    } else if (key == "number of nan iterations") {
      r.nan_iterations = to_int(value);
    } else if (number && ((seen_lr_or_gbs && !seen_loss_scale) ||
                          key.find("loss") != std::string_view::npos)) {
      // Between "global batch size" and "loss scale" Megatron prints only the loss dict
      // ("lm loss", MoE aux losses, "mtp_1 loss", ...).
      r.losses.push_back({std::string(key), *number});
    } else {
      other();
    }
  }
  return r;
}

std::optional<ValidationRecord> parse_validation_line(std::string_view line) {
  size_t from = 0;
  while (true) {
    size_t pos = line.find("validation", from);
    if (pos == std::string_view::npos) return std::nullopt;
    from = pos + 1;
    size_t i = pos + 10;
    ValidationRecord r;
    if (i < line.size() && line[i] == '-') {
      ++i;
      int64_t index = 0;
      if (!read_digits(line, &i, &index)) continue;
      r.validation_set_index = static_cast<int>(index);
    }
    static constexpr std::string_view kLossAt = " loss at iteration ";
    if (line.substr(i, kLossAt.size()) != kLossAt) continue;
    i += kLossAt.size();
    if (!read_digits(line, &i, &r.iteration)) continue;
    size_t bar = line.find('|', i);
    std::string_view qualifier = trim_view(line.substr(i, bar == std::string_view::npos ? line.npos : bar - i));
    if (qualifier == "on validation set") {
      r.set = EvalSet::kValidationSet;
    } else if (qualifier == "on test set") {
      r.set = EvalSet::kTestSet;
    } else if (qualifier.empty()) {
      r.set = EvalSet::kDuringTraining;
    } else {
      continue;
    }
    if (bar != std::string_view::npos) {
      for (std::string_view piece : split_pipes(line.substr(bar + 1))) {
        piece = trim_view(piece);
        std::string_view key, value;
        if (piece.empty() || !split_field(piece, &key, &value)) continue;
        bool is_value = ends_with(key, " value");
        bool is_ppl = ends_with(key, " PPL");
        if (!is_value && !is_ppl) continue;
        std::string name(key.substr(0, key.size() - (is_value ? 6 : 4)));
        ValidationLoss* slot = nullptr;
        for (auto& l : r.losses)
          if (l.name == name) slot = &l;
        if (!slot) {
          r.losses.push_back({name, std::nullopt, std::nullopt});
          slot = &r.losses.back();
        }
        (is_value ? slot->value : slot->ppl) = to_double(value);
      }
    }
    return r;
  }
}

ParsedLog parse_training_log(std::string_view text) {
  ParsedLog out;
  std::optional<double> pending_step_s, pending_tflops;
  size_t line_no = 0;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find_first_of("\r\n", start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(start, end - start);
    ++line_no;
    start = end + 1;
    if (end < text.size() && text[end] == '\r' && start < text.size() && text[start] == '\n') ++start;

    std::optional<double> step_s, tflops;
    if (parse_step_time(line, &step_s, &tflops)) {
      // Bridge prints it (rank 0) just before the training line (last rank) of the same step.
      pending_step_s = step_s;
      pending_tflops = tflops;
    }
    if (auto r = parse_training_line(line)) {
      r->line = line_no;
      r->step_time_s = pending_step_s;
      r->model_tflops_per_gpu = pending_tflops;
      pending_step_s.reset();
      pending_tflops.reset();
      out.iterations.push_back(std::move(*r));
      continue;
    }
    if (auto v = parse_validation_line(line)) {
      v->line = line_no;
      out.validations.push_back(std::move(*v));
    }
  }
  out.lines = line_no;
  return out;
}

ParsedLog parse_training_log_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw UsageError("'" + path + "' is a directory, not a training log file");
  return parse_training_log(read_file(path));
}

}  // namespace laoyao::train
