// laoyao's own random numbers (initial weights, dropout). Megatron's distributions carry over
// (normal with init_method_std, ...); PyTorch's streams do not, and cannot be reproduced outside
// PyTorch, so parity runs load Megatron's dumped initial weights instead.
//
// A stream is keyed by (seed, name): a parameter's initial values depend only on the seed and its
// Megatron-Core name, never on construction order, rank or parallel layout.
#pragma once
#include <cstdint>
#include <string_view>

namespace laoyao {

class Rng {
 public:
  Rng(uint64_t seed, std::string_view stream);
  uint64_t next_u64();           // SplitMix64
  double uniform();              // [0, 1), 53 random bits
  double normal();               // N(0, 1), Box-Muller

 private:
  uint64_t state_;
  double spare_ = 0;
  bool has_spare_ = false;
};

// 64-bit FNV-1a of a string, for stream keys.
uint64_t fnv1a64(std::string_view s);

// The starting state of stream (seed, name). SplitMix64 is counter-based: the i-th value (from 0)
// of a stream is splitmix64_mix(key + (i + 1) * kSplitMixGamma), so a GPU kernel can draw element i
// of a dropout mask on its own and get the CPU's value bit for bit.
constexpr uint64_t kSplitMixGamma = 0x9E3779B97F4A7C15ull;
uint64_t rng_stream_key(uint64_t seed, std::string_view stream);

// Round-to-nearest-even to bfloat16 and back (what a bf16 copy of an fp32 value holds).
float round_to_bf16(float x);

}  // namespace laoyao
