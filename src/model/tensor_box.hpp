// Parts of a tensor as boxes: what a rank holds of a whole (Megatron-Core-named, full-shape)
// parameter is a list of boxes of it, its data the boxes' elements one box after another, each
// row-major. Any holder's data can then fill any other's where their boxes meet: how a checkpoint
// written by ranks of one parallel layout is read by ranks of another.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace laoyao::model {

struct Box {
  std::vector<int64_t> start, size;  // per dimension of the whole tensor
  int64_t numel() const;
};

// The whole tensor as one box.
Box whole_box(const std::vector<int64_t>& shape);

// The part of a whole tensor a holder has: the tensor's name and shape, and its boxes in data order.
struct TensorPart {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<Box> boxes;
  int64_t numel() const;  // the holder's elements: the boxes' sum
};

// The elements [lo, hi) of a part's data (its boxes' elements one box after another) as a part of
// their own: boxes of the whole tensor, in the same data order. A flat range of a box is a partial
// first row, whole rows, a partial last row, each split the same way a dimension further in.
TensorPart sub_part(const TensorPart& part, int64_t lo, int64_t hi);

// Whether two boxes of one tensor share an element.
bool boxes_meet(const Box& a, const Box& b);

// Copies into dst_data (laid out as dst's boxes) every element of src_data (laid out as src's boxes)
// that lies in both; the two parts must be of the same tensor and shape (Error otherwise). Returns
// the number of elements copied.
int64_t copy_overlap(const TensorPart& src, const float* src_data, const TensorPart& dst, float* dst_data);
// The same from 16-bit floats (little-endian bf16 or f16 bits, as a safetensors file stores them),
// each widened by `widen` as it is copied: a window of a large stored entry reads only what it meets.
int64_t copy_overlap(const TensorPart& src, const uint8_t* src_halves, float (*widen)(uint16_t), const TensorPart& dst,
                     float* dst_data);

}  // namespace laoyao::model
