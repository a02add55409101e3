// A TP rank's share of the routed experts' rows (see moe_share_stage.hpp).
#include "model/moe_share_stage.hpp"

#include <algorithm>
#include <string>
#include <utility>

#include "core/error.hpp"

namespace laoyao::model {

MoeShareStage::MoeShareStage(std::unique_ptr<kernels::cpu::MoeExpertsStage> inner, int64_t rank, int64_t ranks,
                             int64_t H, int64_t num_experts)
    : inner_(std::move(inner)), rank_(rank), ranks_(ranks), H_(H), E_(num_experts) {
  if (!inner_ || ranks_ < 1 || rank_ < 0 || rank_ >= ranks_)
    throw Error("MoeShareStage: needs an inner stage and a rank of its " + std::to_string(ranks_) + " shares");
}

void MoeShareStage::forward(const float* permuted_x, const int64_t* row_tokens, const int64_t* tokens_per_expert,
                            int64_t N, float* expert_out, kernels::cpu::MoeExpertsFp8* fp8) {
  if (s_ < ranks_ || s_ % ranks_ != 0)
    throw Error("MoeShareStage: a sequence of " + std::to_string(s_) + " does not split into " +
                std::to_string(ranks_) + " shares");
  const int64_t span = s_ / ranks_;
  rows_.clear();
  row_tokens_.clear();
  share_tpe_.assign(static_cast<size_t>(E_), 0);
  int64_t row = 0;
  for (int64_t e = 0; e < E_; ++e)
    for (int64_t i = 0; i < tokens_per_expert[e]; ++i, ++row) {
      if (row >= N) throw Error("MoeShareStage: the tokens per expert exceed the " + std::to_string(N) + " rows");
      if ((row_tokens[row] % s_) / span != rank_) continue;  // another rank's share
      rows_.push_back(row);
      row_tokens_.push_back(row_tokens[row]);
      ++share_tpe_[static_cast<size_t>(e)];
    }
  if (row != N) throw Error("MoeShareStage: the tokens per expert add up to " + std::to_string(row) + ", not " +
                            std::to_string(N));
  N_ = N;
  const int64_t n = static_cast<int64_t>(rows_.size());
  share_x_.resize(static_cast<size_t>(n * H_));
  share_y_.resize(static_cast<size_t>(n * H_));
  for (int64_t i = 0; i < n; ++i)
    std::copy(permuted_x + rows_[i] * H_, permuted_x + (rows_[i] + 1) * H_, share_x_.begin() + i * H_);
  inner_->forward(share_x_.data(), row_tokens_.data(), share_tpe_.data(), n, share_y_.data(), fp8);
  std::fill(expert_out, expert_out + N * H_, 0.0f);
  for (int64_t i = 0; i < n; ++i)
    std::copy(share_y_.begin() + i * H_, share_y_.begin() + (i + 1) * H_, expert_out + rows_[i] * H_);
}

void MoeShareStage::backward(const float* dexpert_out, int64_t N, float* dpermuted_x,
                             kernels::cpu::MoeExpertsFp8* fp8) {
  if (N != N_) throw Error("MoeShareStage: backward of " + std::to_string(N) + " rows after a forward of " +
                           std::to_string(N_));
  const int64_t n = static_cast<int64_t>(rows_.size());
  for (int64_t i = 0; i < n; ++i)
    std::copy(dexpert_out + rows_[i] * H_, dexpert_out + (rows_[i] + 1) * H_, share_y_.begin() + i * H_);
  inner_->backward(share_y_.data(), n, share_x_.data(), fp8);
  std::fill(dpermuted_x, dpermuted_x + N * H_, 0.0f);
  for (int64_t i = 0; i < n; ++i)
    std::copy(share_x_.begin() + i * H_, share_x_.begin() + (i + 1) * H_, dpermuted_x + rows_[i] * H_);
}

}  // namespace laoyao::model
