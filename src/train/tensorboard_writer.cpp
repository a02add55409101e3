#include "train/tensorboard_writer.hpp"

#include <unistd.h>

#include <chrono>
#include <cstring>

#include "core/crc32c.hpp"
#include "core/error.hpp"
#include "core/file_io.hpp"
#include "train/training_log.hpp"

namespace laoyao::train {
namespace {

// Protocol-buffer wire format, the few pieces an Event needs.
void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void key(std::string& out, int field, int wire_type) { varint(out, static_cast<uint64_t>(field) << 3 | wire_type); }
template <class T>
void fixed(std::string& out, T v) {  // little-endian, as the hosts this runs on
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}
void bytes_field(std::string& out, int field, const std::string& s) {
  key(out, field, 2);
  varint(out, s.size());
  out += s;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Event.wall_time = 1 (double), Event.step = 2 (int64).
std::string event_head(double wall_time, int64_t step) {
  std::string e;
  key(e, 1, 1);
  fixed(e, wall_time);
  if (step != 0) {  // proto3: a zero is not written
    key(e, 2, 0);
    varint(e, static_cast<uint64_t>(step));
  }
  return e;
}

}  // namespace

std::string tensorboard_scalar_event(double wall_time, int64_t step, const std::string& tag, float value) {
  std::string v;  // Summary.Value: tag = 1, simple_value = 2 (float)
  bytes_field(v, 1, tag);
  key(v, 2, 5);
  fixed(v, value);
  std::string summary;  // Summary.value = 1 (repeated)
  bytes_field(summary, 1, v);
  std::string e = event_head(wall_time, step);
  bytes_field(e, 5, summary);  // Event.summary = 5
  return e;
}

std::string tensorboard_version_event(double wall_time) {
  std::string e = event_head(wall_time, 0);
  bytes_field(e, 3, "brain.Event:2");  // Event.file_version = 3
  return e;
}

std::string tfrecord(const std::string& record) {
  std::string out;
  const uint64_t n = record.size();
  fixed(out, n);
  fixed(out, masked_crc32c(&n, sizeof n));
  out += record;
  fixed(out, masked_crc32c(record.data(), record.size()));
  return out;
}

void write_iteration_scalars(TensorBoardWriter& tb, const IterationScalars& s) {
  auto both = [&](const std::string& tag, double v) {
    tb.add_scalar(tag, v, s.iteration);
    tb.add_scalar(tag + " vs samples", v, s.consumed_samples);
  };
  for (const auto& [tag, v] : s.throughput) tb.add_scalar(tag, v, s.iteration);
  both("learning-rate", s.learning_rate);
  if (s.decoupled_learning_rate) tb.add_scalar("decoupled-learning-rate", *s.decoupled_learning_rate, s.iteration);
  both("batch-size", s.batch_size);
  for (const auto& [key, v] : s.losses) both(key, v);
  if (s.loss_scale) both("loss-scale", *s.loss_scale);
  if (s.world_size) both("world-size", *s.world_size);
  if (s.grad_norm) both("grad-norm", *s.grad_norm);
  if (s.num_zeros) both("num-zeros", *s.num_zeros);
  if (s.params_norm) both("params-norm", *s.params_norm);
  for (const auto& [tag, v] : s.memory) tb.add_scalar(tag, v, s.iteration);
  for (const auto& [name, v] : s.moe_losses) tb.add_scalar(name, v, s.iteration);
  tb.flush();
}

void write_validation_scalars(TensorBoardWriter& tb, const std::string& key, double loss, int64_t iteration,
                              int64_t consumed_samples, bool with_ppl) {
  tb.add_scalar(key + " validation", loss, iteration);
  tb.add_scalar(key + " validation vs samples", loss, consumed_samples);
  if (with_ppl) {
    const double ppl = validation_ppl(loss);
    tb.add_scalar(key + " validation ppl", ppl, iteration);
    tb.add_scalar(key + " validation ppl vs samples", ppl, consumed_samples);
  }
  tb.flush();
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  make_dirs(dir);
  char host[256] = "localhost";
  if (gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "localhost");
  host[sizeof host - 1] = '\0';
  const double t = now_seconds();
  char name[400];
  std::snprintf(name, sizeof name, "events.out.tfevents.%010lld.%s.%lld.0", static_cast<long long>(t), host,
                static_cast<long long>(getpid()));
  path_ = dir + "/" + name;
  f_ = std::fopen(path_.c_str(), "wb");
  if (!f_) throw Error("cannot write the TensorBoard event file " + path_);
  write_record(tensorboard_version_event(t));
  flush();
}

TensorBoardWriter::~TensorBoardWriter() {
  if (f_) std::fclose(f_);
}

void TensorBoardWriter::add_scalar(const std::string& tag, double value, int64_t step) {
  write_record(tensorboard_scalar_event(now_seconds(), step, tag, static_cast<float>(value)));
}

void TensorBoardWriter::flush() {
  if (std::fflush(f_) != 0) throw Error("cannot write the TensorBoard event file " + path_);
}

void TensorBoardWriter::write_record(const std::string& record) {
  const std::string framed = tfrecord(record);
  if (std::fwrite(framed.data(), 1, framed.size(), f_) != framed.size())
    throw Error("cannot write the TensorBoard event file " + path_);
}

}  // namespace laoyao::train
