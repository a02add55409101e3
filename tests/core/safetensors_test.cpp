#include <gtest/gtest.h>

#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/file_io.hpp"
#include "core/safetensors.hpp"
#include "core/sha256.hpp"

using namespace laoyao;
namespace fs = std::filesystem;

namespace {

class Safetensors : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("laoyao_safetensors_test_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  static std::string le64(uint64_t n) {
    std::string s(8, '\0');
    for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(n >> (8 * i));
    return s;
  }
  // A file from a header text (unpadded) and a data buffer, with a correct length prefix.
  std::string craft(const std::string& name, const std::string& header, const std::string& buffer) {
    const std::string p = path(name);
    std::ofstream(p, std::ios::binary) << le64(header.size()) << header << buffer;
    return p;
  }
  std::string raw(const std::string& name, const std::string& bytes) {
    const std::string p = path(name);
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }
  // Opening `p` must fail with a UsageError that names the file and contains `problem`.
  static void expect_bad(const std::string& p, const std::string& problem) {
    try {
      SafetensorsFile f(p);
      ADD_FAILURE() << "no error for " << p << " (expected: " << problem << ")";
    } catch (const UsageError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(p), std::string::npos) << msg;
      EXPECT_NE(msg.find(problem), std::string::npos) << msg;
    }
  }

  fs::path dir_;
};

std::string bytes_of(const std::vector<int>& v) {
  std::string s;
  for (int b : v) s += static_cast<char>(b);
  return s;
}

}  // namespace

// The reference implementation's own unit-test vectors (huggingface/safetensors tensor.rs):
// a single F32 tensor whose header needs no padding, one whose header needs 7 spaces, and an
// empty file with and without metadata.
TEST_F(Safetensors, ReferenceVectorsByteForByte) {
  const float vals[6] = {0, 1, 2, 3, 4, 5};
  write_safetensors(path("a.safetensors"), {{"attn.0", Dtype::F32, {1, 2, 3}, vals}});
  EXPECT_EQ(read_file(path("a.safetensors")),
            bytes_of({64,  0,   0,   0,   0,   0,   0,   0,   123, 34,  97,  116, 116, 110, 46,  48,  34,  58,  123,
                      34,  100, 116, 121, 112, 101, 34,  58,  34,  70,  51,  50,  34,  44,  34,  115, 104, 97,  112,
                      101, 34,  58,  91,  49,  44,  50,  44,  51,  93,  44,  34,  100, 97,  116, 97,  95,  111, 102,
                      102, 115, 101, 116, 115, 34,  58,  91,  48,  44,  50,  52,  93,  125, 125, 0,   0,   0,   0,
                      0,   0,   128, 63,  0,   0,   0,   64,  0,   0,   64,  64,  0,   0,   128, 64,  0,   0,   160, 64}));

  write_safetensors(path("b.safetensors"), {{"attn0", Dtype::F32, {1, 1, 2, 3}, vals}});
  EXPECT_EQ(read_file(path("b.safetensors")),
            bytes_of({72,  0,   0,   0,   0,   0,   0,   0,   123, 34,  97,  116, 116, 110, 48,  34,  58,  123, 34,
                      100, 116, 121, 112, 101, 34,  58,  34,  70,  51,  50,  34,  44,  34,  115, 104, 97,  112, 101,
                      34,  58,  91,  49,  44,  49,  44,  50,  44,  51,  93,  44,  34,  100, 97,  116, 97,  95,  111,
                      102, 102, 115, 101, 116, 115, 34,  58,  91,  48,  44,  50,  52,  93,  125, 125, 32,  32,  32,
                      32,  32,  32,  32,  0,   0,   0,   0,   0,   0,   128, 63,  0,   0,   0,   64,  0,   0,   64,
                      64,  0,   0,   128, 64,  0,   0,   160, 64}));

  write_safetensors(path("empty.safetensors"), {});
  EXPECT_EQ(read_file(path("empty.safetensors")), bytes_of({8, 0, 0, 0, 0, 0, 0, 0, 123, 125, 32, 32, 32, 32, 32, 32}));
  write_safetensors(path("meta.safetensors"), {}, {{"framework", "pt"}});
  EXPECT_EQ(read_file(path("meta.safetensors")),
            bytes_of({40, 0,   0,  0,   0,   0,   0,   0,   123, 34,  95,  95,  109, 101, 116, 97,
                      100, 97, 116, 97,  95,  95,  34,  58,  123, 34,  102, 114, 97,  109, 101, 119,
                      111, 114, 107, 34,  58,  34,  112, 116, 34,  125, 125, 32,  32,  32,  32,  32}));

  SafetensorsFile f(path("a.safetensors"));
  ASSERT_EQ(f.tensors().size(), 1u);
  EXPECT_EQ(f.read_f32(f.tensors()[0]), std::vector<float>(vals, vals + 6));
  EXPECT_TRUE(SafetensorsFile(path("empty.safetensors")).tensors().empty());
  EXPECT_EQ(SafetensorsFile(path("meta.safetensors")).metadata().at("framework"), "pt");
}

// Built by hand from the spec: tensors go largest dtype first (I64, F32, BF16, F16), names break
// ties; __metadata__ first with its keys sorted; a scalar ([]) and an empty tensor ([0]) included.
TEST_F(Safetensors, HandBuiltMixedFileByteForByte) {
  const int64_t c = -1;
  const float a = 0.5f;
  const uint16_t b[2] = {0x3F80, 0xC000};  // bf16 1.0, -2.0
  std::vector<TensorWrite> ts = {
      {"b", Dtype::BF16, {2}, b}, {"a", Dtype::F32, {}, &a}, {"c", Dtype::I64, {1}, &c}, {"a2", Dtype::F16, {0}, nullptr}};
  const std::string header =
      R"({"__metadata__":{"format":"pt","z":"1"},"c":{"dtype":"I64","shape":[1],"data_offsets":[0,8]},)"
      R"("a":{"dtype":"F32","shape":[],"data_offsets":[8,12]},"b":{"dtype":"BF16","shape":[2],"data_offsets":[12,16]},)"
      R"("a2":{"dtype":"F16","shape":[0],"data_offsets":[16,16]}})"
      "      ";  // 258 bytes of JSON + 6 spaces = 264 = 0x108
  const std::string expected = bytes_of({0x08, 0x01, 0, 0, 0, 0, 0, 0}) + header +
                               bytes_of({0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,  // c = -1
                                         0x00, 0x00, 0x00, 0x3f,                          // a = 0.5
                                         0x80, 0x3f, 0x00, 0xc0});                        // b
  auto r = write_safetensors(path("m.safetensors"), ts, {{"z", "1"}, {"format", "pt"}});
  const std::string got = read_file(path("m.safetensors"));
  EXPECT_EQ(got, expected);
  EXPECT_EQ(r.file_bytes, expected.size());
  EXPECT_EQ(r.sha256, sha256_hex(expected));

  // Input order does not matter: the same tensors in another order give the same bytes.
  std::reverse(ts.begin(), ts.end());
  write_safetensors(path("m2.safetensors"), ts, {{"format", "pt"}, {"z", "1"}});
  EXPECT_EQ(read_file(path("m2.safetensors")), expected);

  SafetensorsFile f(path("m.safetensors"));
  ASSERT_EQ(f.tensors().size(), 4u);
  EXPECT_EQ(f.tensors()[0].name, "c");  // buffer order
  EXPECT_EQ(f.tensors()[3].name, "a2");
  const SafetensorsTensor* ta = f.find("a");
  ASSERT_NE(ta, nullptr);
  EXPECT_TRUE(ta->shape.empty());
  EXPECT_EQ(ta->numel(), 1);
  EXPECT_EQ(f.read_f32(*ta), std::vector<float>{0.5f});
  EXPECT_EQ(f.read_f32(*f.find("b")), (std::vector<float>{1.0f, -2.0f}));
  EXPECT_EQ(f.find("a2")->numel(), 0);
  EXPECT_EQ(f.find("a2")->nbytes, 0u);
  EXPECT_EQ(f.find("nope"), nullptr);
  EXPECT_EQ(f.metadata().size(), 2u);
  // The data buffer starts 8-aligned after the padded header.
  EXPECT_EQ((f.find("c")->data - f.bytes().data()) % 8, 0);
}

TEST_F(Safetensors, NamesAreEscapedAsSerdeJsonDoes) {
  const float x = 1;
  const std::string h = safetensors_header({{"q\"b\\s\tn\x01\x7f\xc3\xa9", Dtype::F32, {1}, &x}}, {});
  EXPECT_EQ(h.substr(0, h.find(':')), "{\"q\\\"b\\\\s\\tn\\u0001\x7f\xc3\xa9\"");
  EXPECT_EQ(h.size() % 8, 0u);
  write_safetensors(path("e.safetensors"), {{"q\"b\\s\tn\x01\x7f\xc3\xa9", Dtype::F32, {1}, &x}});
  SafetensorsFile f(path("e.safetensors"));
  EXPECT_NE(f.find("q\"b\\s\tn\x01\x7f\xc3\xa9"), nullptr);
}

TEST_F(Safetensors, EveryDtypeRoundTripsBitForBit) {
  for (int d = 0; d <= static_cast<int>(Dtype::U64); ++d) {
    const Dtype dt = static_cast<Dtype>(d);
    const std::string name(dtype_name(dt));
    ASSERT_EQ(parse_dtype(name), dt);
    std::vector<uint8_t> data(dtype_size(dt) * 6);
    for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 37 + d);
    const std::string p = path(name + ".safetensors");
    write_safetensors(p, {{"t", dt, {2, 3}, data.data()}, {"scalar", dt, {}, data.data()}});
    SafetensorsFile f(p);
    const SafetensorsTensor* t = f.find("t");
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->dtype, dt);
    EXPECT_EQ(t->shape, (std::vector<int64_t>{2, 3}));
    ASSERT_EQ(t->nbytes, data.size());
    EXPECT_EQ(std::memcmp(t->data, data.data(), data.size()), 0) << name;
    EXPECT_EQ(std::memcmp(f.find("scalar")->data, data.data(), dtype_size(dt)), 0) << name;
  }
  EXPECT_FALSE(parse_dtype("F8_E4M3FN").has_value());
  EXPECT_FALSE(parse_dtype("f32").has_value());
}

TEST_F(Safetensors, HalfAndBfloatWidenExactly) {
  EXPECT_EQ(f16_to_f32(0x3C00), 1.0f);
  EXPECT_EQ(f16_to_f32(0xC000), -2.0f);
  EXPECT_EQ(f16_to_f32(0x7BFF), 65504.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(f16_to_f32(0x03FF), std::ldexp(1023.0f, -24));  // largest subnormal
  EXPECT_EQ(f16_to_f32(0x8400), -std::ldexp(1.0f, -14));  // smallest normal, negative
  EXPECT_EQ(f16_to_f32(0x3555), std::bit_cast<float>(0x3EAAA000u));  // 0.333...
  EXPECT_EQ(f16_to_f32(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(f16_to_f32(0xFC00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7E00)));
  EXPECT_TRUE(std::signbit(f16_to_f32(0x8000)) && f16_to_f32(0x8000) == 0.0f);

  EXPECT_EQ(bf16_to_f32(0x3F80), 1.0f);
  EXPECT_EQ(bf16_to_f32(0x4049), 3.140625f);
  EXPECT_EQ(bf16_to_f32(0x0001), std::bit_cast<float>(0x00010000u));
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x3F808000u)), 0x3F80);  // tie -> even (down)
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x3F818000u)), 0x3F82);  // tie -> even (up)
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x3F808001u)), 0x3F81);  // above the tie
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));

  const uint16_t h[3] = {0x3C00, 0x0001, 0xFC00};
  const uint16_t bf[2] = {0x3F80, 0xC049};
  write_safetensors(path("h.safetensors"), {{"h", Dtype::F16, {3}, h}, {"bf", Dtype::BF16, {2}, bf}});
  SafetensorsFile f(path("h.safetensors"));
  EXPECT_EQ(f.read_f32(*f.find("h")),
            (std::vector<float>{1.0f, std::ldexp(1.0f, -24), -std::numeric_limits<float>::infinity()}));
  EXPECT_EQ(f.read_f32(*f.find("bf")), (std::vector<float>{1.0f, -3.140625f}));
}

TEST_F(Safetensors, ReadingAnIntegerTensorAsFloatNamesFileAndTensor) {
  const int32_t v[2] = {1, 2};
  write_safetensors(path("i.safetensors"), {{"ids", Dtype::I32, {2}, v}});
  SafetensorsFile f(path("i.safetensors"));
  try {
    f.read_f32(*f.find("ids"));
    FAIL();
  } catch (const UsageError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(path("i.safetensors")), std::string::npos) << m;
    EXPECT_NE(m.find("'ids' has dtype I32"), std::string::npos) << m;
  }
  float out[3];
  EXPECT_THROW(f.read_f32(*f.find("ids"), out, 3), UsageError);
}

TEST_F(Safetensors, WriterReplacesAtomicallyAndRefusesBadInput) {
  const float x[2] = {1, 2};
  write_safetensors(path("w.safetensors"), {{"x", Dtype::F32, {2}, x}});
  write_safetensors(path("w.safetensors"), {{"y", Dtype::F32, {1}, x}});
  SafetensorsFile f(path("w.safetensors"));
  EXPECT_EQ(f.find("x"), nullptr);
  EXPECT_NE(f.find("y"), nullptr);
  int entries = 0;
  for (auto& e : fs::directory_iterator(dir_)) (void)e, ++entries;
  EXPECT_EQ(entries, 1) << "no temporary file left behind";

  EXPECT_THROW(write_safetensors(path("d.safetensors"), {{"x", Dtype::F32, {1}, x}, {"x", Dtype::F32, {1}, x}}), Error);
  EXPECT_THROW(write_safetensors(path("d.safetensors"), {{"__metadata__", Dtype::F32, {1}, x}}), Error);
  EXPECT_THROW(write_safetensors(path("d.safetensors"), {{"x", Dtype::F32, {2}, nullptr}}), Error);
  EXPECT_THROW(write_safetensors(path("d.safetensors"), {{"x", Dtype::F32, {-1}, x}}), Error);
  EXPECT_THROW(write_safetensors(path("d.safetensors"), {{"bad\xff", Dtype::F32, {1}, x}}), Error);
  EXPECT_FALSE(fs::exists(path("d.safetensors")));
}

TEST_F(Safetensors, CorruptFilesAreUsageErrorsNamingTheFileAndProblem) {
  const std::string f32x2(8, '\0');
  const std::string ok = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  // Sanity: the crafted good file opens.
  EXPECT_NO_THROW(SafetensorsFile(craft("good", ok, f32x2)));

  expect_bad(path("missing.safetensors"), "cannot read");
  expect_bad(raw("short", "abc"), "shorter than the 8-byte header length");
  expect_bad(raw("toolong", le64(1000) + ok), "runs past the end of the file");
  expect_bad(raw("huge", le64(uint64_t{1} << 40) + ok), "exceeds the 100 MB limit");
  expect_bad(craft("nobrace", " " + ok, f32x2), "does not start with '{'");
  expect_bad(craft("json", R"({"x":{"dtype":"F32",)", f32x2), "not valid JSON");
  expect_bad(craft("utf8", "{\"x\xff\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", f32x2),
             "not valid JSON");
  // A number past a double's range is nlohmann's out_of_range, not a parse_error.
  expect_bad(craft("overflow", R"({"x":{"dtype":"F32","shape":[2.2e4444],"data_offsets":[0,8]}})", f32x2),
             "not valid JSON");
  expect_bad(craft("array", "[1]", ""), "does not start with '{'");
  expect_bad(craft("dup", R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                   f32x2),
             "key 'x' twice");
  expect_bad(craft("dupnested", R"({"x":{"dtype":"F32","shape":[2],"dtype":"F32","data_offsets":[0,8]}})", f32x2),
             "key 'dtype' twice");
  expect_bad(craft("dtype", R"({"x":{"dtype":"F31","shape":[2],"data_offsets":[0,8]}})", f32x2), "unknown dtype \"F31\"");
  expect_bad(craft("negshape", R"({"x":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", f32x2),
             "shape must hold non-negative integers");
  expect_bad(craft("floatshape", R"({"x":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", f32x2),
             "shape must hold non-negative integers");
  expect_bad(craft("overflow", R"({"x":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", f32x2),
             "overflows");
  expect_bad(craft("nofield", R"({"x":{"dtype":"F32","shape":[2]}})", f32x2), "needs dtype, shape and data_offsets");
  expect_bad(craft("extrafield", R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"offsets":[0,8]}})", f32x2),
             "unknown field 'offsets'");
  expect_bad(craft("offsets3", R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,4,8]}})", f32x2),
             "data_offsets must be [BEGIN, END]");
  expect_bad(craft("reversed", R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", f32x2),
             "end before they begin");
  expect_bad(craft("truncated", ok, std::string(6, '\0')), "run past the end of the 6-byte data buffer");
  expect_bad(craft("size", R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", f32x2),
             "F32 [3] needs 12 bytes but data_offsets [0,8] hold 8");
  expect_bad(craft("overlap", R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"y":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                   f32x2),
             "overlaps tensor");
  expect_bad(craft("hole", R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"y":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                   std::string(12, '\0')),
             "bytes 4..8 of the data buffer belong to no tensor");
  expect_bad(craft("startgap", R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", f32x2),
             "bytes 0..4 of the data buffer belong to no tensor");
  expect_bad(craft("trailing", ok, f32x2 + "junk"), "bytes 8..12 of the data buffer belong to no tensor");
  expect_bad(craft("meta", R"({"__metadata__":{"a":1},"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", f32x2),
             "__metadata__ value of 'a' is not a string");
  expect_bad(craft("metaobj", R"({"__metadata__":"pt","x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", f32x2),
             "__metadata__ must be an object");
  expect_bad(craft("notobj", R"({"x":[1,2]})", f32x2), "expected {dtype, shape, data_offsets}");
}

TEST_F(Safetensors, ReaderAcceptsUnpaddedHeadersAndAnyEntryOrder) {
  // Other writers (MLX) do not pad; entries need not be in buffer order in the JSON.
  const float v[3] = {1, 2, 3};
  std::string buf(reinterpret_cast<const char*>(v), 12);
  const std::string p = craft("unpadded",
                              R"({"y":{"dtype":"F32","shape":[1],"data_offsets":[8,12]},"__metadata__":null,)"
                              R"("x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                              buf);
  SafetensorsFile f(p);
  ASSERT_EQ(f.tensors().size(), 2u);
  EXPECT_TRUE(f.metadata().empty());
  EXPECT_EQ(f.tensors()[0].name, "x");
  EXPECT_EQ(f.read_f32(*f.find("y")), std::vector<float>{3.0f});
  EXPECT_EQ(f.read_f32(*f.find("x")), (std::vector<float>{1.0f, 2.0f}));
  // Moving keeps the mapping alive.
  SafetensorsFile g = std::move(f);
  EXPECT_EQ(g.read_f32(*g.find("y")), std::vector<float>{3.0f});
  EXPECT_EQ(g.path(), p);
}

// A tensor given by the fill callback (streamed from elsewhere, one tensor at a time) is written as
// the same bytes as one given by its data, in the writer's order.
TEST_F(Safetensors, FilledTensorsWriteTheSameBytesAsGivenOnes) {
  std::vector<float> a = {1.5f, -2.0f, 3.25f}, b = {7.0f, 8.0f};
  write_safetensors(path("given.safetensors"), {{"b", Dtype::F32, {2}, b.data()}, {"a", Dtype::F32, {3}, a.data()}});
  std::vector<size_t> order;
  const std::vector<const std::vector<float>*> values = {&b, &a};
  write_safetensors(path("filled.safetensors"), {{"b", Dtype::F32, {2}, nullptr}, {"a", Dtype::F32, {3}, nullptr}}, {},
                    [&](size_t i, size_t offset, size_t n, void* dst) {
                      order.push_back(i);
                      std::memcpy(dst, reinterpret_cast<const uint8_t*>(values[i]->data()) + offset, n);
                    });
  EXPECT_EQ(read_file(path("filled.safetensors")), read_file(path("given.safetensors")));
  EXPECT_EQ(order, (std::vector<size_t>{1, 0})) << "each filled once, in the file's order";
  // A tensor larger than the fill window comes in windows, each asked for once, in order.
  std::vector<float> big(kFillWindow / sizeof(float) + 3);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i);
  write_safetensors(path("big_given.safetensors"), {{"big", Dtype::F32, {static_cast<int64_t>(big.size())}, big.data()}});
  std::vector<std::pair<size_t, size_t>> windows;
  write_safetensors(path("big_filled.safetensors"), {{"big", Dtype::F32, {static_cast<int64_t>(big.size())}, nullptr}},
                    {}, [&](size_t, size_t offset, size_t n, void* dst) {
                      windows.emplace_back(offset, n);
                      std::memcpy(dst, reinterpret_cast<const uint8_t*>(big.data()) + offset, n);
                    });
  EXPECT_EQ(sha256_hex(read_file(path("big_filled.safetensors"))), sha256_hex(read_file(path("big_given.safetensors"))));
  EXPECT_EQ(windows, (std::vector<std::pair<size_t, size_t>>{{0, kFillWindow}, {kFillWindow, 12}}));
  EXPECT_THROW(write_safetensors(path("none.safetensors"), {{"c", Dtype::F32, {1}, nullptr}}), Error);
}

// The file's SHA-256 read a window at a time is sha256sum's; pages given back read again the same.
TEST_F(Safetensors, HashAndReleaseLeaveTheMappedBytesAsTheFileHolds) {
  std::vector<float> big(3u << 20);  // 12 MB: several pages, not one window
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i % 1000) * 0.25f;
  write_safetensors(path("big.safetensors"), {{"w", Dtype::F32, {static_cast<int64_t>(big.size())}, big.data()}});
  const SafetensorsFile f(path("big.safetensors"));
  EXPECT_EQ(to_hex(f.sha256()), sha256_hex(read_file(path("big.safetensors"))));
  const SafetensorsTensor& t = *f.find("w");
  f.release(t.data, t.nbytes);
  EXPECT_EQ(f.read_f32(t), big);
  f.release(f.bytes().data(), f.bytes().size());
  EXPECT_EQ(to_hex(sha256(f.bytes().data(), f.bytes().size())), sha256_hex(read_file(path("big.safetensors"))));
}
