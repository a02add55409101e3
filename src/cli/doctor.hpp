// `laoyao doctor`: the plain, CPU-side parts (version decoding and comparison, tolerance checks,
// report lines), kept apart from the GPU checks so that tests/cli checks them on any machine.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace laoyao::cli::doctor {

// ---- versions
struct Version {
  int major = 0, minor = 0, patch = 0;
};
Version cuda_version(int code);       // CUDA runtime/driver codes: 13000 -> 13.0
Version cublaslt_version(long code);  // cublasLtGetVersion / CUBLAS_VERSION: 130100 -> 13.1.0
Version cudnn_version(long code);     // cuDNN 9: 91900 -> 9.19.0; cuDNN 8: 8907 -> 8.9.7
Version nccl_version(int code);       // NCCL >= 2.9: 22809 -> 2.28.9; older: 2708 -> 2.7.8
std::string to_string(const Version& v, bool with_patch = true);

// NVIDIA keeps a library's ABI within a major version, but kernels, heuristics and bugs change with
// the minor version: a binary built against one minor version and running another deserves a flag.
// Patch levels do not.
bool major_minor_differs(const Version& compiled, const Version& loaded);

// "cuDNN      compiled 9.19.0  loaded 9.19.0", with "  MISMATCH: major.minor differ" appended
// when they do.
std::string version_line(const std::string& library, const Version& compiled, const Version& loaded,
                         bool with_patch = true);

// The driver's version from the text of /proc/driver/nvidia/version ("NVRM version: NVIDIA UNIX
// x86_64 Kernel Module  580.159.04  ..."): the first word made of digits and dots. "" if none.
std::string nvidia_driver_version(const std::string& proc_text);

// ---- bf16 on the host (round to nearest even, as the GPU's conversions)
uint16_t to_bf16_bits(float x);
float from_bf16_bits(uint16_t bits);

// ---- comparing GPU results with a reference
// Element i passes when |got_i - ref_i| <= rtol * |ref_i| + atol * max_j |ref_j|: the relative part
// covers rounding of the result itself (bf16: rtol = 2^-7 is one unit in the last place), the part
// scaled by the tensor's largest value covers the cancellation in sums whose terms were rounded.
struct Tolerance {
  double rtol = 0.0;
  double atol = 0.0;  // a fraction of max |ref|
};

struct Comparison {
  size_t count = 0;           // elements compared
  size_t failures = 0;        // elements outside the tolerance (NaN and Inf included)
  double max_abs_err = 0.0;
  double worst_ratio = 0.0;   // max over elements of |got - ref| / allowed; <= 1 passes
  size_t worst_index = 0;
  double ref_max_abs = 0.0;
  bool pass() const { return count > 0 && failures == 0; }
};
Comparison compare(const std::vector<float>& got, const std::vector<double>& ref, const Tolerance& tol);

// "max |err| 0.0123 = 0.41 of tolerance" (+ ", 3 of 1048576 outside at [17]" on failure).
std::string describe(const Comparison& c);

// ---- report
struct CheckResult {
  std::string name;    // what ran: "gemm bf16 4096x4096x4096 (cuBLASLt)"
  bool pass = false;
  std::string figure;  // the measurement or the error
};
std::string check_line(const CheckResult& r);  // "  PASS  <name>: <figure>"
// 0 when at least one check ran and every check passed, else 1.
int exit_status(const std::vector<CheckResult>& results);
std::string summary_line(const std::vector<CheckResult>& results);

// The one line printed, before exit status 1, when there is nothing to check on.
std::string no_gpu_line(bool backend_built, const std::string& reason);

double median(std::vector<double> v);
double tflops(double flops, double seconds);

struct Options {
  uint64_t seed = 0;
};

// ---- `laoyao doctor --no-gpu` (doctor_host.cpp): what a machine without a GPU can check of a build,
// the container recipe's last step. The CPU ops the CPU backend trains with (a GEMM and causal
// attention against fp64 loops on random inputs), the FP8 casts (every code of both formats back to
// itself), and in a CUDA build the CUDA runtime, cuBLASLt, cuDNN and NCCL the loader gives against
// the versions compiled against (a major.minor difference fails). Prints the report, returns the
// exit status.
int run_host_checks(const Options& options);

// ---- the GPU part (cmd_doctor_gpu.cpp), built only with the CUDA backend
#ifdef LAOYAO_HAVE_CUDA
// Runs every check on every visible GPU, prints the report, returns the exit status.
int run_gpu_checks(const Options& options);
#endif

}  // namespace laoyao::cli::doctor
