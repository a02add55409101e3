// Dropout masks on the GPU, bit for bit the CPU's (core/rng.hpp): element i of stream `key` keeps
// its value unless uniform(i) < p, and a kept value is scaled by 1/(1-p) (inverted dropout, as
// torch.nn.functional.dropout). uniform(i) = (splitmix64(key + (i+1)*gamma) >> 11) * 2^-53.
#pragma once
#include <cstdint>

#include "core/rng.hpp"

namespace laoyao::kernels::cuda {

// p == 0 means no dropout: kernels skip the mask entirely.
struct DropoutSpec {
  uint64_t key = 0;  // laoyao::rng_stream_key(seed, stream name)
  double p = 0.0;  // compared in double, as the CPU compares
  float keep_scale = 1.0f;  // float(1 / (1 - p)), computed on the host in double like the CPU's
  // A kernel's element i is element `map(i)` of the whole model's mask, so that a tensor-parallel
  // rank draws its slice of what one rank would: runs of `run` elements, run k starting at
  // k * stride + offset (this rank's heads of every sequence, or its share of every sequence under
  // sequence parallelism). run == 0: the identity.
  uint64_t run = 0, stride = 0, offset = 0;
};

// A rank's slice of a whole mask made of runs of `whole_run` elements (per sequence: all heads, or
// all positions x hidden): it holds the `part`-th of `parts` equal pieces of every run.
inline DropoutSpec sliced(DropoutSpec d, uint64_t whole_run, uint64_t part, uint64_t parts) {
  if (parts <= 1) return d;
  d.run = whole_run / parts;
  d.stride = whole_run;
  d.offset = part * d.run;
  return d;
}

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
