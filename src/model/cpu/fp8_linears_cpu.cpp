#include "model/cpu/fp8_linears_cpu.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "core/error.hpp"

namespace laoyao::model {

namespace k = kernels::cpu;

CpuFp8Linears::Linear& CpuFp8Linears::linear(int64_t w) {
  auto it = linears_.find(w);
  if (it != linears_.end()) return it->second;
  const Fp8Format fwd = fp8_format_of(spec_.formats, false), grad = fp8_format_of(spec_.formats, true);
  const int64_t len = spec_.amax_history_len;
  return linears_
      .emplace(w, Linear(DelayedScaling({fwd, fwd}, len, spec_.amax_compute_algo, spec_.margin),
                         DelayedScaling({grad}, len, spec_.amax_compute_algo, spec_.margin)))
      .first->second;
}

void CpuFp8Linears::new_weights() {
  for (auto& [w, l] : linears_) l.weight_stale = true;
}

void CpuFp8Linears::reduce_amaxes(Fp8Pass pass) {
  // Every rank holds the same linears in the same (offset) order: each was made by the same casts
  // (every FP8 layer's linears, every expert's weight, in each forward); the count is checked.
  std::vector<float>& a = reduced_;
  a.clear();
  for (auto& [w, l] : linears_) {
    DelayedScaling& s = pass == Fp8Pass::Backward ? l.backward : l.forward;
    a.insert(a.end(), s.pass_amaxes(), s.pass_amaxes() + s.size());
  }
  float count[2] = {static_cast<float>(a.size()), -static_cast<float>(a.size())};
  amax_group_->all_reduce_max(count, 2);
  if (count[0] != -count[1])
    throw Error("FP8 delayed scaling: the ranks hold different FP8 linears (" + std::to_string(int64_t(count[0])) +
                " and " + std::to_string(int64_t(-count[1])) + " amaxes), their amaxes cannot be reduced");
  amax_group_->all_reduce_max(a.data(), a.size());
  size_t at = 0;
  for (auto& [w, l] : linears_) {
    DelayedScaling& s = pass == Fp8Pass::Backward ? l.backward : l.forward;
    std::copy(a.begin() + static_cast<std::ptrdiff_t>(at), a.begin() + static_cast<std::ptrdiff_t>(at + s.size()),
              s.pass_amaxes());
    at += static_cast<size_t>(s.size());
  }
}

void CpuFp8Linears::pass_done(Fp8Pass pass) {
  if (spec_.recipe != Fp8ScalingRecipe::Delayed) return;
  if (pass != Fp8Pass::TrainingForward && pass != Fp8Pass::Backward) return;
  if (amax_group_) reduce_amaxes(pass);
  for (auto& [w, l] : linears_) {
    if (pass == Fp8Pass::TrainingForward) l.forward.update();
    if (pass == Fp8Pass::Backward) l.backward.update();
  }
}

float CpuFp8Linears::scale_for(DelayedScaling& state, int64_t i, float amax, Fp8Format f) const {
  if (records()) state.record_amax(i, amax);
  return spec_.recipe == Fp8ScalingRecipe::Delayed ? state.scale(i) : current_scaling_scale(amax, f);
}

k::Fp8Operand CpuFp8Linears::cast(const float* x, int64_t n, float scale, Fp8Format f, std::vector<float>& buf) {
  buf.resize(static_cast<size_t>(n));
  fp8_quantize_values(x, n, scale, f, buf.data());
  return {buf.data(), 1.0f / scale};
}

k::Fp8Operand CpuFp8Linears::cast_blocks(const float* x, int64_t rows, int64_t cols, int64_t br, int64_t bc,
                                         Fp8Format f, std::vector<float>& buf) {
  buf.resize(static_cast<size_t>(rows * cols));
  fp8_block_quantize_dequantized(x, rows, cols, br, bc, f, /*pow2=*/true, buf.data());
  return {buf.data(), 1.0f};
}

k::Fp8Operand CpuFp8Linears::input(int64_t w, const float* x, int64_t rows, int64_t cols) {
  Linear& l = linear(w);
  const Fp8Format f = fp8_format_of(spec_.formats, false);
  if (blockwise()) return cast_blocks(x, rows, cols, 1, kFp8Block, f, input_q_);
  const int64_t n = rows * cols;
  // A recomputed forward casts with the scale of the forward it repeats.
  if (records()) l.input_scale = scale_for(l.forward, 0, fp8_amax(x, n), f);
  return cast(x, n, l.input_scale, f, input_q_);
}

k::Fp8Operand CpuFp8Linears::weight(int64_t w, const float* values, int64_t rows, int64_t cols) {
  Linear& l = linear(w);
  if (l.weight_stale) {
    const Fp8Format f = fp8_format_of(spec_.formats, false);
    if (blockwise()) {
      l.weight_scale_inv = cast_blocks(values, rows, cols, kFp8Block, kFp8Block, f, l.weight_q).scale_inv;
    } else {
      const int64_t n = rows * cols;
      const float scale = scale_for(l.forward, 1, fp8_amax(values, n), f);
      l.weight_scale_inv = cast(values, n, scale, f, l.weight_q).scale_inv;
    }
    l.weight_stale = false;
  }
  return {l.weight_q.data(), l.weight_scale_inv};
}

k::Fp8Operand CpuFp8Linears::saved_input(int64_t w, const float* x, int64_t rows, int64_t cols) {
  auto it = linears_.find(w);
  if (it == linears_.end()) throw Error("FP8 linear: a backward without its forward");
  const Fp8Format f = fp8_format_of(spec_.formats, false);
  if (blockwise()) return cast_blocks(x, rows, cols, kFp8Block, 1, f, input_q_);
  return cast(x, rows * cols, it->second.input_scale, f, input_q_);
}

k::Fp8GradOperands CpuFp8Linears::output_grad(int64_t w, const float* dy, int64_t rows, int64_t cols) {
  Linear& l = linear(w);
  const Fp8Format f = fp8_format_of(spec_.formats, true);
  if (blockwise())
    return {cast_blocks(dy, rows, cols, 1, kFp8Block, f, grad_q_), cast_blocks(dy, rows, cols, kFp8Block, 1, f, grad_t_q_)};
  const int64_t n = rows * cols;
  const k::Fp8Operand q = cast(dy, n, scale_for(l.backward, 0, fp8_amax(dy, n), f), f, grad_q_);
  return {q, q};
}

const DelayedScaling* CpuFp8Linears::forward_scaling(int64_t w) const {
  auto it = linears_.find(w);
  return it == linears_.end() ? nullptr : &it->second.forward;
}

const DelayedScaling* CpuFp8Linears::backward_scaling(int64_t w) const {
  auto it = linears_.find(w);
  return it == linears_.end() ? nullptr : &it->second.backward;
}

}  // namespace laoyao::model
