// Megatron's rank layout (megatron.core.parallel_state, order "tp-cp-ep-dp-pp"): tensor-parallel
// ranks innermost (consecutive ranks: one node's NVLink domain), then context-parallel, then
// data-parallel, pipeline outermost. A rank's coordinates and the members of each of its groups
// follow from the world size and the three model-parallel sizes alone, identically on every rank.
#pragma once
#include <cstdint>
#include <vector>

namespace laoyao::dist {

struct ParallelSizes {
  int64_t tp = 1, cp = 1, pp = 1;
};

struct RankCoords {
  int64_t tp = 0, cp = 0, dp = 0, pp = 0;
};

class ParallelLayout {
 public:
  // A UsageError when the world size is not a multiple of tp * cp * pp (Megatron's rule) or a size
  // is not positive.
  ParallelLayout(int64_t world_size, ParallelSizes sizes);

  int64_t world_size() const { return world_; }
  const ParallelSizes& sizes() const { return sizes_; }
  int64_t dp() const { return dp_; }

  RankCoords coords(int64_t rank) const;
  int64_t rank_of(const RankCoords& c) const;

  // The ranks of `rank`'s group along one axis (every other coordinate equal), in order of that
  // axis's coordinate: tensor-parallel (consecutive ranks), context-, data- and pipeline-parallel.
  std::vector<int64_t> tp_group(int64_t rank) const;
  std::vector<int64_t> cp_group(int64_t rank) const;
  std::vector<int64_t> dp_group(int64_t rank) const;
  std::vector<int64_t> pp_group(int64_t rank) const;
  // Megatron's data-parallel group with context parallelism (dp_cp): the ranks of every data- and
  // context-parallel coordinate at `rank`'s TP and PP coordinates, cp-minor (member dp * cp + cp),
  // over which the gradients are averaged and the losses summed.
  std::vector<int64_t> dp_cp_group(int64_t rank) const;
  // Expert parallelism over ep data-parallel ranks (Megatron's expert layout "tp-ep-dp-pp" with
  // expert TP = TP): `rank`'s expert-parallel group (ep consecutive data-parallel ranks of its TP
  // rank; with context parallelism, consecutive in the flattened index cp + CP * dp) and its expert
  // data-parallel group (the ranks holding the same experts' shards, dp * cp / ep of them). A
  // UsageError when ep does not divide the data-parallel size (times the context-parallel size).
  std::vector<int64_t> ep_group(int64_t rank, int64_t ep) const;
  std::vector<int64_t> expert_dp_group(int64_t rank, int64_t ep) const;
  // The same with whole experts (expert TP size 1, Megatron's expert layout "tp-ep-dp-pp" with its
  // tp = 1): the expert-parallel groups are ep consecutive ranks, folded across the TP ranks, and
  // the expert data-parallel group of `rank` every ep-th rank from rank % ep (world / ep of them).
  // A UsageError when ep does not divide the world size.
  std::vector<int64_t> folded_ep_group(int64_t rank, int64_t ep) const;
  std::vector<int64_t> folded_expert_dp_group(int64_t rank, int64_t ep) const;

 private:
  enum class Axis { Tp, Cp, Dp, Pp };
  std::vector<int64_t> group_along(int64_t rank, Axis axis) const;
  // The context- and data-parallel coordinates flattened (cp-minor), and back at c's TP and PP.
  int64_t cp_dp_index(const RankCoords& c) const;
  int64_t rank_at_cp_dp_index(RankCoords c, int64_t j) const;

  int64_t world_;
  ParallelSizes sizes_;
  int64_t dp_;
};

}  // namespace laoyao::dist
