// TensorBoard event files: CRC-32C's check value, an Event's exact bytes, a written file read back
// record by record (framing, CRCs, the version event, then each scalar's tag, step and value), and
// event files read back as a training log (train/tensorboard_reader, for compare-logs).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "core/crc32c.hpp"
#include "core/error.hpp"
#include "core/file_io.hpp"
#include "train/tensorboard_reader.hpp"
#include "train/tensorboard_writer.hpp"
#include "train/training_log.hpp"
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

// --log-memory-to-tensorboard's scalars, Megatron's tags at the iteration (no "vs samples" twins),
// only when the device memory is given.
TEST(TensorBoardWriter, DeviceMemoryScalarsFollowMegatronsTags) {
  const fs::path dir = fs::temp_directory_path() / ("laoyao_tb_mem_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  std::string path;
  {
    train::TensorBoardWriter w(dir.string());
    path = w.path();
    train::IterationScalars s;
    s.iteration = 7, s.consumed_samples = 112, s.batch_size = 16;
    s.losses.push_back({"lm loss", 3.0});
    train::write_iteration_scalars(w, s);  // without: none of the memory tags
    s.iteration = 8, s.memory = train::memory_scalars(41452345678, train::LogFlavor::kMegatronLM);
    train::write_iteration_scalars(w, s);
  }
  std::vector<std::string> mem;
  for (const auto& e : read_events(path))
    if (e.tag.rfind("mem-", 0) == 0) {
      mem.push_back(e.tag);
      EXPECT_EQ(e.step, 8) << e.tag;
      EXPECT_EQ(e.value, 41452345678.0f) << e.tag;
    }
  EXPECT_EQ(mem, (std::vector<std::string>{"mem-reserved-bytes", "mem-allocated-bytes", "mem-max-allocated-bytes"}));
  fs::remove_all(dir);
}

TEST(TensorBoardWriter, AnUnwritableDirectoryIsNamed) {
  try {
    train::TensorBoardWriter w("/proc/laoyao_no_such_dir/tb");
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("/proc/laoyao_no_such_dir/tb"), std::string::npos) << e.what();
  }
}

namespace {

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("laoyao_tb_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d;
}

}  // namespace

// Scalars as Megatron writes them, read back as per-iteration records: the "vs samples" twins and
// unknown tags skipped, validations with their ppl, a resumed run's later file overriding.
TEST(TensorBoardReader, ReadsMegatronsScalarsAsALog) {
  const fs::path dir = fresh_dir("reader");
  {
    train::TensorBoardWriter w(dir.string());
    for (int64_t it = 1; it <= 3; ++it) {
      train::IterationScalars s;
      s.iteration = it, s.consumed_samples = 16 * it;
      s.learning_rate = 1e-4 * static_cast<double>(it), s.batch_size = 16;
      s.losses.push_back({"lm loss", 10.0 - static_cast<double>(it)});
      s.loss_scale = 1.0, s.grad_norm = 2.5;
      s.moe_losses.push_back({"load_balancing_loss", 1.25});
      if (it == 2) s.memory = {{"mem-allocated-bytes", 41452345678.0}};
      train::write_iteration_scalars(w, s);
      w.add_scalar("some-other-tag", 7.0, it);
    }
    train::write_validation_scalars(w, "lm loss", 6.5, 2, 32, true);
    w.add_scalar("iteration-time", 0.25, 3);
    w.flush();
  }
  EXPECT_TRUE(train::is_tensorboard_path(dir.string()));
  EXPECT_FALSE(train::is_tensorboard_path(fs::temp_directory_path().string() + "/laoyao_no_such_dir"));
  train::ParsedLog log = train::parse_tensorboard_events(dir.string());
  ASSERT_EQ(log.iterations.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    const auto& r = log.iterations[static_cast<size_t>(i)];
    EXPECT_EQ(r.iteration, i + 1);
    EXPECT_EQ(r.loss("lm loss"), static_cast<float>(9.0 - i));
    EXPECT_EQ(r.loss("load_balancing_loss"), 1.25);
    EXPECT_EQ(*r.learning_rate, static_cast<float>(1e-4 * (i + 1)));
    EXPECT_EQ(*r.grad_norm, 2.5);
    EXPECT_EQ(*r.global_batch_size, 16);
  }
  EXPECT_EQ(*log.iterations[2].elapsed_ms, 250.0);
  ASSERT_EQ(log.validations.size(), 1u);
  EXPECT_EQ(log.validations[0].iteration, 2);
  EXPECT_EQ(log.validations[0].loss("lm loss"), 6.5);
  EXPECT_NEAR(*log.validations[0].losses[0].ppl, std::exp(6.5), 1e-3 * std::exp(6.5));

  // A resumed run's file (later in name order) replaces iteration 3 and adds 4.
  std::string second;
  {
    train::TensorBoardWriter w((dir / "resume").string());
    w.add_scalar("lm loss", 5.0, 3);
    w.add_scalar("lm loss", 4.0, 4);
    second = w.path();
  }
  const fs::path moved = dir / ("events.out.tfevents.9999999999" + fs::path(second).filename().string().substr(30));
  fs::rename(second, moved);
  log = train::parse_tensorboard_events(dir.string());
  ASSERT_EQ(log.iterations.size(), 4u);
  EXPECT_EQ(log.iterations[2].loss("lm loss"), 5.0);
  EXPECT_EQ(log.iterations[3].loss("lm loss"), 4.0);

  // A record cut short at the end (a run still writing) ends the file; a flipped byte is named.
  std::string bytes = read_file(moved.string());
  write_file_atomic(moved.string(), bytes.substr(0, bytes.size() - 3));
  log = train::parse_tensorboard_events(dir.string());
  ASSERT_EQ(log.iterations.size(), 3u) << "iteration 4's record cut off";
  EXPECT_EQ(log.iterations[2].loss("lm loss"), 5.0) << "the resumed file's iteration 3 still read";
  bytes[bytes.size() - 10] ^= 0x40;
  write_file_atomic(moved.string(), bytes);
  try {
    train::parse_tensorboard_events(dir.string());
    ADD_FAILURE() << "a corrupt record must be refused";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(moved.filename().string()), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

// Megatron's evaluations as its event files hold them: one during training at 2, then at 4 one
// during training and the end of training's validation and test sets' under the same tags (each
// value with its ppl); with two at the last step, the validation and test sets'.
TEST(TensorBoardReader, EvaluationsAtOneStepAreTheEndOfTrainingsSets) {
  const fs::path dir = fresh_dir("reader_final_evals");
  auto read = [&](const std::vector<std::pair<int64_t, double>>& evals) {
    fs::remove_all(dir);
    {
      train::TensorBoardWriter w(dir.string());
      for (const auto& [step, loss] : evals) train::write_validation_scalars(w, "lm loss", loss, step, 8 * step, true);
    }
    return train::parse_tensorboard_events(dir.string()).validations;
  };
  const auto v = read({{2, 6.0}, {4, 5.0}, {4, 5.1}, {4, 5.2}});
  ASSERT_EQ(v.size(), 4u);
  const train::EvalSet want[] = {train::EvalSet::kDuringTraining, train::EvalSet::kDuringTraining,
                                 train::EvalSet::kValidationSet, train::EvalSet::kTestSet};
  const double loss[] = {6.0, 5.0, 5.1, 5.2};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(v[i].set, want[i]) << i;
    EXPECT_EQ(v[i].loss("lm loss"), static_cast<float>(loss[i])) << i;
    EXPECT_NEAR(*v[i].losses[0].ppl, std::exp(loss[i]), 1e-3 * std::exp(loss[i])) << "its own ppl, " << i;
  }
  const auto two = read({{2, 6.0}, {3, 5.5}, {3, 5.4}});
  ASSERT_EQ(two.size(), 3u);
  EXPECT_EQ(two[0].set, train::EvalSet::kDuringTraining);
  EXPECT_EQ(two[1].set, train::EvalSet::kValidationSet);
  EXPECT_EQ(two[2].set, train::EvalSet::kTestSet);
  fs::remove_all(dir);
}
