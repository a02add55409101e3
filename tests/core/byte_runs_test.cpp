// Flag bytes painted a window at a time (core/byte_runs.hpp) are the whole array painted at once:
// zeros, then each run in order, overlapping runs and runs past the array included.
#include "core/byte_runs.hpp"

#include <gtest/gtest.h>

#include <vector>

#include "core/rng.hpp"

namespace laoyao {

TEST(ByteRuns, WindowsPaintTheWholeArrayAsItsRunsInOrder) {
  Rng rng(5, "byte_runs");
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t n = 1 + static_cast<int64_t>(rng.next_u64() % 300);
    std::vector<ByteRun> runs;
    for (int k = 0; k < 1 + trial % 7; ++k) {
      const int64_t offset = static_cast<int64_t>(rng.next_u64() % static_cast<uint64_t>(n + 10));
      const int64_t count = static_cast<int64_t>(rng.next_u64() % 50);
      runs.push_back({offset, count, static_cast<uint8_t>(rng.next_u64() % 3)});
    }
    std::vector<uint8_t> want(static_cast<size_t>(n), 0);  // naive: every run over the whole array
    for (const ByteRun& r : runs)
      for (int64_t i = r.offset; i < r.offset + r.count && i < n; ++i) want[static_cast<size_t>(i)] = r.value;
    const int64_t window = 1 + static_cast<int64_t>(rng.next_u64() % static_cast<uint64_t>(n));
    std::vector<uint8_t> got(static_cast<size_t>(n), 9);
    for (int64_t w0 = 0; w0 < n; w0 += window)
      paint_byte_runs(got.data() + w0, w0, std::min(window, n - w0), runs);
    ASSERT_EQ(got, want) << "trial " << trial << ", window " << window;
  }
}

}  // namespace laoyao
