// `laoyao compare-logs` as a user runs it: two log files in a temporary directory, the built
// binary, its output and exit status (0 within tolerance, 1 the runs part, 2 bad input).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

namespace fs = std::filesystem;

namespace {

struct RunResult {
  int status = -1;
  std::string output;  // stdout and stderr together
};

RunResult run_laoyao(const std::string& args) {
  std::string cmd = std::string(LAOYAO_BINARY) + " compare-logs " + args + " 2>&1";
  RunResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

std::string quote(const fs::path& p) {
  std::string q = "'";
  q.append(p.string()).append("'");
  return q;
}

void write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

// A 30-iteration log written with Megatron's exact format strings (independently of laoyao's
// formatter): MLM flavour (microsecond timestamp, "[default0]:" prefix from torchrun) or Bridge
// flavour (no microseconds, "0: " prefix from srun -l, a "Step Time" line before each line).
std::string make_log(bool bridge, const std::function<double(int)>& loss) {
  std::string text = "> building train, validation, and test datasets ...\n";
  char line[1024];
  for (int it = 1; it <= 30; ++it) {
    double lr = 3e-4 - 9e-6 * it, gn = 0.65 - 0.005 * it, l = loss(it);
    if (bridge) text += "0: Step Time : 0.10s GPU utilization: 9.5MODEL_TFLOP/s/GPU\n";
    std::snprintf(line, sizeof line,
                  "%s [%s] iteration %8d/%8d | consumed samples: %12d | elapsed time per iteration "
                  "(ms): %.1f | learning rate: %.6E | global batch size: %5d | lm loss: %.6E | loss "
                  "scale: %.1f | grad norm: %.3f | number of skipped iterations: %3d | number of nan "
                  "iterations: %3d |\n",
                  bridge ? "0:" : "[default0]:",
                  bridge ? "2026-05-28 22:32:59" : "2026-11-30 05:34:22.661240", it, 30, it * 32,
                  104.0, lr, 32, l, 1.0, gn, 0, 0);
    text += line;
    if (it % 10 == 0) {
      double v = l - 0.1;
      std::snprintf(line, sizeof line,
                    " validation loss at iteration %d | lm loss value: %.6E | lm loss PPL: %.6E | ", it,
                    v, std::exp(std::min(20.0, v)));
      std::string dashes(std::string(line).size() + 1, '-');
      text += dashes + "\n" + line + "\n" + dashes + "\n";
    }
  }
  return text;
}

double curve(int it) { return 10.42071 - 0.065 * (it - 1); }

class CompareLogsCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("laoyao_compare_logs_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

}  // namespace

TEST_F(CompareLogsCli, SameRunInMlmAndBridgeFormatIsWithinTolerance) {
  write(dir_ / "a" / "mlm.log", make_log(false, curve));
  // BF16-sized differences (~1e-3 relative).
  write(dir_ / "b" / "bridge.log",
        make_log(true, [](int it) { return curve(it) * (1 + 1e-3 * std::sin(it)); }));
  RunResult r = run_laoyao(quote(dir_ / "a" / "mlm.log") + " " + quote(dir_ / "b" / "bridge.log"));
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("verdict: within BF16 tolerance: 30 iterations and 3 validation results"),
            std::string::npos)
      << r.output;
  // The per-iteration table and the validation values side by side.
  EXPECT_NE(r.output.find("lm loss A"), std::string::npos);
  EXPECT_NE(r.output.find("grad norm B"), std::string::npos);
  EXPECT_NE(r.output.find("1.042071E+01"), std::string::npos);
  EXPECT_NE(r.output.find("iteration 20 "), std::string::npos);
  EXPECT_NE(r.output.find("config: not compared"), std::string::npos);
}

TEST_F(CompareLogsCli, DivergingRunsNameTheFirstIterationAndQuantity) {
  write(dir_ / "a.log", make_log(false, curve));
  write(dir_ / "b.log", make_log(false, [](int it) { return curve(it) * (it >= 12 ? 1.05 : 1.0); }));
  RunResult r = run_laoyao(quote(dir_ / "a.log") + " " + quote(dir_ / "b.log"));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("verdict: the runs part at iteration 12 (training): lm loss differs by"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("5.00e-02 relative"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("OUT: lm loss"), std::string::npos);

  // A looser --tolerance accepts a 5% difference.
  r = run_laoyao(quote(dir_ / "a.log") + " " + quote(dir_ / "b.log") + " --tolerance 0.06");
  EXPECT_EQ(r.status, 0) << r.output;

  // --json: machine-readable result with the same verdict.
  r = run_laoyao(quote(dir_ / "a.log") + " " + quote(dir_ / "b.log") + " --json");
  EXPECT_EQ(r.status, 1);
  auto j = nlohmann::json::parse(r.output);
  EXPECT_FALSE(j["within_tolerance"].get<bool>());
  EXPECT_EQ(j["first_divergence"]["iteration"].get<int>(), 12);
  EXPECT_EQ(j["first_divergence"]["quantity"].get<std::string>(), "lm loss");
  EXPECT_NEAR(j["first_divergence"]["rel_diff"].get<double>(), 0.05, 1e-6);
  EXPECT_EQ(j["rows"].size(), 30u);
  EXPECT_EQ(j["validation"].size(), 3u);
  EXPECT_TRUE(j["config_diff"].is_null());

  // --plot: an SVG with both curves.
  fs::path svg = dir_ / "plots" / "loss.svg";
  r = run_laoyao(quote(dir_ / "a.log") + " " + quote(dir_ / "b.log") + " --plot " + quote(svg));
  EXPECT_EQ(r.status, 1);
  std::ifstream in(svg);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  EXPECT_EQ(text.rfind("<?xml", 0), 0u) << text;
  size_t first = text.find("<polyline"), second = text.find("<polyline", first + 1);
  EXPECT_NE(first, std::string::npos);
  EXPECT_NE(second, std::string::npos);
  EXPECT_NE(text.find("A: a.log"), std::string::npos);
  EXPECT_NE(text.find("stroke-dasharray"), std::string::npos);  // marks iteration 12
}

TEST_F(CompareLogsCli, ConfigFieldsThatDifferAreListed) {
  write(dir_ / "a" / "train.log", make_log(false, curve));
  write(dir_ / "b" / "train.log", make_log(true, curve));
  write(dir_ / "a" / "run_config.yaml",
        "model:\n  num_layers: 2\n  hidden_size: 256\noptimizer:\n  lr: 3e-4\n  min_lr: 3.0e-05\n");
  write(dir_ / "b" / "run_config.yaml",
        "model:\n  num_layers: 2\n  hidden_size: 512\noptimizer:\n  lr: 0.0003\n  min_lr: 3.0e-05\n"
        "  clip_grad: 1.0\n");
  RunResult r = run_laoyao(quote(dir_ / "a" / "train.log") + " " + quote(dir_ / "b" / "train.log"));
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("config: 2 field(s) differ"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("  model.hidden_size: 256 | 512\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("  optimizer.clip_grad: (absent) | 1.0\n"), std::string::npos);
  EXPECT_EQ(r.output.find("optimizer.lr"), std::string::npos);  // 3e-4 == 0.0003

  // --config-a/--config-b name other directories (or files).
  write(dir_ / "cfg" / "x" / "run_config.yaml", "model:\n  num_layers: 4\n");
  write(dir_ / "cfg" / "y.yaml", "model:\n  num_layers: 8\n");
  r = run_laoyao(quote(dir_ / "a" / "train.log") + " " + quote(dir_ / "b" / "train.log") +
                 " --config-a " + quote(dir_ / "cfg" / "x") + " --config-b=" + quote(dir_ / "cfg" / "y.yaml"));
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("config: 1 field(s) differ"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("  model.num_layers: 4 | 8\n"), std::string::npos) << r.output;
  r = run_laoyao(quote(dir_ / "a" / "train.log") + " " + quote(dir_ / "b" / "train.log") +
                 " --config-a " + quote(dir_ / "nowhere"));
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("nowhere"), std::string::npos);
}

TEST_F(CompareLogsCli, BadInputExitsWithTwoNamingTheFile) {
  write(dir_ / "a.log", make_log(false, curve));
  write(dir_ / "empty.log", "WARNING: nothing to see here\n");
  RunResult r = run_laoyao(quote(dir_ / "a.log") + " " + quote(dir_ / "missing.log"));
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("missing.log"), std::string::npos) << r.output;
  r = run_laoyao(quote(dir_ / "empty.log") + " " + quote(dir_ / "a.log"));
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("no training iterations found in log A"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("empty.log"), std::string::npos);
  r = run_laoyao(quote(dir_ / "a.log"));
  EXPECT_EQ(r.status, 2) << r.output;
  r = run_laoyao(quote(dir_ / "a.log") + " " + quote(dir_ / "a.log") + " --tolerence 0.1");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("did you mean --tolerance"), std::string::npos) << r.output;
  r = run_laoyao(quote(dir_ / "a.log") + " " + quote(dir_ / "a.log") + " --tolerance -1");
  EXPECT_EQ(r.status, 2) << r.output;
  r = run_laoyao("--help");
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(r.output.find("--grad-norm-tolerance"), std::string::npos);
  EXPECT_NE(r.output.find("Why these defaults"), std::string::npos);
}
