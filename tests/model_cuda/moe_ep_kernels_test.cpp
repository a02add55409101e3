// Expert parallelism's row groups (src/kernels/cuda/moe_ep.hpp) against a host version: random
// counts with empty chunks. GPU only (device 0).
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

// Rank me's source-major groups, the order the all-to-all delivers them: group s * El + e holds
// source s's rows for local expert e. The groups of local expert e, taken in group order, are its
// rows in the CPU stage's expert-major order (model/moe_expert_parallel.cpp: source 0's, then 1's).
TEST_F(CudaMoeEp, SourceOffsetsFollowTheAllToAllsOrder) {
  for (const auto& [P, E] : std::vector<std::pair<int64_t, int64_t>>{{2, 8}, {4, 64}, {8, 512}, {1, 16}}) {
    const std::vector<int32_t> counts = random_counts(P, E, static_cast<uint64_t>(P * 1000 + E));
    auto dcounts = to_device(counts);
    const int64_t El = E / P;
    for (int64_t me : {int64_t{0}, P - 1}) {
      SCOPED_TRACE("P " + std::to_string(P) + ", E " + std::to_string(E) + ", rank " + std::to_string(me));
      DeviceBuffer doff((E + 1) * sizeof(int32_t));
      cuda::moe_ep_source_offsets(dcounts.as<int32_t>(), P, E, me, doff.as<int32_t>(), stream_);
      sync();
      const std::vector<int32_t> off = from_device<int32_t>(doff, static_cast<size_t>(E + 1));
      int32_t at = 0;
      for (int64_t s = 0; s < P; ++s)
        for (int64_t e = 0; e < El; ++e) {
          EXPECT_EQ(off[s * El + e], at) << "offset of source " << s << "'s rows for local expert " << e;
          at += counts[s * E + me * El + e];
        }
      EXPECT_EQ(off[E], at);
      for (int64_t g = 0; g < E; ++g) EXPECT_LE(off[g], off[g + 1]);
    }
  }
}

TEST_F(CudaMoeEp, BadShapesThrow) {
  DeviceBuffer counts(8 * sizeof(int32_t)), off(9 * sizeof(int32_t));
  EXPECT_THROW(cuda::moe_ep_source_offsets(counts.as<int32_t>(), 3, 8, 0, off.as<int32_t>(), stream_),
               Error);  // 8 experts over 3 ranks
  EXPECT_THROW(cuda::moe_ep_source_offsets(counts.as<int32_t>(), 2, 8, 2, off.as<int32_t>(), stream_),
               Error);  // rank outside the group
  EXPECT_THROW(cuda::moe_ep_source_offsets(counts.as<int32_t>(), 2, 1024, 0, off.as<int32_t>(), stream_),
               Error);  // more experts than the router takes
}

}  // namespace
}  // namespace laoyao::kernels::cuda_test
