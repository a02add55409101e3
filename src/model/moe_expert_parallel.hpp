// The routed experts of one MoE layer under expert parallelism (model/gpt_ep.hpp), on CPU ranks:
// Megatron-Core's all-to-all token dispatcher. Each rank routes its own tokens over all E experts;
// the rows for each expert go to the rank that holds it, which runs its El experts on the rows
// from every rank (grouped by expert, sources in rank order), and the outputs go back. The
// backward sends the output gradients the same way and the input gradients back; each rank's
// experts' weight gradients then hold every rank's tokens (averaged over the data-parallel ranks
// by the trainer, as Megatron's expert data-parallel gradient reduction does).
//
// The exchanges are all-reduces of a buffer where each rank fills its own blocks (Gloo has no
// all-to-all here): every rank moves every row, which is right but not fast. CPU ranks check
// the numbers; the GPU version will use NCCL's all-to-all.
#pragma once
#include <cstdint>
#include <vector>

#include "dist/process_group.hpp"
#include "kernels/cpu/moe.hpp"

namespace laoyao::model {

class MoeExpertParallelStage final : public kernels::cpu::MoeExpertsStage {
 public:
  // ep: the expert-parallel group (its rank r holds global experts r*El .. r*El+El-1);
  // num_experts: E, all ranks'; H, F: hidden and expert ffn sizes (F: this rank's share of each
  // expert under tensor parallelism).
  MoeExpertParallelStage(dist::ProcessGroup& ep, int64_t num_experts, int64_t H, int64_t F,
                         kernels::cpu::MoeActivation act);
  // This rank's experts' weights [El][F1][H], [El][H][F] and their gradients (accumulated).
  void set_weights(const float* fc1, const float* fc2, float* dfc1, float* dfc2) {
    local_.set_weights(fc1, fc2, dfc1, dfc2);
  }
  void forward(const float* permuted_x, const int64_t* row_tokens, const int64_t* tokens_per_expert, int64_t N,
               float* expert_out, kernels::cpu::MoeExpertsFp8* fp8) override;
  void backward(const float* dexpert_out, int64_t N, float* dpermuted_x, kernels::cpu::MoeExpertsFp8* fp8) override;

 private:
  // Rows of rank `src`'s tokens for global expert g (after forward's count exchange).
  int64_t count(int64_t src, int64_t g) const { return counts_[static_cast<size_t>(src * E_ + g)]; }
  // Rows rank src sends rank dst (for dst's experts).
  int64_t block_rows(int64_t src, int64_t dst) const;
  // Dispatch: this rank's rows [N, H] (grouped by global expert) to the owners; `local` [R, H]
  // gets the rows for this rank's experts, grouped by local expert, sources in rank order.
  void dispatch(const float* rows, float* local);
  // Combine: the inverse, local [R, H] back to the sources; rows [N, H] in this rank's order.
  void combine(const float* local, float* rows);

  dist::ProcessGroup& ep_;
  int64_t P_, me_, E_, El_, H_;
  kernels::cpu::MoeLocalExpertsStage local_;  // this rank's El experts on the rows sent to them
  std::vector<int64_t> counts_;          // [P][E] every rank's tokens per expert (the forward's)
  std::vector<int64_t> local_tpe_;       // [El] rows for each of this rank's experts
  int64_t N_ = 0, R_ = 0;                // this rank's permuted rows, rows for its experts
  std::vector<float> local_x_, local_y_, exchange_;  // scratch
};

}  // namespace laoyao::model
