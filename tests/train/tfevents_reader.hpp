// Reads TensorBoard event files back for the tests (train/tensorboard_writer): the TFRecord
// framing with its CRCs checked, and each Event's fields this writer uses.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/crc32c.hpp"

namespace laoyao::test {

template <class T>
inline T read_le(const std::string& s, size_t at) {
  T v;
  std::memcpy(&v, s.data() + at, sizeof(T));
  return v;
}

inline uint64_t read_varint(const std::string& s, size_t& at) {
  uint64_t v = 0;
  for (int shift = 0;; shift += 7) {
    const auto b = static_cast<unsigned char>(s.at(at++));
    v |= static_cast<uint64_t>(b & 0x7F) << shift;
    if (!(b & 0x80)) return v;
  }
}

// What a scalar Event holds, decoded field by field (the fields this writer uses).
struct Decoded {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version, tag;
  float value = 0;
};

inline void decode_value(const std::string& v, Decoded& d) {
  for (size_t at = 0; at < v.size();) {
    const uint64_t k = read_varint(v, at);
    if (k == (1 << 3 | 2)) {
      const uint64_t n = read_varint(v, at);
      d.tag = v.substr(at, n), at += n;
    } else if (k == (2 << 3 | 5)) {
      d.value = read_le<float>(v, at), at += 4;
    } else {
      ADD_FAILURE() << "unexpected Summary.Value key " << k;
      return;
    }
  }
}

inline Decoded decode_event(const std::string& e) {
  Decoded d;
  for (size_t at = 0; at < e.size();) {
    const uint64_t k = read_varint(e, at);
    if (k == (1 << 3 | 1)) {
      d.wall_time = read_le<double>(e, at), at += 8;
    } else if (k == (2 << 3 | 0)) {
      d.step = static_cast<int64_t>(read_varint(e, at));
    } else if (k == (3 << 3 | 2) || k == (5 << 3 | 2)) {
      const uint64_t n = read_varint(e, at);
      const std::string body = e.substr(at, n);
      at += n;
      if (k == (3 << 3 | 2)) {
        d.file_version = body;
        continue;
      }
      size_t s = 0;  // Summary: one value = 1
      EXPECT_EQ(read_varint(body, s), 1u << 3 | 2);
      const uint64_t m = read_varint(body, s);
      decode_value(body.substr(s, m), d);
      EXPECT_EQ(s + m, body.size()) << "one Value per Summary";
    } else {
      ADD_FAILURE() << "unexpected Event key " << k;
      break;
    }
  }
  return d;
}

// Every event of the file at `path`, in order (CRC mismatches are test failures).
inline std::vector<Decoded> read_events(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<Decoded> events;
  for (size_t at = 0; at < s.size();) {
    if (at + 12 > s.size()) {
      ADD_FAILURE() << "a truncated record header at byte " << at;
      break;
    }
    const auto n = read_le<uint64_t>(s, at);
    EXPECT_EQ(read_le<uint32_t>(s, at + 8), masked_crc32c(s.data() + at, 8)) << "length CRC";
    if (at + 12 + n + 4 > s.size()) {
      ADD_FAILURE() << "a truncated record at byte " << at;
      break;
    }
    const std::string record = s.substr(at + 12, n);
    EXPECT_EQ(read_le<uint32_t>(s, at + 12 + n), masked_crc32c(record.data(), record.size())) << "record CRC";
    events.push_back(decode_event(record));
    at += 12 + n + 4;
  }
  return events;
}

}  // namespace laoyao::test
