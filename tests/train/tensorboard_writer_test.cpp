// TensorBoard event files: CRC-32C's check value, an Event's exact bytes, and a written file read
// back record by record (framing, CRCs, the version event, then each scalar's tag, step and value).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "core/crc32c.hpp"
#include "core/error.hpp"
#include "train/tensorboard_writer.hpp"
#include "tfevents_reader.hpp"

using namespace laoyao;
using namespace laoyao::test;
namespace fs = std::filesystem;

TEST(Crc32c, CheckValueAndMask) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c("", 0), 0u);
  // Continuing over a split input gives the whole input's CRC.
  EXPECT_EQ(crc32c("6789", 4, crc32c("12345", 5)), 0xE3069283u);
  const uint32_t c = crc32c("123456789", 9);
  EXPECT_EQ(masked_crc32c("123456789", 9), ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

TEST(TensorBoardWriter, ScalarEventBytes) {
  // Event{wall_time 1.5, step 3, summary{value{tag "a", simple_value 2}}}.
  const std::string want("\x09\x00\x00\x00\x00\x00\x00\xF8\x3F"  // wall_time
                         "\x10\x03"                               // step
                         "\x2A\x0A\x0A\x08\x0A\x01"
                         "a"
                         "\x15\x00\x00\x00\x40",
                         23);
  EXPECT_EQ(train::tensorboard_scalar_event(1.5, 3, "a", 2.0f), want);
  // Step 0 is proto3's default: not written.
  EXPECT_EQ(train::tensorboard_scalar_event(1.5, 0, "a", 2.0f).substr(9, 1), "\x2A");
  const std::string framed = train::tfrecord(want);
  ASSERT_EQ(framed.size(), 8 + 4 + want.size() + 4);
  EXPECT_EQ(read_le<uint64_t>(framed, 0), want.size());
}

TEST(TensorBoardWriter, WritesReadableRecords) {
  const fs::path dir = fs::temp_directory_path() / ("laoyao_tb_" + std::to_string(::getpid())) / "tb";
  fs::remove_all(dir.parent_path());
  std::string path;
  {
    train::TensorBoardWriter w(dir.string());  // creates the directory
    path = w.path();
    w.add_scalar("lm loss", 10.5, 1);
    w.add_scalar("lm loss vs samples", 10.5, 16);
    w.add_scalar("learning-rate", 3e-4, 1234567890123);
    w.flush();
  }
  EXPECT_EQ(fs::path(path).parent_path(), dir);
  EXPECT_EQ(fs::path(path).filename().string().rfind("events.out.tfevents.", 0), 0u);
  const std::vector<Decoded> events = read_events(path);
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  EXPECT_GT(events[0].wall_time, 1.6e9);
  const char* tags[] = {"lm loss", "lm loss vs samples", "learning-rate"};
  const int64_t steps[] = {1, 16, 1234567890123};
  const float values[] = {10.5f, 10.5f, 3e-4f};
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(events[i + 1].tag, tags[i]);
    EXPECT_EQ(events[i + 1].step, steps[i]);
    EXPECT_EQ(events[i + 1].value, values[i]);
    EXPECT_GE(events[i + 1].wall_time, events[0].wall_time);
  }
  fs::remove_all(dir.parent_path());
}

TEST(TensorBoardWriter, AnUnwritableDirectoryIsNamed) {
  try {
    train::TensorBoardWriter w("/proc/laoyao_no_such_dir/tb");
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("/proc/laoyao_no_such_dir/tb"), std::string::npos) << e.what();
  }
}
