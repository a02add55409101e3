// `laoyao doctor`: its CPU-side rules (version decoding and the mismatch flag, tolerance checks,
// report lines and exit status) and the built binary's behaviour where no GPU is visible.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "cli/doctor.hpp"
#include "core/rng.hpp"
#include "run_binary.hpp"

namespace laoyao::cli::doctor {
namespace {

TEST(DoctorVersions, DecodesEachLibrarysEncoding) {
  EXPECT_EQ(to_string(cuda_version(13000), false), "13.0");
  EXPECT_EQ(to_string(cuda_version(12080), false), "12.8");
  EXPECT_EQ(to_string(cublaslt_version(130100)), "13.1.0");
  EXPECT_EQ(to_string(cublaslt_version(120903)), "12.9.3");
  EXPECT_EQ(to_string(cudnn_version(91900)), "9.19.0");
  EXPECT_EQ(to_string(cudnn_version(8907)), "8.9.7");    // cuDNN 8: major*1000 + minor*100 + patch
  EXPECT_EQ(to_string(nccl_version(22809)), "2.28.9");
  EXPECT_EQ(to_string(nccl_version(2708)), "2.7.8");     // NCCL before 2.9
  EXPECT_EQ(to_string(nccl_version(21003)), "2.10.3");
}

TEST(DoctorVersions, MismatchIsMajorMinorNotPatch) {
  EXPECT_TRUE(major_minor_differs({9, 19, 0}, {9, 18, 0}));
  EXPECT_TRUE(major_minor_differs({9, 19, 0}, {9, 18, 9}));
  EXPECT_TRUE(major_minor_differs({2, 28, 9}, {3, 28, 9}));
  EXPECT_FALSE(major_minor_differs({9, 19, 0}, {9, 19, 1}));
  EXPECT_FALSE(major_minor_differs({13, 1, 0}, {13, 1, 0}));

  const std::string bad = version_line("cuDNN", cudnn_version(91900), cudnn_version(91800));
  EXPECT_NE(bad.find("compiled 9.19.0"), std::string::npos) << bad;
  EXPECT_NE(bad.find("loaded 9.18.0"), std::string::npos) << bad;
  EXPECT_NE(bad.find("MISMATCH"), std::string::npos) << bad;
  const std::string ok = version_line("cuDNN", cudnn_version(91900), cudnn_version(91901));
  EXPECT_EQ(ok.find("MISMATCH"), std::string::npos) << ok;
}

TEST(DoctorVersions, DriverVersionFromProcText) {
  EXPECT_EQ(nvidia_driver_version("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Thu Oct 30 "
                                  "2025\nGCC version:  gcc version 13.3.0\n"),
            "580.159.04");
  EXPECT_EQ(nvidia_driver_version("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release "
                                  "Build  (dvs-builder@U16)\n"),
            "570.86.15");
  EXPECT_EQ(nvidia_driver_version(""), "");
  EXPECT_EQ(nvidia_driver_version("no version here\n1.2.3"), "");  // only the first line counts
}

TEST(DoctorBf16, RoundsToNearestEvenAndBack) {
  EXPECT_EQ(to_bf16_bits(1.0f), 0x3f80);
  EXPECT_EQ(from_bf16_bits(0x3f80), 1.0f);
  EXPECT_EQ(to_bf16_bits(-2.0f), 0xc000);
  // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: ties go to the even significand (1.0).
  EXPECT_EQ(from_bf16_bits(to_bf16_bits(1.0f + 0x1p-8f)), 1.0f);
  EXPECT_EQ(from_bf16_bits(to_bf16_bits(1.0f + 0x1.8p-8f)), 1.0f + 0x1p-7f);
}

TEST(DoctorCompare, Bf16RoundingOfRandomValuesIsWithinTolerance) {
  Rng rng(7, "doctor.test");
  std::vector<float> got;
  std::vector<double> ref;
  for (int i = 0; i < 10000; ++i) {
    const double v = rng.normal() * 3.0;
    ref.push_back(v);
    got.push_back(from_bf16_bits(to_bf16_bits(static_cast<float>(v))));
  }
  const Comparison c = compare(got, ref, {0x1p-7, 0.0});
  EXPECT_TRUE(c.pass()) << describe(c);
  EXPECT_EQ(c.count, 10000u);
  EXPECT_GT(c.max_abs_err, 0.0);            // rounding did move values...
  EXPECT_LE(c.worst_ratio, 0.5 + 1e-9);     // ...by at most half a unit in the last place
}

TEST(DoctorCompare, FlagsAnElementJustOutside) {
  std::vector<double> ref = {1.0, -2.0, 4.0, 0.5};
  std::vector<float> got = {1.0f, -2.0f, 4.0f, 0.5f};
  const Tolerance tol{0x1p-7, 0x1p-10};  // allowed at [2]: 4/128 + 4/1024 = 0.03515625
  got[2] = 4.0f + 0.035f;
  EXPECT_TRUE(compare(got, ref, tol).pass());
  got[2] = 4.0f + 0.036f;
  const Comparison c = compare(got, ref, tol);
  EXPECT_FALSE(c.pass());
  EXPECT_EQ(c.failures, 1u);
  EXPECT_EQ(c.worst_index, 2u);
  EXPECT_GT(c.worst_ratio, 1.0);
  EXPECT_NE(describe(c).find("1 of 4 outside"), std::string::npos) << describe(c);
}

TEST(DoctorCompare, NanSizeMismatchAndEmptyFail) {
  const Tolerance loose{1.0, 1.0};
  EXPECT_FALSE(compare({1.0f, NAN}, {1.0, 1.0}, loose).pass());
  EXPECT_EQ(compare({1.0f, NAN}, {1.0, 1.0}, loose).worst_index, 1u);
  EXPECT_FALSE(compare({INFINITY}, {1.0}, loose).pass());
  EXPECT_FALSE(compare({1.0f}, {1.0, 2.0}, loose).pass());
  EXPECT_FALSE(compare({}, {}, loose).pass());
  // Zero tolerance: exact values pass (the all-reduce check), anything else fails.
  EXPECT_TRUE(compare({3.0f, -5.0f}, {3.0, -5.0}, {0.0, 0.0}).pass());
  EXPECT_FALSE(compare({3.0f, -5.0f}, {3.0, -4.0}, {0.0, 0.0}).pass());
}

TEST(DoctorReport, LinesAndExitStatus) {
  const CheckResult pass{"gemm", true, "700 TFLOP/s"}, fail{"attention", false, "max |err| 1"};
  EXPECT_EQ(check_line(pass), "  PASS  gemm: 700 TFLOP/s");
  EXPECT_EQ(check_line(fail), "  FAIL  attention: max |err| 1");
  EXPECT_EQ(exit_status({pass, pass}), 0);
  EXPECT_EQ(exit_status({pass, fail}), 1);
  EXPECT_EQ(exit_status({}), 1);  // nothing checked is not a pass
  EXPECT_EQ(summary_line({pass, pass}), "laoyao doctor: all 2 checks passed");
  EXPECT_EQ(summary_line({pass, fail, fail}), "laoyao doctor: 2 of 3 checks FAILED");
}

TEST(DoctorReport, MedianAndTflops) {
  EXPECT_DOUBLE_EQ(median({3.0, 1.0, 2.0}), 2.0);
  EXPECT_DOUBLE_EQ(median({4.0, 1.0, 3.0, 2.0}), 2.5);
  EXPECT_TRUE(std::isnan(median({})));
  EXPECT_NEAR(tflops(2.0 * 4096.0 * 4096.0 * 4096.0, 2e-4), 687.19, 0.01);
}

// The binary, as a user runs it, with no GPU visible (CUDA_VISIBLE_DEVICES empty hides every GPU,
// so this holds on the GPU machine too): one line saying so, exit status 1.
TEST(DoctorCommand, NoGpuIsOneLineAndExitOne) {
  const auto r = test::run_laoyao({"doctor"}, ".", "CUDA_VISIBLE_DEVICES=");
  EXPECT_EQ(r.status, 1) << r.output;
  ASSERT_FALSE(r.output.empty());
  EXPECT_EQ(r.output.find('\n'), r.output.size() - 1) << "expected exactly one line:\n" << r.output;
  EXPECT_NE(r.output.find("laoyao doctor: no"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("GPU"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("PASS"), std::string::npos) << r.output;
}

// --no-gpu (the container recipe's last step): the CPU ops, the FP8 casts and, in a CUDA build, the
// libraries loaded, each a PASS line; exit 0 with no GPU visible. The seed is printed and repeats.
TEST(DoctorCommand, NoGpuChecksTheBuildWithoutAGpu) {
  const auto r = test::run_laoyao({"doctor", "--no-gpu", "--seed", "42"}, ".", "CUDA_VISIBLE_DEVICES=");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("--seed 42"), std::string::npos) << r.output;
  for (const char* check : {"PASS  cpu gemm", "PASS  cpu causal attention", "PASS  fp8 casts", "checks passed"})
    EXPECT_NE(r.output.find(check), std::string::npos) << check << "\n" << r.output;
  EXPECT_EQ(r.output.find("FAIL"), std::string::npos) << r.output;
  if (r.output.find("CUDA backend is built") != std::string::npos) {
    EXPECT_NE(r.output.find("PASS  CUDA libraries loaded"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("PASS  CUDA device code: sm_90"), std::string::npos) << r.output;
  }
}

TEST(DoctorCommand, HelpAndBadOptions) {
  const auto help = test::run_laoyao({"doctor", "--help"});
  EXPECT_EQ(help.status, 0) << help.output;
  EXPECT_NE(help.output.find("all-reduce"), std::string::npos) << help.output;
  EXPECT_NE(help.output.find("--no-gpu"), std::string::npos) << help.output;

  const auto bad = test::run_laoyao({"doctor", "--sed", "3"}, ".", "CUDA_VISIBLE_DEVICES=");
  EXPECT_EQ(bad.status, 2) << bad.output;
  EXPECT_NE(bad.output.find("--sed"), std::string::npos) << bad.output;
  EXPECT_NE(bad.output.find("did you mean --seed"), std::string::npos) << bad.output;

  const auto bad_seed = test::run_laoyao({"doctor", "--seed", "x1"}, ".", "CUDA_VISIBLE_DEVICES=");
  EXPECT_EQ(bad_seed.status, 2) << bad_seed.output;
  EXPECT_NE(bad_seed.output.find("--seed"), std::string::npos) << bad_seed.output;

  const auto listed = test::run_laoyao({"--help"});
  EXPECT_NE(listed.output.find("doctor"), std::string::npos) << listed.output;
}

}  // namespace
}  // namespace laoyao::cli::doctor
