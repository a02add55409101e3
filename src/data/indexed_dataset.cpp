// Reader of Megatron's .bin/.idx (megatron/core/datasets/indexed_dataset.py: _IndexReader and
// the mmap'd .bin reader), plus the DType table.
#include "data/indexed_dataset.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>

#include "core/error.hpp"

namespace laoyao::data {

// The format is little-endian and so are the hosts laoyao runs on (x86-64, aarch64); reading
// with memcpy is then exact.
static_assert(std::endian::native == std::endian::little, "laoyao assumes a little-endian host");

size_t dtype_size(TokenDType dtype) {
  switch (dtype) {
    case TokenDType::kUInt8:
    case TokenDType::kInt8: return 1;
    case TokenDType::kInt16:
    case TokenDType::kUInt16: return 2;
    case TokenDType::kInt32:
    case TokenDType::kFloat32: return 4;
    case TokenDType::kInt64:
    case TokenDType::kFloat64: return 8;
  }
  return 0;
}

const char* dtype_name(TokenDType dtype) {
  switch (dtype) {
    case TokenDType::kUInt8: return "uint8";
    case TokenDType::kInt8: return "int8";
    case TokenDType::kInt16: return "int16";
    case TokenDType::kInt32: return "int32";
    case TokenDType::kInt64: return "int64";
    case TokenDType::kFloat64: return "float64";
    case TokenDType::kFloat32: return "float32";
    case TokenDType::kUInt16: return "uint16";
  }
  return "?";
}

bool is_valid_dtype_code(uint8_t code) { return code >= 1 && code <= 8; }

TokenDType optimal_dtype(int64_t vocab_size) {
  return vocab_size < 65500 ? TokenDType::kUInt16 : TokenDType::kInt32;
}

bool dtype_holds(TokenDType dtype, int64_t v) {
  switch (dtype) {
    case TokenDType::kUInt8: return v >= 0 && v <= 255;
    case TokenDType::kInt8: return v >= -128 && v <= 127;
    case TokenDType::kInt16: return v >= -32768 && v <= 32767;
    case TokenDType::kUInt16: return v >= 0 && v <= 65535;
    case TokenDType::kInt32:
      return v >= std::numeric_limits<int32_t>::min() && v <= std::numeric_limits<int32_t>::max();
    case TokenDType::kInt64: return true;
    case TokenDType::kFloat32: return static_cast<int64_t>(static_cast<float>(v)) == v;
    case TokenDType::kFloat64: return static_cast<int64_t>(static_cast<double>(v)) == v;
  }
  return false;
}

std::string idx_path(const std::string& prefix) { return prefix + ".idx"; }
std::string bin_path(const std::string& prefix) { return prefix + ".bin"; }

namespace {

template <typename T>
T load(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Maps `path` read-only; an empty file gives an empty mapping.
void* map_file(const std::string& path, size_t& size, const char* what) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    throw UsageError(std::string("cannot open indexed dataset ") + what + " '" + path +
                     "': " + std::strerror(errno));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    throw UsageError("cannot stat '" + path + "': " + std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw UsageError("indexed dataset " + std::string(what) + " '" + path + "' is not a regular file");
  }
  size = static_cast<size_t>(st.st_size);
  void* addr = nullptr;
  if (size > 0) {
    addr = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    if (addr == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      throw UsageError("cannot memory-map '" + path + "': " + std::strerror(e));
    }
  }
  ::close(fd);
  return addr;
}

void unmap(void* addr, size_t size) {
  if (addr && size) ::munmap(addr, size);
}

// a*b + c without overflow, or false.
bool mul_add(uint64_t a, uint64_t b, uint64_t c, uint64_t& out) {
  unsigned __int128 r = static_cast<unsigned __int128>(a) * b + c;
  if (r > std::numeric_limits<uint64_t>::max()) return false;
  out = static_cast<uint64_t>(r);
  return true;
}

// A token id stored as a float: its integer value, or nullopt when it has none in int64 (NaN, a
// fraction, out of range), where a cast would be undefined.
template <class F>
std::optional<int64_t> float_token(F v) {
  constexpr F kLimit = static_cast<F>(9223372036854775808.0);  // 2^63
  if (!(v >= -kLimit && v < kLimit) || std::trunc(v) != v) return std::nullopt;
  return static_cast<int64_t>(v);
}

// Appends n ids of `dtype` from p; returns the index of the first float that is no token id, or -1.
int64_t append_converted(TokenDType dtype, const unsigned char* p, int64_t n,
                         std::vector<int64_t>& out) {
  size_t base = out.size();
  out.resize(base + static_cast<size_t>(n));
  int64_t* dst = out.data() + base;
  switch (dtype) {
    case TokenDType::kUInt8:
      for (int64_t i = 0; i < n; ++i) dst[i] = p[i];
      break;
    case TokenDType::kInt8:
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<int8_t>(p[i]);
      break;
    case TokenDType::kInt16:
      for (int64_t i = 0; i < n; ++i) dst[i] = load<int16_t>(p + 2 * i);
      break;
    case TokenDType::kUInt16:
      for (int64_t i = 0; i < n; ++i) dst[i] = load<uint16_t>(p + 2 * i);
      break;
    case TokenDType::kInt32:
      for (int64_t i = 0; i < n; ++i) dst[i] = load<int32_t>(p + 4 * i);
      break;
    case TokenDType::kInt64:
      std::memcpy(dst, p, static_cast<size_t>(n) * 8);
      break;
    case TokenDType::kFloat32:
      for (int64_t i = 0; i < n; ++i) {
        const auto v = float_token(load<float>(p + 4 * i));
        if (!v) return i;
        dst[i] = *v;
      }
      break;
    case TokenDType::kFloat64:
      for (int64_t i = 0; i < n; ++i) {
        const auto v = float_token(load<double>(p + 8 * i));
        if (!v) return i;
        dst[i] = *v;
      }
      break;
  }
  return -1;
}

}  // namespace

IndexedDataset::IndexedDataset(const std::string& path_prefix, const IndexedDatasetOptions& options)
    : prefix_(path_prefix) {
  const std::string ipath = idx_path(prefix_);
  try {
    idx_map_.addr = map_file(ipath, idx_map_.size, "index");
    bin_map_.addr = map_file(bin_path(prefix_), bin_map_.size, "data file");
    validate(options);
  } catch (...) {
    unmap(idx_map_.addr, idx_map_.size);
    unmap(bin_map_.addr, bin_map_.size);
    throw;
  }
}

IndexedDataset::~IndexedDataset() {
  unmap(idx_map_.addr, idx_map_.size);
  unmap(bin_map_.addr, bin_map_.size);
}

void IndexedDataset::validate(const IndexedDatasetOptions& options) {
  IndexedDataset* self = this;
  const std::string ipath = idx_path(prefix_);
  const std::string bpath = bin_path(prefix_);
  auto bad = [&](const std::string& what) {
    return UsageError("corrupt indexed dataset index '" + ipath + "': " + what);
  };
  const auto* idx = static_cast<const unsigned char*>(idx_map_.addr);
  const size_t isize = idx_map_.size;
  if (isize < kIndexHeaderSize) {
    throw bad("file is " + std::to_string(isize) + " bytes, shorter than the " +
              std::to_string(kIndexHeaderSize) + "-byte header");
  }
  if (std::memcmp(idx, kIndexMagic, sizeof(kIndexMagic)) != 0) {
    throw bad("bad magic header (expected \"MMIDIDX\\x00\\x00\"; not a Megatron .idx file)");
  }
  const uint64_t version = load<uint64_t>(idx + 9);
  if (version != kIndexVersion) {
    throw bad("unsupported version " + std::to_string(version) + " (only version 1 exists)");
  }
  const uint8_t code = idx[17];
  if (!is_valid_dtype_code(code)) {
    throw bad("unknown dtype code " + std::to_string(code) +
              " (accepted: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, "
              "8 uint16)");
  }
  self->dtype_ = static_cast<TokenDType>(code);
  const uint64_t n = load<uint64_t>(idx + 18);
  const uint64_t d = load<uint64_t>(idx + 26);
  uint64_t arrays = 0, expected = 0;
  if (!mul_add(n, 12, kIndexHeaderSize, arrays) || !mul_add(d, 8, arrays, expected)) {
    throw bad("sequence count " + std::to_string(n) + " / document count " + std::to_string(d) +
              " are impossibly large");
  }
  const bool with_modes = isize == expected + n && n > 0;
  if (isize < expected) {
    throw bad("truncated: " + std::to_string(n) + " sequences and " + std::to_string(d) +
              " document indices need " + std::to_string(expected) + " bytes, the file has " +
              std::to_string(isize));
  }
  if (isize != expected && !with_modes) {
    throw bad("size " + std::to_string(isize) + " does not match its header (" +
              std::to_string(expected) + " bytes, or " + std::to_string(expected + n) +
              " with sequence modes)");
  }
  if (d == 0) throw bad("document count is 0 (document_indices always starts with 0)");
  self->num_sequences_ = static_cast<size_t>(n);
  self->num_doc_indices_ = static_cast<size_t>(d);
  self->lengths_ = idx + kIndexHeaderSize;
  self->pointers_ = self->lengths_ + 4 * n;
  self->doc_indices_ = self->pointers_ + 8 * n;
  self->modes_ = with_modes ? self->doc_indices_ + 8 * d : nullptr;
  self->bin_ = static_cast<const unsigned char*>(bin_map_.addr);

  const uint64_t item = dtype_size(dtype_);
  const uint64_t bsize = bin_map_.size;
  // Megatron's _IndexWriter lays the sequences back to back from byte 0 (pointer[i] = the bytes
  // of all sequences before i) and its reader trusts the pointers blindly; without a checksum,
  // holding the index to that layout is what catches a wrong dtype byte or a mismatched .bin.
  uint64_t total_tokens = 0;
  for (uint64_t i = 0; i < n; ++i) {
    total_tokens += static_cast<uint64_t>(std::max(0, load<int32_t>(lengths_ + 4 * i)));  // < 0 is refused below
  }
  uint64_t next = 0;  // where sequence i must start: the end of sequence i-1
  for (uint64_t i = 0; i < n; ++i) {
    const int32_t len = load<int32_t>(lengths_ + 4 * i);
    const int64_t ptr = load<int64_t>(pointers_ + 8 * i);
    if (len < 0) throw bad("sequence " + std::to_string(i) + " has negative length " + std::to_string(len));
    if (ptr < 0) throw bad("sequence " + std::to_string(i) + " has negative pointer " + std::to_string(ptr));
    const uint64_t end = static_cast<uint64_t>(ptr) + static_cast<uint64_t>(len) * item;
    if (end > bsize) {
      throw UsageError("indexed dataset '" + prefix_ + "': sequence " + std::to_string(i) +
                       " (byte offset " + std::to_string(ptr) + ", " + std::to_string(len) +
                       " tokens of " + dtype_name(dtype_) + ") ends at byte " + std::to_string(end) +
                       " past the end of '" + bpath + "' (" + std::to_string(bsize) +
                       " bytes): the .bin is truncated or does not belong to this .idx");
    }
    if (static_cast<uint64_t>(ptr) % item != 0) {
      throw bad("sequence " + std::to_string(i) + " has pointer " + std::to_string(ptr) +
                ", not a multiple of the " + std::to_string(item) + "-byte size of its dtype " +
                dtype_name(dtype_));
    }
    if (static_cast<uint64_t>(ptr) != next) {
      throw bad(misplaced_sequence(i, static_cast<uint64_t>(ptr), next, total_tokens));
    }
    next = end;
  }
  if (next != bsize) throw UsageError(bin_size_mismatch(next / item, bsize));
  int64_t prev = 0;
  for (uint64_t i = 0; i < d; ++i) {
    const int64_t v = load<int64_t>(doc_indices_ + 8 * i);
    if (v < 0 || static_cast<uint64_t>(v) > n) {
      throw bad("document index " + std::to_string(i) + " is " + std::to_string(v) +
                ", outside [0, " + std::to_string(n) + "] (the sequence count)");
    }
    if (i == 0 && v != 0) throw bad("document_indices must start with 0, found " + std::to_string(v));
    if (v < prev) {
      throw bad("document_indices decrease at entry " + std::to_string(i) + " (" +
                std::to_string(prev) + " then " + std::to_string(v) + ")");
    }
    prev = v;
  }
  if (static_cast<uint64_t>(prev) != n) {
    throw bad("document_indices must end with the sequence count " + std::to_string(n) +
              ", found " + std::to_string(prev));
  }
  if (options.check_vocab_size > 0) check_vocab(options.check_vocab_size);
}

// The bytes per token that `bytes` over `tokens` suggests, when it is a dtype size other than
// this index's, else 0: the likely cause of a layout that does not add up.
static uint64_t implied_item_size(uint64_t bytes, uint64_t tokens, uint64_t item) {
  if (tokens == 0 || bytes % tokens != 0) return 0;
  const uint64_t k = bytes / tokens;
  return (k == 1 || k == 2 || k == 4 || k == 8) && k != item ? k : 0;
}

std::string IndexedDataset::dtype_hint(uint64_t implied) const {
  if (implied == 0) return "";
  return "; that is " + std::to_string(implied) + " bytes per token, so the .idx's dtype code " +
         std::to_string(static_cast<int>(dtype_)) + " (" + dtype_name(dtype_) + ", " +
         std::to_string(dtype_size(dtype_)) + " byte" + (dtype_size(dtype_) == 1 ? "" : "s") +
         ") probably does not match the dtype the .bin was written with";
}

std::string IndexedDataset::misplaced_sequence(uint64_t seq, uint64_t ptr, uint64_t expected,
                                               uint64_t total_tokens) const {
  const uint64_t item = dtype_size(dtype_);
  std::string msg = "sequence " + std::to_string(seq) + " starts at byte " + std::to_string(ptr) + " of the .bin";
  if (seq == 0) return msg + ", not 0 (Megatron's writer starts the first sequence at byte 0)";
  const uint64_t tokens = expected / item;
  // Blame the dtype only when another item size explains this pointer and the .bin's size both.
  uint64_t implied = implied_item_size(ptr, tokens, item);
  if (implied && bin_map_.size != total_tokens * implied) implied = 0;
  return msg + ", but the " + std::to_string(tokens) + " tokens of " + dtype_name(dtype_) + " before it end at byte " +
         std::to_string(expected) +
         " (Megatron's writer lays sequences back to back: pointer[i+1] = pointer[i] + length[i] * itemsize)" +
         dtype_hint(implied);
}

std::string IndexedDataset::bin_size_mismatch(uint64_t tokens, uint64_t bsize) const {
  const uint64_t item = dtype_size(dtype_);
  std::string msg = "indexed dataset '" + bin_path(prefix_) + "' is " + std::to_string(bsize) + " bytes, but '" +
                    idx_path(prefix_) + "' describes " + std::to_string(tokens) + " tokens of " + dtype_name(dtype_) +
                    " = " + std::to_string(tokens * item) + " bytes";
  const uint64_t implied = implied_item_size(bsize, tokens, item);
  return msg + (implied ? dtype_hint(implied) : "; the .bin does not belong to this .idx or is damaged");
}

void IndexedDataset::check_vocab(int64_t vocab_size) const {
  std::vector<int64_t> buf;
  for (size_t s = 0; s < num_sequences_; ++s) {
    buf.clear();
    read_tokens(static_cast<int64_t>(s), 0, sequence_length(static_cast<int64_t>(s)), buf);
    for (size_t j = 0; j < buf.size(); ++j) {
      if (buf[j] < 0 || buf[j] >= vocab_size) {
        throw UsageError("indexed dataset '" + bin_path(prefix_) + "': token id " +
                         std::to_string(buf[j]) + " at sequence " + std::to_string(s) +
                         ", position " + std::to_string(j) + " is outside the vocabulary [0, " +
                         std::to_string(vocab_size) + ")");
      }
    }
  }
}

int32_t IndexedDataset::sequence_length(int64_t seq) const {
  if (seq < 0 || static_cast<size_t>(seq) >= num_sequences_) {
    throw Error("indexed dataset '" + prefix_ + "': sequence " + std::to_string(seq) +
                " out of range [0, " + std::to_string(num_sequences_) + ")");
  }
  return load<int32_t>(lengths_ + 4 * static_cast<size_t>(seq));
}

int64_t IndexedDataset::sequence_pointer(int64_t seq) const {
  sequence_length(seq);  // range check
  return load<int64_t>(pointers_ + 8 * static_cast<size_t>(seq));
}

int64_t IndexedDataset::document_index(int64_t i) const {
  if (i < 0 || static_cast<size_t>(i) >= num_doc_indices_) {
    throw Error("indexed dataset '" + prefix_ + "': document index entry " + std::to_string(i) +
                " out of range [0, " + std::to_string(num_doc_indices_) + ")");
  }
  return load<int64_t>(doc_indices_ + 8 * static_cast<size_t>(i));
}

int8_t IndexedDataset::sequence_mode(int64_t seq) const {
  sequence_length(seq);
  if (!modes_) throw Error("indexed dataset '" + prefix_ + "' is not multimodal (no sequence modes)");
  return static_cast<int8_t>(modes_[seq]);
}

std::vector<int32_t> IndexedDataset::sequence_lengths() const {
  std::vector<int32_t> v(num_sequences_);
  if (!v.empty()) std::memcpy(v.data(), lengths_, 4 * num_sequences_);
  return v;
}

std::vector<int64_t> IndexedDataset::sequence_pointers() const {
  std::vector<int64_t> v(num_sequences_);
  if (!v.empty()) std::memcpy(v.data(), pointers_, 8 * num_sequences_);
  return v;
}

std::vector<int64_t> IndexedDataset::document_indices() const {
  std::vector<int64_t> v(num_doc_indices_);
  std::memcpy(v.data(), doc_indices_, 8 * num_doc_indices_);
  return v;
}

int64_t IndexedDataset::document_length(int64_t doc) const { return sequence_length(doc); }

void IndexedDataset::read_tokens(int64_t doc, int64_t offset, int64_t length,
                                 std::vector<int64_t>& out) const {
  const int64_t len = sequence_length(doc);
  if (offset < 0 || length < 0 || offset > len || length > len - offset) {
    throw Error("indexed dataset '" + prefix_ + "': tokens [" + std::to_string(offset) + ", " +
                std::to_string(offset + length) + ") are outside sequence " + std::to_string(doc) +
                " of length " + std::to_string(len));
  }
  if (length == 0) return;
  const size_t item = dtype_size(dtype_);
  const int64_t ptr = load<int64_t>(pointers_ + 8 * static_cast<size_t>(doc));
  const size_t before = out.size();
  const int64_t bad = append_converted(dtype_, bin_ + ptr + static_cast<int64_t>(item) * offset, length, out);
  if (bad >= 0) {
    out.resize(before);
    throw UsageError("indexed dataset '" + bin_path(prefix_) + "': token " + std::to_string(offset + bad) +
                     " of sequence " + std::to_string(doc) + " is a " + dtype_name(dtype_) +
                     " with no integer value (NaN, a fraction or out of int64's range): not a token id");
  }
}

std::vector<int64_t> IndexedDataset::sequence(int64_t seq) const {
  std::vector<int64_t> out;
  read_tokens(seq, 0, sequence_length(seq), out);
  return out;
}

}  // namespace laoyao::data
