// laoyao compare-logs A.log B.log [--tolerance REL] [--lr-tolerance REL]
//                                 [--grad-norm-tolerance REL] [--loss KEY] [--plot OUT.svg]
//                                 [--json] [--config-a PATH] [--config-b PATH]
// Parse two Megatron-format training logs (ours, Megatron-LM's or Megatron-Bridge's), compare
// them iteration by iteration, print a table, the validation results side by side, the config
// fields that differ (run_config.yaml), and a verdict. Exit 0 within tolerance, 1 when the runs
// part, 2 on bad input.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cli/cli.hpp"
#include "core/error.hpp"
#include "core/file_io.hpp"
#include "core/text.hpp"
#include "train/log_parse.hpp"
#include "train/tensorboard_reader.hpp"
#include "train/training_log.hpp"
#include "train/training_log_compare.hpp"
#include "train/training_log_plot.hpp"

namespace laoyao::cli {
namespace {

namespace fs = std::filesystem;
using train::CompareTolerances;

void print_help() {
  const CompareTolerances d;
  std::printf(
      "usage: laoyao compare-logs A.log B.log [options]\n"
      "\n"
      "Compares two Megatron-format training logs (laoyao's, Megatron-LM's or Megatron-Bridge's;\n"
      "launcher prefixes such as '[default0]:' and other output between the lines are fine)\n"
      "iteration by iteration -- the loss, grad norm and learning rate -- then the validation\n"
      "losses, and says whether the two runs agree within BF16 tolerance or where they part.\n"
      "A is the reference: relative differences are |B - A| / |A|.\n"
      "Either side may also be a TensorBoard event file (events.out.tfevents.*) or a\n"
      "--tensorboard-dir holding them: its per-iteration lm loss, grad-norm, learning-rate and\n"
      "validation scalars are read as a log with --log-interval 1.\n"
      "\n"
      "options:\n"
      "  --tolerance REL            largest relative loss difference per iteration, training and\n"
      "                             validation (default %g)\n"
      "  --lr-tolerance REL         largest relative learning-rate difference (default %g)\n"
      "  --grad-norm-tolerance REL  largest relative grad-norm difference (default %g, plus %g\n"
      "                             absolute for the 3 printed decimals)\n"
      "  --loss KEY                 the loss to compare (default \"%s\")\n"
      "  --config-a PATH            run_config.yaml of run A, or a directory holding one\n"
      "  --config-b PATH            the same for run B (default for both: a run_config.yaml in\n"
      "                             the log's directory, or in the TensorBoard directory given);\n"
      "                             when both exist, every config field\n"
      "                             that differs is listed\n"
      "  --plot OUT.svg             write both loss curves as an SVG chart\n"
      "  --json                     print the result as JSON instead of tables\n"
      "\n"
      "Why these defaults: this is a same-weights correlation test (same config, same initial\n"
      "weights, same data order, dropout off), so the curves should agree within BF16 rounding.\n"
      "BF16 keeps 8 significant bits (unit roundoff 2^-8 = 3.9e-3); the logged loss is a mean\n"
      "over every token of the global batch, so same-weights runs of two BF16 implementations\n"
      "stay ~1e-3 apart. %g (~5 roundoffs) leaves room for the slow drift of different GEMM\n"
      "accumulation orders and still catches a wrong mask, scale, schedule or data order within\n"
      "a few iterations. Megatron-Bridge's golden-value check allows 10%% (loss > 2), 5%% (0.5-2),\n"
      "2%% (< 0.5) with 10%% of points allowed to fail -- built for other hardware and kernels,\n"
      "too loose for this; %g is its tightest bucket, applied to every point. The learning rate\n"
      "follows a deterministic schedule printed to 7 digits, so anything above %g means a\n"
      "different schedule. A grad norm is more sensitive to rounding than the loss and printed\n"
      "with 3 decimals, hence %g relative + %g absolute.\n"
      "\n"
      "When the logs use different --log-interval, the finer log's losses are averaged over the\n"
      "coarser log's windows (Megatron prints the mean since the last log line).\n"
      "\n"
      "exit status: 0 within tolerance, 1 the runs part, 2 bad input (a missing file, a log\n"
      "without iterations, logs without a common iteration, a bad option).\n",
      d.loss_rel, d.lr_rel, d.grad_norm_rel, d.grad_norm_abs, d.loss_key.c_str(), d.loss_rel,
      d.loss_rel, d.lr_rel, d.grad_norm_rel, d.grad_norm_abs);
}

struct Options {
  std::string log_a, log_b;
  CompareTolerances tol;
  std::optional<std::string> config_a, config_b, plot;
  bool json = false;
  bool help = false;
};

double parse_tolerance(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !std::isfinite(v) || v < 0)
    throw UsageError(flag + " takes a non-negative number (a relative tolerance such as 0.02), got '" +
                     text + "'");
  return v;
}

Options parse_options(const Args& args) {
  static const std::vector<std::string> kFlags = {
      "--tolerance", "--lr-tolerance", "--grad-norm-tolerance", "--loss", "--config-a",
      "--config-b",  "--plot",         "--json",                "--help"};
  Options o;
  std::vector<std::string> positional;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string arg = args[i];
    if (arg == "-h" || arg == "--help") {
      o.help = true;
      continue;
    }
    if (arg == "--json") {
      o.json = true;
      continue;
    }
    if (!starts_with(arg, "--") || arg == "--") {
      positional.push_back(arg);
      continue;
    }
    std::string flag = arg, value;
    bool has_value = false;
    if (size_t eq = arg.find('='); eq != std::string::npos) {
      flag = arg.substr(0, eq);
      value = arg.substr(eq + 1);
      has_value = true;
    }
    bool known = false;
    for (const auto& f : kFlags) known = known || f == flag;
    if (!known || flag == "--json" || flag == "--help")
      throw UsageError("unknown option '" + flag + "'" + did_you_mean(flag, kFlags) +
                       "; see `laoyao compare-logs --help`");
    if (!has_value) {
      if (i + 1 >= args.size()) throw UsageError(flag + " needs a value");
      value = args[++i];
    }
    if (flag == "--tolerance") o.tol.loss_rel = parse_tolerance(flag, value);
    else if (flag == "--lr-tolerance") o.tol.lr_rel = parse_tolerance(flag, value);
    else if (flag == "--grad-norm-tolerance") o.tol.grad_norm_rel = parse_tolerance(flag, value);
    else if (flag == "--loss") o.tol.loss_key = value;
    else if (flag == "--config-a") o.config_a = value;
    else if (flag == "--config-b") o.config_b = value;
    else if (flag == "--plot") o.plot = value;
  }
  if (o.help) return o;
  if (positional.size() != 2)
    throw UsageError("give exactly two log files (A.log B.log), got " +
                     std::to_string(positional.size()) + "; see `laoyao compare-logs --help`");
  o.log_a = positional[0];
  o.log_b = positional[1];
  if (o.tol.loss_key.empty()) throw UsageError("--loss needs a loss name such as \"lm loss\"");
  return o;
}

train::ParsedLog load_log(const std::string& path, const std::string& which) {
  if (train::is_tensorboard_path(path)) {
    train::ParsedLog log = train::parse_tensorboard_events(path);
    if (log.iterations.empty())
      throw UsageError("no 'lm loss' scalars found in the TensorBoard events of " + which + " '" + path + "'");
    return log;
  }
  train::ParsedLog log = train::parse_training_log_file(path);
  if (log.iterations.empty())
    throw UsageError("no training iterations found in log " + which + " '" + path +
                     "' (expected Megatron lines such as ' [date] iteration        1/      30 | "
                     "consumed samples: ... | lm loss: ... |', or TensorBoard event files)");
  return log;
}

// The run_config.yaml for a log: the one named with --config-X (a file, or a directory holding
// run_config.yaml; it must exist), else the one beside the log when there is one.
std::optional<std::string> find_config(const std::optional<std::string>& given, const std::string& log,
                                       const std::string& flag) {
  std::error_code ec;
  if (given) {
    fs::path p(*given);
    if (fs::is_directory(p, ec)) p /= "run_config.yaml";
    if (!fs::is_regular_file(p, ec))
      throw UsageError(flag + ": no config file at '" + p.string() +
                       "' (give a run_config.yaml or the directory that holds it)");
    return p.string();
  }
  // A --tensorboard-dir holds laoyao's run_config.yaml itself; a log file has it beside.
  fs::path beside = (fs::is_directory(log, ec) ? fs::path(log) : fs::path(log).parent_path()) / "run_config.yaml";
  if (fs::is_regular_file(beside, ec)) return beside.string();
  return std::nullopt;
}

std::string opt_exp(const std::optional<double>& v) {
  return v ? train::pyfmt::exp_upper(*v, 6) : std::string("-");
}
std::string opt_fixed3(const std::optional<double>& v) {
  return v ? train::pyfmt::fixed(*v, 3) : std::string("-");
}
std::string signed_exp(double x, int precision) {
  if (!std::isfinite(x)) return train::pyfmt::exp_lower(x, precision);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%+.*e", precision, x);
  return buf;
}

struct Result {
  Options opt;
  train::ParsedLog a, b;
  train::LogComparison cmp;
  std::optional<std::string> config_a, config_b;
  bool configs_compared = false;
  std::vector<train::ConfigDifference> config_diff;
};

std::string verdict_text(const Result& r) {
  const auto& c = r.cmp;
  const auto& t = r.opt.tol;
  if (c.within_tolerance()) {
    std::string s = "within BF16 tolerance: " + std::to_string(c.rows.size()) + " iterations";
    size_t validations = 0;
    for (const auto& v : c.validation)
      if (v.loss_a && v.loss_b) ++validations;
    s += " and " + std::to_string(validations) + " validation results compared; largest " +
         t.loss_key + " difference " + train::pyfmt::exp_lower(c.max_loss_rel, 2) + " relative (iteration " +
         std::to_string(c.max_loss_rel_iteration) + ", tolerance " + train::pyfmt::exp_lower(t.loss_rel, 2) +
         "), largest grad norm difference " + train::pyfmt::exp_lower(c.max_grad_norm_rel, 2) +
         " relative, largest learning-rate difference " + train::pyfmt::exp_lower(c.max_lr_rel, 2) + " relative";
    return s;
  }
  const auto& d = *c.first_divergence;
  return "the runs part at iteration " + std::to_string(d.iteration) + " (" + d.where + "): " + d.message;
}

void print_text(const Result& r) {
  const auto& c = r.cmp;
  const std::string& key = r.opt.tol.loss_key;
  std::printf("A: %s (%zu iterations, %zu validation results)\n", r.opt.log_a.c_str(),
              r.a.iterations.size(), r.a.validations.size());
  std::printf("B: %s (%zu iterations, %zu validation results)\n\n", r.opt.log_b.c_str(),
              r.b.iterations.size(), r.b.validations.size());

  std::string la = key + " A", lb = key + " B";
  std::printf("%9s  %14s  %14s  %14s  %10s  %11s  %11s  %13s  %13s  %s\n", "iteration", la.c_str(),
              lb.c_str(), "diff (B-A)", "rel diff", "grad norm A", "grad norm B", "lr A", "lr B",
              "check");
  for (const auto& row : c.rows) {
    std::string diff = "-", rel = "-";
    if (row.loss_a && row.loss_b && row.loss_comparable) {
      double d = *row.loss_b - *row.loss_a;
      diff = signed_exp(d, 3);
      double rd = std::fabs(*row.loss_a) > 0 ? d / std::fabs(*row.loss_a) : train::relative_difference(*row.loss_a, *row.loss_b);
      rel = signed_exp(rd, 2);
    }
    std::string check = "ok";
    if (!row.failed.empty()) check = "OUT: " + join(row.failed, ", ");
    if (!row.loss_comparable) check += " (loss windows differ: not compared)";
    if (row.loss_a_rebinned) check += " (A averaged over B's interval)";
    if (row.loss_b_rebinned) check += " (B averaged over A's interval)";
    std::printf("%9lld  %14s  %14s  %14s  %10s  %11s  %11s  %13s  %13s  %s\n",
                static_cast<long long>(row.iteration), opt_exp(row.loss_a).c_str(),
                opt_exp(row.loss_b).c_str(), diff.c_str(), rel.c_str(), opt_fixed3(row.grad_norm_a).c_str(),
                opt_fixed3(row.grad_norm_b).c_str(), opt_exp(row.lr_a).c_str(), opt_exp(row.lr_b).c_str(),
                check.c_str());
  }

  std::printf("\n");
  if (c.validation.empty()) {
    std::printf("validation: none in either log\n");
  } else {
    std::string va = key + " A", vb = key + " B";
    std::printf("%-40s  %14s  %14s  %10s  %s\n", "validation", va.c_str(), vb.c_str(), "rel diff", "check");
    for (const auto& v : c.validation) {
      std::string where = "iteration " + std::to_string(v.iteration);
      if (v.set != train::EvalSet::kDuringTraining) where += std::string(" ") + train::eval_set_name(v.set);
      if (v.validation_set_index) where = "[set " + std::to_string(*v.validation_set_index) + "] " + where;
      std::string rel = "-";
      if (v.loss_a && v.loss_b)
        rel = signed_exp(std::fabs(*v.loss_a) > 0 ? (*v.loss_b - *v.loss_a) / std::fabs(*v.loss_a)
                                                  : train::relative_difference(*v.loss_a, *v.loss_b), 2);
      std::string check = v.failed.empty() ? (v.loss_a && v.loss_b ? "ok" : "one log only") : "OUT";
      std::printf("%-40s  %14s  %14s  %10s  %s\n", where.c_str(), opt_exp(v.loss_a).c_str(),
                  opt_exp(v.loss_b).c_str(), rel.c_str(), check.c_str());
    }
  }

  std::printf("\n");
  if (r.configs_compared) {
    if (r.config_diff.empty()) {
      std::printf("config: %s and %s are the same\n", r.config_a->c_str(), r.config_b->c_str());
    } else {
      std::printf("config: %zu field(s) differ between %s (A) and %s (B):\n", r.config_diff.size(),
                  r.config_a->c_str(), r.config_b->c_str());
      for (const auto& d : r.config_diff)
        std::printf("  %s: %s | %s\n", d.key.c_str(), d.a ? d.a->c_str() : "(absent)",
                    d.b ? d.b->c_str() : "(absent)");
    }
  } else {
    std::printf("config: not compared (%s)\n",
                !r.config_a && !r.config_b ? "no run_config.yaml beside either log; see --config-a/--config-b"
                : !r.config_a              ? "no run_config.yaml for A; see --config-a"
                                           : "no run_config.yaml for B; see --config-b");
  }
  for (const auto& n : c.notes) std::printf("note: %s\n", n.c_str());
  if (r.opt.plot) std::printf("plot: %s\n", r.opt.plot->c_str());
  std::printf("verdict: %s\n", verdict_text(r).c_str());
}

nlohmann::ordered_json opt_json(const std::optional<double>& v) {
  if (!v || !std::isfinite(*v)) return nullptr;
  return *v;
}

void print_json(const Result& r) {
  using json = nlohmann::ordered_json;
  const auto& c = r.cmp;
  json j;
  auto side = [](const std::string& path, const train::ParsedLog& log, const std::optional<std::string>& cfg) {
    return json{{"path", path},
                {"iterations", log.iterations.size()},
                {"validations", log.validations.size()},
                {"config", cfg ? json(*cfg) : json(nullptr)}};
  };
  j["a"] = side(r.opt.log_a, r.a, r.config_a);
  j["b"] = side(r.opt.log_b, r.b, r.config_b);
  j["loss_key"] = r.opt.tol.loss_key;
  j["tolerances"] = {{"loss_rel", r.opt.tol.loss_rel},
                     {"lr_rel", r.opt.tol.lr_rel},
                     {"grad_norm_rel", r.opt.tol.grad_norm_rel},
                     {"grad_norm_abs", r.opt.tol.grad_norm_abs}};
  j["within_tolerance"] = c.within_tolerance();
  j["verdict"] = verdict_text(r);
  if (c.first_divergence) {
    const auto& d = *c.first_divergence;
    j["first_divergence"] = {{"iteration", d.iteration}, {"where", d.where},
                             {"quantity", d.quantity},   {"a", opt_json(d.a)},
                             {"b", opt_json(d.b)},       {"abs_diff", opt_json(d.abs_diff)},
                             {"rel_diff", opt_json(d.rel_diff)}, {"tolerance", d.tolerance},
                             {"message", d.message}};
  } else {
    j["first_divergence"] = nullptr;
  }
  j["max_loss_rel_diff"] = opt_json(c.max_loss_rel);
  j["max_loss_rel_diff_iteration"] = c.max_loss_rel_iteration;
  j["max_grad_norm_rel_diff"] = opt_json(c.max_grad_norm_rel);
  j["max_lr_rel_diff"] = opt_json(c.max_lr_rel);
  json rows = json::array();
  for (const auto& row : c.rows) {
    std::optional<double> diff, rel;
    if (row.loss_a && row.loss_b && row.loss_comparable) {
      diff = *row.loss_b - *row.loss_a;
      rel = train::relative_difference(*row.loss_a, *row.loss_b);
    }
    rows.push_back({{"iteration", row.iteration},
                    {"loss_a", opt_json(row.loss_a)},
                    {"loss_b", opt_json(row.loss_b)},
                    {"diff", opt_json(diff)},
                    {"rel_diff", opt_json(rel)},
                    {"loss_a_rebinned", row.loss_a_rebinned},
                    {"loss_b_rebinned", row.loss_b_rebinned},
                    {"loss_compared", row.loss_comparable},
                    {"grad_norm_a", opt_json(row.grad_norm_a)},
                    {"grad_norm_b", opt_json(row.grad_norm_b)},
                    {"lr_a", opt_json(row.lr_a)},
                    {"lr_b", opt_json(row.lr_b)},
                    {"problems", row.problems}});
  }
  j["rows"] = rows;
  json val = json::array();
  for (const auto& v : c.validation) {
    std::optional<double> rel;
    if (v.loss_a && v.loss_b) rel = train::relative_difference(*v.loss_a, *v.loss_b);
    val.push_back({{"iteration", v.iteration},
                   {"set", train::eval_set_name(v.set)},
                   {"validation_set_index", v.validation_set_index ? json(*v.validation_set_index) : json(nullptr)},
                   {"loss_a", opt_json(v.loss_a)},
                   {"loss_b", opt_json(v.loss_b)},
                   {"ppl_a", opt_json(v.ppl_a)},
                   {"ppl_b", opt_json(v.ppl_b)},
                   {"rel_diff", opt_json(rel)},
                   {"problems", v.problems}});
  }
  j["validation"] = val;
  j["only_in_a"] = c.only_in_a;
  j["only_in_b"] = c.only_in_b;
  if (r.configs_compared) {
    json diffs = json::array();
    for (const auto& d : r.config_diff)
      diffs.push_back({{"key", d.key}, {"a", d.a ? json(*d.a) : json(nullptr)}, {"b", d.b ? json(*d.b) : json(nullptr)}});
    j["config_diff"] = diffs;
  } else {
    j["config_diff"] = nullptr;
  }
  j["notes"] = c.notes;
  j["plot"] = r.opt.plot ? json(*r.opt.plot) : json(nullptr);
  std::printf("%s\n", j.dump(2).c_str());
}

std::vector<std::pair<double, double>> curve(const train::ParsedLog& log, const std::string& key) {
  std::vector<std::pair<double, double>> pts;
  for (const auto& r : log.iterations)
    if (auto v = r.loss(key)) pts.emplace_back(static_cast<double>(r.iteration), *v);
  return pts;
}

}  // namespace

int cmd_compare_logs(const Args& args) {
  Result r;
  r.opt = parse_options(args);
  if (r.opt.help) {
    print_help();
    return 0;
  }
  r.a = load_log(r.opt.log_a, "A");
  r.b = load_log(r.opt.log_b, "B");
  r.config_a = find_config(r.opt.config_a, r.opt.log_a, "--config-a");
  r.config_b = find_config(r.opt.config_b, r.opt.log_b, "--config-b");
  if (r.config_a && r.config_b) {
    r.config_diff = train::diff_configs(train::flatten_yaml(read_file(*r.config_a), *r.config_a),
                                        train::flatten_yaml(read_file(*r.config_b), *r.config_b));
    r.configs_compared = true;
  }
  r.cmp = train::compare_logs(r.a, r.b, r.opt.tol);

  if (r.opt.plot) {
    std::vector<train::PlotSeries> series = {
        {"A: " + fs::path(r.opt.log_a).filename().string(), curve(r.a, r.opt.tol.loss_key)},
        {"B: " + fs::path(r.opt.log_b).filename().string(), curve(r.b, r.opt.tol.loss_key)}};
    std::optional<double> marker;
    if (r.cmp.first_divergence) marker = static_cast<double>(r.cmp.first_divergence->iteration);
    write_file_atomic(*r.opt.plot, train::line_chart_svg(r.opt.tol.loss_key, r.opt.tol.loss_key, series, marker));
  }
  if (r.opt.json) print_json(r);
  else print_text(r);
  return r.cmp.within_tolerance() ? 0 : 1;
}

}  // namespace laoyao::cli
