// Writer of Megatron's .bin/.idx (megatron/core/datasets/indexed_dataset.py:
// IndexedDatasetBuilder and _IndexWriter). The .idx bytes are exactly Megatron's: header, int32
// lengths, int64 pointers (cumulative length * itemsize from 0), int64 document indices.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>

#include "core/error.hpp"
#include "core/file_io.hpp"
#include "data/indexed_dataset.hpp"

namespace laoyao::data {
namespace {

constexpr size_t kBufferBytes = 1 << 20;

template <typename T>
void put(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}

void write_all(int fd, const char* data, size_t n, const std::string& path) {
  while (n > 0) {
    ssize_t w = ::write(fd, data, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw Error("cannot write '" + path + "': " + std::strerror(errno));
    }
    data += w;
    n -= static_cast<size_t>(w);
  }
}

void fsync_dir(const std::string& file) {
  std::filesystem::path p(file);
  std::string dir = p.has_parent_path() ? p.parent_path().string() : ".";
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

std::string unique_suffix() {
  static std::atomic<uint64_t> counter{0};
  return ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
}

}  // namespace

std::string encode_index(TokenDType dtype, std::span<const int32_t> lengths,
                         std::span<const int64_t> doc_indices) {
  std::string out;
  out.reserve(kIndexHeaderSize + 12 * lengths.size() + 8 * doc_indices.size());
  out.append(kIndexMagic, sizeof(kIndexMagic));
  put<uint64_t>(out, kIndexVersion);
  put<uint8_t>(out, static_cast<uint8_t>(dtype));
  put<uint64_t>(out, lengths.size());
  put<uint64_t>(out, doc_indices.size());
  for (int32_t len : lengths) put<int32_t>(out, len);
  const int64_t item = static_cast<int64_t>(dtype_size(dtype));
  int64_t ptr = 0;
  for (int32_t len : lengths) {
    put<int64_t>(out, ptr);
    ptr += static_cast<int64_t>(len) * item;
  }
  for (int64_t d : doc_indices) put<int64_t>(out, d);
  return out;
}

IndexedDatasetBuilder::IndexedDatasetBuilder(std::string path_prefix, TokenDType dtype)
    : prefix_(std::move(path_prefix)), dtype_(dtype) {
  if (!is_valid_dtype_code(static_cast<uint8_t>(dtype))) {
    throw UsageError("indexed dataset builder: invalid dtype code " +
                     std::to_string(static_cast<int>(dtype)));
  }
  std::filesystem::path p(bin_path(prefix_));
  if (p.has_parent_path()) make_dirs(p.parent_path().string());
  const std::string suffix = unique_suffix();
  bin_tmp_ = bin_path(prefix_) + suffix;
  idx_tmp_ = idx_path(prefix_) + suffix;
  bin_fd_ = ::open(bin_tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (bin_fd_ < 0) {
    throw UsageError("cannot create '" + bin_tmp_ + "': " + std::strerror(errno));
  }
  buffer_.reserve(kBufferBytes);
}

IndexedDatasetBuilder::~IndexedDatasetBuilder() {
  if (!finished_) abandon();
}

void IndexedDatasetBuilder::abandon() {
  if (bin_fd_ >= 0) ::close(bin_fd_);
  bin_fd_ = -1;
  ::unlink(bin_tmp_.c_str());
  ::unlink(idx_tmp_.c_str());
  finished_ = true;
}

void IndexedDatasetBuilder::flush_buffer() {
  if (buffer_.empty()) return;
  write_all(bin_fd_, buffer_.data(), buffer_.size(), bin_tmp_);
  buffer_.clear();
}

void IndexedDatasetBuilder::write_bin(const void* data, size_t bytes) {
  if (buffer_.size() + bytes > kBufferBytes) flush_buffer();
  if (bytes >= kBufferBytes) {
    write_all(bin_fd_, static_cast<const char*>(data), bytes, bin_tmp_);
  } else {
    const char* c = static_cast<const char*>(data);
    buffer_.insert(buffer_.end(), c, c + bytes);
  }
  bin_bytes_ += bytes;
}

void IndexedDatasetBuilder::add_item(std::span<const int64_t> tokens) {
  if (finished_) throw Error("indexed dataset builder for '" + prefix_ + "' is already finalized");
  if (tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    throw UsageError("indexed dataset '" + prefix_ + "': a sequence of " +
                     std::to_string(tokens.size()) + " tokens exceeds the int32 length field");
  }
  const size_t item = dtype_size(dtype_);
  std::vector<unsigned char> bytes(tokens.size() * item);
  unsigned char* p = bytes.data();
  for (size_t i = 0; i < tokens.size(); ++i, p += item) {
    const int64_t v = tokens[i];
    if (!dtype_holds(dtype_, v)) {
      throw UsageError("indexed dataset '" + prefix_ + "': token id " + std::to_string(v) +
                       " does not fit the dataset dtype " + dtype_name(dtype_));
    }
    switch (dtype_) {
      case TokenDType::kUInt8: *p = static_cast<uint8_t>(v); break;
      case TokenDType::kInt8: *p = static_cast<unsigned char>(static_cast<int8_t>(v)); break;
      case TokenDType::kInt16: { int16_t x = static_cast<int16_t>(v); std::memcpy(p, &x, 2); break; }
      case TokenDType::kUInt16: { uint16_t x = static_cast<uint16_t>(v); std::memcpy(p, &x, 2); break; }
      case TokenDType::kInt32: { int32_t x = static_cast<int32_t>(v); std::memcpy(p, &x, 4); break; }
      case TokenDType::kInt64: std::memcpy(p, &v, 8); break;
      case TokenDType::kFloat32: { float x = static_cast<float>(v); std::memcpy(p, &x, 4); break; }
      case TokenDType::kFloat64: { double x = static_cast<double>(v); std::memcpy(p, &x, 8); break; }
    }
  }
  write_bin(bytes.data(), bytes.size());
  lengths_.push_back(static_cast<int32_t>(tokens.size()));
}

void IndexedDatasetBuilder::add_document(std::span<const int64_t> tokens,
                                         std::span<const int64_t> lengths) {
  size_t pos = 0;
  for (int64_t len : lengths) {
    if (len < 0 || pos + static_cast<size_t>(len) > tokens.size()) {
      throw Error("indexed dataset builder: document lengths exceed its " +
                  std::to_string(tokens.size()) + " tokens");
    }
    add_item(tokens.subspan(pos, static_cast<size_t>(len)));
    pos += static_cast<size_t>(len);
  }
  end_document();
}

void IndexedDatasetBuilder::end_document() {
  if (finished_) throw Error("indexed dataset builder for '" + prefix_ + "' is already finalized");
  doc_indices_.push_back(static_cast<int64_t>(lengths_.size()));
}

void IndexedDatasetBuilder::finalize() {
  if (finished_) throw Error("indexed dataset builder for '" + prefix_ + "' is already finalized");
  if (doc_indices_.back() != static_cast<int64_t>(lengths_.size())) {
    throw Error("indexed dataset builder for '" + prefix_ +
                "': sequences were added after the last end_document()");
  }
  try {
    flush_buffer();
    if (::fsync(bin_fd_) != 0) throw Error("cannot fsync '" + bin_tmp_ + "': " + std::strerror(errno));
    int fd = bin_fd_;
    bin_fd_ = -1;
    if (::close(fd) != 0) throw Error("cannot close '" + bin_tmp_ + "': " + std::strerror(errno));

    const std::string index = encode_index(dtype_, lengths_, doc_indices_);
    int ifd = ::open(idx_tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (ifd < 0) throw Error("cannot create '" + idx_tmp_ + "': " + std::strerror(errno));
    try {
      write_all(ifd, index.data(), index.size(), idx_tmp_);
    } catch (...) {
      ::close(ifd);
      throw;
    }
    if (::fsync(ifd) != 0 || ::close(ifd) != 0) {
      throw Error("cannot flush '" + idx_tmp_ + "': " + std::strerror(errno));
    }
    // The .bin goes into place first: whoever sees the new .idx also sees its .bin.
    if (::rename(bin_tmp_.c_str(), bin_path(prefix_).c_str()) != 0) {
      throw Error("cannot rename '" + bin_tmp_ + "': " + std::strerror(errno));
    }
    if (::rename(idx_tmp_.c_str(), idx_path(prefix_).c_str()) != 0) {
      throw Error("cannot rename '" + idx_tmp_ + "': " + std::strerror(errno));
    }
    fsync_dir(bin_path(prefix_));
    finished_ = true;
  } catch (...) {
    abandon();
    throw;
  }
}

}  // namespace laoyao::data
