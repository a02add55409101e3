// The CUDA backend's FP8 linear layers (GptConfig::fp8): Transformer Engine's Linear under
// Megatron's recipes, on the device, as the CPU backend simulates it (model/cpu/fp8_linears_cpu.hpp,
// the reference these are checked against; docs/fp8.md). Per FP8 linear layer, keyed by its
// weight's place in the parameter table:
//   - the scaling state: delayed scaling's scales and amax histories (the forward's two tensors,
//     input and weight, the backward's one, the output gradient), each pass's amaxes recorded by
//     the casts themselves and folded in by one fp8_delayed_update launch per pass for every linear;
//     tensorwise scaling's scales from each cast's own amax;
//   - the weight's FP8 copy and its transpose (Hopper's FP8 GEMMs take TN operands only), made for
//     every FP8 linear at once by new_weights(), before a step's (or an evaluation's) first forward;
//   - the scale the input was cast with, which a recomputed forward and the backward cast the same
//     bf16 input with again (the FP8 values TE keeps from the forward, without keeping them).
// The three GEMMs through cuBLASLt: y = x w^T (E4M3 x E4M3, fast accumulation, the bias in the
// epilogue), dx = dy w (the weight's transposed copy, the gradient's format), dw (+)=
// dy^T x into the fp32 main gradient (both transposed copies). Everything is allocated at
// construction for up to max_rows rows, and nothing waits for the host: a step stays capturable.
//
// Block scaling (Float8BlockScaling) keeps no state but the weights' copies in 128 x 128 tiles with
// their scales; the input and the output gradient cast per GEMM in 1 x 128 blocks (fp8_block_cast.hpp),
// along the tokens for the weight gradient, the GEMMs cuBLASLt's block-scaled ones. Dense linears
// only: the routed experts' grouped GEMMs take per-tensor scales.
//
// An MoE layer's routed experts run as Transformer Engine's GroupedLinear: a quantizer per expert,
// so each expert's linear_fc1 and linear_fc2 is a slot of its own (E consecutive slots a linear),
// its casts per group of rows (fp8_cast.hpp's grouped casts, from the device-side offsets) and its
// GEMMs our FP8 grouped ones (grouped_gemm.hpp: the same three, the backward's with the split
// accumulator). The shared expert's linears are plain FP8 linears.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <vector>

#include "core/fp8_scaling.hpp"
#include "dist/process_group.hpp"
#include "kernels/cuda/device_buffer.hpp"
#include "kernels/cuda/gemm_cublaslt.hpp"
#include "kernels/cuda/grouped_gemm.hpp"
#include "model/backend.hpp"
#include "model/gpt_config.hpp"
#include "model/gpt_layout.hpp"

namespace laoyao::model {

class CudaFp8Linears {
 public:
  using bf16 = __nv_bfloat16;
  // The FP8 linears of `local` (every decoder layer spec.layer_in_fp8 keeps: its qkv or
  // multi-latent projections, linear_proj, linear_fc1, linear_fc2, its experts' and shared
  // expert's; and every MTP layer's with its eh_proj), their weights in `layout`.
  // expert_rows: the most rows an MoE layer's experts take (tokens x top-k; 0 without MoE layers).
  CudaFp8Linears(const GptConfig& local, const GptParameterLayout& layout, int64_t max_rows, int64_t expert_rows,
                 cudaStream_t stream, kernels::cuda::CublasLtGemm* gemm);

  // Backend::fp8_layer's decision (whether the layer's linears run in FP8) and pass.
  void set_layer(bool fp8, Fp8Pass pass) { on_ = fp8, pass_ = pass; }
  // Whether linear w's GEMMs run in FP8 now (the layer is in FP8 and w is one of its linears).
  bool runs(int64_t w) const { return on_ && slots_.count(w) > 0; }
  // Whether the routed experts' linear w (a layer's experts_fc1 or experts_fc2) runs in FP8 now.
  bool runs_experts(int64_t w) const { return on_ && experts_.count(w) > 0; }
  // Backend::fp8_new_weights: every FP8 weight cast (with its transpose) from the bf16 table.
  void new_weights(const bf16* params);
  // Backend::fp8_pass_done: delayed scaling's update after a training forward and a backward, the
  // pass's amaxes first MAX-reduced over the amax group, as Transformer Engine reduces its amax
  // buffer (every rank holds the same linears in the same order: the reduction is positional).
  void pass_done(Fp8Pass pass);
  // Delayed scaling's amax reduction group (Megatron's: the tensor-, data- and context-parallel
  // ranks; null or one rank: none). Its collective runs inside the step: no CUDA graph may hold it.
  void set_amax_group(dist::ProcessGroup* group) { amax_group_ = group && group->size() > 1 ? group : nullptr; }
  bool reduces_amaxes() const { return amax_group_ != nullptr && delayed(); }

  // y[rows, N] = x[rows, K] @ w^T (+ bias) (+ residual [rows, N]), in bf16: with a residual the
  // GEMM adds it (beta 1, C the residual) and rounds once, as the BF16 path's linear_forward does
  // Megatron's bias-dropout-add without dropout.
  void forward(int64_t w, const bf16* x, const bf16* bias, bf16* y, int64_t rows, const bf16* residual = nullptr);
  // dx[rows, K] = dy @ w (dx null: skipped); dw[N, K] += dy^T x (accumulate false: written; dw
  // null: a frozen weight, skipped). x is the bf16 input the forward cast.
  void backward(int64_t w, const bf16* x, const bf16* dy, bf16* dx, float* dw, bool accumulate, int64_t rows);
  // The routed experts' linear w over their rows (groups: group g expert g, its rows from the
  // device-side offsets): y [first + rows, N] = x [first + rows, K] @ W_g^T, and the backward's dx
  // = dy @ W_g (null: skipped) and dw_g (+)= dy_g^T x_g (null: skipped), as forward / backward.
  // The forward's cast of x, transposed, goes to xt [K][expert_ld(rows)] (the caller's, kept for
  // the backward; a pass with no backward to follow writes none), which the weight gradient reads.
  void grouped_forward(int64_t w, const bf16* x, const kernels::cuda::RowGroups& groups, bf16* y, uint8_t* xt);
  void grouped_backward(int64_t w, const uint8_t* xt, const bf16* dy, const kernels::cuda::RowGroups& groups,
                        bf16* dx, float* dw, bool accumulate);
  // The row pitch of the experts' transposed casts over `rows` rows (16-byte multiples: the TMA
  // maps' strides).
  static int64_t expert_ld(int64_t rows) { return (rows + 15) / 16 * 16; }

  size_t device_bytes() const { return state_.bytes + scratch_.bytes; }

  // Delayed scaling's state of linear w, downloaded (tests; synchronises): the forward's scales [2]
  // (input, weight) and history [len][2], or the backward's [1] and [len][1], as DelayedScaling
  // holds them. Expert e of an experts' linear at offset o is w = o + e * (its weight's elements),
  // as the CPU backend keys it.
  struct Scaling {
    std::vector<float> scale, history;
  };
  Scaling download_scaling(int64_t w, bool backward) const;

 private:
  struct Slot {
    int64_t index = 0, N = 0, K = 0;
    uint8_t *wq = nullptr, *wqt = nullptr;  // the weight's FP8 copy [N, K] and its transpose [K, N]
    float *w_inv = nullptr, *wt_inv = nullptr;  // block scaling: their tiles' scale_invs
  };
  // The routed experts' linear: slots index .. index + E - 1, the weights' FP8 copies [E][N][K] and
  // transposes [E][K][N].
  struct Experts {
    int64_t index = 0, E = 0, N = 0, K = 0;
    uint8_t *wq = nullptr, *wqt = nullptr;
  };
  const Slot& slot(int64_t w) const;
  const Experts& experts(int64_t w) const;
  int64_t index_of(int64_t w) const;  // a linear's slot, or an expert's (download_scaling's keys)
  void check_expert_rows(const kernels::cuda::RowGroups& groups) const;
  bool delayed() const { return spec_.recipe == Fp8ScalingRecipe::Delayed; }
  bool blockwise() const { return spec_.recipe == Fp8ScalingRecipe::Blockwise; }
  void blockwise_forward(const Slot& s, const bf16* x, const bf16* bias, bf16* y, int64_t rows, const bf16* residual);
  void blockwise_backward(const Slot& s, const bf16* x, const bf16* dy, bf16* dx, float* dw, bool accumulate,
                          int64_t rows);
  // Current scaling: *scale from x's own amax (amax_ scratch) in the format.
  void current_scale(const bf16* x, int64_t n, Fp8Format f, float* scale);

  Fp8Spec spec_;
  cudaStream_t stream_;
  kernels::cuda::CublasLtGemm* gemm_;
  Fp8Format fwd_format_, grad_format_;
  int64_t n_ = 0, len_ = 1, max_rows_ = 0, max_k_ = 0, max_n_ = 0;
  std::map<int64_t, Slot> slots_;
  std::map<int64_t, Experts> experts_;
  int64_t expert_rows_ = 0, expert_ld_ = 0, max_experts_ = 0;
  bool on_ = false;
  Fp8Pass pass_ = Fp8Pass::TrainingForward;
  dist::ProcessGroup* amax_group_ = nullptr;
  kernels::cuda::DeviceBuffer state_, scratch_;
  // Delayed scaling: the forward's history [len][2n] (tensor 2i linear i's input, 2i + 1 its
  // weight), scales [2n] and formats' maxima [2n]; the backward's [len][n], [n], [n].
  float *fwd_history_ = nullptr, *fwd_scale_ = nullptr, *fwd_max_ = nullptr;
  float *bwd_history_ = nullptr, *bwd_scale_ = nullptr, *bwd_max_ = nullptr;
  // Per linear, at(base, i): the scale its input was last cast with and its inverse; the weight's
  // and the output gradient's scale (tensorwise; delayed reads the histories' scales) and inverses.
  // Each in its own 256 bytes: cuBLASLt refuses an FP8 GEMM whose scale pointers are not aligned
  // (an H100 refused 4-byte-aligned ones, cublasStatus 15).
  static constexpr int64_t kStride = 64;
  static float* at(float* base, int64_t i) { return base + kStride * i; }
  float *input_scale_ = nullptr, *input_inv_ = nullptr, *weight_scale_ = nullptr, *weight_inv_ = nullptr;
  float *grad_scale_ = nullptr, *grad_inv_ = nullptr;
  float* amax_ = nullptr;  // current scaling's amax of the tensor being cast
  // The casts of one GEMM's operands: the input [max_rows, max_k] (the forward's, or the
  // backward's transposed), the output gradient [max_rows, max_n] and its transpose.
  uint8_t *xq_ = nullptr, *dyq_ = nullptr, *dyqt_ = nullptr;
  // Block scaling: their blocks' scale_invs (the input's along its features or along the tokens,
  // the output gradient's both ways).
  float *xq_inv_ = nullptr, *dyq_inv_ = nullptr, *dyqt_inv_ = nullptr;
  // The experts' casts: the input [expert_rows, K] (forward), the output gradient [expert_rows, N]
  // and its transpose [N, expert_ld]; current scaling's per-expert amaxes.
  uint8_t *exq_ = nullptr, *edyq_ = nullptr, *edyqt_ = nullptr;
  float* expert_amax_ = nullptr;
};

}  // namespace laoyao::model
