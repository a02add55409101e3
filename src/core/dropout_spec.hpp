// Which dropout mask an op applies, as every backend draws it (the CUDA kernels by
// kernels/cuda/dropout_rng.cuh's device twin of dropout_factor): element i of a site's mask is
// element i of the counter-based stream (seed, site name) (core/rng.hpp), 0 with probability p and
// 1 / (1 - p) otherwise, so the CPU and the GPU draw the same masks, and a tensor-parallel rank its
// slice of what one rank would draw.
#pragma once
#include <cstdint>

#include "core/rng.hpp"

namespace laoyao {

// p == 0 means no dropout: ops skip the mask entirely.
struct DropoutSpec {
  uint64_t key = 0;         // rng_stream_key(seed, site name)
  double p = 0.0;           // compared in double
  float keep_scale = 1.0f;  // float(1 / (1 - p)), computed in double
  // Element i of the op is element map(i) of the whole model's mask: runs of `run` elements, run k
  // starting at k * stride + offset (this rank's heads of every sequence, or its share of every
  // sequence under sequence parallelism). run == 0: the identity.
  uint64_t run = 0, stride = 0, offset = 0;
  // Then, under context parallelism, that index (in this rank's chunks) becomes the whole
  // sequence's: blocks of 2 cp_unit elements (a sequence's rows, or a head's query rows) hold this
  // rank's two chunks, cp_rank and 2 cp_size - 1 - cp_rank, of cp_unit elements each, out of the
  // whole block's 2 cp_size. cp_unit == 0: none (CPU backend only: the CUDA one refuses CP).
  uint64_t cp_unit = 0, cp_size = 1, cp_rank = 0;
};

inline DropoutSpec dropout_spec(double p, uint64_t seed, const char* site) {
  DropoutSpec d;
  if (p <= 0) return d;
  d.key = rng_stream_key(seed, site);
  d.p = p;
  d.keep_scale = static_cast<float>(1.0 / (1.0 - p));
  return d;
}

// A rank's slice of a whole mask made of runs of `whole_run` elements (per sequence: all heads, or
// all positions x hidden): the `part`-th of `parts` equal pieces of every run.
inline DropoutSpec sliced(DropoutSpec d, uint64_t whole_run, uint64_t part, uint64_t parts) {
  if (parts <= 1) return d;
  d.run = whole_run / parts;
  d.stride = whole_run;
  d.offset = part * d.run;
  return d;
}

// The mask's value at element i (core/rng.cpp's SplitMix64 step, as Rng::uniform).
// A rank's chunks of every sequence (context parallelism): `unit` elements a chunk.
inline DropoutSpec context_parallel(DropoutSpec d, uint64_t unit, uint64_t cp_rank, uint64_t cp_size) {
  if (cp_size <= 1) return d;
  d.cp_unit = unit, d.cp_rank = cp_rank, d.cp_size = cp_size;
  return d;
}

inline float dropout_factor_host(const DropoutSpec& d, uint64_t i) {
  if (d.run) i = i / d.run * d.stride + d.offset + i % d.run;
  if (d.cp_unit) {
    const uint64_t block = i / (2 * d.cp_unit), r = i % (2 * d.cp_unit), half = r / d.cp_unit;
    const uint64_t chunk = half == 0 ? d.cp_rank : 2 * d.cp_size - 1 - d.cp_rank;
    i = block * 2 * d.cp_size * d.cp_unit + chunk * d.cp_unit + r % d.cp_unit;
  }
  uint64_t z = d.key + (i + 1) * kSplitMixGamma;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  const double u = static_cast<double>(z >> 11) * 0x1.0p-53;
  return u < d.p ? 0.0f : d.keep_scale;
}

}  // namespace laoyao
