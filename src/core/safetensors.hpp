// The safetensors file format (Hugging Face), read and written exactly per its spec:
//   8 bytes   N, little-endian u64: the header's length
//   N bytes   UTF-8 JSON object {"__metadata__": {str: str} (optional),
//                                "<name>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [BEGIN, END]}, ...}
//             with offsets relative to the byte buffer; padded with spaces to a multiple of 8
//   the rest  the byte buffer: every tensor little-endian, row-major, packed; the tensors cover it
//             exactly (no holes, no overlaps: the spec forbids polyglot files)
//
// The writer's output is byte-identical to the reference writer's (huggingface/safetensors
// `serialize`, which `safetensors.torch.save_file` calls): tensors sorted by dtype, largest
// alignment first (the reference's Dtype enum order, F64/I64/U64 before F32 before BF16/F16 ...),
// then by name (bytewise); compact JSON with "__metadata__" first and each entry's keys in the
// order dtype, shape, data_offsets. The one freedom the reference leaves open, the order of
// __metadata__'s keys (a Rust HashMap), is sorted here so that output is deterministic.
//
// The reader validates everything the reference reader does (header length within the file and at
// most 100 MB, UTF-8 JSON object starting with '{', known dtypes, offsets in bounds, contiguous
// cover of the buffer, dtype size x shape = byte length, overflow) plus what the spec states but
// the reference does not enforce (no duplicate keys, __metadata__ values are strings). Any problem
// is a laoyao::UsageError that names the file and the problem.
#pragma once
#include <bit>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/sha256.hpp"

namespace laoyao {

// "[8, 4]": a shape as the error messages print it.
std::string shape_string(const std::vector<int64_t>& shape);

// In the reference's order (increasing alignment): the writer sorts by it, descending.
enum class Dtype { BOOL, U8, I8, F8_E5M2, F8_E4M3, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64 };

size_t dtype_size(Dtype d);
std::string_view dtype_name(Dtype d);                  // "F32", "BF16", ...
std::optional<Dtype> parse_dtype(std::string_view s);  // nullopt for names we do not know

// Element conversions (bit patterns as stored in the file).
float bf16_to_f32(uint16_t bits);
float f16_to_f32(uint16_t bits);  // IEEE binary16 (subnormals, Inf, NaN)
// Round to nearest even; NaN stays NaN (inline: bulk conversions vectorise).
inline uint16_t f32_to_bf16(float x) {
  const uint32_t b = std::bit_cast<uint32_t>(x);
  if ((b & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((b >> 16) | 0x40);  // quiet NaN
  return static_cast<uint16_t>((b + 0x7fffu + ((b >> 16) & 1)) >> 16);
}

// ---- writing ----

struct TensorWrite {
  std::string name;
  Dtype dtype = Dtype::F32;
  std::vector<int64_t> shape;  // [] is a scalar; a 0 dimension is an empty tensor
  const void* data = nullptr;  // dtype_size * prod(shape) bytes, little-endian, row-major
};

// For tensors[i] without data: writes its bytes [offset, offset + n) into `dst` when the writer
// reaches them, a window of at most kFillWindow bytes (a multiple of 8) at a time: state streamed
// from where it lives, a device, through a small host buffer.
using TensorFill = std::function<void(size_t i, size_t offset, size_t n, void* dst)>;
inline constexpr size_t kFillWindow = size_t{64} << 20;

struct SafetensorsWriteResult {
  uint64_t file_bytes = 0;
  std::string sha256;  // of the whole file, lowercase hex (what `sha256sum` prints); empty unless hashed
};

// The header JSON (with its padding) the writer puts after the length prefix.
std::string safetensors_header(const std::vector<TensorWrite>& tensors,
                               const std::map<std::string, std::string>& metadata);

// Streams the file to "<path>.tmp.<pid>", fsyncs it, renames it over `path` and fsyncs the folder:
// readers see the old file or the new one, never half of one. An empty `metadata` writes no
// "__metadata__" key. Bad input (duplicate names, a null data pointer) is laoyao::Error (a bug in
// the caller); I/O failures are laoyao::Error naming the file. hash: the SHA-256 is computed as the
// bytes go (a checkpoint records it; a conversion that records nothing skips the cost).
SafetensorsWriteResult write_safetensors(const std::string& path, const std::vector<TensorWrite>& tensors,
                                         const std::map<std::string, std::string>& metadata = {},
                                         const TensorFill& fill = {}, bool hash = true);

// ---- reading ----

struct SafetensorsTensor {
  std::string name;
  Dtype dtype = Dtype::F32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // into the mapping (aligned only as the file is)
  size_t nbytes = 0;
  int64_t numel() const;
};

// A memory-mapped, validated safetensors file. Views stay valid while this object lives.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  SafetensorsFile(SafetensorsFile&& o) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& o) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }  // buffer order
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const SafetensorsTensor* find(std::string_view name) const;
  // The whole file as mapped (for checksums).
  std::span<const uint8_t> bytes() const { return {base_, size_}; }
  // The whole file's SHA-256, read a window at a time, each window's pages given back after.
  Sha256Digest sha256() const;
  // Gives back the mapping's pages within [data, data + n) (touched again, they are read again from
  // the file): a large file read a piece at a time then keeps the resident set to a piece.
  void release(const uint8_t* data, size_t n) const;

  // The tensor's values as fp32 (F32 copied bit for bit; BF16 and F16 widened exactly).
  // UsageError naming the file and tensor when its dtype is not F32/BF16/F16 or `n` differs from
  // its element count.
  void read_f32(const SafetensorsTensor& t, float* out, size_t n) const;
  std::vector<float> read_f32(const SafetensorsTensor& t) const;

 private:
  void unmap();
  std::string path_;
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  std::vector<SafetensorsTensor> tensors_;
  std::unordered_map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace laoyao
