// Tensors stored as parts in safetensors files: which file holds which boxes of which whole
// (Megatron-Core-named) tensor, and reads of any part of a tensor from the stored parts it meets.
// A laoyao checkpoint's model or optimizer state is one (each rank wrote its parts, train_state.json
// says which), and so is a folder of whole tensors (--pretrained-checkpoint). A reader takes only
// what it asks for: a rank of one parallel layout reads its parts out of the files ranks of another
// wrote, a tensor at a time.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/safetensors.hpp"
#include "model/tensor_box.hpp"

namespace laoyao::train {

// A file's size and SHA-256 as recorded when it was written (train_state.json's "files").
struct FileSum {
  uint64_t bytes = 0;
  std::string sha256;
};

// The UsageError of a checkpoint file that is not as written (`why`: how it differs).
[[noreturn]] void corrupt_file(const std::string& path, const std::string& why);
// A UsageError naming `path` unless its n bytes are the recorded size and SHA-256.
void verify_file_sum(const std::string& path, const uint8_t* data, size_t n, const FileSum& want);
// The same of a mapped file, read a window at a time (SafetensorsFile::sha256).
void verify_file_sum(const SafetensorsFile& f, const FileSum& want);

// "[0:4, 0:16]": a box as the messages print it (start:end per dimension).
std::string box_string(const model::Box& b);
// "decoder.layers.0.mlp.linear_fc1.weight [0:4, 0:16] [8:12, 0:16] of [16, 16]"
std::string part_string(const model::TensorPart& p);

class TensorStore {
 public:
  // `where` opens the messages ("checkpoint '<dir>'", "pretrained checkpoint '<path>'").
  explicit TensorStore(std::string where) : where_(std::move(where)) {}

  struct Stored {
    size_t file = 0;         // add_file's index
    std::string key;         // the entry's name in that file
    model::TensorPart part;  // what of the whole tensor the entry holds (its data: the boxes in order)
  };

  // Takes a mapped file; with `sum`, its bytes are checked against it before the first read from it.
  size_t add_file(SafetensorsFile file, std::optional<FileSum> sum);
  // A stored part: the entry `key` of file `file` holding `part` (UsageError naming the file when
  // the entry is absent, not F32/BF16/F16, of another element count, or the boxes leave the shape).
  void add(size_t file, const std::string& key, model::TensorPart part);

  const std::map<std::string, std::vector<Stored>>& tensors() const { return tensors_; }
  const std::vector<Stored>* find(const std::string& name) const;
  const SafetensorsFile& file(size_t i) const { return files_[i]->file; }
  const SafetensorsTensor& entry(const Stored& s) const;  // the stored entry's header
  size_t num_files() const { return files_.size(); }
  const std::string& where() const { return where_; }
  // "checkpoint '<dir>' has no tensor 'x' (its files: '<path>', ...)"
  [[noreturn]] void no_tensor(const std::string& name) const;
  // The elements of a tensor the stored parts hold together (prod(shape) when they cover it once).
  int64_t stored_elements(const std::string& name) const;

  // Every element of `want` (laid out as its boxes) from the stored parts that meet it. A
  // UsageError naming the tensor, the slice and the files when the parts do not cover it exactly
  // once, or a file fails its checksum.
  void read(const model::TensorPart& want, float* out) const;
  // The stored entry of tensor `name` when one entry holds it whole (its file checked as read()
  // checks it), else null: a reader that wants the stored bytes themselves (a conversion that
  // keeps the dtype) takes them from the mapping. release_tensor gives its pages back after.
  const SafetensorsTensor* whole_entry(const std::string& name) const;
  void release_tensor(const std::string& name) const;

 private:
  struct File {
    SafetensorsFile file;
    std::optional<FileSum> sum;
    bool verified = false;
  };
  void verify(File& f) const;
  std::string where_;
  std::vector<std::unique_ptr<File>> files_;
  std::map<std::string, std::vector<Stored>> tensors_;
};

}  // namespace laoyao::train
