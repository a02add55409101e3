// Megatron's indexed dataset: a `.bin` of raw token ids and an `.idx` describing it
// (megatron/core/datasets/indexed_dataset.py; reference/megatron-lm.md §6). Read memory-mapped
// and written byte-identically to Megatron's IndexedDatasetBuilder.
//
// .idx layout (little-endian):
//   "MMIDIDX\0\0" | u64 version=1 | u8 dtype code | u64 N (sequences) | u64 D (document_indices
//   entries) | i32 lengths[N] | i64 pointers[N] | i64 document_indices[D] | [i8 modes[N]]
// .bin: every sequence's ids back to back in the dtype, no header.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "data/low_level_dataset.hpp"

namespace laoyao::data {

// Megatron's DType table (the code is the byte stored in the .idx).
enum class TokenDType : uint8_t {
  kUInt8 = 1,
  kInt8 = 2,
  kInt16 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kFloat64 = 6,
  kFloat32 = 7,
  kUInt16 = 8,
};

inline constexpr TokenDType kAllTokenDTypes[] = {
    TokenDType::kUInt8,   TokenDType::kInt8,    TokenDType::kInt16,  TokenDType::kInt32,
    TokenDType::kInt64,   TokenDType::kFloat64, TokenDType::kFloat32, TokenDType::kUInt16};

size_t dtype_size(TokenDType dtype);        // bytes per item
const char* dtype_name(TokenDType dtype);   // numpy's name: "uint16", "int32", ...
bool is_valid_dtype_code(uint8_t code);
// Megatron's DType.optimal_dtype: uint16 when vocab_size < 65500, else int32.
TokenDType optimal_dtype(int64_t vocab_size);
// Whether `value` is representable in `dtype` (integers exactly; floats: exactly as well).
bool dtype_holds(TokenDType dtype, int64_t value);

inline constexpr char kIndexMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
inline constexpr uint64_t kIndexVersion = 1;
inline constexpr size_t kIndexHeaderSize = 34;  // magic 9 + version 8 + dtype 1 + N 8 + D 8

std::string idx_path(const std::string& prefix);  // prefix + ".idx"
std::string bin_path(const std::string& prefix);  // prefix + ".bin"

struct IndexedDatasetOptions {
  // When > 0, every token id of the .bin is checked to be in [0, check_vocab_size) on open
  // (a full scan of the corpus); a violation is a UsageError naming sequence and position.
  int64_t check_vocab_size = 0;
};

// A read-only, memory-mapped view of `prefix.idx` + `prefix.bin`. Opening validates the whole
// index (magic, version, dtype, sizes, every length/pointer against the .bin's size, the
// pointers laid out back to back from byte 0 as Megatron's writer lays them, the .bin exactly
// as large as the lengths say, the document indices); any inconsistency is a
// laoyao::UsageError naming the file (and the sequence at fault).
//
// For GPTDataset (as in Megatron) a "document" of the LowLevelDataset interface is a *sequence*
// of the indexed dataset: num_documents() = sequence_count() and document_length(i) =
// sequence_lengths()[i]. For document-level data (what preprocess-data writes) both notions are
// the same; the document_indices() boundaries are kept for sentence-level data.
class IndexedDataset final : public LowLevelDataset {
 public:
  explicit IndexedDataset(const std::string& path_prefix, const IndexedDatasetOptions& options = {});
  ~IndexedDataset() override;
  IndexedDataset(const IndexedDataset&) = delete;
  IndexedDataset& operator=(const IndexedDataset&) = delete;

  // LowLevelDataset
  int64_t num_documents() const override { return sequence_count(); }
  int64_t document_length(int64_t doc) const override;
  void read_tokens(int64_t doc, int64_t offset, int64_t length,
                   std::vector<int64_t>& out) const override;
  std::string name() const override { return prefix_; }

  // The index as Megatron exposes it. The .idx arrays start at byte 34, so they are never
  // aligned for their types: they are read element-wise from the mapping (no copy).
  TokenDType dtype() const { return dtype_; }
  int64_t sequence_count() const { return static_cast<int64_t>(num_sequences_); }
  int32_t sequence_length(int64_t seq) const;    // unchecked beyond an assert-like bound check
  int64_t sequence_pointer(int64_t seq) const;   // byte offset in the .bin
  int64_t document_index_count() const { return static_cast<int64_t>(num_doc_indices_); }
  int64_t document_index(int64_t i) const;       // document_indices[i]
  bool multimodal() const { return modes_ != nullptr; }
  int8_t sequence_mode(int64_t seq) const;
  // Copies, for callers that want whole arrays (numpy's views in Megatron).
  std::vector<int32_t> sequence_lengths() const;
  std::vector<int64_t> sequence_pointers() const;
  std::vector<int64_t> document_indices() const;
  // Whole sequence `seq` as int64 ids (Megatron's dataset[seq]).
  std::vector<int64_t> sequence(int64_t seq) const;

 private:
  struct Mapping {
    void* addr = nullptr;
    size_t size = 0;
  };
  void validate(const IndexedDatasetOptions& options);
  void check_vocab(int64_t vocab_size) const;
  // Messages for an index whose layout does not add up (see validate()).
  std::string dtype_hint(uint64_t implied_item_size) const;
  std::string misplaced_sequence(uint64_t seq, uint64_t ptr, uint64_t expected, uint64_t total_tokens) const;
  std::string bin_size_mismatch(uint64_t tokens, uint64_t bin_size) const;

  std::string prefix_;
  Mapping idx_map_, bin_map_;
  TokenDType dtype_ = TokenDType::kUInt16;
  size_t num_sequences_ = 0, num_doc_indices_ = 0;
  // Start of each .idx array inside idx_map_ (unaligned).
  const unsigned char* lengths_ = nullptr;
  const unsigned char* pointers_ = nullptr;
  const unsigned char* doc_indices_ = nullptr;
  const unsigned char* modes_ = nullptr;
  const unsigned char* bin_ = nullptr;
};

// Writes `prefix.bin` and `prefix.idx` as Megatron's IndexedDatasetBuilder does: add_item()
// appends one sequence, end_document() closes a document, finalize() writes the index. The
// .bin is streamed to a temporary file; finalize() fsyncs both and renames them into place
// (.bin first, then .idx), so a reader never sees a half-written dataset. A builder destroyed
// without finalize() removes its temporary files and leaves no output.
class IndexedDatasetBuilder {
 public:
  IndexedDatasetBuilder(std::string path_prefix, TokenDType dtype);
  ~IndexedDatasetBuilder();
  IndexedDatasetBuilder(const IndexedDatasetBuilder&) = delete;
  IndexedDatasetBuilder& operator=(const IndexedDatasetBuilder&) = delete;

  // One sequence. A value the dtype cannot hold is a UsageError (numpy would wrap silently).
  void add_item(std::span<const int64_t> tokens);
  // Megatron's add_document(tokens, lengths): the sequences of one document, then end_document().
  void add_document(std::span<const int64_t> tokens, std::span<const int64_t> lengths);
  void end_document();
  void finalize();
  // Drops everything written so far (also done by the destructor when not finalized).
  void abandon();

  int64_t sequence_count() const { return static_cast<int64_t>(lengths_.size()); }
  uint64_t bytes_written() const { return bin_bytes_; }

 private:
  void write_bin(const void* data, size_t bytes);
  void flush_buffer();

  std::string prefix_, bin_tmp_, idx_tmp_;
  TokenDType dtype_;
  int bin_fd_ = -1;
  bool finished_ = false;
  std::vector<char> buffer_;
  uint64_t bin_bytes_ = 0;
  std::vector<int32_t> lengths_;
  std::vector<int64_t> doc_indices_{0};
};

// The bytes of an .idx for the given contents (exposed for tests and tools).
std::string encode_index(TokenDType dtype, std::span<const int32_t> lengths,
                         std::span<const int64_t> doc_indices);

}  // namespace laoyao::data
