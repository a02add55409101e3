#include "data/numpy_random.hpp"

#include <string>

#include "core/error.hpp"

namespace laoyao::data {

// ---------------------------------------------------------------------------------------------
// SeedSequence (numpy/random/bit_generator.pyx): hash every entropy word into a 4-word pool,
// cross-mix the pool, then stretch it into output words with a second hash.

namespace {

constexpr uint32_t kInitA = 0x43b0d7e5u;
constexpr uint32_t kMultA = 0x931e8875u;
constexpr uint32_t kInitB = 0x8b51f9ddu;
constexpr uint32_t kMultB = 0x58f38dedu;
constexpr uint32_t kMixMultL = 0xca01f9ddu;
constexpr uint32_t kMixMultR = 0x4973f715u;
constexpr int kXShift = 16;  // 32-bit words / 2

// numpy's hashmix: the multiplier `hash_const` advances on every call.
uint32_t hashmix(uint32_t value, uint32_t& hash_const) {
  value ^= hash_const;
  hash_const *= kMultA;
  value *= hash_const;
  value ^= value >> kXShift;
  return value;
}

uint32_t mix(uint32_t x, uint32_t y) {
  uint32_t result = kMixMultL * x - kMixMultR * y;
  result ^= result >> kXShift;
  return result;
}

std::vector<uint32_t> u64_to_words(uint64_t n) {
  // numpy's _int_to_uint32_array: 0 -> [0]; otherwise 32-bit words, least significant first.
  if (n == 0) return {0};
  std::vector<uint32_t> words;
  while (n > 0) {
    words.push_back(static_cast<uint32_t>(n & 0xffffffffu));
    n >>= 32;
  }
  return words;
}

}  // namespace

SeedSequence::SeedSequence(uint64_t entropy) : SeedSequence(u64_to_words(entropy)) {}

SeedSequence::SeedSequence(const std::vector<uint32_t>& entropy) {
  if (entropy.empty()) throw Error("SeedSequence: empty entropy");
  // mix_entropy: hash the first pool-size words (zeros past the end) into the pool...
  uint32_t hash_const = kInitA;
  for (int i = 0; i < kPoolSize; ++i) {
    const uint32_t word = i < static_cast<int>(entropy.size()) ? entropy[i] : 0u;
    pool_[i] = hashmix(word, hash_const);
  }
  // ...mix every pool word into every other one...
  for (int src = 0; src < kPoolSize; ++src) {
    for (int dst = 0; dst < kPoolSize; ++dst) {
      if (src != dst) pool_[dst] = mix(pool_[dst], hashmix(pool_[src], hash_const));
    }
  }
  // ...and fold in the entropy words that did not fit in the pool.
  for (size_t src = kPoolSize; src < entropy.size(); ++src) {
    for (int dst = 0; dst < kPoolSize; ++dst) {
      pool_[dst] = mix(pool_[dst], hashmix(entropy[src], hash_const));
    }
  }
}

std::vector<uint32_t> SeedSequence::generate_state_u32(int64_t n_words) const {
  std::vector<uint32_t> out(static_cast<size_t>(n_words));
  uint32_t hash_const = kInitB;
  for (int64_t i = 0; i < n_words; ++i) {
    uint32_t value = pool_[static_cast<size_t>(i % kPoolSize)];  // cycles over the pool
    value ^= hash_const;
    hash_const *= kMultB;
    value *= hash_const;
    value ^= value >> kXShift;
    out[static_cast<size_t>(i)] = value;
  }
  return out;
}

std::vector<uint64_t> SeedSequence::generate_state_u64(int64_t n_words) const {
  // numpy generates 2n uint32 words and views them as uint64 (little-endian: low word first).
  const std::vector<uint32_t> words = generate_state_u32(2 * n_words);
  std::vector<uint64_t> out(static_cast<size_t>(n_words));
  for (int64_t i = 0; i < n_words; ++i) {
    out[i] = static_cast<uint64_t>(words[2 * i]) | (static_cast<uint64_t>(words[2 * i + 1]) << 32);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// PCG64 (numpy/random/src/pcg64): state' = state * M + inc; output = rotr64(hi ^ lo, state >> 122).

namespace {

constexpr unsigned __int128 kPcgMultiplier =
    (static_cast<unsigned __int128>(2549297995355413924ULL) << 64) | 4865540595714422341ULL;

inline uint64_t rotr64(uint64_t value, unsigned rot) {
  return (value >> rot) | (value << ((-rot) & 63u));
}

}  // namespace

Pcg64::Pcg64(const SeedSequence& seed) {
  // PCG64._seed_seq.generate_state(4, uint64) -> seed = (w0 << 64) | w1, inc = (w2 << 64) | w3;
  // then pcg_setseq_128_srandom_r: state = 0, inc = (initseq << 1) | 1, step, state += seed, step.
  const std::vector<uint64_t> w = seed.generate_state_u64(4);
  const unsigned __int128 initstate = (static_cast<unsigned __int128>(w[0]) << 64) | w[1];
  const unsigned __int128 initseq = (static_cast<unsigned __int128>(w[2]) << 64) | w[3];
  state_ = 0;
  inc_ = (initseq << 1) | 1u;
  state_ = state_ * kPcgMultiplier + inc_;
  state_ += initstate;
  state_ = state_ * kPcgMultiplier + inc_;
}

uint64_t Pcg64::next_u64() {
  // pcg64_random_r: advance first, then output from the new state (XSL-RR).
  state_ = state_ * kPcgMultiplier + inc_;
  const auto hi = static_cast<uint64_t>(state_ >> 64);
  const auto lo = static_cast<uint64_t>(state_);
  return rotr64(hi ^ lo, static_cast<unsigned>(state_ >> 122));
}

uint32_t Pcg64::next_u32() {
  if (has_u32_) {
    has_u32_ = false;
    return u32_;
  }
  const uint64_t next = next_u64();
  has_u32_ = true;
  u32_ = static_cast<uint32_t>(next >> 32);
  return static_cast<uint32_t>(next & 0xffffffffu);
}

// ---------------------------------------------------------------------------------------------
// Generator.integers (numpy/random/_bounded_integers.pyx + distributions.c): the range is
// reduced to an unsigned `rng = high - low` (inclusive) and offset `off = low`; draws use
// Lemire's multiply-shift with rejection, on 32-bit draws whenever rng fits in 32 bits.

namespace {

// numpy's buffered_bounded_lemire_uint32 (the 32-bit buffering lives in Pcg64::next_u32).
uint32_t bounded_lemire_u32(Pcg64& bitgen, uint32_t rng) {
  const uint32_t rng_excl = rng + 1;
  uint64_t m = static_cast<uint64_t>(bitgen.next_u32()) * rng_excl;
  uint32_t leftover = static_cast<uint32_t>(m & 0xffffffffu);
  if (leftover < rng_excl) {
    const uint32_t threshold = (UINT32_MAX - rng) % rng_excl;
    while (leftover < threshold) {
      m = static_cast<uint64_t>(bitgen.next_u32()) * rng_excl;
      leftover = static_cast<uint32_t>(m & 0xffffffffu);
    }
  }
  return static_cast<uint32_t>(m >> 32);
}

// numpy's bounded_lemire_uint64.
uint64_t bounded_lemire_u64(Pcg64& bitgen, uint64_t rng) {
  const uint64_t rng_excl = rng + 1;
  unsigned __int128 m = static_cast<unsigned __int128>(bitgen.next_u64()) * rng_excl;
  uint64_t leftover = static_cast<uint64_t>(m);
  if (leftover < rng_excl) {
    const uint64_t threshold = (UINT64_MAX - rng) % rng_excl;
    while (leftover < threshold) {
      m = static_cast<unsigned __int128>(bitgen.next_u64()) * rng_excl;
      leftover = static_cast<uint64_t>(m);
    }
  }
  return static_cast<uint64_t>(m >> 64);
}

// random_bounded_uint32_fill without the masked variant (Generator uses Lemire).
uint32_t bounded_u32(Pcg64& bitgen, uint32_t rng) {
  if (rng == 0) return 0;  // no draw
  if (rng == UINT32_MAX) return bitgen.next_u32();
  return bounded_lemire_u32(bitgen, rng);
}

// random_bounded_uint64_fill without the masked variant.
uint64_t bounded_u64(Pcg64& bitgen, uint64_t rng) {
  if (rng == 0) return 0;  // no draw
  if (rng <= UINT32_MAX) return bounded_u32(bitgen, static_cast<uint32_t>(rng));
  if (rng == UINT64_MAX) return bitgen.next_u64();
  return bounded_lemire_u64(bitgen, rng);
}

void check_size(int64_t size) {
  if (size < 0) throw UsageError("Generator.integers: size must be >= 0, got " + std::to_string(size));
}

}  // namespace

std::vector<int32_t> Generator::integers_int32(int64_t low, int64_t high, int64_t size) {
  check_size(size);
  if (low >= high) {
    throw UsageError("Generator.integers: low (" + std::to_string(low) + ") must be < high (" +
                     std::to_string(high) + ")");
  }
  if (low < INT32_MIN || high > int64_t{INT32_MAX} + 1) {
    throw UsageError("Generator.integers: [" + std::to_string(low) + ", " + std::to_string(high) +
                     ") is out of bounds for int32");
  }
  const uint32_t rng = static_cast<uint32_t>(high) - 1u - static_cast<uint32_t>(low);
  const uint32_t off = static_cast<uint32_t>(low);
  std::vector<int32_t> out(static_cast<size_t>(size));
  for (auto& v : out) v = static_cast<int32_t>(off + bounded_u32(bitgen_, rng));
  return out;
}

std::vector<int64_t> Generator::integers_int64(int64_t low, int64_t high, int64_t size) {
  if (low >= high) {
    throw UsageError("Generator.integers: low (" + std::to_string(low) + ") must be < high (" +
                     std::to_string(high) + ")");
  }
  return integers_int64_closed(low, high - 1, size);
}

std::vector<int64_t> Generator::integers_int64_closed(int64_t low, int64_t high, int64_t size) {
  check_size(size);
  if (low > high) {
    throw UsageError("Generator.integers: low (" + std::to_string(low) + ") must be <= high (" +
                     std::to_string(high) + ") with endpoint=True");
  }
  const uint64_t rng = static_cast<uint64_t>(high) - static_cast<uint64_t>(low);
  const uint64_t off = static_cast<uint64_t>(low);
  std::vector<int64_t> out(static_cast<size_t>(size));
  for (auto& v : out) v = static_cast<int64_t>(off + bounded_u64(bitgen_, rng));
  return out;
}

Generator default_rng(uint64_t seed) { return Generator(SeedSequence(seed)); }

// ---------------------------------------------------------------------------------------------
// MT19937 (numpy/random/src/mt19937 and legacy seeding mt19937_seed).

Mt19937::Mt19937(uint32_t seed) {
  for (int pos = 0; pos < 624; ++pos) {
    key_[pos] = seed;
    seed = 1812433253u * (seed ^ (seed >> 30)) + static_cast<uint32_t>(pos + 1);
  }
  pos_ = 624;
}

void Mt19937::refill() {
  constexpr int kN = 624, kM = 397;
  constexpr uint32_t kMatrixA = 0x9908b0dfu, kUpper = 0x80000000u, kLower = 0x7fffffffu;
  for (int i = 0; i < kN; ++i) {
    const uint32_t y = (key_[i] & kUpper) | (key_[(i + 1) % kN] & kLower);
    key_[i] = key_[(i + kM) % kN] ^ (y >> 1) ^ ((y & 1u) ? kMatrixA : 0u);
  }
  pos_ = 0;
}

uint32_t Mt19937::next_u32() {
  if (pos_ == 624) refill();
  uint32_t y = key_[pos_++];
  y ^= y >> 11;
  y ^= (y << 7) & 0x9d2c5680u;
  y ^= (y << 15) & 0xefc60000u;
  y ^= y >> 18;
  return y;
}

uint64_t Mt19937::next_u64() {
  const uint64_t hi = next_u32();
  return (hi << 32) | next_u32();
}

// ---------------------------------------------------------------------------------------------
// RandomState

namespace {
uint32_t checked_legacy_seed(int64_t seed) {
  if (seed < 0 || seed > static_cast<int64_t>(UINT32_MAX)) {
    throw UsageError("random seed " + std::to_string(seed) +
                     " is out of range: numpy.random.RandomState accepts 0 .. 4294967295");
  }
  return static_cast<uint32_t>(seed);
}
}  // namespace

RandomState::RandomState(int64_t seed) : mt_(checked_legacy_seed(seed)) {}

uint64_t RandomState::random_interval(uint64_t max) {
  if (max == 0) return 0;
  uint64_t mask = max;  // smallest all-ones mask >= max
  mask |= mask >> 1;
  mask |= mask >> 2;
  mask |= mask >> 4;
  mask |= mask >> 8;
  mask |= mask >> 16;
  mask |= mask >> 32;
  uint64_t value;
  if (max <= UINT32_MAX) {
    while ((value = (mt_.next_u32() & mask)) > max) {
    }
  } else {
    while ((value = (mt_.next_u64() & mask)) > max) {
    }
  }
  return value;
}

std::vector<int64_t> RandomState::permutation(int64_t n) {
  if (n < 0) throw UsageError("RandomState.permutation: n must be >= 0, got " + std::to_string(n));
  std::vector<int64_t> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[i] = i;
  shuffle(std::span<int64_t>(out));
  return out;
}

int64_t RandomState::randint(int64_t low, int64_t high) {
  if (low >= high) {
    throw UsageError("RandomState.randint: low (" + std::to_string(low) + ") must be < high (" +
                     std::to_string(high) + ")");
  }
  const uint64_t rng = static_cast<uint64_t>(high) - 1u - static_cast<uint64_t>(low);
  return static_cast<int64_t>(static_cast<uint64_t>(low) + random_interval(rng));
}

}  // namespace laoyao::data
