#include "core/sha256.hpp"

#include <algorithm>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define LAOYAO_SHA256_X86 1
#endif

namespace laoyao {
namespace {

constexpr uint32_t kK[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

constexpr uint32_t kInit[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                               0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};

inline uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

#ifdef LAOYAO_SHA256_X86
bool cpu_has_sha() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const bool sha = (b >> 29) & 1;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
  const bool ssse3 = (c >> 9) & 1, sse41 = (c >> 19) & 1;
  return sha && ssse3 && sse41;
}

// The standard SHA-NI schedule: state held as ABEF/CDGH, four rounds per K group, the message
// schedule W[16..63] computed four words at a time with sha256msg1/msg2 in a ring of 4 registers.
__attribute__((target("sha,sse4.1,ssse3"))) void blocks_shani(uint32_t h[8], const uint8_t* data,
                                                               size_t blocks) {
  const __m128i mask = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
  __m128i tmp = _mm_loadu_si128(reinterpret_cast<const __m128i*>(&h[0]));     // A B C D (low..high)
  __m128i state1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(&h[4]));  // E F G H
  tmp = _mm_shuffle_epi32(tmp, 0xB1);
  state1 = _mm_shuffle_epi32(state1, 0x1B);
  __m128i state0 = _mm_alignr_epi8(tmp, state1, 8);  // ABEF
  state1 = _mm_blend_epi16(state1, tmp, 0xF0);       // CDGH

  for (size_t blk = 0; blk < blocks; ++blk, data += 64) {
    const __m128i abef = state0, cdgh = state1;
    __m128i w[4];
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) {
      if (i < 4) w[i] = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(data + 16 * i)), mask);
      __m128i msg = _mm_add_epi32(w[i & 3], _mm_loadu_si128(reinterpret_cast<const __m128i*>(&kK[4 * i])));
      state1 = _mm_sha256rnds2_epu32(state1, state0, msg);
      if (i >= 3 && i <= 14) {  // W for the next group: msg2(w + alignr(w[i], w[i-1])) of w[i]
        const int nxt = (i + 1) & 3;
        __m128i t = _mm_alignr_epi8(w[i & 3], w[(i + 3) & 3], 4);
        w[nxt] = _mm_sha256msg2_epu32(_mm_add_epi32(w[nxt], t), w[i & 3]);
      }
      msg = _mm_shuffle_epi32(msg, 0x0E);
      state0 = _mm_sha256rnds2_epu32(state0, state1, msg);
      if (i >= 1 && i <= 12) {
        const int prv = (i + 3) & 3;
        w[prv] = _mm_sha256msg1_epu32(w[prv], w[i & 3]);
      }
    }
    state0 = _mm_add_epi32(state0, abef);
    state1 = _mm_add_epi32(state1, cdgh);
  }

  tmp = _mm_shuffle_epi32(state0, 0x1B);       // FEBA
  state1 = _mm_shuffle_epi32(state1, 0xB1);    // DCHG
  state0 = _mm_blend_epi16(tmp, state1, 0xF0); // DCBA
  state1 = _mm_alignr_epi8(state1, tmp, 8);    // HGFE
  _mm_storeu_si128(reinterpret_cast<__m128i*>(&h[0]), state0);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(&h[4]), state1);
}

const bool kHaveShaNi = cpu_has_sha();
#else
const bool kHaveShaNi = false;
#endif

void compress(uint32_t h[8], const uint8_t* data, size_t blocks) {
  if (!detail::sha256_blocks_shani(h, data, blocks)) detail::sha256_blocks_portable(h, data, blocks);
}

}  // namespace

namespace detail {

void sha256_blocks_portable(uint32_t h[8], const uint8_t* data, size_t blocks) {
  for (size_t blk = 0; blk < blocks; ++blk, data += 64) {
    uint32_t w[64];
    for (int i = 0; i < 16; ++i)
      w[i] = uint32_t(data[4 * i]) << 24 | uint32_t(data[4 * i + 1]) << 16 | uint32_t(data[4 * i + 2]) << 8 |
             uint32_t(data[4 * i + 3]);
    for (int i = 16; i < 64; ++i) {
      const uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      const uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
    for (int i = 0; i < 64; ++i) {
      const uint32_t S1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25);
      const uint32_t ch = (e & f) ^ (~e & g);
      const uint32_t t1 = hh + S1 + ch + kK[i] + w[i];
      const uint32_t S0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22);
      const uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
      const uint32_t t2 = S0 + maj;
      hh = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
    }
    h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += hh;
  }
}

bool sha256_blocks_shani(uint32_t h[8], const uint8_t* data, size_t blocks) {
#ifdef LAOYAO_SHA256_X86
  if (!kHaveShaNi) return false;
  blocks_shani(h, data, blocks);
  return true;
#else
  (void)h, (void)data, (void)blocks;
  return false;
#endif
}

}  // namespace detail

Sha256::Sha256() { reset(); }

void Sha256::reset() {
  std::memcpy(h_, kInit, sizeof h_);
  buf_len_ = 0;
  total_ = 0;
}

void Sha256::update(const void* data, size_t n) {
  if (n == 0) return;  // an empty tensor's data may be null, which memcpy may not be given
  const uint8_t* p = static_cast<const uint8_t*>(data);
  total_ += n;
  if (buf_len_ > 0) {
    const size_t take = std::min(n, 64 - buf_len_);
    std::memcpy(buf_ + buf_len_, p, take);
    buf_len_ += take, p += take, n -= take;
    if (buf_len_ < 64) return;
    compress(h_, buf_, 1);
    buf_len_ = 0;
  }
  if (n >= 64) {
    compress(h_, p, n / 64);
    p += n / 64 * 64;
    n %= 64;
  }
  std::memcpy(buf_, p, n);
  buf_len_ = n;
}

Sha256Digest Sha256::finish() {
  const uint64_t bits = total_ * 8;
  uint8_t pad[72] = {0x80};
  const size_t pad_len = (buf_len_ < 56 ? 56 : 120) - buf_len_;
  for (int i = 0; i < 8; ++i) pad[pad_len + i] = static_cast<uint8_t>(bits >> (56 - 8 * i));
  update(pad, pad_len + 8);
  Sha256Digest d;
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 4; ++j) d[4 * i + j] = static_cast<uint8_t>(h_[i] >> (24 - 8 * j));
  return d;
}

Sha256Digest sha256(const void* data, size_t n) {
  Sha256 s;
  s.update(data, n);
  return s.finish();
}

std::string sha256_hex(std::string_view s) { return to_hex(sha256(s.data(), s.size())); }

std::string to_hex(const Sha256Digest& d) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  out.reserve(64);
  for (uint8_t b : d) out += digits[b >> 4], out += digits[b & 15];
  return out;
}

}  // namespace laoyao
