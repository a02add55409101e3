// Flag bytes described as runs (a parameter's weight-decay flag, whether a rank counts it in the
// norms): painted into a window of a larger array, so that an array the size of a model is built a
// bounded window at a time (kernels/cuda/device_buffer.hpp upload_byte_runs).
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

namespace laoyao {

// A run of equal bytes: `count` bytes of `value` from `offset`.
struct ByteRun {
  int64_t offset = 0, count = 0;
  uint8_t value = 0;
};

// out[0, count) = bytes [first, first + count) of the array that is zero everywhere, then each run's
// value over its bytes, in order (a later run wins).
inline void paint_byte_runs(uint8_t* out, int64_t first, int64_t count, const std::vector<ByteRun>& runs) {
  std::fill(out, out + count, uint8_t{0});
  for (const ByteRun& r : runs) {
    const int64_t lo = std::max(r.offset, first), hi = std::min(r.offset + r.count, first + count);
    if (lo < hi) std::fill(out + (lo - first), out + (hi - first), r.value);
  }
}

}  // namespace laoyao
