#include "core/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <filesystem>
#include <limits>
#include <mutex>
#include <numeric>
#include <set>
#include <thread>
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "core/file_io.hpp"
#include "core/sha256.hpp"

namespace laoyao {

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

// Tensor bytes are little-endian in the file and copied as they are.
static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

namespace {

using json = nlohmann::json;

// The reference reader refuses larger headers (a guard against JSON bombs).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

constexpr std::string_view kDtypeNames[] = {"BOOL", "U8",  "I8",   "F8_E5M2", "F8_E4M3", "I16", "U16", "F16",
                                            "BF16", "I32", "U32", "F32",     "F64",     "I64", "U64"};
constexpr size_t kDtypeSizes[] = {1, 1, 1, 1, 1, 2, 2, 2, 2, 4, 4, 4, 8, 8, 8};


// Writing order: descending dtype (alignment) then name, as the reference's prepare() sorts.
std::vector<size_t> write_order(const std::vector<TensorWrite>& tensors) {
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (tensors[a].dtype != tensors[b].dtype) return tensors[a].dtype > tensors[b].dtype;
    return tensors[a].name < tensors[b].name;
  });
  return order;
}

size_t write_nbytes(const TensorWrite& t) {
  uint64_t n = dtype_size(t.dtype);
  for (int64_t d : t.shape) {
    if (d < 0) throw Error("safetensors: tensor '" + t.name + "' has a negative dimension " + shape_string(t.shape));
    if (d != 0 && n > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(d))
      throw Error("safetensors: tensor '" + t.name + "' is too large " + shape_string(t.shape));
    n *= static_cast<uint64_t>(d);
  }
  return n;
}

// A JSON string as serde_json writes it: ", \ and control characters escaped (\b \f \n \r \t,
// else \u00xx lowercase), everything else raw UTF-8. nlohmann's dump escapes identically and
// refuses invalid UTF-8.
std::string json_string(const std::string& s, const char* what) {
  try {
    return json(s).dump();
  } catch (const json::exception&) {
    throw Error(std::string("safetensors: ") + what + " is not valid UTF-8: '" + s + "'");
  }
}

// Writes through a buffer (small tensors) or directly (large ones), hashing what it writes (when
// asked to).
class FileSink {
 public:
  FileSink(std::string path, bool hash) : path_(std::move(path)), hash_(hash) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) throw Error("cannot write '" + path_ + "': " + std::strerror(errno));
    buf_.reserve(kBuf);
  }
  ~FileSink() {
    if (fd_ >= 0) ::close(fd_);
  }
  void write(const void* p, size_t n) {
    if (hash_) sha_.update(p, n);
    bytes_ += n;
    if (buf_.size() + n <= kBuf) {
      const auto* c = static_cast<const uint8_t*>(p);
      buf_.insert(buf_.end(), c, c + n);
      return;
    }
    flush();
    raw_write(p, n);
  }
  // Flushes, fsyncs and closes; returns the file's SHA-256.
  std::string close() {
    flush();
    if (::fsync(fd_) != 0) throw Error("cannot flush '" + path_ + "': " + std::strerror(errno));
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) throw Error("cannot close '" + path_ + "': " + std::strerror(errno));
    return hash_ ? to_hex(sha_.finish()) : std::string();
  }
  uint64_t bytes() const { return bytes_; }

 private:
  static constexpr size_t kBuf = 4 << 20;
  void flush() {
    raw_write(buf_.data(), buf_.size());
    buf_.clear();
  }
  void raw_write(const void* p, size_t n) {
    const auto* c = static_cast<const uint8_t*>(p);
    while (n > 0) {
      // Linux writes at most ~2 GiB per call; ask for 1 GiB at a time.
      const ssize_t w = ::write(fd_, c, std::min<size_t>(n, size_t{1} << 30));
      if (w < 0) {
        if (errno == EINTR) continue;
        throw Error("cannot write '" + path_ + "': " + std::strerror(errno));
      }
      c += w;
      n -= static_cast<size_t>(w);
      written_ += static_cast<uint64_t>(w);
      write_back();
    }
  }
  // The disk starts on each 128 MB as soon as it is written, and the one before it is waited for:
  // a file of many gigabytes is not left dirty in the page cache for close()'s fsync to write at
  // the end, after all the work that made it (the disk works while the bytes are made).
  void write_back() {
#ifdef __linux__
    constexpr uint64_t kRange = uint64_t{128} << 20;
    while (written_ - started_ >= kRange) {
      (void)::sync_file_range(fd_, static_cast<off_t>(started_), kRange, SYNC_FILE_RANGE_WRITE);
      if (started_ >= kRange)
        (void)::sync_file_range(fd_, static_cast<off_t>(started_ - kRange), kRange,
                                SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
      started_ += kRange;
    }
#endif
  }
  std::string path_;
  bool hash_;
  int fd_ = -1;
  std::vector<uint8_t> buf_;
  Sha256 sha_;
  uint64_t bytes_ = 0;
  uint64_t written_ = 0, started_ = 0;  // bytes written; bytes whose write-back was started
};

// Writes filled windows on a thread of its own, so that the caller fills the next window (reads,
// converts) while the last one is written and hashed. One window in flight: submit() waits for
// the previous one, so the caller may refill a buffer two submits after it gave it.
class WindowWriter {
 public:
  explicit WindowWriter(FileSink& out) : out_(out), thread_([this] { run(); }) {}
  ~WindowWriter() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  WindowWriter(const WindowWriter&) = delete;
  WindowWriter& operator=(const WindowWriter&) = delete;

  void submit(const uint8_t* p, size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !busy_; });
    if (error_) std::rethrow_exception(error_);
    p_ = p, n_ = n, busy_ = true;
    cv_.notify_all();
  }
  // Waits for the window in flight; rethrows its error.
  void drain() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !busy_; });
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return busy_ || stop_; });
      if (!busy_) return;
      lock.unlock();
      std::exception_ptr err;
      try {
        out_.write(p_, n_);
      } catch (...) {
        err = std::current_exception();
      }
      lock.lock();
      if (err) error_ = err;
      busy_ = false;
      cv_.notify_all();
    }
  }
  FileSink& out_;
  std::mutex mu_;
  std::condition_variable cv_;
  const uint8_t* p_ = nullptr;
  size_t n_ = 0;
  bool busy_ = false, stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;  // last: started once the rest is made
};

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

[[noreturn]] void bad_file(const std::string& path, const std::string& problem) {
  throw UsageError("safetensors file '" + path + "': " + problem);
}

// Parses the header JSON, noting the first duplicate key at any depth (JSON parsers, nlohmann's
// included, silently keep one of them; the spec forbids duplicates, and two readers disagreeing
// on which one counts is how polyglot files are made).
json parse_header(const std::string& path, std::string_view text) {
  std::vector<std::set<std::string>> keys;
  std::string duplicate;
  json::parser_callback_t cb = [&](int, json::parse_event_t ev, json& parsed) {
    if (ev == json::parse_event_t::object_start) {
      keys.emplace_back();
    } else if (ev == json::parse_event_t::object_end) {
      if (!keys.empty()) keys.pop_back();
    } else if (ev == json::parse_event_t::key && !keys.empty()) {
      const std::string& k = parsed.get_ref<const std::string&>();
      if (!keys.back().insert(k).second && duplicate.empty()) duplicate = k;
    }
    return true;
  };
  json h;
  try {
    h = json::parse(text.begin(), text.end(), cb);
  } catch (const json::exception& e) {  // parse_error, or out_of_range for a number past a double
    bad_file(path, std::string("the header is not valid JSON: ") + e.what());
  }
  if (!duplicate.empty()) bad_file(path, "the header has the key '" + duplicate + "' twice (duplicate keys are not allowed)");
  if (!h.is_object()) bad_file(path, "the header is not a JSON object");
  return h;
}

uint64_t offset_value(const std::string& path, const std::string& name, const json& v, const char* field) {
  if (!v.is_number_unsigned())
    bad_file(path, "tensor '" + name + "': " + field + " must hold non-negative integers, found " + v.dump());
  return v.get<uint64_t>();
}

}  // namespace

size_t dtype_size(Dtype d) { return kDtypeSizes[static_cast<int>(d)]; }
std::string_view dtype_name(Dtype d) { return kDtypeNames[static_cast<int>(d)]; }

std::optional<Dtype> parse_dtype(std::string_view s) {
  for (size_t i = 0; i < std::size(kDtypeNames); ++i)
    if (kDtypeNames[i] == s) return static_cast<Dtype>(i);
  return std::nullopt;
}

float bf16_to_f32(uint16_t bits) { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24, exact in fp32
    const float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));  // Inf, NaN (payload kept)
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (mant << 13));
}

std::string safetensors_header(const std::vector<TensorWrite>& tensors,
                               const std::map<std::string, std::string>& metadata) {
  std::set<std::string_view> names;
  for (const auto& t : tensors) {
    if (t.name == "__metadata__") throw Error("safetensors: '__metadata__' cannot be a tensor name");
    if (!names.insert(t.name).second) throw Error("safetensors: tensor '" + t.name + "' given twice");
  }
  std::string h = "{";
  if (!metadata.empty()) {
    h += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : metadata) {
      if (!first) h += ',';
      first = false;
      h += json_string(k, "a metadata key") + ':' + json_string(v, "a metadata value");
    }
    h += '}';
  }
  uint64_t offset = 0;
  bool first = metadata.empty();
  for (size_t i : write_order(tensors)) {
    const TensorWrite& t = tensors[i];
    const uint64_t n = write_nbytes(t);
    if (!first) h += ',';
    first = false;
    h += json_string(t.name, "a tensor name");
    h += ":{\"dtype\":\"";
    h += dtype_name(t.dtype);
    h += "\",\"shape\":[";
    for (size_t d = 0; d < t.shape.size(); ++d) {
      if (d) h += ',';
      h += std::to_string(t.shape[d]);
    }
    h += "],\"data_offsets\":[" + std::to_string(offset) + ',' + std::to_string(offset + n) + "]}";
    offset += n;
  }
  h += '}';
  h.append((8 - h.size() % 8) % 8, ' ');  // the buffer starts 8-aligned: fp32/fp64 views need no copy
  return h;
}

SafetensorsWriteResult write_safetensors(const std::string& path, const std::vector<TensorWrite>& tensors,
                                         const std::map<std::string, std::string>& metadata, const TensorFill& fill,
                                         bool hash) {
  const std::string header = safetensors_header(tensors, metadata);
  for (const auto& t : tensors)
    if (t.data == nullptr && !fill && write_nbytes(t) > 0)
      throw Error("safetensors: tensor '" + t.name + "' has no data");

  std::filesystem::path p(path);
  const std::string dir = p.has_parent_path() ? p.parent_path().string() : ".";
  if (p.has_parent_path()) make_dirs(dir);
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  SafetensorsWriteResult r;
  try {
    FileSink out(tmp, hash);
    uint8_t len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(header.size()) >> (8 * i));
    out.write(len, 8);
    out.write(header.data(), header.size());
    std::vector<uint8_t> filled[2];
    int next = 0;
    {
      WindowWriter writer(out);
      for (size_t i : write_order(tensors)) {
        const TensorWrite& t = tensors[i];
        if (t.data || write_nbytes(t) == 0) {
          writer.drain();  // (in file order)
          out.write(t.data, write_nbytes(t));
          continue;
        }
        const size_t total = write_nbytes(t);
        for (size_t at = 0; at < total; at += kFillWindow) {
          const size_t n = std::min(kFillWindow, total - at);
          std::vector<uint8_t>& buf = filled[next];
          if (buf.size() < n) buf.resize(std::min(total, kFillWindow));  // (n is at most that)
          fill(i, at, n, buf.data());
          writer.submit(buf.data(), n);
          next ^= 1;
        }
      }
      writer.drain();
    }
    r.file_bytes = out.bytes();
    r.sha256 = out.close();
    if (::rename(tmp.c_str(), path.c_str()) != 0)
      throw Error("cannot rename '" + tmp + "' to '" + path + "': " + std::strerror(errno));
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  fsync_dir(dir);
  return r;
}

int64_t SafetensorsTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw UsageError("cannot read safetensors file '" + path + "': " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    bad_file(path, "not a regular file");
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ < 8) {
    ::close(fd);
    bad_file(path, "the file is " + std::to_string(size_) + " bytes, shorter than the 8-byte header length");
  }
  void* m = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);
  if (m == MAP_FAILED) throw Error("cannot map '" + path + "': " + std::strerror(map_errno));
  base_ = static_cast<const uint8_t*>(m);

  try {
    uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(base_[i]) << (8 * i);
    if (n > kMaxHeaderBytes)
      bad_file(path, "the header length " + std::to_string(n) + " exceeds the 100 MB limit (not a safetensors file?)");
    if (n > size_ - 8)
      bad_file(path, "the header length " + std::to_string(n) + " runs past the end of the file (" +
                         std::to_string(size_) + " bytes; truncated?)");
    const std::string_view text(reinterpret_cast<const char*>(base_ + 8), n);
    if (text.empty() || text[0] != '{') bad_file(path, "the header does not start with '{'");
    const json h = parse_header(path, text);

    const uint64_t buffer = size_ - 8 - n;
    const uint8_t* data = base_ + 8 + n;
    struct Span {
      uint64_t begin, end;
      size_t idx;
    };
    std::vector<Span> spans;
    for (const auto& [name, v] : h.items()) {
      if (name == "__metadata__") {
        if (v.is_null()) continue;  // the reference reads null as "no metadata"
        if (!v.is_object()) bad_file(path, "__metadata__ must be an object of strings");
        for (const auto& [k, s] : v.items()) {
          if (!s.is_string()) bad_file(path, "__metadata__ value of '" + k + "' is not a string: " + s.dump());
          metadata_[k] = s.get<std::string>();
        }
        continue;
      }
      if (!v.is_object()) bad_file(path, "tensor '" + name + "': expected {dtype, shape, data_offsets}, found " + v.dump());
      for (const auto& [k, _] : v.items())
        if (k != "dtype" && k != "shape" && k != "data_offsets")
          bad_file(path, "tensor '" + name + "': unknown field '" + k + "' (expected dtype, shape, data_offsets)");
      if (!v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
        bad_file(path, "tensor '" + name + "': needs dtype, shape and data_offsets");
      SafetensorsTensor t;
      t.name = name;
      const json& dt = v["dtype"];
      const auto d = dt.is_string() ? parse_dtype(dt.get<std::string>()) : std::nullopt;
      if (!d) bad_file(path, "tensor '" + name + "': unknown dtype " + dt.dump());
      t.dtype = *d;
      const json& sh = v["shape"];
      if (!sh.is_array()) bad_file(path, "tensor '" + name + "': shape must be an array, found " + sh.dump());
      uint64_t bytes = dtype_size(t.dtype);
      bool overflow = false;
      for (const json& e : sh) {
        const uint64_t dim = offset_value(path, name, e, "shape");
        if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) overflow = true;
        if (dim != 0 && bytes > std::numeric_limits<uint64_t>::max() / dim) overflow = true;
        bytes *= dim;
        t.shape.push_back(static_cast<int64_t>(dim));
      }
      if (overflow) bad_file(path, "tensor '" + name + "': shape " + sh.dump() + " overflows");
      const json& off = v["data_offsets"];
      if (!off.is_array() || off.size() != 2)
        bad_file(path, "tensor '" + name + "': data_offsets must be [BEGIN, END], found " + off.dump());
      const uint64_t b = offset_value(path, name, off[0], "data_offsets");
      const uint64_t e = offset_value(path, name, off[1], "data_offsets");
      if (e < b) bad_file(path, "tensor '" + name + "': data_offsets " + off.dump() + " end before they begin");
      if (e > buffer)
        bad_file(path, "tensor '" + name + "': data_offsets " + off.dump() + " run past the end of the " +
                           std::to_string(buffer) + "-byte data buffer (truncated file?)");
      if (e - b != bytes)
        bad_file(path, "tensor '" + name + "': " + std::string(dtype_name(t.dtype)) + " " + shape_string(t.shape) +
                           " needs " + std::to_string(bytes) + " bytes but data_offsets " + off.dump() + " hold " +
                           std::to_string(e - b));
      t.data = data + b;
      t.nbytes = static_cast<size_t>(bytes);
      spans.push_back({b, e, tensors_.size()});
      tensors_.push_back(std::move(t));
    }
    // The tensors must tile the buffer: sorted by offset, each begins where the previous ends.
    std::sort(spans.begin(), spans.end(), [&](const Span& a, const Span& b) {
      if (a.begin != b.begin) return a.begin < b.begin;
      if (a.end != b.end) return a.end < b.end;
      return tensors_[a.idx].name < tensors_[b.idx].name;
    });
    uint64_t pos = 0;
    std::string prev;
    for (const Span& s : spans) {
      const std::string& name = tensors_[s.idx].name;
      if (s.begin < pos)
        bad_file(path, "tensor '" + name + "' overlaps tensor '" + prev + "' (bytes " + std::to_string(s.begin) +
                           ".." + std::to_string(pos) + " of the data buffer)");
      if (s.begin > pos)
        bad_file(path, "bytes " + std::to_string(pos) + ".." + std::to_string(s.begin) +
                           " of the data buffer belong to no tensor (before '" + name + "'; holes are not allowed)");
      pos = s.end;
      prev = name;
    }
    if (pos != buffer)
      bad_file(path, "bytes " + std::to_string(pos) + ".." + std::to_string(buffer) +
                         " of the data buffer belong to no tensor (after the last one; holes are not allowed)");
    std::vector<SafetensorsTensor> ordered;
    ordered.reserve(spans.size());
    for (const Span& s : spans) ordered.push_back(std::move(tensors_[s.idx]));
    tensors_ = std::move(ordered);
    for (size_t i = 0; i < tensors_.size(); ++i) index_.emplace(tensors_[i].name, i);
  } catch (...) {
    unmap();
    throw;
  }
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept
    : path_(std::move(o.path_)),
      base_(std::exchange(o.base_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      tensors_(std::move(o.tensors_)),
      index_(std::move(o.index_)),
      metadata_(std::move(o.metadata_)) {}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& o) noexcept {
  if (this != &o) {
    unmap();
    path_ = std::move(o.path_);
    base_ = std::exchange(o.base_, nullptr);
    size_ = std::exchange(o.size_, 0);
    tensors_ = std::move(o.tensors_);
    index_ = std::move(o.index_);
    metadata_ = std::move(o.metadata_);
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() { unmap(); }

void SafetensorsFile::unmap() {
  if (base_) ::munmap(const_cast<uint8_t*>(base_), size_);
  base_ = nullptr;
  size_ = 0;
}

Sha256Digest SafetensorsFile::sha256() const {
  constexpr size_t kWindow = size_t{64} << 20;
  Sha256 h;
  for (size_t at = 0; at < size_; at += kWindow) {
    const size_t n = std::min(kWindow, size_ - at);
    h.update(base_ + at, n);
    release(base_ + at, n);
  }
  return h.finish();
}

void SafetensorsFile::release(const uint8_t* data, size_t n) const {
  static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t from = (reinterpret_cast<uintptr_t>(data) + page - 1) / page * page;
  const uintptr_t to = (reinterpret_cast<uintptr_t>(data) + n) / page * page;
  if (to > from) ::madvise(reinterpret_cast<void*>(from), to - from, MADV_DONTNEED);  // (advice: failure is harmless)
}

const SafetensorsTensor* SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

void SafetensorsFile::read_f32(const SafetensorsTensor& t, float* out, size_t n) const {
  const size_t count = static_cast<size_t>(t.numel());
  if (n != count)
    bad_file(path_, "tensor '" + t.name + "' has " + std::to_string(count) + " elements " + shape_string(t.shape) +
                        ", expected " + std::to_string(n));
  switch (t.dtype) {
    case Dtype::F32:
      std::memcpy(out, t.data, t.nbytes);
      return;
    case Dtype::BF16:
    case Dtype::F16: {
      const bool bf = t.dtype == Dtype::BF16;
      const int64_t n64 = static_cast<int64_t>(count);
      // (Threads for a large tensor: a checkpoint conversion widens gigabytes of them.)
#pragma omp parallel for schedule(static) if (n64 > (int64_t{1} << 20))
      for (int64_t i = 0; i < n64; ++i) {
        const uint16_t bits = static_cast<uint16_t>(t.data[2 * i] | (t.data[2 * i + 1] << 8));
        out[i] = bf ? bf16_to_f32(bits) : f16_to_f32(bits);
      }
      return;
    }
    default:
      bad_file(path_, "tensor '" + t.name + "' has dtype " + std::string(dtype_name(t.dtype)) +
                          "; expected a floating-point tensor (F32, BF16 or F16)");
  }
}

std::vector<float> SafetensorsFile::read_f32(const SafetensorsTensor& t) const {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  read_f32(t, v.data(), v.size());
  return v;
}

}  // namespace laoyao
