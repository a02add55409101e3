// Megatron .bin/.idx reader and writer: byte-exact format, round trips for every dtype, and a
// UsageError (naming the file) for every kind of corruption.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/file_io.hpp"
#include "data/indexed_dataset.hpp"

using namespace laoyao;
using namespace laoyao::data;
namespace fs = std::filesystem;

namespace {

std::string bytes(std::initializer_list<int> b) {
  std::string s;
  for (int x : b) s.push_back(static_cast<char>(x));
  return s;
}

// A scratch directory per test.
struct TempDir {
  fs::path dir;
  TempDir() {
    dir = fs::temp_directory_path() /
          ("laoyao_idx_" + std::to_string(::getpid()) + "_" +
           std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~TempDir() { fs::remove_all(dir); }
  std::string prefix(const std::string& name = "ds") const { return (dir / name).string(); }
  int entries() const {
    int n = 0;
    for (auto& e : fs::directory_iterator(dir)) (void)e, ++n;
    return n;
  }
};

// Written by hand from the format in reference/megatron-lm.md §6: two documents of uint16 ids,
// [1, 2, 3] and [65535].
const std::string kHandIdx = bytes({
    0x4D, 0x4D, 0x49, 0x44, 0x49, 0x44, 0x58, 0x00, 0x00,  // "MMIDIDX\0\0"
    0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,        // version 1
    0x08,                                                  // dtype code 8 = uint16
    0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,        // sequence_count 2
    0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,        // document_count 3 (= docs + 1)
    0x03, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00,        // lengths int32 [3, 1]
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,        // pointers int64 [0,
    0x06, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,        //                 6]
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,        // document_indices int64 [0,
    0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,        //                          1,
    0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,        //                          2]
});
const std::string kHandBin = bytes({0x01, 0x00, 0x02, 0x00, 0x03, 0x00, 0xFF, 0xFF});

// Sentence-level data with int32 ids: document 0 = sequences {[7, -1], [300000]}, document 1 =
// sequence {[]}, i.e. document_indices [0, 2, 3].
const std::string kSentenceIdx = bytes({
    0x4D, 0x4D, 0x49, 0x44, 0x49, 0x44, 0x58, 0x00, 0x00,
    0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x04,                                                  // int32
    0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,        // 3 sequences
    0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,        // 3 document indices
    0x02, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  // lengths [2, 1, 0]
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,        // pointers [0, 8, 12]
    0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x0C, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,        // document_indices [0, 2, 3]
    0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
});
const std::string kSentenceBin = bytes({0x07, 0x00, 0x00, 0x00, 0xFF, 0xFF, 0xFF, 0xFF,
                                        0xE0, 0x93, 0x04, 0x00});  // 7, -1, 300000

void write_pair(const std::string& prefix, const std::string& idx, const std::string& bin) {
  write_file_atomic(idx_path(prefix), idx);
  write_file_atomic(bin_path(prefix), bin);
}

// Opening must fail with a UsageError whose message contains every fragment.
void expect_usage_error(const std::string& prefix, std::vector<std::string> fragments,
                        IndexedDatasetOptions opts = {}) {
  try {
    IndexedDataset ds(prefix, opts);
    ADD_FAILURE() << "opening " << prefix << " should have failed";
  } catch (const UsageError& e) {
    std::string msg = e.what();
    for (const auto& f : fragments) {
      EXPECT_NE(msg.find(f), std::string::npos) << "message '" << msg << "' lacks '" << f << "'";
    }
  }
}

std::string with_byte(std::string s, size_t at, int value) {
  s.replace(at, 1, 1, static_cast<char>(value));
  return s;
}

}  // namespace

TEST(IndexedDataset, DtypeTableAndOptimalDtypeMatchMegatron) {
  EXPECT_EQ(static_cast<int>(TokenDType::kUInt8), 1);
  EXPECT_EQ(static_cast<int>(TokenDType::kInt8), 2);
  EXPECT_EQ(static_cast<int>(TokenDType::kInt16), 3);
  EXPECT_EQ(static_cast<int>(TokenDType::kInt32), 4);
  EXPECT_EQ(static_cast<int>(TokenDType::kInt64), 5);
  EXPECT_EQ(static_cast<int>(TokenDType::kFloat64), 6);
  EXPECT_EQ(static_cast<int>(TokenDType::kFloat32), 7);
  EXPECT_EQ(static_cast<int>(TokenDType::kUInt16), 8);
  const size_t sizes[] = {1, 1, 2, 4, 8, 8, 4, 2};
  for (int c = 1; c <= 8; ++c) EXPECT_EQ(dtype_size(static_cast<TokenDType>(c)), sizes[c - 1]);
  EXPECT_EQ(optimal_dtype(50257), TokenDType::kUInt16);
  EXPECT_EQ(optimal_dtype(65499), TokenDType::kUInt16);
  EXPECT_EQ(optimal_dtype(65500), TokenDType::kInt32);
  EXPECT_EQ(optimal_dtype(128256), TokenDType::kInt32);
}

TEST(IndexedDataset, BuilderWritesTheHandMadeBytesExactly) {
  TempDir t;
  IndexedDatasetBuilder b(t.prefix(), TokenDType::kUInt16);
  b.add_item(std::vector<int64_t>{1, 2, 3});
  b.end_document();
  b.add_item(std::vector<int64_t>{65535});
  b.end_document();
  b.finalize();
  EXPECT_EQ(read_file(idx_path(t.prefix())), kHandIdx);
  EXPECT_EQ(read_file(bin_path(t.prefix())), kHandBin);
  EXPECT_EQ(t.entries(), 2) << "temporary files left behind";
}

TEST(IndexedDataset, BuilderWritesSentenceLevelBytesExactly) {
  TempDir t;
  IndexedDatasetBuilder b(t.prefix(), TokenDType::kInt32);
  b.add_document(std::vector<int64_t>{7, -1, 300000}, std::vector<int64_t>{2, 1});
  b.add_item(std::vector<int64_t>{});
  b.end_document();
  b.finalize();
  EXPECT_EQ(read_file(idx_path(t.prefix())), kSentenceIdx);
  EXPECT_EQ(read_file(bin_path(t.prefix())), kSentenceBin);
}

TEST(IndexedDataset, ReaderReadsTheHandMadeFiles) {
  TempDir t;
  write_pair(t.prefix(), kHandIdx, kHandBin);
  IndexedDataset ds(t.prefix());
  EXPECT_EQ(ds.dtype(), TokenDType::kUInt16);
  EXPECT_EQ(ds.num_documents(), 2);
  EXPECT_EQ(ds.document_length(0), 3);
  EXPECT_EQ(ds.document_length(1), 1);
  EXPECT_EQ(ds.sequence(0), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(ds.sequence(1), (std::vector<int64_t>{65535}));
  EXPECT_EQ(ds.sequence_pointers(), (std::vector<int64_t>{0, 6}));
  EXPECT_EQ(ds.document_indices(), (std::vector<int64_t>{0, 1, 2}));
  std::vector<int64_t> out{42};
  ds.read_tokens(0, 1, 2, out);  // appends
  EXPECT_EQ(out, (std::vector<int64_t>{42, 2, 3}));
  ds.read_tokens(0, 3, 0, out);
  EXPECT_EQ(out.size(), 3u);
  EXPECT_FALSE(ds.multimodal());
  EXPECT_EQ(ds.name(), t.prefix());

  write_pair(t.prefix("s"), kSentenceIdx, kSentenceBin);
  IndexedDataset s(t.prefix("s"));
  EXPECT_EQ(s.sequence_count(), 3);
  EXPECT_EQ(s.document_indices(), (std::vector<int64_t>{0, 2, 3}));
  EXPECT_EQ(s.sequence(0), (std::vector<int64_t>{7, -1}));
  EXPECT_EQ(s.sequence(1), (std::vector<int64_t>{300000}));
  EXPECT_TRUE(s.sequence(2).empty());
}

TEST(IndexedDataset, ReadOutsideASequenceIsAnErrorNamingTheDataset) {
  TempDir t;
  write_pair(t.prefix(), kHandIdx, kHandBin);
  IndexedDataset ds(t.prefix());
  std::vector<int64_t> out;
  EXPECT_THROW(ds.read_tokens(0, 2, 2, out), Error);
  EXPECT_THROW(ds.read_tokens(0, -1, 1, out), Error);
  EXPECT_THROW(ds.read_tokens(2, 0, 0, out), Error);
  EXPECT_THROW(ds.document_length(-1), Error);
  try {
    ds.read_tokens(1, 0, 5, out);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(t.prefix()), std::string::npos);
  }
  EXPECT_TRUE(out.empty());
}

TEST(IndexedDataset, RoundTripsEveryDtype) {
  TempDir t;
  for (TokenDType dt : kAllTokenDTypes) {
    std::vector<int64_t> values;
    switch (dt) {
      case TokenDType::kUInt8: values = {0, 1, 127, 128, 255}; break;
      case TokenDType::kInt8: values = {-128, -1, 0, 1, 127}; break;
      case TokenDType::kInt16: values = {-32768, -1, 0, 256, 32767}; break;
      case TokenDType::kUInt16: values = {0, 1, 256, 50256, 65535}; break;
      case TokenDType::kInt32: values = {INT32_MIN, -1, 0, 128255, INT32_MAX}; break;
      case TokenDType::kInt64: values = {INT64_MIN, -1, 0, int64_t{1} << 40, INT64_MAX}; break;
      case TokenDType::kFloat32: values = {-16777216, -1, 0, 151642, 16777216}; break;
      case TokenDType::kFloat64: values = {-(int64_t{1} << 53), -1, 0, 151642, int64_t{1} << 53}; break;
    }
    const std::string prefix = t.prefix(dtype_name(dt));
    // Documents: [v0 v1 v2], [] (an empty sequence), [v3 v4 v0 v1] split into two sequences.
    IndexedDatasetBuilder b(prefix, dt);
    b.add_item(std::vector<int64_t>{values[0], values[1], values[2]});
    b.end_document();
    b.add_item(std::vector<int64_t>{});
    b.end_document();
    b.add_document(std::vector<int64_t>{values[3], values[4], values[0], values[1]},
                   std::vector<int64_t>{1, 3});
    b.finalize();

    const size_t item = dtype_size(dt);
    EXPECT_EQ(fs::file_size(bin_path(prefix)), 7 * item) << dtype_name(dt);
    EXPECT_EQ(fs::file_size(idx_path(prefix)), 34u + 12 * 4 + 8 * 4) << dtype_name(dt);
    IndexedDataset ds(prefix);
    EXPECT_EQ(ds.dtype(), dt);
    ASSERT_EQ(ds.sequence_count(), 4);
    EXPECT_EQ(ds.sequence(0), (std::vector<int64_t>{values[0], values[1], values[2]})) << dtype_name(dt);
    EXPECT_TRUE(ds.sequence(1).empty());
    EXPECT_EQ(ds.sequence(2), (std::vector<int64_t>{values[3]})) << dtype_name(dt);
    EXPECT_EQ(ds.sequence(3), (std::vector<int64_t>{values[4], values[0], values[1]})) << dtype_name(dt);
    EXPECT_EQ(ds.sequence_lengths(), (std::vector<int32_t>{3, 0, 1, 3}));
    const int64_t it = static_cast<int64_t>(item);
    EXPECT_EQ(ds.sequence_pointers(), (std::vector<int64_t>{0, 3 * it, 3 * it, 4 * it}));
    EXPECT_EQ(ds.document_indices(), (std::vector<int64_t>{0, 1, 2, 4}));
  }
}

TEST(IndexedDataset, BuilderRefusesValuesTheDtypeCannotHold) {
  TempDir t;
  IndexedDatasetBuilder b(t.prefix(), TokenDType::kUInt16);
  EXPECT_THROW(b.add_item(std::vector<int64_t>{65536}), UsageError);
  EXPECT_THROW(b.add_item(std::vector<int64_t>{-1}), UsageError);
  IndexedDatasetBuilder f(t.prefix("f"), TokenDType::kFloat32);
  EXPECT_THROW(f.add_item(std::vector<int64_t>{16777217}), UsageError);
}

TEST(IndexedDataset, UnfinishedBuilderLeavesNoFiles) {
  TempDir t;
  {
    IndexedDatasetBuilder b(t.prefix(), TokenDType::kInt32);
    b.add_item(std::vector<int64_t>{1, 2});
    b.end_document();
  }
  EXPECT_EQ(t.entries(), 0);
  // Finalizing replaces an existing dataset whole.
  write_pair(t.prefix(), kHandIdx, kHandBin);
  IndexedDatasetBuilder b(t.prefix(), TokenDType::kInt32);
  b.add_item(std::vector<int64_t>{9});
  b.end_document();
  b.finalize();
  EXPECT_EQ(t.entries(), 2);
  IndexedDataset ds(t.prefix());
  EXPECT_EQ(ds.sequence(0), (std::vector<int64_t>{9}));
  EXPECT_THROW(b.add_item(std::vector<int64_t>{1}), Error);
}

TEST(IndexedDataset, LargeDatasetStreamsThroughTheBuffer) {
  TempDir t;
  IndexedDatasetBuilder b(t.prefix(), TokenDType::kInt32);
  std::vector<int64_t> big(400000);  // 1.6 MB, more than the write buffer
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<int64_t>(i * 7919 % 100003);
  for (int d = 0; d < 3; ++d) {
    b.add_item(std::vector<int64_t>{d, d + 1});
    b.add_item(big);
    b.end_document();
  }
  b.finalize();
  IndexedDataset ds(t.prefix(), IndexedDatasetOptions{.check_vocab_size = 100003});
  EXPECT_EQ(ds.sequence_count(), 6);
  EXPECT_EQ(ds.sequence(5), big);
  EXPECT_EQ(ds.sequence(4), (std::vector<int64_t>{2, 3}));
}

TEST(IndexedDataset, MissingFilesAreUsageErrorsNamingThem) {
  TempDir t;
  expect_usage_error(t.prefix(), {idx_path(t.prefix())});
  write_file_atomic(idx_path(t.prefix()), kHandIdx);
  expect_usage_error(t.prefix(), {bin_path(t.prefix())});
}

TEST(IndexedDataset, BadMagicIsRefused) {
  TempDir t;
  write_pair(t.prefix(), with_byte(kHandIdx, 0, 'X'), kHandBin);
  expect_usage_error(t.prefix(), {idx_path(t.prefix()), "magic"});
}

TEST(IndexedDataset, UnknownVersionIsRefused) {
  TempDir t;
  write_pair(t.prefix(), with_byte(kHandIdx, 9, 2), kHandBin);
  expect_usage_error(t.prefix(), {idx_path(t.prefix()), "version 2"});
}

TEST(IndexedDataset, UnknownDtypeCodeIsRefused) {
  TempDir t;
  for (int code : {0, 9, 255}) {
    write_pair(t.prefix(), with_byte(kHandIdx, 17, code), kHandBin);
    expect_usage_error(t.prefix(), {idx_path(t.prefix()), "dtype code " + std::to_string(code)});
  }
}

TEST(IndexedDataset, TruncatedOrOversizedIndexIsRefused) {
  TempDir t;
  write_pair(t.prefix(), kHandIdx.substr(0, 20), kHandBin);
  expect_usage_error(t.prefix(), {idx_path(t.prefix()), "header"});
  write_pair(t.prefix(), kHandIdx.substr(0, kHandIdx.size() - 1), kHandBin);
  expect_usage_error(t.prefix(), {idx_path(t.prefix()), "truncated"});
  write_pair(t.prefix(), kHandIdx + "x", kHandBin);
  expect_usage_error(t.prefix(), {idx_path(t.prefix()), "does not match"});
  // A huge sequence count must not overflow into a "valid" size.
  std::string huge = kHandIdx;
  for (int i = 0; i < 8; ++i) huge[18 + i] = static_cast<char>(0xFF);
  write_pair(t.prefix(), huge, kHandBin);
  expect_usage_error(t.prefix(), {idx_path(t.prefix())});
}

TEST(IndexedDataset, TruncatedBinIsRefused) {
  TempDir t;
  write_pair(t.prefix(), kHandIdx, kHandBin.substr(0, 7));
  expect_usage_error(t.prefix(), {bin_path(t.prefix()), "sequence 1", "truncated"});
}

TEST(IndexedDataset, PointerOrLengthPastTheEndIsRefused) {
  TempDir t;
  // lengths live at 34..41, pointers at 42..57: set pointer[1] (bytes 50..57) to 8.
  write_pair(t.prefix(), with_byte(kHandIdx, 50, 0x08), kHandBin);
  expect_usage_error(t.prefix(), {bin_path(t.prefix()), "sequence 1"});
  write_pair(t.prefix(), with_byte(kHandIdx, 34, 0x05), kHandBin);  // length[0] = 5
  expect_usage_error(t.prefix(), {bin_path(t.prefix()), "sequence 0"});
  write_pair(t.prefix(), with_byte(kHandIdx, 41, 0x80), kHandBin);  // length[1] < 0
  expect_usage_error(t.prefix(), {idx_path(t.prefix()), "negative length"});
  write_pair(t.prefix(), with_byte(kHandIdx, 57, 0x80), kHandBin);  // pointer[1] < 0
  expect_usage_error(t.prefix(), {idx_path(t.prefix()), "negative pointer"});
}

TEST(IndexedDataset, DocumentIndexOutOfRangeIsRefused) {
  TempDir t;
  // document_indices at 58..81: [0, 1, 2].
  write_pair(t.prefix(), with_byte(kHandIdx, 66, 0x07), kHandBin);
  expect_usage_error(t.prefix(), {idx_path(t.prefix()), "document index 1 is 7"});
  write_pair(t.prefix(), with_byte(kHandIdx, 58, 0x01), kHandBin);
  expect_usage_error(t.prefix(), {idx_path(t.prefix()), "start with 0"});
  write_pair(t.prefix(), with_byte(kHandIdx, 74, 0x01), kHandBin);
  expect_usage_error(t.prefix(), {idx_path(t.prefix()), "end with the sequence count"});
  write_pair(t.prefix(), with_byte(with_byte(kHandIdx, 66, 0x02), 74, 0x01), kHandBin);
  expect_usage_error(t.prefix(), {idx_path(t.prefix()), "decrease"});
}

TEST(IndexedDataset, VocabCheckReportsTheOffendingToken) {
  TempDir t;
  write_pair(t.prefix(), kHandIdx, kHandBin);
  IndexedDataset ok(t.prefix(), IndexedDatasetOptions{.check_vocab_size = 65536});
  EXPECT_EQ(ok.sequence_count(), 2);
  expect_usage_error(t.prefix(), {bin_path(t.prefix()), "65535", "sequence 1", "position 0", "65535)"},
                     IndexedDatasetOptions{.check_vocab_size = 65535});
  write_pair(t.prefix("s"), kSentenceIdx, kSentenceBin);
  expect_usage_error(t.prefix("s"), {"-1", "sequence 0", "position 1"},
                     IndexedDatasetOptions{.check_vocab_size = 1000000});
}

// Megatron's writer lays the sequences back to back from byte 0 and the .bin ends right after
// the last one; the reader holds every index to that, so a wrong dtype byte or a .bin that does
// not belong to the .idx is refused instead of read as garbage.

TEST(IndexedDataset, MisalignedPointerIsRefusedNamingTheSequence) {
  TempDir t;
  write_pair(t.prefix(), with_byte(kHandIdx, 50, 0x05), kHandBin);  // pointer[1] = 5 (uint16)
  expect_usage_error(t.prefix(), {idx_path(t.prefix()), "sequence 1 has pointer 5",
                                  "not a multiple of the 2-byte size of its dtype uint16"});
}

TEST(IndexedDataset, PointersThatAreNotBackToBackAreRefused) {
  TempDir t;
  // kSentenceIdx (int32): lengths [2, 1, 0] at 34..45, pointers [0, 8, 12] at 46.., 54.., 62...
  write_pair(t.prefix(), with_byte(kSentenceIdx, 54, 0x04), kSentenceBin);  // pointer[1] = 4
  expect_usage_error(t.prefix(), {idx_path(t.prefix()), "sequence 1 starts at byte 4",
                                  "2 tokens of int32 before it end at byte 8", "back to back"});
  try {
    IndexedDataset ds(t.prefix());
  } catch (const UsageError& e) {
    // No dtype explains a pointer moved back: the message must not blame one.
    EXPECT_EQ(std::string(e.what()).find("bytes per token"), std::string::npos) << e.what();
  }
  write_pair(t.prefix(), with_byte(kSentenceIdx, 46, 0x04), kSentenceBin);  // pointer[0] = 4
  expect_usage_error(t.prefix(), {idx_path(t.prefix()), "sequence 0 starts at byte 4", "not 0"});
  write_pair(t.prefix(), with_byte(kSentenceIdx, 62, 0x08), kSentenceBin);  // pointer[2] = 8 (empty)
  expect_usage_error(t.prefix(), {idx_path(t.prefix()), "sequence 2 starts at byte 8"});
}

TEST(IndexedDataset, DtypeByteThatDoesNotMatchThePointersIsRefused) {
  TempDir t;
  // The hand-made uint16 index with its dtype byte turned into uint8: the pointers [0, 6] say
  // 2 bytes per token, the dtype 1.
  write_pair(t.prefix(), with_byte(kHandIdx, 17, 1), kHandBin);
  expect_usage_error(t.prefix(), {idx_path(t.prefix()), "sequence 1 starts at byte 6",
                                  "2 bytes per token", "dtype code 1 (uint8, 1 byte)", "probably does not match"});
}

TEST(IndexedDataset, BinOfTheWrongSizeIsRefusedWithTheLikelyCause) {
  TempDir t;
  // A self-consistent uint8 index of [1, 2, 3], [255] (4 bytes) over the uint16 .bin of the same
  // tokens (8 bytes): the .bin is twice what the index describes.
  const std::vector<int32_t> lengths{3, 1};
  const std::vector<int64_t> docs{0, 1, 2};
  write_pair(t.prefix(), encode_index(TokenDType::kUInt8, lengths, docs), kHandBin);
  expect_usage_error(t.prefix(), {bin_path(t.prefix()), idx_path(t.prefix()), "is 8 bytes",
                                  "4 tokens of uint8 = 4 bytes", "2 bytes per token",
                                  "dtype code 1 (uint8, 1 byte) probably does not match"});
  // A stray trailing byte: no dtype explains it.
  write_pair(t.prefix(), kHandIdx, kHandBin + "x");
  expect_usage_error(t.prefix(), {bin_path(t.prefix()), "is 9 bytes", "4 tokens of uint16 = 8 bytes",
                                  "does not belong to this .idx or is damaged"});
  // An index of no tokens over a non-empty .bin.
  write_pair(t.prefix(), encode_index(TokenDType::kUInt16, std::vector<int32_t>{0},
                                      std::vector<int64_t>{0, 1}), kHandBin);
  expect_usage_error(t.prefix(), {bin_path(t.prefix()), "0 tokens of uint16 = 0 bytes"});
  // The same uint8 index over its own 4-byte .bin reads fine.
  write_pair(t.prefix(), encode_index(TokenDType::kUInt8, lengths, docs), bytes({1, 2, 3, 255}));
  IndexedDataset ds(t.prefix());
  EXPECT_EQ(ds.sequence(1), (std::vector<int64_t>{255}));
}

// A float dtype's token must hold an integer: NaN, fractions and values past int64 have none
// (casting them would be undefined behaviour).
TEST(IndexedDataset, FloatTokensWithNoIntegerValueAreRefusedNamingTheSequence) {
  TempDir t;
  for (TokenDType dtype : {TokenDType::kFloat32, TokenDType::kFloat64}) {
    for (double bad : {std::nan(""), 2.5, 1e300, -1e19}) {
      {
        IndexedDatasetBuilder b(t.prefix(), dtype);
        const std::vector<int64_t> first = {1, 2, 3}, second = {4, 5, 6};
        b.add_item(first);
        b.add_item(second);
        b.end_document();
        b.finalize();
      }
      {  // the second sequence's middle token becomes `bad`
        std::fstream f(bin_path(t.prefix()), std::ios::in | std::ios::out | std::ios::binary);
        const size_t item = dtype_size(dtype);
        f.seekp(static_cast<std::streamoff>(4 * item));
        if (dtype == TokenDType::kFloat32) {
          const float v = static_cast<float>(bad);
          f.write(reinterpret_cast<const char*>(&v), sizeof v);
        } else {
          f.write(reinterpret_cast<const char*>(&bad), sizeof bad);
        }
      }
      IndexedDataset ds(t.prefix());
      EXPECT_EQ(ds.sequence(0), (std::vector<int64_t>{1, 2, 3}));
      std::vector<int64_t> out = {7};
      try {
        ds.read_tokens(1, 0, 3, out);
        ADD_FAILURE() << "accepted " << bad;
      } catch (const UsageError& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find(bin_path(t.prefix())), std::string::npos) << m;
        EXPECT_NE(m.find("token 1 of sequence 1"), std::string::npos) << m;
      }
      EXPECT_EQ(out, std::vector<int64_t>{7});  // nothing half-appended
    }
  }
}
