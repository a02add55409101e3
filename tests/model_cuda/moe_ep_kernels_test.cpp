// Expert parallelism's reorders (src/kernels/cuda/moe_ep.hpp) against a host version of the CPU
// stage's row order (model/moe_expert_parallel.cpp): random counts with empty chunks, random bf16
// rows; the reorders move bits, so the results must be identical. GPU only (device 0).
#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/rng.hpp"
#include "kernels/cuda/device_buffer.hpp"
#include "kernels/cuda/moe_ep.hpp"
#include "cuda_test_util.hpp"

namespace laoyao::kernels::cuda_test {
namespace {

using CudaMoeEp = CudaStreamTest;

// counts [P][E]: about a quarter of them zero (empty chunks), the rest 1..9.
std::vector<int32_t> random_counts(int64_t P, int64_t E, uint64_t seed) {
  Rng rng(seed, "moe_ep.counts");
  std::vector<int32_t> c(static_cast<size_t>(P * E));
  for (auto& v : c) v = rng.next_u64() % 4 == 0 ? 0 : static_cast<int32_t>(1 + rng.next_u64() % 9);
  return c;
}

// The expert-major order's source-major row for each of rank me's rows.
std::vector<int64_t> expert_major_sources(const std::vector<int32_t>& c, int64_t P, int64_t E, int64_t me) {
  const int64_t El = E / P;
  std::vector<int64_t> start(static_cast<size_t>(P * El));  // source-major chunk starts
  int64_t at = 0;
  for (int64_t s = 0; s < P; ++s)
    for (int64_t e = 0; e < El; ++e) start[s * El + e] = at, at += c[s * E + me * El + e];
  std::vector<int64_t> src;
  for (int64_t e = 0; e < El; ++e)
    for (int64_t s = 0; s < P; ++s)
      for (int64_t i = 0; i < c[s * E + me * El + e]; ++i) src.push_back(start[s * El + e] + i);
  return src;
}

TEST_F(CudaMoeEp, SortChunksMatchTheCpuStagesOrderAndInvert) {
  for (const auto& [P, E] : std::vector<std::pair<int64_t, int64_t>>{{2, 8}, {4, 64}, {8, 512}, {1, 16}}) {
    const int64_t H = 136;  // a multiple of 8, not of 32 vectors
    const std::vector<int32_t> counts = random_counts(P, E, static_cast<uint64_t>(P * 1000 + E));
    auto dcounts = to_device(counts);
    for (int64_t me : {int64_t{0}, P - 1}) {
      SCOPED_TRACE("P " + std::to_string(P) + ", E " + std::to_string(E) + ", rank " + std::to_string(me));
      const std::vector<int64_t> src = expert_major_sources(counts, P, E, me);
      const auto R = static_cast<int64_t>(src.size());
      ASSERT_GT(R, 0);
      const auto rows = randn_bf16(static_cast<size_t>(R * H), 31, "moe_ep.rows");
      std::vector<float> want(rows.size());
      for (int64_t r = 0; r < R; ++r)
        for (int64_t h = 0; h < H; ++h) want[r * H + h] = rows[src[r] * H + h];
      auto din = to_device_bf16(rows);
      DeviceBuffer sorted(rows.size() * sizeof(bf16)), back(rows.size() * sizeof(bf16));
      cuda::moe_ep_sort_chunks(din.as<bf16>(), sorted.as<bf16>(), dcounts.as<int32_t>(), P, E, me, R, H, true,
                               stream_);
      cuda::moe_ep_sort_chunks(sorted.as<bf16>(), back.as<bf16>(), dcounts.as<int32_t>(), P, E, me, R, H, false,
                               stream_);
      const int64_t El = E / P;
      DeviceBuffer doff((El + 1) * sizeof(int32_t));
      cuda::moe_ep_local_offsets(dcounts.as<int32_t>(), P, E, me, doff.as<int32_t>(), stream_);
      sync();
      expect_equal(from_device_bf16(sorted, rows.size()), want, "expert-major rows");
      expect_equal(from_device_bf16(back, rows.size()), rows, "source-major again");
      std::vector<int32_t> off = from_device<int32_t>(doff, static_cast<size_t>(El + 1));
      int32_t at = 0;
      for (int64_t e = 0; e < El; ++e) {
        EXPECT_EQ(off[e], at) << "offset of local expert " << e;
        for (int64_t s = 0; s < P; ++s) at += counts[s * E + me * El + e];
      }
      EXPECT_EQ(off[El], R);
    }
  }
}

TEST_F(CudaMoeEp, BadShapesThrow) {
  DeviceBuffer rows(64 * sizeof(bf16)), counts(8 * sizeof(int32_t));
  EXPECT_THROW(cuda::moe_ep_sort_chunks(rows.as<bf16>(), rows.as<bf16>() + 16, counts.as<int32_t>(), 3, 8, 0, 1, 16,
                                        true, stream_),
               Error);  // 8 experts over 3 ranks
  EXPECT_THROW(cuda::moe_ep_sort_chunks(rows.as<bf16>(), rows.as<bf16>() + 16, counts.as<int32_t>(), 2, 8, 2, 1, 16,
                                        true, stream_),
               Error);  // rank outside the group
  EXPECT_THROW(cuda::moe_ep_sort_chunks(rows.as<bf16>(), rows.as<bf16>() + 16, counts.as<int32_t>(), 2, 8, 0, 1, 12,
                                        true, stream_),
               Error);  // rows not of 16-byte vectors
  EXPECT_THROW(cuda::moe_ep_local_offsets(counts.as<int32_t>(), 2, 1024, 0, counts.as<int32_t>(), stream_), Error);
}

}  // namespace
}  // namespace laoyao::kernels::cuda_test
