// The routed experts of one MoE layer under tensor parallelism with whole experts (Megatron-Core's
// --expert-tensor-parallel-size 1, "parallel folding"), on CPU ranks. Megatron's TP ranks each
// route their own share of the sequence (sequence parallelism: positions r*s/TP .. of every
// sequence) and send those rows to the ranks of their expert-parallel group, which here is folded
// across the TP ranks: every rank holds whole experts, num_experts / EP of them.
//
// Every TP rank here routes the whole gathered sequence (the same numbers on each, as for split
// experts), then this stage passes only the rows of the rank's own share to the expert-parallel
// stage, as Megatron's rank would send them; the other shares' rows get zero outputs. The layer's
// output is then this rank's share's rows, whole, and zeros elsewhere: the reduce-scatter that
// follows the MoE layer (the same as with split experts, whose outputs are partial sums) gives
// each rank its share's whole output. The backward mirrors it: only the share's rows' gradients
// go to the experts; the others' input gradients are zero (their owners add theirs).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/cpu/moe.hpp"

namespace laoyao::model {

class MoeShareStage final : public kernels::cpu::MoeExpertsStage {
 public:
  // inner: the stage the share's rows go through (the expert-parallel one, or all the experts here
  // without EP); rank of ranks: this rank's share of each sequence; H: hidden size; num_experts: E
  // (the counts' length).
  MoeShareStage(std::unique_ptr<kernels::cpu::MoeExpertsStage> inner, int64_t rank, int64_t ranks, int64_t H,
                int64_t num_experts);
  // The gathered batch's sequence length (its tokens are [b, s], batch-major): set before a forward.
  void set_sequence_length(int64_t s) { s_ = s; }

  void forward(const float* permuted_x, const int64_t* row_tokens, const int64_t* tokens_per_expert, int64_t N,
               float* expert_out, kernels::cpu::MoeExpertsFp8* fp8) override;
  void backward(const float* dexpert_out, int64_t N, float* dpermuted_x, kernels::cpu::MoeExpertsFp8* fp8) override;

 private:
  std::unique_ptr<kernels::cpu::MoeExpertsStage> inner_;
  int64_t rank_, ranks_, H_, E_, s_ = 0;
  int64_t N_ = 0;                      // the forward's permuted rows
  std::vector<int64_t> rows_;          // the share's permuted rows, in order (still grouped by expert)
  std::vector<int64_t> row_tokens_;    // their tokens
  std::vector<int64_t> share_tpe_;     // [E] the share's rows per expert
  std::vector<float> share_x_, share_y_;  // [rows, H]
};

}  // namespace laoyao::model
