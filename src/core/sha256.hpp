// SHA-256 (FIPS 180-4), for checkpoint checksums: a user can check a file with `sha256sum`.
// Checkpoints are large (a 2B-parameter model with Adam state is ~24 GB), so on x86-64 CPUs with
// the SHA extensions (SHA-NI) the compression runs on them (~2 GB/s a core instead of ~0.3).
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace laoyao {

using Sha256Digest = std::array<uint8_t, 32>;

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t n);
  Sha256Digest finish();  // the object is spent afterwards (reset() to reuse)
  void reset();

 private:
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buf_len_ = 0;
  uint64_t total_ = 0;  // bytes
};

Sha256Digest sha256(const void* data, size_t n);
std::string sha256_hex(std::string_view s);
std::string to_hex(const Sha256Digest& d);  // lowercase, as sha256sum prints it

namespace detail {
// The compression function over `blocks` 64-byte blocks; exposed so tests compare the two paths.
void sha256_blocks_portable(uint32_t h[8], const uint8_t* data, size_t blocks);
// Returns false (doing nothing) when this CPU lacks the SHA extensions.
bool sha256_blocks_shani(uint32_t h[8], const uint8_t* data, size_t blocks);
}  // namespace detail

}  // namespace laoyao
