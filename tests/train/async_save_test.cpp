// --async-save's writer (train/async_save.hpp): the copy is written on a thread, the lines come in
// Megatron's order, and a write that fails there fails the run where it is finalized.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "core/error.hpp"
#include "train/async_save.hpp"
#include "train/checkpoint.hpp"

using namespace laoyao;

namespace {

std::unique_ptr<train::RunCheckpointCopy> tiny_copy(const std::string& dir, int64_t iteration) {
  auto c = std::make_unique<train::RunCheckpointCopy>();
  c->save_dir = dir;
  c->iteration = iteration;
  c->weights = {1.5f, -2.0f, 0.25f, 4.0f, 8.0f, -0.5f};
  c->write.model.push_back({"decoder.final_layernorm.weight", {2, 3}, c->weights.data()});
  c->write.state.iteration = iteration;
  c->write.run_config_yaml = "model: {}\n";
  return c;
}

std::string read_text(std::FILE* f) {
  std::string out;
  std::rewind(f);
  char buf[1024];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  return out;
}

std::string fresh_dir(const std::string& name) {
  auto d = std::filesystem::temp_directory_path() / ("laoyao_async_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d.string();
}

}  // namespace

TEST(AsyncCheckpointSave, WritesOnItsThreadAndReportsWhenFinalized) {
  const std::string dir = fresh_dir("ok");
  std::FILE* out = std::tmpfile();
  {
    train::AsyncCheckpointSave save;
    save.start(tiny_copy(dir, 3), out);
    EXPECT_TRUE(save.in_flight());
    save.start(tiny_copy(dir, 6), out);  // the first is finalized before the second starts
    save.finalize(true);
    EXPECT_FALSE(save.in_flight());
    save.finalize(true);  // nothing in flight: nothing to do
  }
  const std::string log = read_text(out);
  std::fclose(out);
  const std::string lines[] = {"  scheduled an async checkpoint save at iteration       3 to " + dir,
                               "  successfully saved checkpoint from iteration       3 to " + dir,
                               "  scheduled an async checkpoint save at iteration       6 to " + dir,
                               "  successfully saved checkpoint from iteration       6 to " + dir};
  size_t at = 0;
  for (const std::string& line : lines) {
    const size_t found = log.find(line, at);
    ASSERT_NE(found, std::string::npos) << line << "\n" << log;
    at = found + line.size();
  }
  EXPECT_TRUE(std::filesystem::exists(dir + "/iter_0000003/model.safetensors"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/iter_0000006/model.safetensors"));
  std::ifstream tracker(train::tracker_path(dir));
  std::string latest;
  tracker >> latest;
  EXPECT_EQ(latest, "6");
}

TEST(AsyncCheckpointSave, AWriteThatFailsOnItsThreadFailsTheFinalize) {
  const std::string dir = fresh_dir("bad");
  std::ofstream(dir + "/file") << "x";  // a save directory under a regular file cannot be made
  std::FILE* out = std::tmpfile();
  train::AsyncCheckpointSave save;
  save.start(tiny_copy(dir + "/file/ckpt", 2), out);
  try {
    save.finalize(true);
    ADD_FAILURE() << "the failed write was not reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(dir + "/file/ckpt"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(save.in_flight());
  EXPECT_EQ(read_text(out).find("successfully saved"), std::string::npos);
  std::fclose(out);
}
