// Bit-exact reproductions of the numpy random algorithms Megatron's datasets use, so that
// laoyao draws the same numbers as Megatron for the same seed:
//   * numpy.random.default_rng(seed)  -> SeedSequence + PCG64 + Generator.integers
//     (MockGPTLowLevelDataset's document lengths: default_rng(0).integers(1, 4096, ...)).
//   * numpy.random.RandomState(seed)  -> legacy MT19937 + shuffle/permutation/randint
//     (GPTDataset's document and sample shuffles).
// The algorithms follow numpy's documented/implemented behaviour (numpy >= 1.17; both streams
// have been stable since); the code is ours.
#pragma once
#include <array>
#include <cstdint>
#include <span>
#include <vector>

namespace laoyao::data {

// numpy.random.SeedSequence(entropy) with the default pool size (4 words) and no spawn key.
// numpy turns a non-negative Python int into 32-bit words, least significant first
// (0 becomes the single word 0); `entropy_words` is that list.
class SeedSequence {
 public:
  static constexpr int kPoolSize = 4;
  explicit SeedSequence(uint64_t entropy);
  explicit SeedSequence(const std::vector<uint32_t>& entropy_words);

  const std::array<uint32_t, kPoolSize>& pool() const { return pool_; }
  // SeedSequence.generate_state(n, np.uint32).
  std::vector<uint32_t> generate_state_u32(int64_t n_words) const;
  // SeedSequence.generate_state(n, np.uint64): pairs of 32-bit words, low word first.
  std::vector<uint64_t> generate_state_u64(int64_t n_words) const;

 private:
  std::array<uint32_t, kPoolSize> pool_{};
};

// numpy's PCG64 bit generator (128-bit LCG, XSL-RR output), seeded from a SeedSequence as
// numpy.random.PCG64(seed_sequence) does.
class Pcg64 {
 public:
  explicit Pcg64(const SeedSequence& seed);
  // One 64-bit output (numpy's next_uint64 / random_raw). Leaves the 32-bit buffer alone.
  uint64_t next_u64();
  // numpy's next_uint32: a 64-bit draw yields two 32-bit values, the low half first; the high
  // half is kept for the next call.
  uint32_t next_u32();

 private:
  unsigned __int128 state_ = 0;
  unsigned __int128 inc_ = 0;
  bool has_u32_ = false;
  uint32_t u32_ = 0;
};

// numpy.random.Generator over PCG64: the subset Megatron needs.
class Generator {
 public:
  explicit Generator(const SeedSequence& seed) : bitgen_(seed) {}
  // Generator.integers(low, high, size, dtype=np.int32): values in [low, high). As in numpy,
  // high may be 2**31 (exclusive bound). Throws laoyao::UsageError if low >= high or the range
  // does not fit int32.
  std::vector<int32_t> integers_int32(int64_t low, int64_t high, int64_t size);
  // Generator.integers(low, high, size, dtype=np.int64): values in [low, high).
  std::vector<int64_t> integers_int64(int64_t low, int64_t high, int64_t size);
  // The same with endpoint=True: values in [low, high].
  std::vector<int64_t> integers_int64_closed(int64_t low, int64_t high, int64_t size);
  Pcg64& bit_generator() { return bitgen_; }

 private:
  Pcg64 bitgen_;
};

// numpy.random.default_rng(seed) for a non-negative integer seed.
Generator default_rng(uint64_t seed);

// The 32-bit Mersenne Twister with numpy's legacy integer seeding (RandomState(seed)).
class Mt19937 {
 public:
  explicit Mt19937(uint32_t seed);
  uint32_t next_u32();
  // numpy's mt19937_next64: two 32-bit draws, the first one is the high word.
  uint64_t next_u64();

 private:
  void refill();
  std::array<uint32_t, 624> key_{};
  int pos_ = 624;
};

// numpy.random.RandomState(seed): the legacy generator Megatron's GPTDataset shuffles with.
class RandomState {
 public:
  // numpy accepts 0 <= seed <= 2**32 - 1; anything else is a laoyao::UsageError.
  explicit RandomState(int64_t seed);

  // numpy's legacy random_interval(max): uniform in [0, max] by masked rejection (32-bit draws
  // when max fits in 32 bits, 64-bit draws otherwise; no draw at all for max == 0).
  uint64_t random_interval(uint64_t max);

  // RandomState.shuffle(x) for a 1-D array: Fisher-Yates from the end, i = n-1 .. 1,
  // j = random_interval(i), swap x[i] and x[j]. The draws do not depend on the element type.
  template <typename T>
  void shuffle(std::span<T> x) {
    for (int64_t i = static_cast<int64_t>(x.size()) - 1; i >= 1; --i) {
      const auto j = static_cast<int64_t>(random_interval(static_cast<uint64_t>(i)));
      std::swap(x[i], x[j]);
    }
  }
  // RandomState.permutation(n): a shuffled arange(n).
  std::vector<int64_t> permutation(int64_t n);
  // RandomState.randint(low, high) (default int64 dtype): low + random_interval(high-1-low),
  // numpy's legacy masked bounded draw. Throws laoyao::UsageError if low >= high.
  int64_t randint(int64_t low, int64_t high);

  Mt19937& bit_generator() { return mt_; }

 private:
  Mt19937 mt_;
};

}  // namespace laoyao::data
