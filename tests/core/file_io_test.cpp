#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "core/error.hpp"
#include "core/file_io.hpp"

using namespace laoyao;

TEST(FileIo, AtomicWriteReplacesWholeFileAndLeavesNoTemporary) {
  auto dir = std::filesystem::temp_directory_path() / ("laoyao_file_io_test_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::string path = (dir / "sub" / "f.txt").string();
  write_file_atomic(path, "first");
  write_file_atomic(path, "second, longer");
  EXPECT_EQ(read_file(path), "second, longer");
  int entries = 0;
  for (auto& e : std::filesystem::directory_iterator(dir / "sub")) (void)e, ++entries;
  EXPECT_EQ(entries, 1);
  std::filesystem::remove_all(dir);
}

TEST(FileIo, ReadingAMissingFileIsAUsageErrorNamingIt) {
  try {
    read_file("/nonexistent/laoyao.yaml");
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/laoyao.yaml"), std::string::npos);
  }
}

TEST(FileIo, ReadingADirectoryIsAUsageErrorSayingSo) {
  auto dir = std::filesystem::temp_directory_path() / ("laoyao_file_io_dir_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  try {
    read_file(dir.string());
    FAIL() << "a directory was read as a file";
  } catch (const UsageError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(dir.string()), std::string::npos) << m;
    EXPECT_NE(m.find("is a directory"), std::string::npos) << m;
  }
  std::filesystem::remove_all(dir);
}

TEST(FileIo, ReadingADeviceIsAUsageErrorNotAnEndlessRead) {
  try {
    read_file("/dev/zero");
    FAIL() << "/dev/zero was read";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("'/dev/zero' is a device or socket"), std::string::npos) << e.what();
  }
}
