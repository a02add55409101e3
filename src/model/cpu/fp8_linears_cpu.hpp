// The CPU backend's FP8 linear layers (GptConfig::fp8): what Transformer Engine keeps per Linear
// under Megatron's recipes, simulated in fp32 (docs/reference/fp8-facts.md §2-3, §7). Per linear
// layer, keyed by its weight's place in the parameter table: the scaling state of its FP8 tensors
// (the input and the weight in the forward, the output gradient in the backward), the weight's FP8
// values made at its first use after new_weights(), and the scale its input was cast with, which
// the backward casts the same input with again (the FP8 values TE keeps from the forward). Under
// block scaling (docs/reference/fp8-blockwise-facts.md) no state but the weight's copy: the input
// in 1 x 128 blocks along its features for the forward, 128 x 1 along its tokens for the weight
// gradient; the weight in 128 x 128 blocks; the output gradient both ways.
#pragma once
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "core/fp8_scaling.hpp"
#include "dist/process_group.hpp"
#include "kernels/cpu/moe.hpp"
#include "kernels/cpu/ops.hpp"
#include "model/backend.hpp"
#include "model/gpt_config.hpp"

namespace laoyao::model {

class CpuFp8Linears {
 public:
  explicit CpuFp8Linears(const Fp8Spec& spec) : spec_(spec) {}

  // Backend::fp8_layer's decision (whether the layer's linears run in FP8) and pass.
  void set_layer(bool fp8, Fp8Pass pass) { on_ = fp8, pass_ = pass; }
  bool on() const { return on_; }
  // Backend::fp8_new_weights and fp8_pass_done.
  void new_weights();
  void pass_done(Fp8Pass pass);
  // Delayed scaling over several ranks: each pass's amaxes are MAX-reduced over this group before
  // the update, as Megatron reduces them over its amax reduction group (TP x DP x CP: every rank,
  // FP8 having no pipeline or expert parallelism). Null or one rank: none.
  void set_amax_group(dist::ProcessGroup* group) { amax_group_ = group && group->size() > 1 ? group : nullptr; }

  // The FP8 operands of linear `w`'s GEMMs, valid until the next call of the same kind: its input
  // x[rows][cols] cast (in a forward; the scale kept for the backward), the weight values[rows][cols]'s
  // FP8 copy, the backward's input cast again (with the forward's scale; under block scaling along
  // the tokens), and the output gradient dy[rows][cols] cast for the data and weight gradients.
  kernels::cpu::Fp8Operand input(int64_t w, const float* x, int64_t rows, int64_t cols);
  kernels::cpu::Fp8Operand weight(int64_t w, const float* values, int64_t rows, int64_t cols);
  kernels::cpu::Fp8Operand saved_input(int64_t w, const float* x, int64_t rows, int64_t cols);
  kernels::cpu::Fp8GradOperands output_grad(int64_t w, const float* dy, int64_t rows, int64_t cols);

  // Delayed scaling's state of linear w (tests): tensor 0 the input, 1 the weight; the backward's 0
  // the output gradient. Null before the linear's first cast.
  const DelayedScaling* forward_scaling(int64_t w) const;
  const DelayedScaling* backward_scaling(int64_t w) const;

 private:
  struct Linear {
    Linear(DelayedScaling f, DelayedScaling b) : forward(std::move(f)), backward(std::move(b)) {}
    DelayedScaling forward, backward;  // (tensorwise scales keep no state: their histories stay unused)
    float input_scale = 1.0f;          // what this micro-batch's forward cast the input with
    std::vector<float> weight_q;
    float weight_scale_inv = 1.0f;
    bool weight_stale = true;
  };
  Linear& linear(int64_t w);
  // The scale a cast of x (amax `amax`) takes: delayed, state's tensor i; tensorwise, its own.
  float scale_for(DelayedScaling& state, int64_t i, float amax, Fp8Format f) const;
  bool records() const { return pass_ != Fp8Pass::Recompute; }
  bool blockwise() const { return spec_.recipe == Fp8ScalingRecipe::Blockwise; }
  // x[n] * scale cast into buf: the operand.
  static kernels::cpu::Fp8Operand cast(const float* x, int64_t n, float scale, Fp8Format f, std::vector<float>& buf);
  // x[rows][cols] cast in br x bc blocks into buf, dequantized: the operand.
  static kernels::cpu::Fp8Operand cast_blocks(const float* x, int64_t rows, int64_t cols, int64_t br, int64_t bc,
                                              Fp8Format f, std::vector<float>& buf);

  // The pass's amaxes of every linear (forward: input and weight; backward: the output gradient),
  // MAX-reduced over amax_group_.
  void reduce_amaxes(Fp8Pass pass);

  Fp8Spec spec_;
  dist::ProcessGroup* amax_group_ = nullptr;
  std::vector<float> reduced_;  // reduce_amaxes' buffer (kept: no allocation a pass)
  bool on_ = false;
  Fp8Pass pass_ = Fp8Pass::TrainingForward;
  std::map<int64_t, Linear> linears_;
  std::vector<float> input_q_, grad_q_, grad_t_q_;
};

// One MoE layer's experts in FP8 (kernels/cpu/moe.hpp's MoeExpertsFp8) over the linears' state:
// Transformer Engine's GroupedLinear keeps a quantizer per GEMM, so each expert's linear is a linear
// of its own here, keyed by where its weight sits in the table (the experts' [E][out][in] weights
// one after another: expert e's at offset + e * out * in; a shared expert is expert 0 of one).
class CpuFp8Experts final : public kernels::cpu::MoeExpertsFp8 {
 public:
  CpuFp8Experts(CpuFp8Linears& fp8, int64_t fc1, int64_t fc1_numel, int64_t fc2, int64_t fc2_numel)
      : fp8_(fp8), offset_{fc1, fc2}, numel_{fc1_numel, fc2_numel} {}
  kernels::cpu::Fp8Operand input(int linear, int64_t e, const float* x, int64_t rows, int64_t cols) override {
    return fp8_.input(key(linear, e), x, rows, cols);
  }
  kernels::cpu::Fp8Operand weight(int linear, int64_t e, const float* w, int64_t rows, int64_t cols) override {
    return fp8_.weight(key(linear, e), w, rows, cols);
  }
  kernels::cpu::Fp8Operand saved_input(int linear, int64_t e, const float* x, int64_t rows, int64_t cols) override {
    return fp8_.saved_input(key(linear, e), x, rows, cols);
  }
  kernels::cpu::Fp8GradOperands output_grad(int linear, int64_t e, const float* dy, int64_t rows,
                                            int64_t cols) override {
    return fp8_.output_grad(key(linear, e), dy, rows, cols);
  }

 private:
  int64_t key(int linear, int64_t e) const { return offset_[linear] + e * numel_[linear]; }
  CpuFp8Linears& fp8_;
  int64_t offset_[2], numel_[2];
};

}  // namespace laoyao::model
