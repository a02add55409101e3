// `laoyao doctor`: version decoding, tolerance checks and report lines (see doctor.hpp).
#include "cli/doctor.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "core/rng.hpp"

namespace laoyao::cli::doctor {

Version cuda_version(int code) { return {code / 1000, (code % 1000) / 10, 0}; }

Version cublaslt_version(long code) {
  return {static_cast<int>(code / 10000), static_cast<int>(code / 100 % 100), static_cast<int>(code % 100)};
}

Version cudnn_version(long code) {
  if (code < 10000)  // cuDNN 8 and older: major*1000 + minor*100 + patch
    return {static_cast<int>(code / 1000), static_cast<int>(code / 100 % 10), static_cast<int>(code % 100)};
  return cublaslt_version(code);  // cuDNN 9: major*10000 + minor*100 + patch
}

Version nccl_version(int code) {
  if (code < 20900)  // before NCCL 2.9: major*1000 + minor*100 + patch (nccl.h's NCCL_VERSION)
    return {code / 1000, code / 100 % 10, code % 100};
  return {code / 10000, code / 100 % 100, code % 100};
}

std::string to_string(const Version& v, bool with_patch) {
  char buf[48];
  if (with_patch) std::snprintf(buf, sizeof buf, "%d.%d.%d", v.major, v.minor, v.patch);
  else std::snprintf(buf, sizeof buf, "%d.%d", v.major, v.minor);
  return buf;
}

bool major_minor_differs(const Version& compiled, const Version& loaded) {
  return compiled.major != loaded.major || compiled.minor != loaded.minor;
}

std::string version_line(const std::string& library, const Version& compiled, const Version& loaded,
                         bool with_patch) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "%-13s compiled %-8s loaded %s", library.c_str(),
                to_string(compiled, with_patch).c_str(), to_string(loaded, with_patch).c_str());
  std::string line = buf;
  if (major_minor_differs(compiled, loaded)) line += "  MISMATCH: major.minor differ";
  return line;
}

std::string nvidia_driver_version(const std::string& proc_text) {
  std::istringstream in(proc_text.substr(0, proc_text.find('\n')));
  std::string word;
  while (in >> word) {
    const bool digits_and_dots =
        std::all_of(word.begin(), word.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)) || c == '.'; });
    if (digits_and_dots && word.find('.') != std::string::npos && std::isdigit(static_cast<unsigned char>(word[0])))
      return word;
  }
  return {};
}

uint16_t to_bf16_bits(float x) {
  const float r = round_to_bf16(x);
  uint32_t u;
  std::memcpy(&u, &r, 4);
  return static_cast<uint16_t>(u >> 16);
}

float from_bf16_bits(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

Comparison compare(const std::vector<float>& got, const std::vector<double>& ref, const Tolerance& tol) {
  Comparison c;
  if (got.size() != ref.size() || got.empty()) {  // nothing comparable: a failure, not a pass
    c.count = std::max(got.size(), ref.size());
    c.failures = c.count == 0 ? 1 : c.count;
    c.worst_ratio = INFINITY;
    return c;
  }
  c.count = got.size();
  for (double r : ref) c.ref_max_abs = std::max(c.ref_max_abs, std::fabs(r));
  const double floor = tol.atol * c.ref_max_abs;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - ref[i]);
    const double allowed = tol.rtol * std::fabs(ref[i]) + floor;
    const bool ok = err <= allowed;  // false for a NaN; an exact match passes even at zero tolerance
    double ratio = allowed > 0 ? err / allowed : (err == 0 ? 0.0 : INFINITY);
    if (std::isnan(ratio)) ratio = INFINITY;
    if (!ok) ++c.failures;
    c.max_abs_err = std::isnan(err) ? INFINITY : std::max(c.max_abs_err, err);
    if (ratio > c.worst_ratio) {
      c.worst_ratio = ratio;
      c.worst_index = i;
    }
  }
  return c;
}

std::string describe(const Comparison& c) {
  char buf[200];
  std::snprintf(buf, sizeof buf, "max |err| %.3g = %.2f of tolerance", c.max_abs_err, c.worst_ratio);
  std::string s = buf;
  if (c.failures > 0) {
    std::snprintf(buf, sizeof buf, ", %zu of %zu outside (worst at [%zu])", c.failures, c.count, c.worst_index);
    s += buf;
  }
  return s;
}

std::string check_line(const CheckResult& r) {
  return std::string("  ") + (r.pass ? "PASS" : "FAIL") + "  " + r.name + ": " + r.figure;
}

int exit_status(const std::vector<CheckResult>& results) {
  if (results.empty()) return 1;
  for (const auto& r : results)
    if (!r.pass) return 1;
  return 0;
}

std::string summary_line(const std::vector<CheckResult>& results) {
  size_t failed = 0;
  for (const auto& r : results) failed += r.pass ? 0 : 1;
  if (results.empty()) return "laoyao doctor: no checks ran";
  if (failed == 0) return "laoyao doctor: all " + std::to_string(results.size()) + " checks passed";
  return "laoyao doctor: " + std::to_string(failed) + " of " + std::to_string(results.size()) + " checks FAILED";
}

std::string no_gpu_line(bool backend_built, const std::string& reason) {
  if (!backend_built)
    return "laoyao doctor: no GPU checks: this laoyao was built without the CUDA backend (nvcc was not found "
           "when it was configured)";
  return "laoyao doctor: no CUDA GPU is visible" + (reason.empty() ? std::string() : " (" + reason + ")") +
         "; nothing to check";
}

double median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double tflops(double flops, double seconds) { return seconds > 0 ? flops / seconds * 1e-12 : 0.0; }

}  // namespace laoyao::cli::doctor
