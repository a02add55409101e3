// Tensor parts as boxes (model/tensor_box.hpp): copy_overlap (from floats and from bf16 bits)
// against a naive element-by-element copy over the whole tensor, on random shapes and boxes of one
// to three dimensions; and TP boxes (model/gpt_tp.hpp) that tile each whole tensor once over the ranks.
#include "model/tensor_box.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/rng.hpp"
#include "core/safetensors.hpp"
#include "model/gpt_tp.hpp"

using namespace laoyao;
using namespace laoyao::model;

namespace {

// The position of whole-tensor element `idx` (per dimension) in a part's data, or -1.
int64_t position_in(const TensorPart& part, const std::vector<int64_t>& idx) {
  int64_t base = 0;
  for (const Box& b : part.boxes) {
    bool inside = true;
    int64_t off = 0;
    for (size_t d = 0; d < idx.size(); ++d) {
      inside = inside && idx[d] >= b.start[d] && idx[d] < b.start[d] + b.size[d];
      off = off * b.size[d] + (idx[d] - b.start[d]);
    }
    if (inside) return base + off;
    base += b.numel();
  }
  return -1;
}

Box random_box(Rng& rng, const std::vector<int64_t>& shape) {
  Box b;
  for (int64_t n : shape) {
    const int64_t start = static_cast<int64_t>(rng.next_u64() % static_cast<uint64_t>(n));
    const int64_t size = 1 + static_cast<int64_t>(rng.next_u64() % static_cast<uint64_t>(n - start));
    b.start.push_back(start), b.size.push_back(size);
  }
  return b;
}

}  // namespace

TEST(TensorBox, CopyOverlapIsTheNaiveElementwiseCopy) {
  Rng rng(3, "tensor_box");
  for (int trial = 0; trial < 300; ++trial) {
    const size_t dims = 1 + trial % 3;
    std::vector<int64_t> shape;
    for (size_t d = 0; d < dims; ++d) shape.push_back(1 + static_cast<int64_t>(rng.next_u64() % 7));
    TensorPart src{"t", shape, {}}, dst{"t", shape, {}};
    for (int k = 0; k < 1 + trial % 3; ++k) src.boxes.push_back(random_box(rng, shape));
    for (int k = 0; k < 1 + (trial / 3) % 2; ++k) dst.boxes.push_back(random_box(rng, shape));
    std::vector<float> src_data(static_cast<size_t>(src.numel()));
    for (float& v : src_data) v = static_cast<float>(rng.normal());
    std::vector<float> got(static_cast<size_t>(dst.numel()), -7.0f), want = got;
    // Naive: every element of the whole tensor, from the first src box holding it to every dst box
    // holding it (boxes of one part may overlap; the last src box wins in copy_overlap, as here).
    int64_t total = 1;
    for (int64_t n : shape) total *= n;
    for (int64_t flat = 0; flat < total; ++flat) {
      std::vector<int64_t> idx(dims);
      for (size_t d = dims, rest = static_cast<size_t>(flat); d-- > 0;) idx[d] = static_cast<int64_t>(rest % shape[d]), rest /= shape[d];
      int64_t from = -1, base = 0;
      for (const Box& a : src.boxes) {  // the last src box holding it
        const TensorPart one{"t", shape, {a}};
        if (const int64_t p = position_in(one, idx); p >= 0) from = base + p;
        base += a.numel();
      }
      if (from < 0) continue;
      base = 0;
      for (const Box& b : dst.boxes) {
        const TensorPart one{"t", shape, {b}};
        if (const int64_t p = position_in(one, idx); p >= 0) want[static_cast<size_t>(base + p)] = src_data[static_cast<size_t>(from)];
        base += b.numel();
      }
    }
    copy_overlap(src, src_data.data(), dst, got.data());
    ASSERT_EQ(got, want) << "trial " << trial;
    // From bf16 bits (a safetensors entry's bytes), widened as copied: the same as widening every
    // element first and copying the floats.
    std::vector<uint8_t> halves;
    std::vector<float> widened;
    for (float v : src_data) {
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      halves.push_back(static_cast<uint8_t>(bits >> 16)), halves.push_back(static_cast<uint8_t>(bits >> 24));
      widened.push_back(bf16_to_f32(static_cast<uint16_t>(bits >> 16)));
    }
    std::vector<float> got16(got.size(), -7.0f), want16 = got16;
    copy_overlap(src, widened.data(), dst, want16.data());
    EXPECT_EQ(copy_overlap(src, halves.data(), bf16_to_f32, dst, got16.data()),
              copy_overlap(src, src_data.data(), dst, got.data()));
    ASSERT_EQ(got16, want16) << "trial " << trial;
  }
  EXPECT_THROW(copy_overlap({"a", {2}, {whole_box({2})}}, nullptr, {"b", {2}, {whole_box({2})}}, nullptr), Error);
}

TEST(TensorBox, TensorParallelBoxesTileTheWholeTensorOnce) {
  const std::vector<int64_t> shape = {8, 6};
  for (const TpSplit split : {TpSplit::Replicated, TpSplit::Rows, TpSplit::SwigluRows, TpSplit::Cols})
    for (const int64_t tp : {int64_t{1}, int64_t{2}}) {
      std::vector<int> covered(48, 0);
      for (int64_t r = 0; r < tp; ++r)
        for (const Box& b : tp_boxes(split, shape, r, tp))
          for (int64_t i = b.start[0]; i < b.start[0] + b.size[0]; ++i)
            for (int64_t j = b.start[1]; j < b.start[1] + b.size[1]; ++j) ++covered[static_cast<size_t>(i * 6 + j)];
      const int want = split == TpSplit::Replicated ? static_cast<int>(tp) : 1;
      for (int c : covered) ASSERT_EQ(c, want) << static_cast<int>(split) << " tp " << tp;
    }
  // SwiGLU: a rank's gate rows, then its up rows.
  const auto b = tp_boxes(TpSplit::SwigluRows, shape, 1, 2);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0].start[0], 2);
  EXPECT_EQ(b[1].start[0], 6);
}

// A flat range of a part's data as boxes: every element of [lo, hi), in order, once. The part's
// data holds each element's own position, so the sub-part's data read through copy_overlap must be
// lo, lo + 1, ..., hi - 1 (the parts' boxes are disjoint here: rows of a tensor, as TP cuts them).
TEST(TensorBox, SubPartIsTheFlatRangeOfThePartsData) {
  Rng rng(5, "sub_part");
  for (int trial = 0; trial < 400; ++trial) {
    const size_t dims = trial % 4;  // scalars too
    std::vector<int64_t> shape;
    for (size_t d = 0; d < dims; ++d) shape.push_back(1 + static_cast<int64_t>(rng.next_u64() % 6));
    TensorPart part{"t", shape, {}};
    if (dims == 0 || trial % 2 == 0) {
      part.boxes.push_back(whole_box(shape));
    } else {  // two disjoint row blocks, the later first
      const int64_t cut = static_cast<int64_t>(rng.next_u64() % static_cast<uint64_t>(shape[0] + 1));
      Box a = whole_box(shape), b = whole_box(shape);
      a.size[0] = cut, b.start[0] = cut, b.size[0] = shape[0] - cut;
      part.boxes = {b, a};
    }
    const int64_t n = part.numel();
    const int64_t lo = static_cast<int64_t>(rng.next_u64() % static_cast<uint64_t>(n + 1));
    const int64_t hi = lo + static_cast<int64_t>(rng.next_u64() % static_cast<uint64_t>(n - lo + 1));
    const TensorPart sub = sub_part(part, lo, hi);
    ASSERT_EQ(sub.numel(), hi - lo) << "trial " << trial;
    for (const Box& b : sub.boxes) ASSERT_GT(b.numel(), 0) << "trial " << trial;
    std::vector<float> data(static_cast<size_t>(n)), got(static_cast<size_t>(hi - lo), -1.0f), want;
    for (int64_t i = 0; i < n; ++i) data[static_cast<size_t>(i)] = static_cast<float>(i);
    for (int64_t i = lo; i < hi; ++i) want.push_back(static_cast<float>(i));
    EXPECT_EQ(copy_overlap(part, data.data(), sub, got.data()), hi - lo) << "trial " << trial;
    ASSERT_EQ(got, want) << "trial " << trial << " [" << lo << ", " << hi << ")";
  }
  // A range of rows is one box; a range that starts and ends inside rows is three.
  const TensorPart m{"m", {4, 5}, {whole_box({4, 5})}};
  EXPECT_EQ(sub_part(m, 5, 15).boxes.size(), 1u);
  EXPECT_EQ(sub_part(m, 3, 17).boxes.size(), 3u);
  EXPECT_THROW(sub_part(m, 3, 21), Error);
  EXPECT_TRUE(boxes_meet(m.boxes[0], sub_part(m, 3, 4).boxes[0]));
  EXPECT_FALSE(boxes_meet(sub_part(m, 0, 5).boxes[0], sub_part(m, 5, 10).boxes[0]));
}
