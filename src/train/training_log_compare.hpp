// Comparing two parsed training logs iteration by iteration (the "correlation test" of
// DESIGN.md: same config, same initial weights, same data -> the same loss curve within BF16
// rounding), and listing how two resolved configs (run_config.yaml) differ. `laoyao
// compare-logs` prints what this computes.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "train/log_parse.hpp"

namespace laoyao::train {

// Default tolerances of a same-weights correlation test. Why these numbers:
//  * loss, relative 2e-2 per iteration. Megatron-Bridge's golden-value check
//    (scripts/performance/utils/evaluate.py) allows 10% (loss > 2), 5% (0.5-2) or 2% (< 0.5)
//    per point and lets 10% of points fail: it is built for runs on other hardware and with
//    other kernels, and would pass a run with a real bug (a loss 5% off at loss 8 is a broken
//    model). MLM-vs-Bridge parity is expected "within BF16 rounding": BF16 keeps 8 significant
//    bits (unit roundoff 2^-8 ~ 3.9e-3 per element); the reported loss is a mean over all
//    tokens of the global batch, so per-element rounding mostly averages out and same-weights
//    runs of two BF16 implementations stay ~1e-3 apart for tens to hundreds of iterations.
//    2e-2 is ~5 BF16 roundoffs: loose enough for the slow drift that different GEMM
//    accumulation orders cause over a run, tight enough to catch a wrong mask, scale, schedule
//    or data order within a few iterations -- and equal to Bridge's tightest bucket, applied to
//    every point with no outliers allowed.
//  * learning rate, relative 1e-5: the schedule is deterministic (same formula, same float64
//    arithmetic), printed with 7 significant digits ({:.6E}, relative quantum 5e-7), so any
//    larger difference means a different schedule (warmup, decay style, train_iters, min lr).
//  * grad norm, relative 0.1 with an absolute floor of 2e-3: the norm of a gradient is more
//    sensitive to rounding than the loss (a sum of squares of differences of products), and it
//    is printed with only 3 decimals ({:.3f}: 5e-4 rounding on each side), so small norms need
//    an absolute floor.
struct CompareTolerances {
  std::string loss_key = "lm loss";
  double loss_rel = 2e-2;
  double lr_rel = 1e-5;
  double grad_norm_rel = 0.1;
  double grad_norm_abs = 2e-3;
};

// |b - a| / |a|, with a the reference (log A). 0 when both are equal (NaN == NaN, inf == inf);
// +inf when a == 0 != b or exactly one is NaN.
double relative_difference(double a, double b);

struct CompareRow {
  int64_t iteration = 0;
  std::optional<double> loss_a, loss_b;
  // Megatron prints the loss averaged over the iterations since the last log. When the two
  // logs use different --log-interval, the finer log's values are averaged (weighted by the
  // iterations each covers) over the coarser log's window; *_rebinned says which side was.
  bool loss_a_rebinned = false, loss_b_rebinned = false;
  bool loss_comparable = true;  // false when the averaging windows cannot be matched
  std::optional<double> grad_norm_a, grad_norm_b;
  std::optional<double> lr_a, lr_b;
  std::vector<std::string> problems;  // why this row is out of tolerance (empty when fine)
  std::vector<std::string> failed;    // the quantities named in `problems`
};

struct ValidationRow {
  int64_t iteration = 0;
  EvalSet set = EvalSet::kDuringTraining;
  std::optional<int> validation_set_index;
  std::optional<double> loss_a, loss_b;
  std::optional<double> ppl_a, ppl_b;
  std::vector<std::string> problems;
  std::vector<std::string> failed;
};

struct Divergence {
  int64_t iteration = 0;
  std::string where;     // "training" or "validation (on test set)" ...
  std::string quantity;  // "lm loss", "learning rate", "grad norm", "global batch size", ...
  std::optional<double> a, b;
  double abs_diff = 0.0;
  double rel_diff = 0.0;
  double tolerance = 0.0;  // relative tolerance (0 for quantities that must match exactly)
  std::string message;     // one sentence, e.g. "lm loss differs by 3.1e-02 relative (...)"
};

struct LogComparison {
  std::vector<CompareRow> rows;  // iterations logged in both, ascending
  std::vector<ValidationRow> validation;
  std::vector<int64_t> only_in_a, only_in_b;  // iterations logged in one log only
  std::vector<std::string> notes;            // things worth knowing that do not fail the check
  std::optional<Divergence> first_divergence;
  // Largest differences seen over the compared rows (loss: relative; lr: relative; grad norm:
  // absolute and relative), and where.
  double max_loss_rel = 0.0;
  int64_t max_loss_rel_iteration = 0;
  double max_lr_rel = 0.0;
  double max_grad_norm_rel = 0.0;
  int64_t max_grad_norm_rel_iteration = 0;
  size_t loss_rows_compared = 0;

  bool within_tolerance() const { return !first_divergence.has_value(); }
};

// Throws laoyao::UsageError when the logs share no iteration.
LogComparison compare_logs(const ParsedLog& a, const ParsedLog& b, const CompareTolerances& tol);

// ---- config differences -------------------------------------------------------------------------

// A YAML document flattened to dotted keys: {"model.num_layers": "2", "train.lr[0]": ...}.
// Sequence elements are "key[i]"; empty maps/sequences "{}"/"[]"; null "null". Throws
// laoyao::UsageError naming `source` when the text is not YAML.
std::map<std::string, std::string> flatten_yaml(const std::string& yaml_text,
                                                const std::string& source);

struct ConfigDifference {
  std::string key;
  std::optional<std::string> a, b;  // nullopt: the key is absent on that side
};

// Every key whose value differs (numbers compare by value: "3e-4" == "0.0003"; booleans
// case-insensitively), or that exists on one side only; sorted by key.
std::vector<ConfigDifference> diff_configs(const std::map<std::string, std::string>& a,
                                           const std::map<std::string, std::string>& b);

}  // namespace laoyao::train
