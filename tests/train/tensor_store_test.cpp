// TensorStore reads (train/tensor_store.hpp): a wanted part, whole or a window of rows, from stored
// entries of every dtype it takes — bf16 and f16 widened as they are copied, fp32 straight from the
// mapping or, where the file puts it off its 4-byte alignment, read whole first — equal to the
// values written, element for element; parts that leave a gap are refused by name.
#include "train/tensor_store.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/rng.hpp"
#include "core/safetensors.hpp"

using namespace laoyao;
using namespace laoyao::train;
namespace fs = std::filesystem;

namespace {

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(n >> (8 * i));
  return s;
}

uint16_t half_bits(float v, bool bf16) {
  if (bf16) return f32_to_bf16(v);
  // f16 of a value that is exact in f16: sign, exponent 15-biased, 10 mantissa bits.
  uint32_t u;
  std::memcpy(&u, &v, 4);
  const uint32_t sign = (u >> 16) & 0x8000u, exp = (u >> 23) & 0xffu, man = u & 0x7fffffu;
  if (exp == 0) return static_cast<uint16_t>(sign);
  return static_cast<uint16_t>(sign | ((exp - 127 + 15) << 10) | (man >> 13));
}

}  // namespace

TEST(TensorStore, WindowsOfEveryDtypeEqualTheWrittenValues) {
  const int64_t rows = 6, cols = 5, n = rows * cols;
  Rng rng(11, "tensor_store");
  // Values exact in each dtype: multiples of 1/8 in [-4, 4).
  std::vector<float> values(static_cast<size_t>(n));
  for (float& v : values) v = static_cast<float>(static_cast<int64_t>(rng.next_u64() % 64) - 32) / 8.0f;
  // "pad" (one bf16) first, so that the fp32 entry after it starts 2 bytes off its alignment.
  std::string data(2, '\0');
  auto add_halves = [&](bool bf16, int64_t from, int64_t to) {
    for (int64_t i = from; i < to; ++i) {
      const uint16_t b = half_bits(values[static_cast<size_t>(i)], bf16);
      data += static_cast<char>(b & 0xff), data += static_cast<char>(b >> 8);
    }
  };
  const size_t f32_at = data.size();
  data.append(reinterpret_cast<const char*>(values.data()), values.size() * 4);
  const size_t bf16_at = data.size();
  add_halves(true, 0, n);
  const size_t f16_at = data.size();
  add_halves(false, 0, n);
  const int64_t half = n / 2;  // "split": its first three rows bf16, its last three f16
  const size_t top_at = data.size();
  add_halves(true, 0, half);
  const size_t bottom_at = data.size();
  add_halves(false, half, n);
  auto entry = [&](const char* name, const char* dtype, int64_t entry_rows, size_t from, size_t bytes) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld,%lld],\"data_offsets\":[%zu,%zu]}", name,
                  dtype, static_cast<long long>(entry_rows), static_cast<long long>(cols), from, from + bytes);
    return std::string(buf);
  };
  const auto bytes = [](int64_t count, size_t size) { return static_cast<size_t>(count) * size; };
  const std::string header = "{\"pad\":{\"dtype\":\"BF16\",\"shape\":[1],\"data_offsets\":[0,2]}," +
                             entry("w32", "F32", rows, f32_at, bytes(n, 4)) + "," +
                             entry("w16", "BF16", rows, bf16_at, bytes(n, 2)) + "," +
                             entry("h16", "F16", rows, f16_at, bytes(n, 2)) + "," +
                             entry("top", "BF16", rows / 2, top_at, bytes(half, 2)) + "," +
                             entry("bottom", "F16", rows / 2, bottom_at, bytes(n - half, 2)) + "}";
  const std::string dir = (fs::temp_directory_path() / ("laoyao_tensor_store." + std::to_string(::getpid()))).string();
  fs::create_directories(dir);
  const std::string path = dir + "/model.safetensors";
  std::ofstream(path, std::ios::binary) << le64(header.size()) << header << data;

  TensorStore store("test store");
  const size_t file = store.add_file(SafetensorsFile(path), std::nullopt);
  ASSERT_NE(reinterpret_cast<uintptr_t>(store.file(file).find("w32")->data) % 4, 0u) << "the fp32 entry is misaligned";
  const model::Box whole = model::whole_box({rows, cols});
  for (const char* key : {"w32", "w16", "h16"}) store.add(file, key, {key, {rows, cols}, {whole}});
  model::Box top = whole, bottom = whole;
  top.size[0] = rows / 2, bottom.start[0] = rows / 2, bottom.size[0] = rows / 2;
  store.add(file, "top", {"split", {rows, cols}, {top}});
  store.add(file, "bottom", {"split", {rows, cols}, {bottom}});
  store.add(file, "top", {"gap", {rows, cols}, {top}});  // nothing holds its last rows
  for (const char* key : {"w32", "w16", "h16", "split"}) {
    SCOPED_TRACE(key);
    const model::TensorPart want{key, {rows, cols}, {whole}};
    std::vector<float> got(static_cast<size_t>(n), -99.0f);
    store.read(want, got.data());
    EXPECT_EQ(got, values);
    for (const auto& [lo, hi] : std::vector<std::pair<int64_t, int64_t>>{{0, 7}, {7, 23}, {23, 30}, {12, 13}}) {
      std::vector<float> window(static_cast<size_t>(hi - lo), -99.0f);
      store.read(model::sub_part(want, lo, hi), window.data());
      EXPECT_EQ(window, std::vector<float>(values.begin() + lo, values.begin() + hi)) << lo << ".." << hi;
    }
  }
  std::vector<float> got(static_cast<size_t>(n));
  try {
    store.read({"gap", {rows, cols}, {whole}}, got.data());
    ADD_FAILURE() << "a part missing, no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("a part is missing"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}
