// Dropout masks on the GPU, bit for bit the CPU's (core/rng.hpp): element i of stream `key` keeps
// its value unless uniform(i) < p, and a kept value is scaled by 1/(1-p) (inverted dropout, as
// torch.nn.functional.dropout). uniform(i) = (splitmix64(key + (i+1)*gamma) >> 11) * 2^-53.
#pragma once
#include <cstdint>

#include "core/dropout_spec.hpp"
#include "core/rng.hpp"

namespace laoyao::kernels::cuda {

using laoyao::DropoutSpec;  // core/dropout_spec.hpp: the spec every backend draws a mask from
using laoyao::sliced;

__device__ __forceinline__ float dropout_factor(const DropoutSpec& d, uint64_t i) {
  if (d.run) i = i / d.run * d.stride + d.offset + i % d.run;
  uint64_t z = d.key + (i + 1) * kSplitMixGamma;  // core/rng.cpp's SplitMix64, step i
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  const double u = static_cast<double>(z >> 11) * 0x1.0p-53;
  return u < d.p ? 0.0f : d.keep_scale;
}

}  // namespace laoyao::kernels::cuda
