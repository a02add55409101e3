// Standard normal values drawn by index from a counter-based stream (key = rng_stream_key(seed,
// name), core/rng.hpp): element i is Box-Muller on the stream's uniforms 2i and 2i+1 (SplitMix64
// steps, 53 bits each), in double, rounded once to float. Any element can be drawn on its own, so a
// GPU kernel and the CPU draw the same values (the GPU's double log, sqrt and cos may differ from
// the host's in the last bit, far below the float rounding). Used for Megatron's
// --moe-router-force-load-balancing (random router logits).
#pragma once
#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#define LAOYAO_HOST_DEVICE __host__ __device__
#else
#define LAOYAO_HOST_DEVICE
#endif

namespace laoyao {

// The j-th uniform of stream `key`, in [0, 1) (Rng::uniform's j-th value for that key).
LAOYAO_HOST_DEVICE inline double counter_uniform(uint64_t key, uint64_t j) {
  uint64_t z = key + (j + 1) * 0x9E3779B97F4A7C15ull;  // kSplitMixGamma
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

LAOYAO_HOST_DEVICE inline float counter_normal(uint64_t key, uint64_t i) {
  const double u1 = 1.0 - counter_uniform(key, 2 * i);  // (0, 1]: the log stays finite
  const double u2 = counter_uniform(key, 2 * i + 1);
  return static_cast<float>(::sqrt(-2.0 * ::log(u1)) * ::cos(6.283185307179586476925 * u2));
}

}  // namespace laoyao
