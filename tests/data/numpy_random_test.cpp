// numpy RNG reproductions against numbers printed by numpy 1.24.2 (Debian python3-numpy), e.g.
//   python3 -c 'import numpy as np; print(np.random.default_rng(0).integers(1,4096,size=12,
//               dtype=np.int32))'
// Each literal below was printed by the numpy call named beside it.
#include "data/numpy_random.hpp"

#include <gtest/gtest.h>

#include <numeric>

#include "core/error.hpp"

namespace laoyao::data {
namespace {

// Sum of (i+1)*v[i] mod 2^61-1: an order-sensitive checksum that numpy computes exactly in int64.
template <typename T>
uint64_t weighted_checksum(const std::vector<T>& v) {
  constexpr unsigned __int128 kMod = (static_cast<unsigned __int128>(1) << 61) - 1;
  unsigned __int128 acc = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    acc = (acc + static_cast<unsigned __int128>(i + 1) * static_cast<uint64_t>(v[i])) % kMod;
  }
  return static_cast<uint64_t>(acc);
}

TEST(SeedSequence, PoolAndGenerateStateMatchNumpy) {
  // np.random.SeedSequence(0).pool / .generate_state(6, np.uint32) / .generate_state(4, np.uint64)
  SeedSequence s0(0);
  EXPECT_EQ(s0.pool(), (std::array<uint32_t, 4>{0xfe40eb07u, 0x4f363a36u, 0x4eb2009du, 0xc89a7aa7u}));
  EXPECT_EQ(s0.generate_state_u32(6), (std::vector<uint32_t>{0xb0f478beu, 0xdb2cd7e7u, 0x2c71ba49u,
                                                             0xabf4641au, 0x9d7b8d41u, 0x20c6ed6du}));
  EXPECT_EQ(s0.generate_state_u64(4),
            (std::vector<uint64_t>{0xdb2cd7e7b0f478beull, 0xabf4641a2c71ba49ull,
                                   0x20c6ed6d9d7b8d41ull, 0x2c4099de223c39d4ull}));
  // SeedSequence(1234)
  SeedSequence s1(1234);
  EXPECT_EQ(s1.pool(), (std::array<uint32_t, 4>{0xa16ad0dcu, 0x42eeeafau, 0x55552560u, 0x001b07acu}));
  EXPECT_EQ(s1.generate_state_u64(4),
            (std::vector<uint64_t>{0x5f83044cad3f26a6ull, 0xa0d9b3700cea3a6full,
                                   0xa8647d8b1e3e7527ull, 0x687a8e7300372192ull}));
  // SeedSequence(2**64 - 1): two entropy words.
  SeedSequence s2(UINT64_MAX);
  EXPECT_EQ(s2.pool(), (std::array<uint32_t, 4>{0xfaf3ecf4u, 0xfa0f8930u, 0xe9f89a67u, 0x0e23d1f9u}));
  EXPECT_EQ(s2.generate_state_u32(6), (std::vector<uint32_t>{0x928cad0du, 0xaebca151u, 0x8638dc7au,
                                                             0x119c3044u, 0x59e642a7u, 0x1bbb1556u}));
  // SeedSequence(2**200 + 12345): 7 entropy words, more than the pool holds.
  std::vector<uint32_t> big(7, 0u);
  big[0] = 12345;
  big[6] = 1u << 8;  // 2**200 = 2**(6*32 + 8)
  SeedSequence s3(big);
  EXPECT_EQ(s3.pool(), (std::array<uint32_t, 4>{0x5e10c966u, 0x0639f92eu, 0xb0652b81u, 0x6dfac273u}));
  EXPECT_EQ(s3.generate_state_u64(4),
            (std::vector<uint64_t>{0x480128f237eb5a28ull, 0x18bce3f69452ba76ull,
                                   0x61540ee71d66d9e5ull, 0x465ab54028376a83ull}));
}

TEST(Pcg64, RawOutputsMatchNumpy) {
  // np.random.default_rng(s).bit_generator.random_raw(4)
  Generator g0 = default_rng(0);
  EXPECT_EQ(g0.bit_generator().next_u64(), 0xa30febcfd9c2825full);
  EXPECT_EQ(g0.bit_generator().next_u64(), 0x4510bdf882d9d721ull);
  EXPECT_EQ(g0.bit_generator().next_u64(), 0x0a7d3da94ecde8b8ull);
  EXPECT_EQ(g0.bit_generator().next_u64(), 0x043b27b61342f01dull);
  Generator g1 = default_rng(1234);
  EXPECT_EQ(g1.bit_generator().next_u64(), 0xfa08fef3fab6bbbaull);
  EXPECT_EQ(g1.bit_generator().next_u64(), 0x615481f7fce9ac81ull);
  EXPECT_EQ(g1.bit_generator().next_u64(), 0xec59dd7c2bde3cb4ull);
}

TEST(Pcg64, Next32ReturnsLowHalfThenHighHalf) {
  Generator a = default_rng(0);
  EXPECT_EQ(a.bit_generator().next_u32(), 0xd9c2825fu);
  EXPECT_EQ(a.bit_generator().next_u32(), 0xa30febcfu);
  EXPECT_EQ(a.bit_generator().next_u32(), 0x82d9d721u);
  // A 64-bit draw does not consume the buffered high half.
  EXPECT_EQ(a.bit_generator().next_u64(), 0x0a7d3da94ecde8b8ull);
  EXPECT_EQ(a.bit_generator().next_u32(), 0x4510bdf8u);
}

TEST(GeneratorIntegers, MockDocumentLengths) {
  // np.random.default_rng(0).integers(1, 4096, size=12, dtype=np.int32); the reference's
  // Megatron run printed the same first 12 mock document lengths.
  EXPECT_EQ(default_rng(0).integers_int32(1, 4096, 12),
            (std::vector<int32_t>{3484, 2609, 2094, 1105, 1261, 168, 309, 68, 718, 3331, 2660, 3738}));
}

TEST(GeneratorIntegers, SeveralSeedsInt32) {
  // np.random.default_rng(s).integers(0, 1000, size=8, dtype=np.int32)
  EXPECT_EQ(default_rng(1).integers_int32(0, 1000, 8),
            (std::vector<int32_t>{473, 511, 755, 950, 34, 144, 822, 948}));
  EXPECT_EQ(default_rng(42).integers_int32(0, 1000, 8),
            (std::vector<int32_t>{89, 773, 654, 438, 433, 858, 85, 697}));
  EXPECT_EQ(default_rng(1234).integers_int32(0, 1000, 8),
            (std::vector<int32_t>{979, 976, 987, 380, 171, 923, 104, 261}));
  EXPECT_EQ(default_rng((1ull << 40) + 7).integers_int32(0, 1000, 8),
            (std::vector<int32_t>{206, 829, 609, 255, 17, 153, 504, 674}));
}

TEST(GeneratorIntegers, LongSequenceOf100kValues) {
  // a = np.random.default_rng(0).integers(1, 4096, size=100000, dtype=np.int32)
  const std::vector<int32_t> a = default_rng(0).integers_int32(1, 4096, 100000);
  ASSERT_EQ(a.size(), 100000u);
  EXPECT_EQ(a[99999], 769);
  EXPECT_EQ(a[50000], 3515);
  // a.sum() (= the mock corpus's total token count the reference's run reports)
  EXPECT_EQ(std::accumulate(a.begin(), a.end(), int64_t{0}), 204637097);
  // (a * arange(1, 100001)).sum() % (2**61 - 1)
  EXPECT_EQ(weighted_checksum(a), 10235530075780ull);
}

TEST(GeneratorIntegers, BufferedHalfCarriesAcrossCallsAndDtypes) {
  // g = np.random.default_rng(7), then these calls in order:
  Generator g = default_rng(7);
  EXPECT_EQ(g.integers_int32(0, 100, 3), (std::vector<int32_t>{94, 62, 68}));
  EXPECT_EQ(g.integers_int32(0, 100, 3), (std::vector<int32_t>{89, 57, 77}));
  EXPECT_EQ(g.integers_int64(0, 1ll << 40, 2), (std::vector<int64_t>{247617924053, 330036320526}));
  EXPECT_EQ(g.integers_int32(0, 100, 3), (std::vector<int32_t>{28, 87, 91}));
  EXPECT_EQ(g.integers_int64(-5, 5, 3), (std::vector<int64_t>{-5, -1, 3}));
  EXPECT_EQ(g.integers_int32(0, 100, 1), (std::vector<int32_t>{13}));
}

TEST(GeneratorIntegers, RejectionHeavyAndFullRanges) {
  // default_rng(3).integers(0, 3*2**30, size=12, dtype=np.int64): 1 in 4 draws is rejected.
  EXPECT_EQ(default_rng(3).integers_int64(0, 3ll << 30, 12),
            (std::vector<int64_t>{275895278, 578019063, 762820035, 584216872, 2581085717, 1875275178,
                                  126913354, 1070096069, 1395199532, 2001114985, 1543132243,
                                  852942552}));
  // default_rng(3).integers(-2**31, 2**30, size=12, dtype=np.int32): same range width, int32.
  EXPECT_EQ(default_rng(3).integers_int32(INT32_MIN, 1 << 30, 12),
            (std::vector<int32_t>{-1871588370, -1569464585, -1384663613, -1563266776, 433602069,
                                  -272208470, -2020570294, -1077387579, -752284116, -146368663,
                                  -604351405, -1294541096}));
  // default_rng(5).integers(-2**62, 2**62 + 2**61, size=6, dtype=np.int64): 64-bit Lemire.
  EXPECT_EQ(default_rng(5).integers_int64(-(1ll << 62), (1ll << 62) + (1ll << 61), 6),
            (std::vector<int64_t>{-1316620446928051511, -191743749880561255, 97689407416677978,
                                  -4089698571673648736, -4049547886299867472,
                                  6619916098569385655}));
  // default_rng(9).integers(-2**31, 2**31, size=4, dtype=np.int32): the whole int32 range.
  EXPECT_EQ(default_rng(9).integers_int32(INT32_MIN, int64_t{1} << 31, 4),
            (std::vector<int32_t>{-336951519, 1590208222, 1980171296, -915613116}));
  // default_rng(9).integers(-2**63, 2**63-1, size=3, dtype=np.int64, endpoint=True)
  EXPECT_EQ(default_rng(9).integers_int64_closed(INT64_MIN, INT64_MAX, 3),
            (std::vector<int64_t>{6829892309130839841, -3932528384880999392, 1902747525677753278}));
}

TEST(GeneratorIntegers, SingleValueRangeDrawsNothing) {
  // default_rng(9).integers(5, 6, size=3) == [5, 5, 5], then integers(0, 10, size=3) == [4, 8, 9]
  Generator g = default_rng(9);
  EXPECT_EQ(g.integers_int32(5, 6, 3), (std::vector<int32_t>{5, 5, 5}));
  EXPECT_EQ(g.integers_int32(0, 10, 3), (std::vector<int32_t>{4, 8, 9}));
}

TEST(GeneratorIntegers, EmptyRangeIsAUsageError) {
  Generator g = default_rng(0);
  EXPECT_THROW(g.integers_int32(5, 5, 1), UsageError);
  EXPECT_THROW(g.integers_int64(6, 5, 1), UsageError);
  EXPECT_THROW(g.integers_int32(0, (int64_t{1} << 31) + 1, 1), UsageError);
}

TEST(Mt19937, LegacySeedingMatchesNumpy) {
  // np.random.RandomState(s)._bit_generator.random_raw(5)
  RandomState r0(0);
  RandomState r1(1234);
  RandomState r2(4294967295);
  const std::vector<uint32_t> e0{2357136044u, 2546248239u, 3071714933u, 3626093760u, 2588848963u};
  const std::vector<uint32_t> e1{822569775u, 2137449171u, 2671936806u, 3512589365u, 1880026316u};
  const std::vector<uint32_t> e2{419326371u, 479346978u, 3918654476u, 2416749639u, 3388880820u};
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(r0.bit_generator().next_u32(), e0[i]);
    EXPECT_EQ(r1.bit_generator().next_u32(), e1[i]);
    EXPECT_EQ(r2.bit_generator().next_u32(), e2[i]);
  }
  // Past the first 624-word refill: draws 1001..1003 of RandomState(1234).
  RandomState r3(1234);
  for (int i = 0; i < 1000; ++i) r3.bit_generator().next_u32();
  EXPECT_EQ(r3.bit_generator().next_u32(), 3796541357u);
  EXPECT_EQ(r3.bit_generator().next_u32(), 317699229u);
  EXPECT_EQ(r3.bit_generator().next_u32(), 3184119239u);
}

TEST(RandomState, SeedOutsideNumpysRangeIsAUsageError) {
  EXPECT_THROW(RandomState(-1), UsageError);
  EXPECT_THROW(RandomState(int64_t{1} << 32), UsageError);
}

TEST(RandomState, PermutationMatchesNumpy) {
  // np.random.RandomState(s).permutation(10)
  EXPECT_EQ(RandomState(1234).permutation(10), (std::vector<int64_t>{7, 2, 9, 1, 0, 8, 4, 5, 6, 3}));
  EXPECT_EQ(RandomState(1).permutation(10), (std::vector<int64_t>{2, 9, 6, 4, 0, 3, 1, 7, 8, 5}));
  EXPECT_EQ(RandomState(42).permutation(10), (std::vector<int64_t>{8, 1, 5, 0, 7, 2, 9, 4, 3, 6}));
}

TEST(RandomState, ShuffleSmallArraysMatchesNumpy) {
  // x = np.arange(n, dtype=np.int32); np.random.RandomState(1234).shuffle(x)
  for (int n : {0, 1, 2, 3}) {
    std::vector<int32_t> x(n);
    std::iota(x.begin(), x.end(), 0);
    RandomState(1234).shuffle(std::span<int32_t>(x));
    std::vector<int32_t> identity(n);
    std::iota(identity.begin(), identity.end(), 0);
    EXPECT_EQ(x, identity) << "n=" << n;  // numpy: [], [0], [0, 1], [0, 1, 2] for this seed
  }
  std::vector<int32_t> x(100);
  std::iota(x.begin(), x.end(), 0);
  RandomState(1234).shuffle(std::span<int32_t>(x));
  EXPECT_EQ(x, (std::vector<int32_t>{
                   40, 35, 81, 61, 98, 68, 85, 27, 39, 42, 33, 59, 63, 94, 56, 87, 96, 1,  71, 82,
                   9,  51, 29, 88, 75, 74, 62, 66, 79, 48, 4,  64, 10, 93, 57, 72, 36, 7,  54, 77,
                   21, 18, 70, 86, 22, 6,  44, 8,  41, 16, 45, 20, 25, 55, 78, 31, 92, 5,  84, 32,
                   52, 13, 91, 17, 28, 46, 60, 14, 65, 12, 19, 2,  3,  0,  11, 67, 97, 34, 37, 95,
                   50, 99, 73, 80, 69, 58, 90, 89, 43, 30, 26, 23, 49, 15, 24, 76, 53, 38, 83, 47}));
}

TEST(RandomState, Shuffle100kMatchesNumpy) {
  // x = np.arange(100000, dtype=np.uint32); np.random.RandomState(7).shuffle(x)
  std::vector<uint32_t> x(100000);
  std::iota(x.begin(), x.end(), 0u);
  RandomState(7).shuffle(std::span<uint32_t>(x));
  EXPECT_EQ(std::vector<uint32_t>(x.begin(), x.begin() + 5),
            (std::vector<uint32_t>{33909, 92307, 89107, 9538, 31008}));
  EXPECT_EQ(std::vector<uint32_t>(x.end() - 3, x.end()), (std::vector<uint32_t>{49689, 58564, 61615}));
  EXPECT_EQ(weighted_checksum(x), 250321905549413ull);
}

TEST(RandomState, ConsecutiveShufflesContinueTheStream) {
  // rs = RandomState(1234); a = arange(10); rs.shuffle(a); b = arange(5); rs.shuffle(b)
  RandomState rs(1234);
  std::vector<int64_t> a(10), b(5);
  std::iota(a.begin(), a.end(), 0);
  std::iota(b.begin(), b.end(), 0);
  rs.shuffle(std::span<int64_t>(a));
  rs.shuffle(std::span<int64_t>(b));
  EXPECT_EQ(a, (std::vector<int64_t>{7, 2, 9, 1, 0, 8, 4, 5, 6, 3}));
  EXPECT_EQ(b, (std::vector<int64_t>{0, 4, 3, 2, 1}));
}

TEST(RandomState, RandintMatchesNumpy) {
  // np.random.RandomState(11).randint(0, 2**40, size=5): 64-bit masked draws (two MT words).
  RandomState big(11);
  const std::vector<int64_t> e_big{657423371967, 346452335707, 348726071223, 59812929868,
                                   691941458503};
  for (int64_t e : e_big) EXPECT_EQ(big.randint(0, int64_t{1} << 40), e);
  // np.random.RandomState(11).randint(-3, 1000, size=5)
  RandomState small(11);
  for (int64_t e : {918, 700, 77, 88, 334}) EXPECT_EQ(small.randint(-3, 1000), e);
  EXPECT_THROW(small.randint(3, 3), UsageError);
}

}  // namespace
}  // namespace laoyao::data
