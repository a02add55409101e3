#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "core/error.hpp"
#include "train/log_parse.hpp"
#include "train/training_log.hpp"
#include "train/training_log_compare.hpp"
#include "train/training_log_plot.hpp"

using namespace laoyao::train;

namespace {

// The §13.2 loss curve of the observed reference run, iterations 1..30 (interpolated between
// the quoted points; the exact values do not matter here).
double reference_loss(int64_t it) { return 10.42071 - 0.065 * static_cast<double>(it - 1); }

struct Curve {
  int64_t iterations = 30;
  int64_t log_interval = 1;
  std::function<double(int64_t)> loss = reference_loss;
  std::function<double(int64_t)> lr = [](int64_t it) { return 3e-4 - 9e-6 * static_cast<double>(it); };
  std::function<double(int64_t)> grad_norm = [](int64_t it) { return 0.65 - 0.005 * static_cast<double>(it); };
  int64_t gbs = 32;
  bool validation = true;
  int64_t loaded = 0;  // a resumed run's log starts at loaded + 1
};

// Megatron's log text of a run: loss averaged over each log window as training_log does.
// Megatron-LM also prints iteration 1 and resets nothing there (should_reset = not
// is_first_iteration), even at log interval 1: its next line's mean starts at iteration 1.
std::string log_text(const Curve& c, LogFlavor flavor) {
  std::string text = "some startup output\n";
  Timestamp t;
  int64_t last = c.loaded;
  const bool mlm = flavor == LogFlavor::kMegatronLM;
  for (int64_t it = c.loaded + 1; it <= c.iterations; ++it) {
    const bool first_line = mlm && it == c.loaded + 1;
    if (it % c.log_interval != 0 && !first_line) continue;
    TrainingLogValues v;
    v.iteration = it;
    v.train_iters = c.iterations;
    v.consumed_samples = it * c.gbs;
    v.elapsed_ms_per_iteration = 104.0;
    v.learning_rate = c.lr(it);
    v.global_batch_size = c.gbs;
    double sum = 0;
    for (int64_t j = last + 1; j <= it; ++j) sum += c.loss(j);
    v.losses = {{"lm loss", sum / static_cast<double>(it - last)}};
    v.grad_norm = c.grad_norm(it);
    text += format_training_line(v, t, flavor) + "\n";
    if (!first_line) last = it;
    if (c.validation && it % 10 == 0) {
      ValidationLogValues val;
      val.iteration = it;
      val.losses = {{"lm loss", c.loss(it) - 0.1}};
      text += format_validation_block(val);
    }
  }
  return text;
}

LogComparison compare(const Curve& a, const Curve& b, CompareTolerances tol = {}) {
  return compare_logs(parse_training_log(log_text(a, LogFlavor::kMegatronLM)),
                      parse_training_log(log_text(b, LogFlavor::kBridge)), tol);
}

}  // namespace

TEST(CompareLogs, SameCurveWithinBf16RoundingPasses) {
  Curve a, b;
  // Differences of a few BF16 roundoffs of the mean loss.
  b.loss = [](int64_t it) { return reference_loss(it) * (1.0 + 3e-3 * std::sin(static_cast<double>(it))); };
  LogComparison r = compare(a, b);
  EXPECT_TRUE(r.within_tolerance());
  EXPECT_EQ(r.rows.size(), 30u);
  EXPECT_EQ(r.validation.size(), 3u);
  EXPECT_EQ(r.loss_rows_compared, 30u);
  EXPECT_GT(r.max_loss_rel, 2e-3);
  EXPECT_LT(r.max_loss_rel, 3.1e-3);
  EXPECT_TRUE(r.only_in_a.empty());
  for (const auto& row : r.rows) EXPECT_TRUE(row.problems.empty());
}

TEST(CompareLogs, FirstIterationOutsideLossToleranceIsNamed) {
  Curve a, b;
  b.loss = [](int64_t it) { return reference_loss(it) * (it >= 12 ? 1.03 : 1.0); };
  LogComparison r = compare(a, b);
  ASSERT_FALSE(r.within_tolerance());
  EXPECT_EQ(r.first_divergence->iteration, 12);
  EXPECT_EQ(r.first_divergence->quantity, "lm loss");
  EXPECT_EQ(r.first_divergence->where, "training");
  EXPECT_NEAR(r.first_divergence->rel_diff, 0.03, 1e-6);
  EXPECT_NE(r.first_divergence->message.find("lm loss differs by"), std::string::npos);
  EXPECT_FALSE(r.rows[11].problems.empty());
  EXPECT_TRUE(r.rows[10].problems.empty());
  // A looser tolerance accepts it.
  CompareTolerances loose;
  loose.loss_rel = 0.05;
  EXPECT_TRUE(compare(a, b, loose).within_tolerance());
}

TEST(CompareLogs, LearningRateGradNormAndBatchSizeDifferencesPart) {
  Curve a;
  Curve lr = a;
  lr.lr = [](int64_t it) { return (3e-4 - 9e-6 * static_cast<double>(it)) * (it >= 5 ? 1.001 : 1.0); };
  LogComparison r = compare(a, lr);
  ASSERT_FALSE(r.within_tolerance());
  EXPECT_EQ(r.first_divergence->iteration, 5);
  EXPECT_EQ(r.first_divergence->quantity, "learning rate");

  Curve gn = a;
  gn.grad_norm = [](int64_t it) {
    return it == 7 ? std::numeric_limits<double>::quiet_NaN() : 0.65 - 0.005 * static_cast<double>(it);
  };
  r = compare(a, gn);
  ASSERT_FALSE(r.within_tolerance());
  EXPECT_EQ(r.first_divergence->iteration, 7);
  EXPECT_EQ(r.first_divergence->quantity, "grad norm");
  // Within 10% (or 2e-3 absolute) is fine.
  gn.grad_norm = [](int64_t it) { return (0.65 - 0.005 * static_cast<double>(it)) * 1.08; };
  EXPECT_TRUE(compare(a, gn).within_tolerance());

  Curve gbs = a;
  gbs.gbs = 64;
  r = compare(a, gbs);
  ASSERT_FALSE(r.within_tolerance());
  EXPECT_EQ(r.first_divergence->iteration, 1);
  EXPECT_EQ(r.first_divergence->quantity, "consumed samples");
}

TEST(CompareLogs, ValidationLossIsCheckedToo) {
  Curve a, b;
  ParsedLog la = parse_training_log(log_text(a, LogFlavor::kMegatronLM));
  ParsedLog lb = parse_training_log(log_text(b, LogFlavor::kMegatronLM));
  ASSERT_EQ(lb.validations.size(), 3u);
  lb.validations[1].losses[0].value = *lb.validations[1].losses[0].value * 1.05;
  LogComparison r = compare_logs(la, lb, {});
  ASSERT_FALSE(r.within_tolerance());
  EXPECT_EQ(r.first_divergence->iteration, 20);
  EXPECT_EQ(r.first_divergence->quantity, "validation lm loss");
  EXPECT_EQ(r.first_divergence->where, "validation during training");
}

TEST(CompareLogs, DifferentLogIntervalsAreRebinned) {
  Curve a, b;
  b.log_interval = 5;
  LogComparison r = compare(a, b);
  EXPECT_TRUE(r.within_tolerance()) << r.first_divergence->message;
  ASSERT_EQ(r.rows.size(), 6u);  // 5, 10, ..., 30
  EXPECT_TRUE(r.rows[0].loss_a_rebinned);
  EXPECT_NEAR(*r.rows[0].loss_a, (reference_loss(1) + reference_loss(5)) / 2, 1e-5);
  EXPECT_EQ(r.only_in_a.size(), 24u);
  EXPECT_FALSE(r.notes.empty());
  // A spike inside B's window (6, 10] shows in B's average and in A's rebinned average only if
  // the windows line up: +1.5 at iteration 9 moves the 5-iteration mean by 0.3 (3%).
  b.loss = [](int64_t it) { return reference_loss(it) + (it == 9 ? 1.5 : 0.0); };
  r = compare(a, b);
  ASSERT_FALSE(r.within_tolerance());
  EXPECT_EQ(r.first_divergence->iteration, 10);
}

// A resumed Megatron-LM run's first line (iteration 11 here) resets nothing either (core 0.20's
// is_first_iteration): at log interval 1 its iteration-12 line is the mean of 11 and 12. Rebinned
// into an uninterrupted run's windows of 5, with a spike at 11 that a wrong window would count
// twice or not at all.
TEST(CompareLogs, ResumedRunsFirstLineIsRebinnedAsMegatronWroteIt) {
  Curve a, b;
  a.loaded = 10;
  b.log_interval = 5;
  a.loss = b.loss = [](int64_t it) { return reference_loss(it) + (it == 11 ? 3.0 : 0.0); };
  LogComparison r = compare(a, b);
  EXPECT_TRUE(r.within_tolerance()) << r.first_divergence->message;
  ASSERT_EQ(r.rows.size(), 4u);  // 15, 20, 25, 30
  EXPECT_EQ(r.rows[0].iteration, 15);
  EXPECT_TRUE(r.rows[0].loss_a_rebinned);
  double sum = 0;
  for (int64_t it = 11; it <= 15; ++it) sum += b.loss(it);
  EXPECT_NEAR(*r.rows[0].loss_a, sum / 5, 1e-5);
}

// The same where the resumed run's first line (iteration 8) is off the interval (5): its next line,
// at 10, averages 8-10; and a resumed run appended to the log of the run it resumed (iterations 9
// and 10 printed twice) has two first lines, each resetting nothing.
TEST(CompareLogs, FirstLinesOffTheIntervalAndInAnAppendedLog) {
  Curve a, b;
  a.loaded = 7;
  a.log_interval = b.log_interval = 5;
  a.loss = b.loss = [](int64_t it) { return reference_loss(it) + (it == 8 ? 3.0 : 0.0); };
  b.log_interval = 1;
  LogComparison r = compare(a, b);
  EXPECT_TRUE(r.within_tolerance()) << r.first_divergence->message;
  ASSERT_FALSE(r.rows.empty());
  EXPECT_EQ(r.rows[0].iteration, 8);
  // Appended: the first run logged 1..10 at interval 1, the resumed one (from 8) 9..30.
  Curve first_run = a, resumed = a;
  first_run.loaded = 0, first_run.iterations = 10, first_run.log_interval = 1;
  resumed.loaded = 8, resumed.log_interval = 1;
  resumed.loss = [](int64_t it) { return reference_loss(it) + (it == 9 ? 3.0 : 0.0); };
  const std::string text = log_text(first_run, LogFlavor::kMegatronLM) + log_text(resumed, LogFlavor::kMegatronLM);
  Curve whole = resumed;  // the same losses from 9 on, uninterrupted, every 5 (Bridge's: no first line)
  whole.loaded = 0, whole.log_interval = 5;
  whole.loss = [](int64_t it) { return it <= 8 ? reference_loss(it) + (it == 8 ? 3.0 : 0.0) : reference_loss(it) + (it == 9 ? 3.0 : 0.0); };
  r = compare_logs(parse_training_log(text), parse_training_log(log_text(whole, LogFlavor::kBridge)), {});
  EXPECT_TRUE(r.within_tolerance()) << r.first_divergence->message;
  EXPECT_GT(r.rows.size(), 4u);
}

TEST(CompareLogs, LogsWithoutCommonIterationsAreBadInput) {
  Curve a, b;
  ParsedLog la = parse_training_log(log_text(a, LogFlavor::kMegatronLM));
  ParsedLog lb = la;
  for (auto& r : lb.iterations) r.iteration += 100;
  EXPECT_THROW(compare_logs(la, lb, {}), laoyao::UsageError);
}

TEST(CompareLogs, RelativeDifferenceEdgeCases) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(relative_difference(2.0, 2.0), 0.0);
  EXPECT_DOUBLE_EQ(relative_difference(2.0, 2.5), 0.25);
  EXPECT_EQ(relative_difference(nan, nan), 0.0);
  EXPECT_TRUE(std::isinf(relative_difference(1.0, nan)));
  EXPECT_TRUE(std::isinf(relative_difference(0.0, 1e-9)));
  EXPECT_EQ(relative_difference(INFINITY, INFINITY), 0.0);
}

TEST(ConfigDiff, FlattenAndDiff) {
  auto a = flatten_yaml(
      "model:\n  num_layers: 2\n  hidden_size: 256\n  layers: [1, 2]\n  extra: {}\n"
      "optimizer:\n  lr: 3e-4\n  use_distributed_optimizer: True\n  name: null\n",
      "a.yaml");
  EXPECT_EQ(a.at("model.num_layers"), "2");
  EXPECT_EQ(a.at("model.layers[1]"), "2");
  EXPECT_EQ(a.at("model.extra"), "{}");
  EXPECT_EQ(a.at("optimizer.name"), "null");
  auto b = flatten_yaml(
      "model:\n  num_layers: 4\n  hidden_size: 256\n  layers: [1, 2, 3]\n  extra: {}\n"
      "optimizer:\n  lr: 0.0003\n  use_distributed_optimizer: true\n  name: ~\n  weight_decay: 0.1\n",
      "b.yaml");
  auto d = diff_configs(a, b);
  ASSERT_EQ(d.size(), 3u);
  EXPECT_EQ(d[0].key, "model.layers[2]");
  EXPECT_FALSE(d[0].a);
  EXPECT_EQ(*d[0].b, "3");
  EXPECT_EQ(d[1].key, "model.num_layers");
  EXPECT_EQ(*d[1].a, "2");
  EXPECT_EQ(*d[1].b, "4");
  EXPECT_EQ(d[2].key, "optimizer.weight_decay");
  EXPECT_FALSE(d[2].a);
  EXPECT_THROW(flatten_yaml("a: [1, 2\n", "broken.yaml"), laoyao::UsageError);
  try {
    flatten_yaml("a: [1, 2\n", "broken.yaml");
  } catch (const laoyao::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("broken.yaml"), std::string::npos);
  }
}

TEST(LossPlot, SvgHasBothCurvesAndSkipsNonFiniteValues) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<PlotSeries> series = {{"A: a<1>.log", {{1, 10.4}, {2, 10.3}, {3, nan}, {4, 10.1}}},
                                    {"B: b&c.log", {{1, 10.4}, {2, 10.35}, {3, 10.2}, {4, INFINITY}}}};
  std::string svg = line_chart_svg("lm loss", "lm loss", series, 3.0);
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  for (const char* bad : {"nan,", ",nan", "inf,", ",inf", "\"nan", "\"inf", "\"-nan", "\"-inf"})
    EXPECT_EQ(svg.find(bad), std::string::npos) << bad;
  EXPECT_NE(svg.find("A: a&lt;1&gt;.log"), std::string::npos);  // labels are XML-escaped
  EXPECT_NE(svg.find("B: b&amp;c.log"), std::string::npos);
  EXPECT_NE(svg.find("stroke-dasharray"), std::string::npos);
  // Three finite points in each polyline.
  size_t p1 = svg.find("points=\""), p2 = svg.find("points=\"", p1 + 1);
  ASSERT_NE(p2, std::string::npos);
  auto count_points = [&](size_t at) {
    size_t end = svg.find('"', at + 8);
    std::string pts = svg.substr(at + 8, end - at - 8);
    return std::count(pts.begin(), pts.end(), ',');
  };
  EXPECT_EQ(count_points(p1), 3);
  EXPECT_EQ(count_points(p2), 3);
  // No data at all still gives a valid, empty chart.
  std::string empty = line_chart_svg("t", "y", {});
  EXPECT_NE(empty.find("</svg>"), std::string::npos);
}
