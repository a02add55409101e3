#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/sha256.hpp"

using namespace laoyao;

namespace {

std::string pattern(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 7 + 3) & 255);
  return s;
}

}  // namespace

// FIPS 180-4 / NIST CSRC examples.
TEST(Sha256, FipsVectors) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sha256_hex("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopq"
                       "rsmnopqrstnopqrstu"),
            "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
  EXPECT_EQ(sha256_hex(std::string(1000000, 'a')), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

// Lengths around the padding boundaries (55/56 bytes: the length field fits or spills a block).
TEST(Sha256, PaddingBoundaries) {
  const std::pair<size_t, const char*> cases[] = {
      {55, "e7313d333c272e639f790978283f9eb392e843d0f29b7016828bb1daa4aac70b"},
      {56, "4324d65f3c103567f5589c710bc08f8523f929a9272e3af36fc968e52abc6c27"},
      {63, "81c80242132f230c3bd41b3e63bbcff16107339549214a99614ff26664625055"},
      {64, "39e3d7b6b5d075d37d053ad89b24b41bef4f3c29760c84447cab3f3be1882241"},
      {65, "aacca6ff74fdbb296d165a45cecfa04e5127bc008770fbbdd48006f2d2fae95e"},
      {119, "9ce7368e4daf32341631b492e80359dc9f594b48453cd0dd5bf0b19279cc177e"},
      {120, "7836b787757e95e58b3ca5aec90b1b004e8deba1e50e9675af9cabf1a13a04b5"},
      {127, "a8d23e75d936f303d248888d9b165ee543f4cbafcad3c9dd2a79bd84faa11d07"},
      {128, "d2742f1f4ac6bb7ca2b239ee18402ba8b3f9f8e652d2a72973c2b9ba11c08cf6"},
      {1000, "1e9bc38cbf860b9ec31918b065f9b52476c549a782e0e7990bed8ce3868d2371"},
  };
  for (auto [n, hex] : cases) EXPECT_EQ(sha256_hex(pattern(n)), hex) << n << " bytes";
}

TEST(Sha256, StreamingInOddPiecesEqualsOneShot) {
  const std::string s = pattern(10007);
  const std::string want = to_hex(sha256(s.data(), s.size()));
  for (size_t piece : {1, 3, 63, 64, 65, 1000}) {
    Sha256 h;
    for (size_t i = 0; i < s.size(); i += piece) h.update(s.data() + i, std::min(piece, s.size() - i));
    EXPECT_EQ(to_hex(h.finish()), want) << "pieces of " << piece;
  }
}

// An empty piece (an empty tensor, whose data may be null) changes nothing and never reaches
// memcpy with a null pointer (UBSan's report).
TEST(Sha256, EmptyPiecesChangeNothing) {
  const std::string s = pattern(70);
  Sha256 h;
  h.update(nullptr, 0);
  h.update(s.data(), 5);
  h.update(nullptr, 0);
  h.update(s.data() + 5, s.size() - 5);
  h.update(nullptr, 0);
  EXPECT_EQ(to_hex(h.finish()), to_hex(sha256(s.data(), s.size())));
}

// The SHA-NI path (where this CPU has it) must agree with the portable one block for block.
TEST(Sha256, HardwarePathMatchesPortable) {
  const std::string s = pattern(64 * 37);
  uint32_t a[8], b[8];
  for (int i = 0; i < 8; ++i) a[i] = b[i] = 0x01234567u * static_cast<uint32_t>(i + 1);
  detail::sha256_blocks_portable(a, reinterpret_cast<const uint8_t*>(s.data()), 37);
  uint32_t before[8];
  std::memcpy(before, b, sizeof b);
  if (detail::sha256_blocks_shani(b, reinterpret_cast<const uint8_t*>(s.data()), 37)) {
    for (int i = 0; i < 8; ++i) EXPECT_EQ(a[i], b[i]) << "word " << i;
  } else {  // no SHA extensions on this CPU: the call must leave the state alone
    for (int i = 0; i < 8; ++i) EXPECT_EQ(before[i], b[i]) << "word " << i;
  }
}
