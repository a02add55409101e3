// What the CUDA kernel tests share: random host data from named streams, host/device copies, the
// element-wise checks with their tolerance rules (kernels_test.cpp's header explains them), and a
// fixture with a stream of device 0.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "core/rng.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/device_buffer.hpp"

namespace laoyao::kernels::cuda_test {

using bf16 = __nv_bfloat16;
using cuda::DeviceBuffer;

constexpr double kBf16Rel = 1.0 / 128.0;  // 2^-7: twice bf16's unit roundoff
constexpr double kFp32Sum = 2e-5;         // times the sum of |terms| of an fp32 reduction

// ---- host data

// n draws of mean + stddev * N(0, 1) from stream (seed, name), as fp32.
inline std::vector<float> randn(size_t n, uint64_t seed, std::string_view name, double stddev = 1.0,
                                double mean = 0.0) {
  Rng rng(seed, name);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(mean + stddev * rng.normal());
  return v;
}

// The same, rounded to bf16 (what a bf16 tensor on the device holds).
inline std::vector<float> randn_bf16(size_t n, uint64_t seed, std::string_view name, double stddev = 1.0,
                                     double mean = 0.0) {
  auto v = randn(n, seed, name, stddev, mean);
  for (auto& x : v) x = round_to_bf16(x);
  return v;
}

// Host conversions (the values are bf16 already, so to_bf16 is exact).
inline std::vector<bf16> to_bf16(const std::vector<float>& v) {
  std::vector<bf16> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = __float2bfloat16(v[i]);
  return out;
}

inline std::vector<float> to_float(const std::vector<bf16>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = __bfloat162float(v[i]);
  return out;
}

inline std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// ---- device data

// A device copy of v (at least one byte, so that an empty tensor still has an aligned address).
template <class T>
DeviceBuffer to_device(const std::vector<T>& v) {
  DeviceBuffer d(std::max<size_t>(v.size() * sizeof(T), 1));
  d.upload(v.data(), v.size() * sizeof(T));
  return d;
}

inline DeviceBuffer to_device_bf16(const std::vector<float>& v) { return to_device(to_bf16(v)); }

template <class T>
std::vector<T> from_device(const DeviceBuffer& d, size_t n) {
  std::vector<T> v(n);
  d.download(v.data(), n * sizeof(T));
  return v;
}

inline std::vector<float> from_device_bf16(const DeviceBuffer& d, size_t n) {
  return to_float(from_device<bf16>(d, n));
}

// ---- checks

inline double max_abs(const std::vector<double>& v) {
  double m = 0.0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

// |got[i] - want[i]| <= tol[i] for every i; reports the count of failures and the worst element
// (largest error / tolerance). NaN (an unwritten, poisoned element) fails.
inline void expect_within(const std::vector<float>& got, const std::vector<double>& want,
                          const std::vector<double>& tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  ASSERT_EQ(tol.size(), want.size()) << what;
  if (want.empty()) return;
  size_t bad = 0, worst_i = 0;
  double worst = -1.0;
  for (size_t i = 0; i < want.size(); ++i) {
    double err = std::abs(static_cast<double>(got[i]) - want[i]);
    if (std::isnan(err)) err = std::numeric_limits<double>::infinity();
    const double ratio = tol[i] > 0 ? err / tol[i] : (err > 0 ? std::numeric_limits<double>::infinity() : 0.0);
    if (ratio > 1.0) ++bad;
    if (ratio > worst) worst = ratio, worst_i = i;
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << want.size() << " elements out of tolerance; worst element "
                     << worst_i << " got " << got[worst_i] << " want " << want[worst_i] << " tolerance "
                     << tol[worst_i] << " (error / tolerance " << worst << ")";
}

// bf16 output rounded once from fp32 math: |got - want| <= 2^-7 |want| + abs_frac * max|want|.
inline void expect_bf16_close(const std::vector<float>& got, const std::vector<double>& want, double abs_frac,
                              const std::string& what) {
  const double floor = abs_frac * max_abs(want);
  std::vector<double> tol(want.size());
  for (size_t i = 0; i < want.size(); ++i) tol[i] = kBf16Rel * std::abs(want[i]) + floor;
  expect_within(got, want, tol, what);
}

// Bit-for-bit equal as values (+0 == -0; NaN fails).
inline void expect_equal(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < want.size(); ++i)
    if (!(got[i] == want[i]) && bad++ == 0) first = i;
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << want.size() << " elements differ; first " << first << " got "
                     << got[first] << " want " << want[first];
}

// Every test runs its ops on a created (blocking) stream of device 0. Uploads are cudaMemcpy on the
// legacy default stream, which a blocking stream's later work waits for; sync() before reading.
class CudaStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    LAOYAO_CUDA_CHECK(cudaSetDevice(0));
    LAOYAO_CUDA_CHECK(cudaStreamCreate(&stream_));
  }
  void TearDown() override {
    if (stream_) LAOYAO_CUDA_CHECK(cudaStreamDestroy(stream_));
  }
  void sync() const { LAOYAO_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

  cudaStream_t stream_ = nullptr;
};

}  // namespace laoyao::kernels::cuda_test
