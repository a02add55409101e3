#include "model/tensor_box.hpp"

#include <algorithm>

#include "core/error.hpp"

namespace laoyao::model {

int64_t Box::numel() const {
  int64_t n = 1;
  for (int64_t s : size) n *= s;
  return n;
}

Box whole_box(const std::vector<int64_t>& shape) { return {std::vector<int64_t>(shape.size(), 0), shape}; }

int64_t TensorPart::numel() const {
  int64_t n = 0;
  for (const Box& b : boxes) n += b.numel();
  return n;
}

namespace {

// Appends the boxes of elements [lo, hi) of `box` (row-major within it), from dimension `dim` in:
// the dimensions before it are already fixed to one index each (size 1).
void range_boxes(Box box, size_t dim, int64_t lo, int64_t hi, std::vector<Box>& out) {
  if (lo >= hi) return;
  if (dim == box.size.size()) {  // a scalar, or every dimension fixed
    out.push_back(std::move(box));
    return;
  }
  int64_t inner = 1;  // elements under one index of `dim`
  for (size_t d = dim + 1; d < box.size.size(); ++d) inner *= box.size[d];
  const int64_t first = lo / inner, last = (hi - 1) / inner;  // the indices of `dim` the range meets
  auto row = [&](int64_t i, int64_t a, int64_t b) {  // index i of `dim`, its elements [a, b)
    Box r = box;
    r.start[dim] += i, r.size[dim] = 1;
    range_boxes(std::move(r), dim + 1, a, b, out);
  };
  if (first == last) return row(first, lo - first * inner, hi - first * inner);
  int64_t whole_from = first, whole_to = last + 1;  // the indices whose elements are all in range
  if (lo % inner != 0) row(first, lo % inner, inner), ++whole_from;
  const bool partial_last = hi % inner != 0;
  if (partial_last) --whole_to;
  if (whole_from < whole_to) {
    Box r = box;
    r.start[dim] += whole_from, r.size[dim] = whole_to - whole_from;
    out.push_back(std::move(r));
  }
  if (partial_last) row(last, 0, hi % inner);
}

// Copies the intersection of boxes a and b: from data laid out as a (row-major within a) to data
// laid out as b. Walks the intersection's rows (all dimensions but the last), one contiguous run
// each; run(offset in a's data, destination, count) copies one.
template <class Run>
int64_t copy_box_overlap(const Box& a, const Box& b, float* b_data, Run run_copy) {
  const size_t dims = a.start.size();
  if (dims == 0) {
    run_copy(0, b_data, 1);
    return 1;
  }
  std::vector<int64_t> lo(dims), hi(dims);
  for (size_t d = 0; d < dims; ++d) {
    lo[d] = std::max(a.start[d], b.start[d]);
    hi[d] = std::min(a.start[d] + a.size[d], b.start[d] + b.size[d]);
    if (lo[d] >= hi[d]) return 0;
  }
  // Row-major strides of each box.
  std::vector<int64_t> sa(dims, 1), sb(dims, 1);
  for (size_t d = dims - 1; d > 0; --d) sa[d - 1] = sa[d] * a.size[d], sb[d - 1] = sb[d] * b.size[d];
  const int64_t run = hi[dims - 1] - lo[dims - 1];
  std::vector<int64_t> at = lo;  // the current row's index in the whole tensor
  int64_t copied = 0;
  while (true) {
    int64_t oa = 0, ob = 0;
    for (size_t d = 0; d < dims; ++d) oa += (at[d] - a.start[d]) * sa[d], ob += (at[d] - b.start[d]) * sb[d];
    run_copy(oa, b_data + ob, run);
    copied += run;
    // The next row: the last-but-one dimension first.
    size_t d = dims - 1;
    while (d > 0) {
      --d;
      if (++at[d] < hi[d]) break;
      at[d] = lo[d];
      if (d == 0) return copied;
    }
    if (dims == 1) return copied;
  }
}

// copy_overlap's walk over the two parts' boxes; run(offset in src's data, destination, count).
template <class Run>
int64_t copy_parts_overlap(const TensorPart& src, const TensorPart& dst, float* dst_data, Run run_copy) {
  if (src.name != dst.name || src.shape != dst.shape)
    throw Error("tensor parts of different tensors: " + src.name + " and " + dst.name);
  int64_t copied = 0, src_at = 0;
  for (const Box& a : src.boxes) {
    int64_t dst_at = 0;
    for (const Box& b : dst.boxes) {
      copied += copy_box_overlap(a, b, dst_data + dst_at,
                                 [&](int64_t from, float* to, int64_t n) { run_copy(src_at + from, to, n); });
      dst_at += b.numel();
    }
    src_at += a.numel();
  }
  return copied;
}

}  // namespace

TensorPart sub_part(const TensorPart& part, int64_t lo, int64_t hi) {
  if (lo < 0 || hi < lo || hi > part.numel())
    throw Error("sub_part of " + part.name + ": elements [" + std::to_string(lo) + ", " + std::to_string(hi) +
                ") of " + std::to_string(part.numel()));
  TensorPart out{part.name, part.shape, {}};
  int64_t at = 0;  // the current box's first element in the part's data
  for (const Box& b : part.boxes) {
    const int64_t n = b.numel();
    range_boxes(b, 0, std::max<int64_t>(lo - at, 0), std::min(hi - at, n), out.boxes);
    at += n;
  }
  return out;
}

bool boxes_meet(const Box& a, const Box& b) {
  for (size_t d = 0; d < a.start.size(); ++d)
    if (std::max(a.start[d], b.start[d]) >= std::min(a.start[d] + a.size[d], b.start[d] + b.size[d])) return false;
  return true;
}

int64_t copy_overlap(const TensorPart& src, const float* src_data, const TensorPart& dst, float* dst_data) {
  return copy_parts_overlap(src, dst, dst_data,
                            [&](int64_t from, float* to, int64_t n) { std::copy(src_data + from, src_data + from + n, to); });
}

int64_t copy_overlap(const TensorPart& src, const uint8_t* src_halves, float (*widen)(uint16_t), const TensorPart& dst,
                     float* dst_data) {
  return copy_parts_overlap(src, dst, dst_data, [&](int64_t from, float* to, int64_t n) {
    const uint8_t* p = src_halves + 2 * from;
    for (int64_t i = 0; i < n; ++i) to[i] = widen(static_cast<uint16_t>(p[2 * i] | (p[2 * i + 1] << 8)));
  });
}

}  // namespace laoyao::model
