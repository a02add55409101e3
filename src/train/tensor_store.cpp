#include "train/tensor_store.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "core/sha256.hpp"
#include "core/text.hpp"

namespace laoyao::train {
namespace {

bool same_boxes(const model::TensorPart& a, const model::TensorPart& b) {
  if (a.boxes.size() != b.boxes.size()) return false;
  for (size_t i = 0; i < a.boxes.size(); ++i)
    if (a.boxes[i].start != b.boxes[i].start || a.boxes[i].size != b.boxes[i].size) return false;
  return true;
}

bool parts_meet(const model::TensorPart& a, const model::TensorPart& b) {
  for (const model::Box& x : a.boxes)
    for (const model::Box& y : b.boxes)
      if (model::boxes_meet(x, y)) return true;
  return false;
}

}  // namespace

void corrupt_file(const std::string& path, const std::string& why) {
  throw UsageError("checkpoint file '" + path + "' is corrupt: " + why +
                   " (it does not match the checksum train_state.json recorded when it was saved)");
}

void verify_file_sum(const std::string& path, const uint8_t* data, size_t n, const FileSum& want) {
  if (n != want.bytes)
    corrupt_file(path, "it is " + std::to_string(n) + " bytes, " + std::to_string(want.bytes) + " were written");
  const std::string got = to_hex(sha256(data, n));
  if (got != want.sha256) corrupt_file(path, "its SHA-256 is " + got + ", " + want.sha256 + " was written");
}

void verify_file_sum(const SafetensorsFile& f, const FileSum& want) {
  if (f.bytes().size() != want.bytes)
    corrupt_file(f.path(), "it is " + std::to_string(f.bytes().size()) + " bytes, " + std::to_string(want.bytes) +
                               " were written");
  const std::string got = to_hex(f.sha256());
  if (got != want.sha256) corrupt_file(f.path(), "its SHA-256 is " + got + ", " + want.sha256 + " was written");
}

std::string box_string(const model::Box& b) {
  std::string s = "[";
  for (size_t d = 0; d < b.start.size(); ++d) {
    if (d) s += ", ";
    s += std::to_string(b.start[d]);
    s += ':';
    s += std::to_string(b.start[d] + b.size[d]);
  }
  s += ']';
  return s;
}

std::string part_string(const model::TensorPart& p) {
  std::string s = p.name;
  for (const model::Box& b : p.boxes) {
    s += ' ';
    s += box_string(b);
  }
  s += " of ";
  s += shape_string(p.shape);
  return s;
}

size_t TensorStore::add_file(SafetensorsFile file, std::optional<FileSum> sum) {
  files_.push_back(std::make_unique<File>(File{std::move(file), std::move(sum)}));
  return files_.size() - 1;
}

void TensorStore::add(size_t file, const std::string& key, model::TensorPart part) {
  const SafetensorsFile& f = files_.at(file)->file;
  auto bad = [&](const std::string& why) { throw UsageError(where_ + ": file '" + f.path() + "': " + why); };
  const SafetensorsTensor* t = f.find(key);
  if (!t) bad("it has no tensor '" + key + "' (train_state.json lists it)");
  if (t->dtype != Dtype::F32 && t->dtype != Dtype::BF16 && t->dtype != Dtype::F16)
    bad("tensor '" + key + "' has dtype " + std::string(dtype_name(t->dtype)) + " (expected F32, BF16 or F16)");
  for (const model::Box& b : part.boxes) {
    bool inside = b.start.size() == part.shape.size() && b.size.size() == part.shape.size();
    for (size_t d = 0; inside && d < b.start.size(); ++d)
      inside = b.start[d] >= 0 && b.size[d] > 0 && b.start[d] + b.size[d] <= part.shape[d];
    if (!inside) bad("tensor '" + key + "': box " + box_string(b) + " is not inside its shape " + shape_string(part.shape));
  }
  if (t->numel() != part.numel())
    bad("tensor '" + key + "' has " + std::to_string(t->numel()) + " elements, its part " + part_string(part) + " has " +
        std::to_string(part.numel()));
  const std::string name = part.name;
  tensors_[name].push_back({file, key, std::move(part)});
}

const std::vector<TensorStore::Stored>* TensorStore::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

const SafetensorsTensor& TensorStore::entry(const Stored& s) const { return *files_.at(s.file)->file.find(s.key); }

int64_t TensorStore::stored_elements(const std::string& name) const {
  int64_t n = 0;
  if (const auto* parts = find(name))
    for (const Stored& s : *parts) n += s.part.numel();
  return n;
}

void TensorStore::no_tensor(const std::string& name) const {
  std::string files;
  for (size_t i = 0; i < files_.size() && i < 8; ++i) files += (i ? ", '" : "'") + files_[i]->file.path() + "'";
  if (files_.size() > 8) files += ", ... (" + std::to_string(files_.size()) + " files)";
  throw UsageError(where_ + " has no tensor '" + name + "' (its files: " + files + ")");
}

void TensorStore::verify(File& f) const {
  if (f.verified || !f.sum) return;
  verify_file_sum(f.file, *f.sum);
  f.verified = true;
}

const SafetensorsTensor* TensorStore::whole_entry(const std::string& name) const {
  const std::vector<Stored>* parts = find(name);
  if (!parts || parts->size() != 1) return nullptr;
  const Stored& s = parts->front();
  if (!same_boxes(s.part, {name, s.part.shape, {model::whole_box(s.part.shape)}})) return nullptr;
  File& f = *files_[s.file];
  verify(f);
  return f.file.find(s.key);
}

void TensorStore::release_tensor(const std::string& name) const {
  if (const std::vector<Stored>* parts = find(name))
    for (const Stored& s : *parts) {
      const File& f = *files_[s.file];
      const SafetensorsTensor& t = *f.file.find(s.key);
      f.file.release(t.data, t.nbytes);
    }
}

void TensorStore::read(const model::TensorPart& want, float* out) const {
  const std::vector<Stored>* parts = find(want.name);
  if (!parts) no_tensor(want.name);
  if (parts->front().part.shape != want.shape)
    throw UsageError(where_ + ": tensor '" + want.name + "' is " + shape_string(parts->front().part.shape) +
                     ", the model's is " + shape_string(want.shape));
  int64_t copied = 0;
  std::vector<std::string> read_from;
  for (const Stored& s : *parts) {
    if (!parts_meet(s.part, want)) continue;
    File& f = *files_[s.file];
    verify(f);
    const SafetensorsTensor& t = *f.file.find(s.key);
    read_from.push_back("'" + f.file.path() + "' " + part_string(s.part));
    // (Each entry's pages given back once read: the files stay mapped, the resident set small.)
    if (same_boxes(s.part, want)) {  // the stored part is the one wanted: straight in
      f.file.read_f32(t, out, static_cast<size_t>(want.numel()));
      copied += want.numel();
    } else if (t.dtype == Dtype::F32 && reinterpret_cast<uintptr_t>(t.data) % alignof(float) == 0) {
      // What meets the wanted part, from the mapping itself (a window of a large entry reads only it).
      copied += model::copy_overlap(s.part, reinterpret_cast<const float*>(t.data), want, out);
    } else if (t.dtype != Dtype::F32) {  // 16-bit floats widened as they are copied
      copied += model::copy_overlap(s.part, t.data, t.dtype == Dtype::BF16 ? bf16_to_f32 : f16_to_f32, want, out);
    } else {  // fp32 off its alignment in the file: read whole first
      std::vector<float> buf(static_cast<size_t>(t.numel()));
      f.file.read_f32(t, buf.data(), buf.size());
      copied += model::copy_overlap(s.part, buf.data(), want, out);
    }
    f.file.release(t.data, t.nbytes);
  }
  if (copied == want.numel()) return;
  std::string from = read_from.empty() ? " (no stored part meets it)" : " (read from:";
  for (const std::string& r : read_from) from += "\n  " + r;
  if (!read_from.empty()) from += ")";
  throw UsageError(where_ + ": its stored parts of " + want.name + " hold " + std::to_string(copied) +
                   " elements of the " + std::to_string(want.numel()) + " of " + part_string(want) +
                   (copied < want.numel() ? " (a part is missing)" : " (stored parts overlap)") + from);
}

}  // namespace laoyao::train
