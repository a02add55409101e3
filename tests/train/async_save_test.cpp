// --async-save's writer (train/async_save.hpp): the shard is written on a thread, the lines come in
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

// One rank's save of one tensor, begun (its scratch folder made) unless the save folder cannot be.
std::unique_ptr<train::RunCheckpointSave> tiny_save(const std::string& dir, int64_t iteration, bool begin = true) {
  auto s = std::make_unique<train::RunCheckpointSave>();
  s->save_dir = dir;
  s->iteration = iteration;
  s->scratch = train::checkpoint_scratch_dir(dir, iteration, ::getpid());
  if (begin) train::begin_checkpoint(dir, s->scratch);
  s->weights = {1.5f, -2.0f, 0.25f, 4.0f, 8.0f, -0.5f};
  s->shard.model.push_back({{"decoder.final_layernorm.weight", {2, 3}, {model::whole_box({2, 3})}}, s->weights.data()});
  s->state.iteration = iteration;
  s->run_config_yaml = "model: {}\n";
  return s;
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
    save.start(tiny_save(dir, 3), out);
    EXPECT_TRUE(save.in_flight());
    // As the trainer does: the save in flight is finalized before the next one begins (beginning a
    // save removes unfinished scratch folders, the one still being written included).
    save.finalize(true);
    EXPECT_FALSE(save.in_flight());
    save.start(tiny_save(dir, 6), out);
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
  save.start(tiny_save(dir + "/file/ckpt", 2, /*begin=*/false), out);
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
