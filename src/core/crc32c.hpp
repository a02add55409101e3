// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as TFRecord framing uses it
// (train/tensorboard_writer). crc32c("123456789") = 0xE3069283.
#pragma once
#include <cstddef>
#include <cstdint>

namespace laoyao {

// The CRC of n bytes; pass a previous result as `crc` to continue over more bytes.
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
// TFRecord's masked form: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t masked_crc32c(const void* data, size_t n);

}  // namespace laoyao
