#include "train/checkpoint.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <future>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <span>

#include "core/error.hpp"
#include "core/file_io.hpp"
#include "core/sha256.hpp"
#include "core/text.hpp"
#include "model/parameters.hpp"

namespace laoyao::train {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

constexpr const char* kFormat = "laoyao-checkpoint";
// Version 2 added the parts (several writing ranks); version 1 (whole tensors in model.safetensors
// and optimizer.safetensors) reads as a checkpoint of one writer.
constexpr int kVersion = 2;
constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kConfigFile = "run_config.yaml";
constexpr const char* kStateFile = "train_state.json";
constexpr size_t kMaxListed = 50;  // problems listed in one message before "... and N more"

std::string join_path(const std::string& a, const std::string& b) { return (fs::path(a) / b).string(); }


std::string list_problems(const std::vector<std::string>& lines) {
  std::string s;
  for (size_t i = 0; i < lines.size() && i < kMaxListed; ++i) s += "\n  " + lines[i];
  if (lines.size() > kMaxListed) s += "\n  ... and " + std::to_string(lines.size() - kMaxListed) + " more";
  return s;
}

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw Error("cannot open directory '" + dir + "' to flush it: " + std::strerror(errno));
  const int rc = ::fsync(fd);
  const int e = errno;
  ::close(fd);
  if (rc != 0 && e != EINVAL) throw Error("cannot flush directory '" + dir + "': " + std::strerror(e));
}

// iter_0000010.tmp.<pid> (a save in progress or interrupted) / iter_0000010.old.<pid> (the copy a
// save without RENAME_EXCHANGE moves aside for an instant).
bool is_scratch_name(const std::string& name, const char* kind) {
  if (name.rfind("iter_", 0) != 0) return false;
  const size_t dot = name.find('.');
  return dot != std::string::npos && name.compare(dot, std::strlen(kind), kind) == 0;
}

json value_json(const StateValue& v, const std::string& key) {
  if (const auto* i = std::get_if<int64_t>(&v)) return *i;
  if (const auto* d = std::get_if<double>(&v)) {
    if (!std::isfinite(*d)) throw Error("checkpoint: train state value '" + key + "' is not finite");
    return *d;
  }
  if (const auto* b = std::get_if<bool>(&v)) return *b;
  return std::get<std::string>(v);
}

json map_json(const StateMap& m, const std::string& what) {
  json j = json::object();
  for (const auto& [k, v] : m) j[k] = value_json(v, what + "." + k);
  return j;
}

// ---- reading train_state.json ----

[[noreturn]] void bad_state(const std::string& file, const std::string& problem) {
  throw UsageError("checkpoint file '" + file + "': " + problem);
}

int64_t get_int(const json& j, const std::string& file, const char* key) {
  if (!j.contains(key)) bad_state(file, std::string("missing field '") + key + "'");
  const json& v = j.at(key);
  if (v.is_number_integer() && !(v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)))
    return v.get<int64_t>();
  bad_state(file, std::string("field '") + key + "' must be an integer, found " + v.dump());
}

StateValue state_value(const json& v, const std::string& file, const std::string& key) {
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_number_unsigned()) {
    if (v.get<uint64_t>() > uint64_t(INT64_MAX)) bad_state(file, "value of '" + key + "' is out of range: " + v.dump());
    return static_cast<int64_t>(v.get<uint64_t>());
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) return v.get<double>();
  if (v.is_string()) return v.get<std::string>();
  bad_state(file, "value of '" + key + "' must be a number, boolean or string, found " + v.dump());
}

StateMap state_map(const json& j, const std::string& file, const char* key) {
  StateMap m;
  if (!j.contains(key)) return m;
  const json& o = j.at(key);
  if (!o.is_object()) bad_state(file, std::string("field '") + key + "' must be an object");
  for (const auto& [k, v] : o.items()) m[k] = state_value(v, file, std::string(key) + "." + k);
  return m;
}

// The counters a save writes can only be what a run reaches: none negative, none of the
// per-iteration counts above the iteration. (The SHA-256s cover the tensors, not this file: a value
// edited by hand would otherwise surface later as a NaN or a data error blamed on training.)
void check_counters(const TrainStateRecord& r, const std::string& file) {
  using Counter = std::pair<const char*, int64_t>;
  const Counter per_iteration[] = {{"skipped_iterations", r.skipped_iterations},
                                   {"nan_iterations", r.nan_iterations},
                                   {"optimizer_steps", r.optimizer_steps}};
  const Counter others[] = {{"iteration", r.iteration},
                            {"consumed_train_samples", r.consumed_train_samples},
                            {"consumed_valid_samples", r.consumed_valid_samples},
                            {"skipped_train_samples", r.skipped_train_samples},
                            {"scheduler_num_steps", r.scheduler_num_steps}};
  for (const auto& counters : {std::span<const Counter>(others), std::span<const Counter>(per_iteration)})
    for (const auto& [key, v] : counters)
      if (v < 0)
        bad_state(file, std::string("field '") + key + "' is " + std::to_string(v) + "; it counts, so it is >= 0");
  for (const auto& [key, v] : per_iteration)
    if (v > r.iteration)
      bad_state(file, std::string("field '") + key + "' is " + std::to_string(v) + ", more than the " +
                          std::to_string(r.iteration) +
                          " iterations the checkpoint says were run (at most one per iteration)");
  if (!std::isfinite(r.floating_point_operations_so_far) || r.floating_point_operations_so_far < 0)
    bad_state(file, "field 'floating_point_operations_so_far' must be a finite number >= 0, found " +
                        json(r.floating_point_operations_so_far).dump());
}

// A tensor file's kind by its name: model.safetensors / model.rankNNNNN.safetensors hold model
// parts, optimizer[...].safetensors optimizer parts.
bool tensor_file_of(const std::string& file, const std::string& kind) {
  const std::string ext = ".safetensors";
  return file.rfind(kind + ".", 0) == 0 && file.size() > ext.size() &&
         file.compare(file.size() - ext.size(), ext.size(), ext) == 0;
}

std::string shard_file(const char* kind, int64_t rank, int64_t world) {
  if (world == 1) return std::string(kind) + ".safetensors";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s.rank%05lld.safetensors", kind, static_cast<long long>(rank));
  return buf;
}

std::string shard_record(int64_t rank) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "shard.rank%05lld.json", static_cast<long long>(rank));
  return buf;
}

// The parts record of one file: its entries that are not whole tensors, by entry name.
using FileParts = std::map<std::string, model::TensorPart>;

json ints_json(const std::vector<int64_t>& v) {
  json a = json::array();
  for (int64_t x : v) a.push_back(x);
  return a;
}

json parts_json(const FileParts& parts) {
  json j = json::object();
  for (const auto& [key, p] : parts) {
    json boxes = json::array();
    for (const model::Box& b : p.boxes) boxes.push_back({{"start", ints_json(b.start)}, {"size", ints_json(b.size)}});
    j[key] = {{"tensor", p.name}, {"shape", ints_json(p.shape)}, {"boxes", boxes}};
  }
  return j;
}

struct StateFile {
  TrainStateRecord state;
  std::map<std::string, FileSum> files;
  std::map<std::string, FileParts> parts;  // by file
};

std::vector<int64_t> read_ints(const json& v, const std::string& file, const std::string& what) {
  if (!v.is_array()) bad_state(file, what + " must be a list of integers, found " + v.dump());
  std::vector<int64_t> out;
  for (const json& x : v) {
    if (!x.is_number_integer()) bad_state(file, what + " must be a list of integers, found " + v.dump());
    out.push_back(x.get<int64_t>());
  }
  return out;
}

// "parts": {file: {entry: {"tensor": name, "shape": [...], "boxes": [{"start": [...], "size": [...]}]}}}
std::map<std::string, FileParts> read_parts(const json& j, const std::string& file,
                                            const std::map<std::string, FileSum>& files) {
  if (!j.is_object()) bad_state(file, "field 'parts' must be an object");
  std::map<std::string, FileParts> out;
  for (const auto& [tensor_file, entries] : j.items()) {
    if (!files.count(tensor_file)) bad_state(file, "parts." + tensor_file + ": no such file in 'files'");
    if (!entries.is_object()) bad_state(file, "parts." + tensor_file + " must be an object");
    for (const auto& [key, e] : entries.items()) {
      const std::string at = "parts." + tensor_file + "." + key;
      if (!e.is_object() || !e.contains("tensor") || !e.at("tensor").is_string() || !e.contains("shape") ||
          !e.contains("boxes") || !e.at("boxes").is_array())
        bad_state(file, at + " needs tensor, shape and boxes");
      model::TensorPart p{e.at("tensor").get<std::string>(), read_ints(e.at("shape"), file, at + ".shape"), {}};
      // Dimensions a tensor can have (their products stay far inside int64), boxes inside them.
      constexpr int64_t kMaxDim = int64_t{1} << 40;
      auto within = [&](int64_t v, int64_t hi) { return v >= 0 && v <= hi; };
      if (p.shape.size() > 8 || !std::all_of(p.shape.begin(), p.shape.end(), [&](int64_t d) { return within(d, kMaxDim); }))
        bad_state(file, at + ".shape " + shape_string(p.shape) + " is not a tensor's shape");
      for (const json& b : e.at("boxes")) {
        if (!b.is_object() || !b.contains("start") || !b.contains("size"))
          bad_state(file, at + ".boxes needs start and size");
        model::Box box{read_ints(b.at("start"), file, at + ".start"), read_ints(b.at("size"), file, at + ".size")};
        bool inside = box.start.size() == p.shape.size() && box.size.size() == p.shape.size();
        for (size_t d = 0; inside && d < p.shape.size(); ++d)
          inside = within(box.start[d], p.shape[d]) && within(box.size[d], p.shape[d] - box.start[d]) && box.size[d] > 0;
        if (!inside)
          bad_state(file, at + ": box " + shape_string(box.start) + " + " + shape_string(box.size) +
                              " is not inside the shape " + shape_string(p.shape));
        p.boxes.push_back(std::move(box));
      }
      out[tensor_file][key] = std::move(p);
    }
  }
  return out;
}

StateFile read_state_file(const std::string& dir) {
  const std::string file = join_path(dir, kStateFile);
  json j;
  try {
    j = json::parse(read_file(file));
  } catch (const json::exception& e) {  // parse_error, or out_of_range for a number past a double
    bad_state(file, std::string("not valid JSON (") + e.what() + ")");
  }
  // (json::value would throw a type_error for a "format" that is not a string.)
  if (!j.is_object() || !j.contains("format") || j.at("format") != kFormat)
    bad_state(file, "not a laoyao train_state.json");
  const int64_t version = get_int(j, file, "version");
  if (version != 1 && version != kVersion)
    bad_state(file, "format version " + std::to_string(version) + "; this laoyao reads versions 1 to " +
                        std::to_string(kVersion));
  StateFile s;
  TrainStateRecord& r = s.state;
  r.iteration = get_int(j, file, "iteration");
  r.consumed_train_samples = get_int(j, file, "consumed_train_samples");
  r.consumed_valid_samples = get_int(j, file, "consumed_valid_samples");
  r.skipped_train_samples = get_int(j, file, "skipped_train_samples");
  r.skipped_iterations = get_int(j, file, "skipped_iterations");
  r.nan_iterations = get_int(j, file, "nan_iterations");
  r.scheduler_num_steps = get_int(j, file, "scheduler_num_steps");
  r.optimizer_steps = get_int(j, file, "optimizer_steps");
  if (!j.contains("floating_point_operations_so_far") || !j.at("floating_point_operations_so_far").is_number())
    bad_state(file, "missing or non-numeric field 'floating_point_operations_so_far'");
  r.floating_point_operations_so_far = j.at("floating_point_operations_so_far").get<double>();
  check_counters(r, file);
  r.rng = state_map(j, file, "rng");
  r.model_shape = state_map(j, file, "model_shape");
  r.scheduler = state_map(j, file, "scheduler");
  if (!j.contains("files") || !j.at("files").is_object()) bad_state(file, "missing field 'files'");
  for (const auto& [name, f] : j.at("files").items()) {
    if (!f.is_object() || !f.contains("sha256") || !f.at("sha256").is_string())
      bad_state(file, "files." + name + " needs bytes and sha256");
    s.files[name] = {static_cast<uint64_t>(get_int(f, file, "bytes")), f.at("sha256").get<std::string>()};
  }
  if (!s.files.count(kConfigFile)) bad_state(file, std::string("files lists no ") + kConfigFile);
  if (std::none_of(s.files.begin(), s.files.end(), [](const auto& f) { return tensor_file_of(f.first, "model"); }))
    bad_state(file, std::string("files lists no model file (") + kModelFile + " or model.rankNNNNN.safetensors)");
  if (j.contains("parts")) s.parts = read_parts(j.at("parts"), file, s.files);
  return s;
}

// Opens a listed safetensors file after checking that it has its recorded size, and (verify) its
// SHA-256.
SafetensorsFile open_listed(const std::string& dir, const std::string& name, const FileSum& want, bool verify) {
  const std::string path = join_path(dir, name);
  if (!fs::exists(path)) throw UsageError("checkpoint file '" + path + "' is missing (train_state.json lists it)");
  std::error_code ec;
  const uint64_t size = fs::file_size(path, ec);
  if (!ec && size != want.bytes)  // a truncated or appended file: say so before parsing it
    corrupt_file(path, "it is " + std::to_string(size) + " bytes, " + std::to_string(want.bytes) + " were written");
  std::optional<SafetensorsFile> f;
  try {
    f.emplace(path);
  } catch (const UsageError& e) {
    throw UsageError(std::string("checkpoint is corrupt: ") + e.what());
  }
  if (verify) verify_file_sum(*f, want);
  return std::move(*f);
}

// The model or optimizer files of a checkpoint (`kind`) as one store: every entry a part (as the
// parts record says) or a whole tensor. Files are opened in parallel (each hashed with kEveryFile).
std::optional<TensorStore> open_store(const std::string& dir, const StateFile& sf, const std::string& kind,
                                      CheckpointVerify verify) {
  std::vector<std::string> names;
  for (const auto& [file, sum] : sf.files)
    if (tensor_file_of(file, kind)) names.push_back(file);
  if (names.empty()) return std::nullopt;
  const bool eager = verify == CheckpointVerify::kEveryFile;
  std::vector<std::future<SafetensorsFile>> opening;
  for (const std::string& n : names)
    opening.push_back(std::async(std::launch::async, [&, n] { return open_listed(dir, n, sf.files.at(n), eager); }));
  std::vector<SafetensorsFile> files;
  std::exception_ptr error;
  for (auto& f : opening) {
    try {
      files.push_back(f.get());
    } catch (...) {
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
  TensorStore store("checkpoint '" + dir + "'");
  static const FileParts kNoParts;
  for (size_t i = 0; i < names.size(); ++i) {
    auto p = sf.parts.find(names[i]);
    const FileParts& parts = p == sf.parts.end() ? kNoParts : p->second;
    std::vector<std::pair<std::string, model::TensorPart>> entries;
    for (const SafetensorsTensor& t : files[i].tensors()) {
      auto rec = parts.find(t.name);
      entries.emplace_back(t.name, rec == parts.end() ? model::TensorPart{t.name, t.shape, {model::whole_box(t.shape)}}
                                                      : rec->second);
    }
    for (const auto& [key, rec] : parts)
      if (!files[i].find(key))
        throw UsageError("checkpoint file '" + files[i].path() + "' has no tensor '" + key +
                         "' (train_state.json lists it)");
    const size_t at = store.add_file(std::move(files[i]), eager ? std::nullopt : std::optional(sf.files.at(names[i])));
    for (auto& [key, part] : entries) store.add(at, key, std::move(part));
  }
  return store;
}

bool has_megatron_files(const std::string& dir) {
  std::error_code ec;
  if (fs::exists(join_path(dir, ".metadata"), ec) || fs::exists(join_path(dir, "common.pt"), ec)) return true;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().extension() == ".distcp" || e.path().extension() == ".pth") return true;
  return false;
}

[[noreturn]] void megatron_format(const std::string& dir) {
  throw UsageError("'" + dir + "' is a Megatron (torch_dist / torch) checkpoint; laoyao reads its own safetensors "
                   "checkpoints and folders of Megatron-Core *.safetensors files");
}

// The iteration directory a load reads.
std::string resolve_iteration_dir(const std::string& load_dir, std::optional<int64_t> step) {
  if (!fs::is_directory(load_dir)) throw UsageError("checkpoint directory '" + load_dir + "' does not exist");
  if (fs::exists(join_path(load_dir, kStateFile))) {  // an iteration directory itself
    if (step) {
      const int64_t it = read_state_file(load_dir).state.iteration;
      if (it != *step)
        throw UsageError("checkpoint '" + load_dir + "' is iteration " + std::to_string(it) + ", not the requested step " +
                         std::to_string(*step));
    }
    return load_dir;
  }
  int64_t it = 0;
  if (step) {
    it = *step;
  } else {
    const auto latest = latest_iteration(load_dir);
    if (!latest) {
      if (has_megatron_files(load_dir)) megatron_format(load_dir);
      throw UsageError("no checkpoint in '" + load_dir + "': it has no latest_checkpointed_iteration.txt");
    }
    it = *latest;
  }
  const std::string dir = join_path(load_dir, iteration_dir_name(it));
  if (!fs::exists(join_path(dir, kStateFile))) {
    std::string why = step ? "checkpoint step " + std::to_string(it) + ": '" + dir + "'"
                           : "'" + tracker_path(load_dir) + "' names iteration " + std::to_string(it) + ", but '" + dir + "'";
    why += fs::exists(dir) ? " has no train_state.json" : " does not exist";
    if (fs::exists(dir) && has_megatron_files(dir)) megatron_format(dir);
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(load_dir, ec)) {
      const std::string n = e.path().filename().string();
      if (n.rfind(iteration_dir_name(it) + ".old.", 0) == 0)
        why += " ('" + e.path().string() + "' is its previous copy, which an interrupted save moved aside: rename it to " +
               iteration_dir_name(it) + " to use it)";
    }
    throw UsageError(why);
  }
  return dir;
}

// Replaces `final_dir` (if any) by the complete `tmp` so that a complete directory of that name
// exists at every instant: an atomic exchange, then the old copy (now at `tmp`) goes.
void install_dir(const std::string& tmp, const std::string& final_dir) {
  if (!fs::exists(final_dir)) {
    if (::rename(tmp.c_str(), final_dir.c_str()) != 0)
      throw Error("cannot rename '" + tmp + "' to '" + final_dir + "': " + std::strerror(errno));
    return;
  }
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) == 0) {
    fs::remove_all(tmp);
    return;
  }
  if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP)
    throw Error("cannot replace '" + final_dir + "': " + std::strerror(errno));
  // A file system without RENAME_EXCHANGE (NFS, ...): move the old copy aside for an instant; a
  // crash in between leaves it as iter_N.old.<pid>, which a load names in its error.
  const std::string old = final_dir + ".old." + std::to_string(::getpid());
  fs::remove_all(old);
  if (::rename(final_dir.c_str(), old.c_str()) != 0)
    throw Error("cannot move '" + final_dir + "' aside: " + std::strerror(errno));
  if (::rename(tmp.c_str(), final_dir.c_str()) != 0) {
    const int e = errno;
    ::rename(old.c_str(), final_dir.c_str());
    throw Error("cannot rename '" + tmp + "' to '" + final_dir + "': " + std::strerror(e));
  }
  fs::remove_all(old);
}

bool same_value(const StateValue& a, const StateValue& b) {
  if (a == b) return true;
  auto num = [](const StateValue& v) -> std::optional<double> {
    if (const auto* i = std::get_if<int64_t>(&v)) return static_cast<double>(*i);
    if (const auto* d = std::get_if<double>(&v)) return *d;
    return std::nullopt;
  };
  const auto x = num(a), y = num(b);
  return x && y && *x == *y;
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Problems of a store against the names and shapes it should hold: each there, of its shape, in
// the dtypes allowed, its parts holding each element once (by count: a read finds overlaps).
void compare_tensors(const TensorStore& store, const std::vector<std::pair<std::string, const ParamShape*>>& want,
                     bool f32_only, std::vector<std::string>& problems) {
  std::set<std::string> expected;
  for (const auto& [name, p] : want) {
    expected.insert(name);
    const auto* parts = store.find(name);
    if (!parts) {
      problems.push_back("missing: " + name + " " + shape_string(p->shape));
      continue;
    }
    const TensorStore::Stored& first = parts->front();
    const std::string in = " (in '" + store.file(first.file).path() + "')";
    if (first.part.shape != p->shape) {
      problems.push_back(name + ": checkpoint " + shape_string(first.part.shape) + ", model " + shape_string(p->shape) + in);
      continue;
    }
    for (const TensorStore::Stored& s : *parts) {
      const Dtype d = store.entry(s).dtype;
      if (f32_only && d != Dtype::F32) {
        problems.push_back(name + ": dtype " + std::string(dtype_name(d)) + " (checkpoints hold F32; in '" +
                           store.file(s.file).path() + "')");
        break;
      }
      if (s.part.shape != p->shape) {
        problems.push_back(name + ": its parts disagree on its shape, " + shape_string(first.part.shape) + " and " +
                           shape_string(s.part.shape) + " (in '" + store.file(s.file).path() + "')");
        break;
      }
    }
    const int64_t held = store.stored_elements(name), whole = numel_of(p->shape);
    if (held != whole) {
      std::string files;
      for (const TensorStore::Stored& s : *parts) files += "\n    '" + store.file(s.file).path() + "' " + part_string(s.part);
      problems.push_back(name + " " + shape_string(p->shape) + ": its stored parts hold " + std::to_string(held) +
                         " elements of " + std::to_string(whole) + (held < whole ? " (a part is missing)" : " (parts overlap)") +
                         ":" + files);
    }
  }
  for (const auto& [name, parts] : store.tensors())
    if (!expected.count(name))
      problems.push_back("unexpected: " + name + " " + shape_string(parts.front().part.shape) + " (in '" +
                         store.file(parts.front().file).path() + "')");
}

void check_unique(const std::vector<ParamShape>& expected) {
  std::set<std::string> seen;
  for (const auto& p : expected)
    if (!seen.insert(p.name).second) throw Error("checkpoint: parameter '" + p.name + "' expected twice");
}

void read_whole(const TensorStore& store, const std::string& name, float* out, size_t n) {
  const auto* parts = store.find(name);
  if (!parts) store.no_tensor(name);
  const std::vector<int64_t>& shape = parts->front().part.shape;
  if (numel_of(shape) != static_cast<int64_t>(n))
    throw UsageError(store.where() + ": tensor '" + name + "' has " + std::to_string(numel_of(shape)) + " elements " +
                     shape_string(shape) + " (in '" + store.file(parts->front().file).path() + "'), expected " +
                     std::to_string(n));
  store.read({name, shape, {model::whole_box(shape)}}, out);
}

}  // namespace

std::string state_value_str(const StateValue& v) {
  if (const auto* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  if (const auto* d = std::get_if<double>(&v)) return json(*d).dump();
  if (const auto* b = std::get_if<bool>(&v)) return *b ? "true" : "false";
  return json(std::get<std::string>(v)).dump();
}

std::vector<ParamShape> param_shapes(const model::ParameterTable& table) {
  std::vector<ParamShape> out;
  out.reserve(table.specs.size());
  for (const auto& s : table.specs) out.push_back({s.name, s.shape});
  return out;
}

std::string exp_avg_name(const std::string& param) { return "optimizer.state.exp_avg." + param; }
std::string exp_avg_sq_name(const std::string& param) { return "optimizer.state.exp_avg_sq." + param; }

std::string iteration_dir_name(int64_t iteration) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "iter_%07lld", static_cast<long long>(iteration));
  return buf;
}

std::string tracker_path(const std::string& dir) { return join_path(dir, "latest_checkpointed_iteration.txt"); }

std::optional<int64_t> latest_iteration(const std::string& load_dir) {
  const std::string path = tracker_path(load_dir);
  if (!fs::exists(path)) return std::nullopt;
  std::string s = read_file(path);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  s = s.substr(i);
  // At most 18 digits: the number then fits int64 (checked before it is computed).
  if (s.empty() || s.size() > 18 || s.find_first_not_of("0123456789") != std::string::npos)
    throw UsageError("checkpoint tracker '" + path + "' holds '" + shorten(s, 40) +
                     "', expected an iteration number" +
                     (s == "release" ? " (Megatron release checkpoints are not supported)" : ""));
  int64_t it = 0;
  for (char c : s) it = it * 10 + (c - '0');
  return it;
}

bool checkpoint_exists(const std::string& load_dir) {
  std::error_code ec;
  return fs::exists(join_path(load_dir, kStateFile), ec) || fs::exists(tracker_path(load_dir), ec);
}

std::vector<std::string> remove_incomplete_checkpoints(const std::string& save_dir) {
  std::vector<std::string> removed;
  std::error_code ec;
  if (!fs::is_directory(save_dir, ec)) return removed;
  std::vector<fs::path> victims;
  for (const auto& e : fs::directory_iterator(save_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (is_scratch_name(name, ".tmp.")) victims.push_back(e.path());
    // A moved-aside old copy is garbage once its directory is back in place; otherwise it is the
    // only copy of that iteration and stays for the user (a load's error names it).
    if (is_scratch_name(name, ".old.") && fs::exists(e.path().parent_path() / name.substr(0, name.find('.'))))
      victims.push_back(e.path());
  }
  for (const auto& v : victims) {
    fs::remove_all(v, ec);
    if (ec) throw Error("cannot remove the incomplete checkpoint '" + v.string() + "': " + ec.message());
    removed.push_back(v.filename().string());
  }
  std::sort(removed.begin(), removed.end());
  return removed;
}

std::string checkpoint_scratch_dir(const std::string& save_dir, int64_t iteration, int64_t token) {
  return join_path(save_dir, iteration_dir_name(iteration)) + ".tmp." + std::to_string(token);
}

void begin_checkpoint(const std::string& save_dir, const std::string& scratch) {
  make_dirs(save_dir);
  remove_incomplete_checkpoints(save_dir);
  fs::remove_all(scratch);
  fs::create_directory(scratch);
}

void abandon_checkpoint(const std::string& scratch) {
  std::error_code ec;
  fs::remove_all(scratch, ec);
}

namespace {

// The safetensors entries of a rank's parts (each under its tensor's name: a rank holds one part of
// a tensor), and the parts record of those that are not whole: the whole shape and the boxes. An
// entry of one box has the box's shape; of several, one dimension.
std::vector<TensorWrite> part_writes(const std::vector<PartRef>& refs, const char* what, FileParts& parts) {
  std::vector<TensorWrite> out;
  out.reserve(refs.size());
  for (const PartRef& r : refs) {
    const model::TensorPart& p = r.part;
    if (p.name.empty()) throw Error(std::string("checkpoint: a ") + what + " tensor has no name");
    const bool whole = p.boxes.size() == 1 && p.boxes[0].start == std::vector<int64_t>(p.shape.size(), 0) &&
                       p.boxes[0].size == p.shape;
    std::vector<int64_t> shape = whole ? p.shape : p.boxes.size() == 1 ? p.boxes[0].size : std::vector<int64_t>{p.numel()};
    out.push_back({p.name, Dtype::F32, std::move(shape), r.data});
    if (!whole) parts[p.name] = p;
  }
  return out;
}

}  // namespace

void write_checkpoint_shard(const std::string& scratch, int64_t rank, int64_t world, const ShardWrite& w) {
  json record = {{"files", json::object()}, {"parts", json::object()}};
  // The two big files are written concurrently: each is hashed as it streams out.
  auto write = [&](const std::vector<PartRef>& refs, const char* kind) -> std::optional<std::pair<std::string, json>> {
    if (refs.empty()) return std::nullopt;
    FileParts parts;
    const std::vector<TensorWrite> writes = part_writes(refs, kind, parts);
    const std::string file = shard_file(kind, rank, world);
    const bool optimizer = &refs == &w.optimizer;
    TensorFill fill;
    if (w.fill)
      fill = [&](size_t i, size_t offset, size_t n, void* dst) {
        w.fill(optimizer, i, static_cast<int64_t>(offset / sizeof(float)), static_cast<int64_t>(n / sizeof(float)),
               static_cast<float*>(dst));
      };
    const SafetensorsWriteResult r = write_safetensors(join_path(scratch, file), writes, {{"format", "pt"}}, fill);
    json entry = {{"sum", {{"bytes", r.file_bytes}, {"sha256", r.sha256}}}};
    if (!parts.empty()) entry["parts"] = parts_json(parts);
    return std::make_pair(file, entry);
  };
  auto opt = std::async(std::launch::async, [&] { return write(w.optimizer, "optimizer"); });
  std::optional<std::pair<std::string, json>> model;
  try {
    model = write(w.model, "model");
  } catch (...) {
    try {
      opt.get();
    } catch (...) {
    }
    throw;
  }
  auto optimizer = opt.get();
  for (const auto* f : {&model, &optimizer}) {
    if (!*f) continue;
    record["files"][(*f)->first] = (*f)->second.at("sum");
    if ((*f)->second.contains("parts")) record["parts"][(*f)->first] = (*f)->second.at("parts");
  }
  write_file_atomic(join_path(scratch, shard_record(rank)), record.dump() + "\n");
}

std::string finish_checkpoint(const std::string& save_dir, const std::string& scratch, int64_t iteration,
                              int64_t world, const TrainStateRecord& s, const std::string& run_config_yaml) {
  const std::string final_dir = join_path(save_dir, iteration_dir_name(iteration));
  try {
    if (iteration < 0) throw Error("checkpoint: negative iteration " + std::to_string(iteration));
    if (s.iteration != iteration)
      throw Error("checkpoint: train state says iteration " + std::to_string(s.iteration) + ", saving " +
                  std::to_string(iteration));
    if (!std::isfinite(s.floating_point_operations_so_far))
      throw Error("checkpoint: floating_point_operations_so_far is not finite");
    // The ranks' records, merged; then gone (train_state.json holds them).
    json files = json::object(), parts = json::object();
    for (int64_t r = 0; r < world; ++r) {
      const std::string path = join_path(scratch, shard_record(r));
      if (!fs::exists(path)) throw Error("checkpoint: rank " + std::to_string(r) + " wrote no shard record " + path);
      const json rec = json::parse(read_file(path));
      for (const auto& [file, sum] : rec.at("files").items()) files[file] = sum;
      for (const auto& [file, p] : rec.at("parts").items()) parts[file] = p;
      fs::remove(path);
    }
    bool has_model = false;
    for (const auto& [file, sum] : files.items()) has_model = has_model || tensor_file_of(file, "model");
    if (!has_model) throw Error("checkpoint: no model tensors to save");
    write_file_atomic(join_path(scratch, kConfigFile), run_config_yaml);
    files[kConfigFile] = {{"bytes", run_config_yaml.size()}, {"sha256", sha256_hex(run_config_yaml)}};

    json j = json::object();
    j["format"] = kFormat;
    j["version"] = kVersion;
    j["iteration"] = iteration;
    j["consumed_train_samples"] = s.consumed_train_samples;
    j["consumed_valid_samples"] = s.consumed_valid_samples;
    j["skipped_train_samples"] = s.skipped_train_samples;
    j["skipped_iterations"] = s.skipped_iterations;
    j["nan_iterations"] = s.nan_iterations;
    j["scheduler_num_steps"] = s.scheduler_num_steps;
    j["optimizer_steps"] = s.optimizer_steps;
    j["floating_point_operations_so_far"] = s.floating_point_operations_so_far;
    j["rng"] = map_json(s.rng, "rng");
    j["model_shape"] = map_json(s.model_shape, "model_shape");
    if (!s.scheduler.empty()) j["scheduler"] = map_json(s.scheduler, "scheduler");
    j["files"] = files;
    if (!parts.empty()) j["parts"] = parts;
    write_file_atomic(join_path(scratch, kStateFile), j.dump(2) + "\n");  // last: its presence marks completeness
    fsync_dir(scratch);
    install_dir(scratch, final_dir);
    fsync_dir(save_dir);
  } catch (...) {
    abandon_checkpoint(scratch);
    throw;
  }
  // Megatron writes the bare number, no newline.
  write_file_atomic(tracker_path(save_dir), std::to_string(iteration));
  return final_dir;
}

std::string save_checkpoint(const std::string& save_dir, int64_t iteration, const CheckpointWrite& w) {
  if (iteration < 0) throw Error("checkpoint: negative iteration " + std::to_string(iteration));
  if (w.state.iteration != iteration)
    throw Error("checkpoint: train state says iteration " + std::to_string(w.state.iteration) + ", saving " +
                std::to_string(iteration));
  if (w.model.empty()) throw Error("checkpoint: no model tensors to save");
  ShardWrite shard;
  for (const auto* refs : {&w.model, &w.optimizer})
    for (const TensorRef& r : *refs)
      (refs == &w.model ? shard.model : shard.optimizer).push_back({{r.name, r.shape, {model::whole_box(r.shape)}}, r.data});
  const std::string scratch = checkpoint_scratch_dir(save_dir, iteration, ::getpid());
  begin_checkpoint(save_dir, scratch);
  try {
    write_checkpoint_shard(scratch, 0, 1, shard);
  } catch (...) {
    abandon_checkpoint(scratch);
    throw;
  }
  return finish_checkpoint(save_dir, scratch, iteration, 1, w.state, w.run_config_yaml);
}

namespace {

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "unknown host";
  return buf;
}

// Whether `fd` is still the file at `path` (not one a holder removed after this process opened it).
bool same_file(int fd, const std::string& path) {
  struct stat a {}, b {};
  return ::fstat(fd, &a) == 0 && ::stat(path.c_str(), &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

}  // namespace

SaveDirLock::SaveDirLock(const std::string& save_dir)
    : dir_(save_dir), path_(join_path(save_dir, ".laoyao_save.lock")) {
  std::error_code ec;
  created_dir_ = !fs::exists(save_dir, ec);
  make_dirs(save_dir);
  for (;;) {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) throw Error("cannot create the lock file '" + path_ + "': " + std::strerror(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int e = errno;
      char holder[512] = {};
      const ssize_t n = ::pread(fd_, holder, sizeof holder - 1, 0);
      ::close(fd_);
      fd_ = -1;
      if (e != EWOULDBLOCK) throw Error("cannot lock '" + path_ + "': " + std::strerror(e));
      std::string who = n > 0 ? std::string(holder, static_cast<size_t>(n)) : "a run that has not said who it is";
      while (!who.empty() && std::isspace(static_cast<unsigned char>(who.back()))) who.pop_back();
      throw UsageError("checkpoint.save / --save '" + save_dir + "' is in use by another run (" + who +
                       "): two runs writing one save directory would replace each other's checkpoints. Give this "
                       "run another --save, or stop that run first");
    }
    if (same_file(fd_, path_)) break;
    ::close(fd_);  // the holder removed the file between our open and lock: take the new one
    fd_ = -1;
  }
  const std::string me = "host " + host_name() + ", pid " + std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, me.data(), me.size(), 0) != static_cast<ssize_t>(me.size())) {
    const int e = errno;
    ::close(fd_);
    fd_ = -1;
    throw Error("cannot write the lock file '" + path_ + "': " + std::strerror(e));
  }
}

SaveDirLock::~SaveDirLock() {
  if (fd_ < 0) return;
  ::unlink(path_.c_str());  // while still holding it: a waiting run re-checks which file it locked
  ::close(fd_);
  std::error_code ec;
  if (created_dir_ && fs::is_empty(dir_, ec)) fs::remove(dir_, ec);
}

void LoadedCheckpoint::read_model(const std::string& name, float* out, size_t n) const {
  read_whole(model, name, out, n);
}

void LoadedCheckpoint::read_optimizer(const std::string& name, float* out, size_t n) const {
  if (!optimizer) throw UsageError("checkpoint '" + dir + "' was saved without optimizer state");
  read_whole(*optimizer, name, out, n);
}

LoadedCheckpoint load_checkpoint(const std::string& load_dir, std::optional<int64_t> step, CheckpointVerify verify) {
  const std::string dir = resolve_iteration_dir(load_dir, step);
  StateFile sf = read_state_file(dir);
  sf.state.loaded_from = join_path(dir, kStateFile);
  const std::string name = fs::path(dir).filename().string();
  if (name.rfind("iter_", 0) == 0 && name != iteration_dir_name(sf.state.iteration))
    throw UsageError("checkpoint '" + dir + "' holds iteration " + std::to_string(sf.state.iteration) +
                     " (train_state.json), which does not match its name");
  // The optimizer files (the larger) are opened and hashed alongside the model files.
  auto opt = std::async(std::launch::async, [&] { return open_store(dir, sf, "optimizer", verify); });
  std::optional<TensorStore> model;
  try {
    model = open_store(dir, sf, "model", verify);
  } catch (...) {
    try {
      opt.get();
    } catch (...) {
    }
    throw;
  }
  std::optional<TensorStore> optimizer = opt.get();
  const std::string config_path = join_path(dir, kConfigFile);
  if (!fs::exists(config_path))
    throw UsageError("checkpoint file '" + config_path + "' is missing (train_state.json lists it)");
  std::string yaml = read_file(config_path);
  verify_file_sum(config_path, reinterpret_cast<const uint8_t*>(yaml.data()), yaml.size(), sf.files.at(kConfigFile));
  for (const auto& [file, sum] : sf.files) {  // files a later version may add: present and intact
    if (tensor_file_of(file, "model") || tensor_file_of(file, "optimizer") || file == kConfigFile) continue;
    const std::string p = join_path(dir, file);
    if (!fs::exists(p)) throw UsageError("checkpoint file '" + p + "' is missing (train_state.json lists it)");
    const std::string bytes = read_file(p);
    verify_file_sum(p, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), sum);
  }
  return LoadedCheckpoint{dir, std::move(sf.state), std::move(yaml), std::move(*model), std::move(optimizer)};
}

void check_model_shape(const LoadedCheckpoint& ckpt, const StateMap& current) {
  std::vector<std::string> diffs;
  const StateMap& saved = ckpt.state.model_shape;
  for (const auto& [k, v] : saved) {
    auto it = current.find(k);
    if (it == current.end())
      diffs.push_back(k + ": checkpoint " + state_value_str(v) + ", current (not set)");
    else if (!same_value(v, it->second))
      diffs.push_back(k + ": checkpoint " + state_value_str(v) + ", current " + state_value_str(it->second));
  }
  for (const auto& [k, v] : current)
    if (!saved.count(k)) diffs.push_back(k + ": checkpoint (not recorded), current " + state_value_str(v));
  if (diffs.empty()) return;
  throw UsageError("checkpoint '" + ckpt.dir + "' was saved from a different model than the one configured:" +
                   list_problems(diffs) +
                   "\nIt may be an earlier run's checkpoint in the load directory. To train from scratch, use a new "
                   "save directory (checkpoint.save / --save) or do not load (checkpoint.load=null / no --load).");
}

void check_parameters(const LoadedCheckpoint& ckpt, const std::vector<ParamShape>& expected) {
  check_unique(expected);
  std::vector<std::string> problems;
  std::vector<std::pair<std::string, const ParamShape*>> want;
  for (const auto& p : expected) want.emplace_back(p.name, &p);
  compare_tensors(ckpt.model, want, true, problems);
  if (ckpt.optimizer) {
    want.clear();
    for (const auto& p : expected) {
      want.emplace_back(exp_avg_name(p.name), &p);
      want.emplace_back(exp_avg_sq_name(p.name), &p);
    }
    compare_tensors(*ckpt.optimizer, want, true, problems);
  }
  if (problems.empty()) return;
  throw UsageError("checkpoint '" + ckpt.dir + "' does not match the model's parameters:" + list_problems(problems) +
                   "\nIt may be an earlier run's checkpoint in the load directory. To train from scratch, use a new "
                   "save directory (checkpoint.save / --save) or do not load (checkpoint.load=null / no --load).");
}

std::string local_spec_name(const std::string& name) {
  // Transformer Engine's spec fuses the pre-attention and pre-MLP norms into linear_qkv and
  // linear_fc1; the local spec (laoyao's names) keeps them as modules of the layer.
  static const std::pair<const char*, const char*> renames[] = {
      {"self_attention.linear_qkv.layer_norm_weight", "input_layernorm.weight"},
      {"self_attention.linear_qkv.layer_norm_bias", "input_layernorm.bias"},
      {"mlp.linear_fc1.layer_norm_weight", "pre_mlp_layernorm.weight"},
      {"mlp.linear_fc1.layer_norm_bias", "pre_mlp_layernorm.bias"},
  };
  for (const auto& [te, local] : renames) {
    const std::string suffix = te;
    if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
      return name.substr(0, name.size() - suffix.size()) + local;
  }
  // TEGroupedMLP (--moe-grouped-gemm) keeps expert E's weights as `experts.linear_fc1.weightE`;
  // SequentialMLP (the local spec, laoyao's names) as `experts.local_experts.E.linear_fc1.weight`.
  for (const char* fc : {"linear_fc1", "linear_fc2"}) {
    const std::string grouped = std::string("mlp.experts.") + fc + ".weight";
    const size_t at = name.rfind(grouped);
    if (at == std::string::npos || at + grouped.size() == name.size()) continue;
    const std::string expert = name.substr(at + grouped.size());
    if (expert.find_first_not_of("0123456789") != std::string::npos) continue;
    return name.substr(0, at) + "mlp.experts.local_experts." + expert + "." + fc + ".weight";
  }
  return name;
}

void check_pretrained_store(const TensorStore& store, const std::vector<ParamShape>& expected,
                            const std::string& path) {
  std::vector<std::string> problems;
  std::vector<std::pair<std::string, const ParamShape*>> want;
  for (const auto& p : expected) want.emplace_back(p.name, &p);
  compare_tensors(store, want, false, problems);
  if (!problems.empty())
    throw UsageError("pretrained checkpoint '" + path + "' does not match the model's parameters:" +
                     list_problems(problems));
}

PretrainedSource open_pretrained(const std::string& path, const std::vector<ParamShape>& expected,
                                 bool allow_unexpected) {
  check_unique(expected);
  std::error_code ec;
  if (!fs::exists(path, ec)) throw UsageError("pretrained checkpoint '" + path + "' does not exist");
  if (fs::exists(tracker_path(path)) || fs::exists(join_path(path, kStateFile))) {
    // A laoyao checkpoint: its model parts as they are (names as saved; each file hashed before it is read).
    LoadedCheckpoint ckpt = load_checkpoint(path, std::nullopt, CheckpointVerify::kFilesRead);
    check_pretrained_store(ckpt.model, expected, path);
    PretrainedSource out{std::move(ckpt.model), {}, {}};
    for (size_t i = 0; i < out.store.num_files(); ++i) out.files.push_back(out.store.file(i).path());
    return out;
  }
  std::vector<SafetensorsFile> files;
  if (fs::is_regular_file(path, ec)) {
    if (fs::path(path).extension() != ".safetensors")
      throw UsageError("pretrained checkpoint '" + path + "' is not a .safetensors file or a directory");
    files.emplace_back(path);
  } else {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(path, ec))
      if (e.is_regular_file() && e.path().extension() == ".safetensors") names.push_back(e.path().string());
    std::sort(names.begin(), names.end());
    if (names.empty()) {
      if (has_megatron_files(path)) megatron_format(path);
      throw UsageError("pretrained checkpoint '" + path +
                       "' holds no *.safetensors files (expected a laoyao checkpoint directory with "
                       "latest_checkpointed_iteration.txt, an iter_NNNNNNN directory, or a folder of .safetensors "
                       "files with Megatron-Core parameter names)");
    }
    for (const auto& n : names) files.emplace_back(n);
  }

  std::map<std::string, std::pair<size_t, const SafetensorsTensor*>> found;  // local-spec name: file, entry
  for (size_t i = 0; i < files.size(); ++i)
    for (const auto& t : files[i].tensors()) {
      auto [it, fresh] = found.emplace(local_spec_name(t.name), std::make_pair(i, &t));
      if (!fresh)
        throw UsageError("pretrained checkpoint '" + path + "': tensor '" + t.name + "' is in both '" +
                         files[it->second.first].path() + "' and '" + files[i].path() + "' (Transformer Engine and "
                         "local-spec names count as the same parameter)");
    }

  PretrainedSource out{TensorStore("pretrained checkpoint '" + path + "'"), {}, {}};
  for (const auto& f : files) out.files.push_back(f.path());
  std::vector<std::string> problems;
  std::set<std::string> expected_names;
  for (const auto& p : expected) {
    expected_names.insert(local_spec_name(p.name));
    auto it = found.find(local_spec_name(p.name));
    if (it == found.end()) {
      problems.push_back("missing: " + p.name + " " + shape_string(p.shape));
      continue;
    }
    const SafetensorsTensor& t = *it->second.second;
    const std::string& in = files[it->second.first].path();
    if (t.shape != p.shape)
      problems.push_back(p.name + ": checkpoint " + shape_string(t.shape) + ", model " + shape_string(p.shape) + " (in '" +
                         in + "')");
    else if (t.dtype != Dtype::F32 && t.dtype != Dtype::BF16 && t.dtype != Dtype::F16)
      problems.push_back(p.name + ": dtype " + std::string(dtype_name(t.dtype)) + " (expected F32, BF16 or F16; in '" +
                         in + "')");
  }
  for (const auto& [name, where] : found) {
    if (expected_names.count(name)) continue;
    const std::string suffix = "._extra_state";
    if (name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) continue;
    if (allow_unexpected)
      out.ignored.push_back(name);
    else
      problems.push_back("unexpected: " + name + " " + shape_string(where.second->shape) + " (in '" +
                         files[where.first].path() + "')");
  }
  if (!problems.empty())
    throw UsageError("pretrained checkpoint '" + path + "' does not match the model's parameters:" +
                     list_problems(problems));
  // The expected tensors under the model's names, each whole (keys as the files spell them).
  std::vector<std::vector<std::pair<std::string, model::TensorPart>>> per_file(files.size());
  for (const auto& p : expected) {
    const auto& [file, t] = found.at(local_spec_name(p.name));
    per_file[file].emplace_back(t->name, model::TensorPart{p.name, p.shape, {model::whole_box(p.shape)}});
  }
  for (size_t i = 0; i < files.size(); ++i) {
    const size_t at = out.store.add_file(std::move(files[i]), std::nullopt);
    for (auto& [key, part] : per_file[i]) out.store.add(at, key, std::move(part));
  }
  return out;
}

PretrainedWeights load_pretrained_weights(const std::string& path, const std::vector<ParamShape>& expected,
                                          bool allow_unexpected) {
  const PretrainedSource src = open_pretrained(path, expected, allow_unexpected);
  PretrainedWeights out{{}, src.files, src.ignored};
  for (const auto& p : expected) {
    std::vector<float>& t = out.tensors[p.name];
    t.resize(static_cast<size_t>(numel_of(p.shape)));
    src.store.read({p.name, p.shape, {model::whole_box(p.shape)}}, t.data());
  }
  return out;
}

}  // namespace laoyao::train
