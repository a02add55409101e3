#include "train/training_log_compare.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <tuple>

#include "core/error.hpp"
#include "train/training_log.hpp"

namespace laoyao::train {
namespace {

std::string num(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", x);
  return buf;
}


// The records of one log by iteration; a resumed run that repeats iterations keeps the last
// occurrence (what the run continued from).
struct Indexed {
  std::map<int64_t, const IterationRecord*> by_iteration;
  std::vector<int64_t> iterations;  // ascending
  int64_t interval = 1;             // most common gap between logged iterations
  size_t duplicates = 0;
  bool per_iteration = false;       // each record is its own iteration's (TensorBoard)
  // Megatron-LM's first lines (its timestamps carry microseconds), ascending: each process's first,
  // iteration 1 or a resumed run's (in a log that goes on from an earlier iteration than the line
  // before it), covers its own iteration and resets nothing, even at --log-interval 1: the next
  // line's mean starts there too. None in Bridge logs and TensorBoard.
  std::vector<int64_t> mlm_first_lines;
};

Indexed index_log(const ParsedLog& log) {
  Indexed x;
  x.per_iteration = log.per_iteration;
  int64_t last = 0;  // the previous record's iteration, in the file's order
  for (const auto& r : log.iterations) {
    if (!log.per_iteration && r.timestamp.find('.') != std::string::npos && (last == 0 || r.iteration <= last)) {
      // a resumed run's lines replace what they repeat, its first line the earlier ones' from there
      while (!x.mlm_first_lines.empty() && x.mlm_first_lines.back() >= r.iteration) x.mlm_first_lines.pop_back();
      x.mlm_first_lines.push_back(r.iteration);
    }
    last = r.iteration;
    if (x.by_iteration.count(r.iteration)) ++x.duplicates;
    x.by_iteration[r.iteration] = &r;
  }
  for (const auto& [it, r] : x.by_iteration) x.iterations.push_back(it);
  std::map<int64_t, size_t> gaps;
  for (size_t i = 1; i < x.iterations.size(); ++i) ++gaps[x.iterations[i] - x.iterations[i - 1]];
  size_t best = 0;
  for (const auto& [gap, count] : gaps)
    if (count > best) best = count, x.interval = gap;
  return x;
}

// The iterations (lo, hi] whose losses Megatron averaged into the record at `iteration`: the
// accumulators reset at multiples of --log-interval (MLM's extra first-iteration line does not
// reset them), so a line at a multiple of K covers (i-K, i], any other line (prev, i].
std::pair<int64_t, int64_t> window(const Indexed& x, int64_t iteration) {
  if (x.per_iteration) return {iteration - 1, iteration};
  auto pos = std::lower_bound(x.iterations.begin(), x.iterations.end(), iteration);
  int64_t prev = pos == x.iterations.begin() ? 0 : *(pos - 1);
  int64_t lo = x.interval > 0 && iteration % x.interval == 0 ? std::max<int64_t>(iteration - x.interval, 0) : prev;
  // The last first line at or before this one: its own iteration's, and it reset nothing.
  const auto first = std::upper_bound(x.mlm_first_lines.begin(), x.mlm_first_lines.end(), iteration);
  if (first != x.mlm_first_lines.begin() && lo <= *(first - 1)) lo = *(first - 1) - 1;
  return {lo, iteration};
}

// The finer log's loss averaged over (lo, hi], when its records tile that window exactly. A record
// whose window reaches back over earlier ones (the line after Megatron-LM's first-iteration line)
// replaces them.
std::optional<double> rebinned_loss(const Indexed& fine, std::pair<int64_t, int64_t> w,
                                    const std::string& key) {
  struct Piece {
    int64_t lo, hi;
    double sum;
  };
  std::vector<Piece> pieces;
  int64_t cursor = w.first;
  for (auto it = fine.by_iteration.upper_bound(w.first);
       it != fine.by_iteration.end() && it->first <= w.second; ++it) {
    auto fw = window(fine, it->first);
    if (fw.first < w.first || fw.first > cursor) return std::nullopt;
    while (!pieces.empty() && pieces.back().lo >= fw.first) pieces.pop_back();
    if ((pieces.empty() ? w.first : pieces.back().hi) != fw.first) return std::nullopt;
    auto v = it->second->loss(key);
    if (!v) return std::nullopt;
    pieces.push_back({fw.first, fw.second, *v * static_cast<double>(fw.second - fw.first)});
    cursor = fw.second;
  }
  if (cursor != w.second || pieces.empty()) return std::nullopt;
  double sum = 0.0;
  for (const Piece& p : pieces) sum += p.sum;
  return sum / static_cast<double>(w.second - w.first);
}

struct Event {
  int64_t iteration;
  int order;  // training 0, then validation during training, on validation set, on test set
  Divergence d;
};

Divergence make_divergence(int64_t iteration, const std::string& where, const std::string& quantity,
                           std::optional<double> a, std::optional<double> b, double tolerance,
                           const std::string& message) {
  Divergence d;
  d.iteration = iteration;
  d.where = where;
  d.quantity = quantity;
  d.a = a;
  d.b = b;
  if (a && b) {
    d.abs_diff = std::fabs(*b - *a);
    d.rel_diff = relative_difference(*a, *b);
  } else {
    d.abs_diff = d.rel_diff = std::numeric_limits<double>::infinity();
  }
  d.tolerance = tolerance;
  d.message = message;
  return d;
}

std::string opt_str(const std::optional<double>& v) { return v ? num(*v) : "absent"; }

// Checks one relative-tolerance quantity; appends a problem and an event when out of tolerance.
void check_value(const std::string& quantity, const std::string& where, int order, int64_t iteration,
                 std::optional<double> a, std::optional<double> b, double rel_tol, double abs_tol,
                 std::vector<std::string>* problems, std::vector<std::string>* failed,
                 std::vector<Event>* events) {
  if (!a && !b) return;
  std::string message;
  if (!a || !b) {
    message = quantity + " is printed in " + (a ? "A" : "B") + " only (A " + opt_str(a) + ", B " +
              opt_str(b) + ")";
  } else {
    double rel = relative_difference(*a, *b);
    double diff = std::fabs(*b - *a);
    bool ok = rel == 0.0 || diff <= rel_tol * std::fabs(*a) + abs_tol;
    if (ok) return;
    message = quantity + " differs by " + pyfmt::exp_lower(diff, 2) + " (" + pyfmt::exp_lower(rel, 2) +
              " relative; A " + num(*a) + ", B " + num(*b) + "), tolerance " + pyfmt::exp_lower(rel_tol, 2) +
              " relative" +
              (abs_tol > 0 ? " + " + pyfmt::exp_lower(abs_tol, 2) + " absolute" : "");
  }
  problems->push_back(message);
  failed->push_back(quantity);
  events->push_back({iteration, order, make_divergence(iteration, where, quantity, a, b, rel_tol, message)});
}

template <typename T>
void check_exact(const std::string& quantity, int64_t iteration, const std::optional<T>& a,
                 const std::optional<T>& b, std::vector<std::string>* problems,
                 std::vector<std::string>* failed, std::vector<Event>* events) {
  if (!a || !b || *a == *b) return;
  std::string message = quantity + " differs: A " + std::to_string(*a) + ", B " + std::to_string(*b);
  problems->push_back(message);
  failed->push_back(quantity);
  events->push_back({iteration, 0,
                     make_divergence(iteration, "training", quantity, static_cast<double>(*a),
                                     static_cast<double>(*b), 0.0, message)});
}

int set_order(EvalSet s) {
  switch (s) {
    case EvalSet::kDuringTraining: return 1;
    case EvalSet::kValidationSet: return 2;
    case EvalSet::kTestSet: return 3;
  }
  return 4;
}

}  // namespace

double relative_difference(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b) ? 0.0 : INFINITY;
  if (a == b) return 0.0;
  if (a == 0.0 || std::isinf(a) || std::isinf(b)) return INFINITY;
  return std::fabs(b - a) / std::fabs(a);
}

LogComparison compare_logs(const ParsedLog& la, const ParsedLog& lb, const CompareTolerances& tol) {
  LogComparison out;
  Indexed a = index_log(la), b = index_log(lb);
  if (a.duplicates)
    out.notes.push_back("A logs " + std::to_string(a.duplicates) +
                        " iteration(s) more than once (a resumed run?); the last occurrence is used");
  if (b.duplicates)
    out.notes.push_back("B logs " + std::to_string(b.duplicates) +
                        " iteration(s) more than once (a resumed run?); the last occurrence is used");
  // Per-iteration values (TensorBoard) against a text log are averaged over the log's windows too.
  const bool rebin = (a.interval != b.interval || a.per_iteration != b.per_iteration) && a.iterations.size() > 1 &&
                     b.iterations.size() > 1;
  if (rebin && a.interval != b.interval)
    out.notes.push_back("the logs use different log intervals (A " + std::to_string(a.interval) +
                        ", B " + std::to_string(b.interval) +
                        "); the finer log's " + tol.loss_key +
                        " is averaged over the coarser log's window");
  else if (rebin)
    out.notes.push_back(std::string(a.per_iteration ? "A" : "B") + " holds each iteration's own " + tol.loss_key +
                        " (TensorBoard); it is averaged over the text log's windows");

  std::vector<Event> events;
  for (int64_t it : a.iterations)
    if (!b.by_iteration.count(it)) out.only_in_a.push_back(it);
  for (int64_t it : b.iterations)
    if (!a.by_iteration.count(it)) out.only_in_b.push_back(it);

  bool train_iters_noted = false;
  for (int64_t it : a.iterations) {
    auto bit = b.by_iteration.find(it);
    if (bit == b.by_iteration.end()) continue;
    const IterationRecord& ra = *a.by_iteration.at(it);
    const IterationRecord& rb = *bit->second;
    CompareRow row;
    row.iteration = it;
    row.loss_a = ra.loss(tol.loss_key);
    row.loss_b = rb.loss(tol.loss_key);
    row.grad_norm_a = ra.grad_norm;
    row.grad_norm_b = rb.grad_norm;
    row.lr_a = ra.learning_rate;
    row.lr_b = rb.learning_rate;
    // (TensorBoard events carry no train_iters: 0.)
    if (!train_iters_noted && ra.train_iters != rb.train_iters && ra.train_iters > 0 && rb.train_iters > 0) {
      out.notes.push_back("train_iters differ: A " + std::to_string(ra.train_iters) + ", B " +
                          std::to_string(rb.train_iters) + " (the LR schedule depends on it)");
      train_iters_noted = true;
    }
    if (rebin) {
      auto wa = window(a, it), wb = window(b, it);
      if (wa != wb) {
        bool a_coarser = (wa.second - wa.first) > (wb.second - wb.first);
        const Indexed& fine = a_coarser ? b : a;
        auto w = a_coarser ? wa : wb;
        auto v = rebinned_loss(fine, w, tol.loss_key);
        if (v) {
          (a_coarser ? row.loss_b : row.loss_a) = v;
          (a_coarser ? row.loss_b_rebinned : row.loss_a_rebinned) = true;
        } else {
          row.loss_comparable = false;
        }
      }
    }

    check_exact<int64_t>("consumed samples", it, ra.consumed_samples, rb.consumed_samples,
                         &row.problems, &row.failed, &events);
    check_exact<int64_t>("global batch size", it, ra.global_batch_size, rb.global_batch_size,
                         &row.problems, &row.failed, &events);
    if (row.loss_comparable) {
      check_value(tol.loss_key, "training", 0, it, row.loss_a, row.loss_b, tol.loss_rel, 0.0,
                  &row.problems, &row.failed, &events);
      if (row.loss_a && row.loss_b) {
        ++out.loss_rows_compared;
        double rel = relative_difference(*row.loss_a, *row.loss_b);
        if (out.loss_rows_compared == 1 || rel > out.max_loss_rel)
          out.max_loss_rel = rel, out.max_loss_rel_iteration = it;
      }
    }
    check_value("learning rate", "training", 0, it, row.lr_a, row.lr_b, tol.lr_rel, 0.0,
                &row.problems, &row.failed, &events);
    if (row.lr_a && row.lr_b) out.max_lr_rel = std::max(out.max_lr_rel, relative_difference(*row.lr_a, *row.lr_b));
    check_value("grad norm", "training", 0, it, row.grad_norm_a, row.grad_norm_b, tol.grad_norm_rel,
                tol.grad_norm_abs, &row.problems, &row.failed, &events);
    if (row.grad_norm_a && row.grad_norm_b) {
      double rel = relative_difference(*row.grad_norm_a, *row.grad_norm_b);
      if (rel > out.max_grad_norm_rel) out.max_grad_norm_rel = rel, out.max_grad_norm_rel_iteration = it;
    }
    check_exact<int64_t>("number of skipped iterations", it, ra.skipped_iterations,
                         rb.skipped_iterations, &row.problems, &row.failed, &events);
    check_exact<int64_t>("number of nan iterations", it, ra.nan_iterations, rb.nan_iterations,
                         &row.problems, &row.failed, &events);
    out.rows.push_back(std::move(row));
  }
  if (out.rows.empty()) {
    auto range = [](const Indexed& x) {
      return std::to_string(x.iterations.front()) + ".." + std::to_string(x.iterations.back());
    };
    throw UsageError("the logs share no iteration (A logs iterations " + range(a) + ", B " +
                     range(b) + ")");
  }

  // Validation blocks, matched by (iteration, which set, validation-set index); a repeated
  // block (resumed run) keeps the last.
  using VKey = std::tuple<int64_t, int, int>;
  auto vkey = [](const ValidationRecord& v) {
    return VKey{v.iteration, set_order(v.set), v.validation_set_index.value_or(-1)};
  };
  std::map<VKey, const ValidationRecord*> va, vb;
  for (const auto& v : la.validations) va[vkey(v)] = &v;
  for (const auto& v : lb.validations) vb[vkey(v)] = &v;
  std::vector<VKey> keys;
  for (const auto& [k, v] : va) keys.push_back(k);
  for (const auto& [k, v] : vb)
    if (!va.count(k)) keys.push_back(k);
  std::sort(keys.begin(), keys.end());
  size_t validation_one_side = 0;
  for (const auto& k : keys) {
    const ValidationRecord* pa = va.count(k) ? va.at(k) : nullptr;
    const ValidationRecord* pb = vb.count(k) ? vb.at(k) : nullptr;
    const ValidationRecord& any = pa ? *pa : *pb;
    ValidationRow row;
    row.iteration = any.iteration;
    row.set = any.set;
    row.validation_set_index = any.validation_set_index;
    auto find = [&](const ValidationRecord* p, bool ppl) -> std::optional<double> {
      if (!p) return std::nullopt;
      for (const auto& l : p->losses)
        if (l.name == tol.loss_key) return ppl ? l.ppl : l.value;
      return std::nullopt;
    };
    row.loss_a = find(pa, false);
    row.loss_b = find(pb, false);
    row.ppl_a = find(pa, true);
    row.ppl_b = find(pb, true);
    if (pa && pb) {
      std::string where = std::string("validation ") + eval_set_name(row.set);
      check_value("validation " + tol.loss_key, where, set_order(row.set), row.iteration, row.loss_a,
                  row.loss_b, tol.loss_rel, 0.0, &row.problems, &row.failed, &events);
    } else {
      ++validation_one_side;
    }
    out.validation.push_back(std::move(row));
  }
  if (validation_one_side)
    out.notes.push_back(std::to_string(validation_one_side) +
                        " validation result(s) appear in one log only (not compared)");
  if (!out.only_in_a.empty() || !out.only_in_b.empty())
    out.notes.push_back("iterations logged in one log only: " + std::to_string(out.only_in_a.size()) +
                        " in A, " + std::to_string(out.only_in_b.size()) + " in B (not compared)");

  std::stable_sort(events.begin(), events.end(), [](const Event& x, const Event& y) {
    return std::tie(x.iteration, x.order) < std::tie(y.iteration, y.order);
  });
  if (!events.empty()) out.first_divergence = events.front().d;
  return out;
}

// ---- config differences -------------------------------------------------------------------------
namespace {

void flatten_node(const YAML::Node& node, const std::string& prefix,
                  std::map<std::string, std::string>* out) {
  switch (node.Type()) {
    case YAML::NodeType::Map:
      if (node.size() == 0) {
        (*out)[prefix] = "{}";
        return;
      }
      for (const auto& kv : node) {
        std::string key = kv.first.Scalar();
        flatten_node(kv.second, prefix.empty() ? key : prefix + "." + key, out);
      }
      return;
    case YAML::NodeType::Sequence:
      if (node.size() == 0) {
        (*out)[prefix] = "[]";
        return;
      }
      for (size_t i = 0; i < node.size(); ++i)
        flatten_node(node[i], prefix + "[" + std::to_string(i) + "]", out);
      return;
    case YAML::NodeType::Scalar:
      (*out)[prefix] = node.Scalar();
      return;
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      (*out)[prefix] = "null";
      return;
  }
}

std::optional<double> as_number(const std::string& s) {
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (*end != '\0') return std::nullopt;
  return v;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool same_value(const std::string& x, const std::string& y) {
  if (x == y) return true;
  auto nx = as_number(x), ny = as_number(y);
  if (nx && ny) return *nx == *ny || (std::isnan(*nx) && std::isnan(*ny));
  std::string lx = lower(x), ly = lower(y);
  auto boolean = [](const std::string& s) { return s == "true" || s == "false"; };
  auto null = [](const std::string& s) { return s == "null" || s == "~" || s == "none"; };
  if (boolean(lx) && boolean(ly)) return lx == ly;
  if (null(lx) && null(ly)) return true;
  return false;
}

}  // namespace

std::map<std::string, std::string> flatten_yaml(const std::string& yaml_text, const std::string& source) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    throw UsageError("'" + source + "' is not valid YAML: " + e.what());
  }
  std::map<std::string, std::string> out;
  flatten_node(root, "", &out);
  return out;
}

std::vector<ConfigDifference> diff_configs(const std::map<std::string, std::string>& a,
                                           const std::map<std::string, std::string>& b) {
  std::vector<ConfigDifference> out;
  auto ia = a.begin();
  auto ib = b.begin();
  while (ia != a.end() || ib != b.end()) {
    if (ib == b.end() || (ia != a.end() && ia->first < ib->first)) {
      out.push_back({ia->first, ia->second, std::nullopt});
      ++ia;
    } else if (ia == a.end() || ib->first < ia->first) {
      out.push_back({ib->first, std::nullopt, ib->second});
      ++ib;
    } else {
      if (!same_value(ia->second, ib->second)) out.push_back({ia->first, ia->second, ib->second});
      ++ia;
      ++ib;
    }
  }
  return out;
}

}  // namespace laoyao::train
