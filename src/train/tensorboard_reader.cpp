#include "train/tensorboard_reader.hpp"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <string_view>

#include "core/crc32c.hpp"
#include "core/error.hpp"
#include "core/file_io.hpp"

namespace laoyao::train {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kPrefix = "events.out.tfevents.";

bool is_event_file_name(const fs::path& p) { return p.filename().string().rfind(kPrefix, 0) == 0; }

// A protocol-buffer reader over one message's bytes; a malformed message throws.
struct Wire {
  std::string_view s;
  size_t at = 0;
  bool done() const { return at >= s.size(); }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (at >= s.size()) throw Error("truncated varint");
      const auto b = static_cast<unsigned char>(s[at++]);
      v |= static_cast<uint64_t>(b & 0x7F) << shift;
      if (!(b & 0x80)) return v;
    }
    throw Error("varint too long");
  }
  std::string_view take(size_t n) {
    if (n > s.size() - at) throw Error("field past the message's end");
    std::string_view v = s.substr(at, n);
    at += n;
    return v;
  }
  template <class T>
  T fixed() {
    T v;
    std::memcpy(&v, take(sizeof(T)).data(), sizeof(T));
    return v;
  }
  void skip(int wire_type) {
    switch (wire_type) {
      case 0: varint(); return;
      case 1: take(8); return;
      case 2: take(varint()); return;
      case 5: take(4); return;
      default: throw Error("unsupported wire type " + std::to_string(wire_type));
    }
  }
};

struct Scalar {
  int64_t step = 0;
  std::string tag;
  float value = 0;
};

// The simple_value scalars of one Event (Event.step = 2, Event.summary = 5; Summary.value = 1;
// Value.tag = 1, Value.simple_value = 2).
void scalars_of(std::string_view event, std::vector<Scalar>& out) {
  Wire e{event};
  int64_t step = 0;
  std::vector<std::string_view> summaries;
  while (!e.done()) {
    const uint64_t k = e.varint();
    const int field = static_cast<int>(k >> 3), type = static_cast<int>(k & 7);
    if (field == 2 && type == 0)
      step = static_cast<int64_t>(e.varint());
    else if (field == 5 && type == 2)
      summaries.push_back(e.take(e.varint()));
    else
      e.skip(type);
  }
  for (std::string_view summary : summaries) {
    Wire s{summary};
    while (!s.done()) {
      const uint64_t k = s.varint();
      if (k != (1 << 3 | 2)) {
        s.skip(static_cast<int>(k & 7));
        continue;
      }
      Wire v{s.take(s.varint())};
      Scalar sc;
      sc.step = step;
      bool simple = false;
      while (!v.done()) {
        const uint64_t vk = v.varint();
        if (vk == (1 << 3 | 2))
          sc.tag = std::string(v.take(v.varint()));
        else if (vk == (2 << 3 | 5))
          sc.value = v.fixed<float>(), simple = true;
        else
          v.skip(static_cast<int>(vk & 7));
      }
      if (simple) out.push_back(std::move(sc));
    }
  }
}

void read_file_scalars(const std::string& path, std::vector<Scalar>& out) {
  const std::string s = read_file(path);
  for (size_t at = 0; at + 12 <= s.size();) {
    uint64_t n;
    uint32_t crc;
    std::memcpy(&n, s.data() + at, 8);
    std::memcpy(&crc, s.data() + at + 8, 4);
    if (crc != masked_crc32c(s.data() + at, 8))
      throw UsageError("corrupt TensorBoard event file '" + path + "': the record length at byte " +
                       std::to_string(at) + " fails its CRC");
    if (n > s.size() - at - 12 || s.size() - at - 12 - n < 4) break;  // cut short: a run still writing
    const std::string_view record(s.data() + at + 12, n);
    std::memcpy(&crc, s.data() + at + 12 + n, 4);
    if (crc != masked_crc32c(record.data(), record.size()))
      throw UsageError("corrupt TensorBoard event file '" + path + "': the record at byte " + std::to_string(at) +
                       " fails its CRC");
    try {
      scalars_of(record, out);
    } catch (const Error& e) {
      throw UsageError("corrupt TensorBoard event file '" + path + "': the record at byte " + std::to_string(at) +
                       " is not an Event (" + e.what() + ")");
    }
    at += 12 + n + 4;
  }
}

bool is_moe_loss(const std::string& tag) {
  return tag == "load_balancing_loss" || tag == "seq_load_balancing_loss" || tag == "global_load_balancing_loss" ||
         tag == "z_loss";
}

void set_loss(std::vector<LossValue>& losses, const std::string& name, double v) {
  for (auto& l : losses)
    if (l.name == name) {
      l.value = v;
      return;
    }
  losses.push_back({name, v});
}

}  // namespace

bool is_tensorboard_path(const std::string& path) {
  std::error_code ec;
  const fs::path p(path);
  if (fs::is_regular_file(p, ec)) return is_event_file_name(p);
  if (!fs::is_directory(p, ec)) return false;
  for (const auto& e : fs::directory_iterator(p, ec))
    if (e.is_regular_file(ec) && is_event_file_name(e.path())) return true;
  return false;
}

ParsedLog parse_tensorboard_events(const std::string& path) {
  std::vector<std::string> files;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    for (const auto& e : fs::directory_iterator(path, ec))
      if (e.is_regular_file(ec) && is_event_file_name(e.path())) files.push_back(e.path().string());
    std::sort(files.begin(), files.end());  // names start with the creation time in seconds
  } else {
    files.push_back(path);
  }
  if (files.empty()) throw UsageError("no TensorBoard event files (events.out.tfevents.*) in '" + path + "'");
  std::vector<Scalar> scalars;
  for (const auto& f : files) read_file_scalars(f, scalars);

  std::map<int64_t, IterationRecord> its;
  // Several evaluations can write the same tags at one step: Megatron's final validation and test
  // evaluations write "<key> validation" at the last iteration, after any evaluation during
  // training there. A value for a key the step's last record already has starts a new record.
  std::map<int64_t, std::vector<ValidationRecord>> vals;
  const std::string kValidation = " validation", kPpl = " validation ppl";
  auto ends_with = [](const std::string& s, const std::string& suffix) {
    return s.size() > suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  for (const Scalar& sc : scalars) {
    const double v = sc.value;
    if (ends_with(sc.tag, kPpl) || ends_with(sc.tag, kValidation)) {
      const bool ppl = ends_with(sc.tag, kPpl);
      const std::string key = sc.tag.substr(0, sc.tag.size() - (ppl ? kPpl : kValidation).size());
      std::vector<ValidationRecord>& at = vals[sc.step];
      auto find = [&](ValidationRecord& r) {
        return std::find_if(r.losses.begin(), r.losses.end(), [&](const auto& l) { return l.name == key; });
      };
      // A ppl belongs to the latest record holding the key's value; a value to the latest record
      // without one (a new record when it has it).
      const auto has_value = [&](ValidationRecord& r) {
        const auto it = find(r);
        return it != r.losses.end() && it->value.has_value();
      };
      if (at.empty() || (!ppl && has_value(at.back()))) {
        at.emplace_back();
        at.back().iteration = sc.step;
      }
      ValidationRecord& r = at.back();
      auto it = find(r);
      if (it == r.losses.end()) it = r.losses.insert(r.losses.end(), ValidationLoss{key, std::nullopt, std::nullopt});
      (ppl ? it->ppl : it->value) = v;
      continue;
    }
    auto rec = [&]() -> IterationRecord& {
      IterationRecord& r = its[sc.step];
      r.iteration = sc.step;
      return r;
    };
    if (sc.tag == "lm loss" || is_moe_loss(sc.tag)) set_loss(rec().losses, sc.tag, v);
    else if (sc.tag == "grad-norm") rec().grad_norm = v;
    else if (sc.tag == "learning-rate") rec().learning_rate = v;
    else if (sc.tag == "batch-size") rec().global_batch_size = static_cast<int64_t>(v);
    else if (sc.tag == "loss-scale") rec().loss_scale = v;
    else if (sc.tag == "num-zeros") rec().num_zeros = v;
    else if (sc.tag == "params-norm") rec().params_norm = v;
    else if (sc.tag == "iteration-time") rec().elapsed_ms = v * 1000.0;
    else if (sc.tag == "throughput") rec().throughput_tflops_per_gpu = v;
  }
  ParsedLog log;
  log.per_iteration = true;
  for (auto& [it, r] : its)
    if (r.loss("lm loss")) log.iterations.push_back(std::move(r));  // the timer-only steps are not iterations
  // Records after the first at the last evaluated step are the end of training's: the test set's
  // last, the validation set's before it (what the text log calls "on validation set" / "on test
  // set"); the step's first record is an evaluation during training when three are there.
  for (auto& [step, records] : vals) {
    const bool last_step = step == vals.rbegin()->first;
    const size_t n = records.size();
    for (size_t i = 0; i < n; ++i) {
      if (last_step && n >= 2 && i + 1 == n) records[i].set = EvalSet::kTestSet;
      else if (last_step && n >= 2 && i + 2 == n) records[i].set = EvalSet::kValidationSet;
      log.validations.push_back(std::move(records[i]));
    }
  }
  return log;
}

}  // namespace laoyao::train
