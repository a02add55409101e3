#include "model/moe_expert_parallel.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.hpp"

namespace laoyao::model {

namespace k = laoyao::kernels::cpu;

MoeExpertParallelStage::MoeExpertParallelStage(dist::ProcessGroup& ep, int64_t num_experts, int64_t H, int64_t F,
                                               k::MoeActivation act)
    : ep_(ep),
      P_(ep.size()),
      me_(ep.rank()),
      E_(num_experts),
      El_(P_ >= 1 && E_ % P_ == 0 ? E_ / P_ : 0),
      H_(H),
      local_(El_, H, F, act) {
  if (P_ < 1 || E_ < 1 || E_ % P_ != 0)
    throw Error("expert parallelism: " + std::to_string(E_) + " experts do not split over " + std::to_string(P_) +
                " ranks");
}

int64_t MoeExpertParallelStage::block_rows(int64_t src, int64_t dst) const {
  int64_t n = 0;
  for (int64_t g = dst * El_; g < (dst + 1) * El_; ++g) n += count(src, g);
  return n;
}

void MoeExpertParallelStage::forward(const float* permuted_x, const int64_t* /*row_tokens*/,
                                     const int64_t* tokens_per_expert, int64_t N, float* expert_out,
                                     kernels::cpu::MoeExpertsFp8* fp8) {
  // Every rank's tokens per expert (exact in double: counts are far below 2^53).
  std::vector<double> c(static_cast<size_t>(P_ * E_), 0.0);
  int64_t rows = 0;
  for (int64_t g = 0; g < E_; ++g) c[static_cast<size_t>(me_ * E_ + g)] = static_cast<double>(tokens_per_expert[g]);
  for (int64_t g = 0; g < E_; ++g) rows += tokens_per_expert[g];
  if (rows != N) throw Error("expert parallelism: the tokens per expert add up to " + std::to_string(rows) +
                             ", not the " + std::to_string(N) + " permuted rows");
  ep_.all_reduce_sum(c.data(), c.size());
  counts_.resize(c.size());
  for (size_t i = 0; i < c.size(); ++i) counts_[i] = static_cast<int64_t>(std::llround(c[i]));
  N_ = N;
  local_tpe_.assign(static_cast<size_t>(El_), 0);
  R_ = 0;
  for (int64_t e = 0; e < El_; ++e) {
    for (int64_t s = 0; s < P_; ++s) local_tpe_[static_cast<size_t>(e)] += count(s, me_ * El_ + e);
    R_ += local_tpe_[static_cast<size_t>(e)];
  }
  local_x_.resize(static_cast<size_t>(R_ * H_));
  local_y_.resize(static_cast<size_t>(R_ * H_));
  dispatch(permuted_x, local_x_.data());
  local_.forward(local_x_.data(), nullptr, local_tpe_.data(), R_, local_y_.data(), fp8);
  combine(local_y_.data(), expert_out);
}

void MoeExpertParallelStage::backward(const float* dexpert_out, int64_t N, float* dpermuted_x,
                                      kernels::cpu::MoeExpertsFp8* fp8) {
  if (N != N_) throw Error("expert parallelism: backward of " + std::to_string(N) + " rows after a forward of " +
                           std::to_string(N_));
  dispatch(dexpert_out, local_y_.data());  // the output gradients, to the experts' ranks
  local_.backward(local_y_.data(), R_, local_x_.data(), fp8);
  combine(local_x_.data(), dpermuted_x);
}

// The exchange buffer holds blocks (src, dst) one after another in that order: src's rows for
// dst's experts, grouped by expert as src's permuted rows are.
void MoeExpertParallelStage::dispatch(const float* rows, float* local) {
  std::vector<int64_t> off(static_cast<size_t>(P_ * P_ + 1), 0);  // block (s, d) starts at off[s * P + d]
  for (int64_t b = 0; b < P_ * P_; ++b) off[b + 1] = off[b] + block_rows(b / P_, b % P_);
  exchange_.assign(static_cast<size_t>(off.back() * H_), 0.0f);
  // This rank's blocks (me, 0..P-1) are consecutive, as its rows are ordered by expert.
  std::copy(rows, rows + N_ * H_, exchange_.begin() + off[me_ * P_] * H_);
  ep_.all_reduce_sum(exchange_.data(), exchange_.size());
  // This rank's experts' rows, expert by expert, each from every source in rank order.
  int64_t out = 0;
  for (int64_t e = 0; e < El_; ++e)
    for (int64_t s = 0; s < P_; ++s) {
      int64_t at = off[s * P_ + me_];
      for (int64_t e2 = 0; e2 < e; ++e2) at += count(s, me_ * El_ + e2);
      const int64_t n = count(s, me_ * El_ + e);
      std::copy(exchange_.begin() + at * H_, exchange_.begin() + (at + n) * H_, local + out * H_);
      out += n;
    }
}

// The inverse: blocks (owner d, src s) in that order, each holding src's rows for d's experts in
// src's order; src then reads its blocks (0..P-1, itself), which follow its own row order.
void MoeExpertParallelStage::combine(const float* local, float* rows) {
  std::vector<int64_t> off(static_cast<size_t>(P_ * P_ + 1), 0);  // block (d, s) starts at off[d * P + s]
  for (int64_t b = 0; b < P_ * P_; ++b) off[b + 1] = off[b] + block_rows(b % P_, b / P_);
  exchange_.assign(static_cast<size_t>(off.back() * H_), 0.0f);
  for (int64_t s = 0; s < P_; ++s) {
    int64_t at = off[me_ * P_ + s];
    for (int64_t e = 0; e < El_; ++e) {
      // Source s's rows for expert e sit in `local` after the earlier experts' and earlier sources'.
      int64_t from = 0;
      for (int64_t e2 = 0; e2 < e; ++e2) from += local_tpe_[static_cast<size_t>(e2)];
      for (int64_t s2 = 0; s2 < s; ++s2) from += count(s2, me_ * El_ + e);
      const int64_t n = count(s, me_ * El_ + e);
      std::copy(local + from * H_, local + (from + n) * H_, exchange_.begin() + at * H_);
      at += n;
    }
  }
  ep_.all_reduce_sum(exchange_.data(), exchange_.size());
  int64_t row = 0;
  for (int64_t d = 0; d < P_; ++d) {
    const int64_t n = block_rows(me_, d);
    std::copy(exchange_.begin() + off[d * P_ + me_] * H_, exchange_.begin() + (off[d * P_ + me_] + n) * H_,
              rows + row * H_);
    row += n;
  }
}

}  // namespace laoyao::model
