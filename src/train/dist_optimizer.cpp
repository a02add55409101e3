// The distributed optimizer over data-parallel CPU ranks (see dist_optimizer.hpp).
#include "train/dist_optimizer.hpp"

#include <algorithm>

namespace laoyao::train {

OptimizerShard optimizer_shard(int64_t n, int64_t rank, int64_t dp) {
  const int64_t chunk = (n + dp - 1) / dp;
  const int64_t begin = std::min(n, rank * chunk);
  return {begin, std::min(n, begin + chunk) - begin};
}

std::unique_ptr<optim::AdamW> make_shard_adam(const model::ParameterTable& table, OptimizerShard shard,
                                              const optim::AdamWSettings& s) {
  std::vector<optim::ParamRange> ranges;
  const int64_t end = shard.begin + shard.size;
  for (const auto& p : table.specs) {  // each parameter's overlap with the share, weight decay kept
    const int64_t lo = std::max(p.offset, shard.begin), hi = std::min(p.offset + p.numel, end);
    if (lo < hi) ranges.push_back({lo - shard.begin, hi - lo, p.weight_decay ? 1.0 : 0.0});
  }
  return std::make_unique<optim::AdamW>(shard.size, ranges, s);
}

void gather_shares(float* weights, int64_t n, OptimizerShard shard, dist::ProcessGroup& group,
                   std::vector<float>& all) {
  all.assign(static_cast<size_t>(n), 0.0f);  // sized once: later steps only refill it
  std::copy(weights + shard.begin, weights + shard.begin + shard.size, all.begin() + shard.begin);
  group.all_reduce_sum(all.data(), all.size());
  std::copy(all.begin(), all.end(), weights);
}

std::unique_ptr<optim::AdamW> gather_moments(const model::ParameterTable& table, const optim::AdamW& shard_adam,
                                             OptimizerShard shard, const optim::AdamWSettings& s,
                                             dist::ProcessGroup& group) {
  std::vector<optim::ParamRange> ranges;
  for (const auto& p : table.specs) ranges.push_back({p.offset, p.numel, p.weight_decay ? 1.0 : 0.0});
  auto whole = std::make_unique<optim::AdamW>(table.total, ranges, s);
  std::copy(shard_adam.exp_avg().begin(), shard_adam.exp_avg().end(), whole->exp_avg().begin() + shard.begin);
  std::copy(shard_adam.exp_avg_sq().begin(), shard_adam.exp_avg_sq().end(),
            whole->exp_avg_sq().begin() + shard.begin);
  group.all_reduce_sum(whole->exp_avg().data(), whole->exp_avg().size());
  group.all_reduce_sum(whole->exp_avg_sq().data(), whole->exp_avg_sq().size());
  whole->set_steps(shard_adam.steps());
  return whole;
}

void keep_moment_share(const optim::AdamW& whole, OptimizerShard shard, optim::AdamW& shard_adam) {
  std::copy(whole.exp_avg().begin() + shard.begin, whole.exp_avg().begin() + shard.begin + shard.size,
            shard_adam.exp_avg().begin());
  std::copy(whole.exp_avg_sq().begin() + shard.begin, whole.exp_avg_sq().begin() + shard.begin + shard.size,
            shard_adam.exp_avg_sq().begin());
  shard_adam.set_steps(whole.steps());
}

}  // namespace laoyao::train
