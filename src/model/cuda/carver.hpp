// Carves one device allocation into 256-byte aligned pieces: run the same sequence of take() calls
// once with base == nullptr to measure, allocate `used` bytes, then again over the allocation to
// hand out the pointers. A piece of no elements still gets an address (nothing may be stored there).
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace laoyao::model {

struct Carver {
  char* base = nullptr;
  size_t used = 0;
  template <class T>
  T* take(int64_t count) {
    const size_t off = used;
    used += (static_cast<size_t>(std::max<int64_t>(count, 0)) * sizeof(T) + 255) / 256 * 256;
    return base ? reinterpret_cast<T*>(base + off) : nullptr;
  }
};

}  // namespace laoyao::model
