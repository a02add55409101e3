// Megatron's rank layout (see parallel_layout.hpp).
#include "dist/parallel_layout.hpp"

#include <string>

#include "core/error.hpp"

namespace laoyao::dist {

ParallelLayout::ParallelLayout(int64_t world_size, ParallelSizes sizes) : world_(world_size), sizes_(sizes) {
  if (world_size <= 0 || sizes.tp <= 0 || sizes.cp <= 0 || sizes.pp <= 0)
    throw UsageError("the world size and the tensor-, context- and pipeline-parallel sizes must be positive");
  const int64_t mp = sizes.tp * sizes.cp * sizes.pp;
  if (world_size % mp != 0)
    throw UsageError("world size (" + std::to_string(world_size) + ") is not divisible by tensor x context x "
                     "pipeline parallel size (" + std::to_string(sizes.tp) + " x " + std::to_string(sizes.cp) +
                     " x " + std::to_string(sizes.pp) + ")");
  dp_ = world_size / mp;
}

RankCoords ParallelLayout::coords(int64_t rank) const {
  if (rank < 0 || rank >= world_)
    throw Error("rank " + std::to_string(rank) + " outside the world of " + std::to_string(world_));
  RankCoords c;
  int64_t r = rank;
  c.tp = r % sizes_.tp, r /= sizes_.tp;
  c.cp = r % sizes_.cp, r /= sizes_.cp;
  c.dp = r % dp_, r /= dp_;
  c.pp = r;
  return c;
}

int64_t ParallelLayout::rank_of(const RankCoords& c) const {
  return ((c.pp * dp_ + c.dp) * sizes_.cp + c.cp) * sizes_.tp + c.tp;
}

std::vector<int64_t> ParallelLayout::group_along(int64_t rank, Axis axis) const {
  const RankCoords base = coords(rank);
  const int64_t n = axis == Axis::Tp ? sizes_.tp : axis == Axis::Cp ? sizes_.cp : axis == Axis::Dp ? dp_ : sizes_.pp;
  std::vector<int64_t> members;
  for (int64_t i = 0; i < n; ++i) {
    RankCoords c = base;
    (axis == Axis::Tp ? c.tp : axis == Axis::Cp ? c.cp : axis == Axis::Dp ? c.dp : c.pp) = i;
    members.push_back(rank_of(c));
  }
  return members;
}

std::vector<int64_t> ParallelLayout::tp_group(int64_t rank) const { return group_along(rank, Axis::Tp); }
std::vector<int64_t> ParallelLayout::cp_group(int64_t rank) const { return group_along(rank, Axis::Cp); }
std::vector<int64_t> ParallelLayout::dp_group(int64_t rank) const { return group_along(rank, Axis::Dp); }
std::vector<int64_t> ParallelLayout::pp_group(int64_t rank) const { return group_along(rank, Axis::Pp); }

std::vector<int64_t> ParallelLayout::dp_cp_group(int64_t rank) const {
  RankCoords c = coords(rank);
  std::vector<int64_t> members;
  for (c.dp = 0; c.dp < dp_; ++c.dp)
    for (c.cp = 0; c.cp < sizes_.cp; ++c.cp) members.push_back(rank_of(c));
  return members;
}

namespace {

// The expert layout with expert TP = TP (Megatron's "tp-ep-dp-pp" beside the dense "tp-cp-dp-pp"):
// past the TP coordinate, the dense layout's context- and data-parallel coordinates flatten into
// one index j = cp + CP * dp, which the expert layout reads as ep + EP * edp.
void check_ep(const ParallelSizes& s, int64_t dp, int64_t ep) {
  if (ep < 1 || (dp * s.cp) % ep != 0)
    throw UsageError("expert-model-parallel size (" + std::to_string(ep) + ") must divide the data-parallel size (" +
                     std::to_string(dp) + ")" +
                     (s.cp > 1 ? " times the context-parallel size (" + std::to_string(s.cp) + ")" : std::string()));
}

}  // namespace

int64_t ParallelLayout::cp_dp_index(const RankCoords& c) const { return c.cp + sizes_.cp * c.dp; }

int64_t ParallelLayout::rank_at_cp_dp_index(RankCoords c, int64_t j) const {
  c.cp = j % sizes_.cp, c.dp = j / sizes_.cp;
  return rank_of(c);
}

std::vector<int64_t> ParallelLayout::ep_group(int64_t rank, int64_t ep) const {
  check_ep(sizes_, dp_, ep);
  const RankCoords c = coords(rank);
  const int64_t first = cp_dp_index(c) / ep * ep;
  std::vector<int64_t> members;
  for (int64_t i = 0; i < ep; ++i) members.push_back(rank_at_cp_dp_index(c, first + i));
  return members;
}

std::vector<int64_t> ParallelLayout::expert_dp_group(int64_t rank, int64_t ep) const {
  check_ep(sizes_, dp_, ep);
  const RankCoords c = coords(rank);
  const int64_t slot = cp_dp_index(c) % ep;
  std::vector<int64_t> members;
  for (int64_t j = slot; j < dp_ * sizes_.cp; j += ep) members.push_back(rank_at_cp_dp_index(c, j));
  return members;
}

namespace {

void check_folded_ep(int64_t world, int64_t ep, int64_t rank) {
  if (ep < 1 || world % ep != 0)
    throw UsageError("expert-model-parallel size (" + std::to_string(ep) + ") must divide the world size (" +
                     std::to_string(world) + ") with an expert tensor-parallel size of 1");
  if (rank < 0 || rank >= world)
    throw Error("rank " + std::to_string(rank) + " outside the world of " + std::to_string(world));
}

}  // namespace

std::vector<int64_t> ParallelLayout::folded_ep_group(int64_t rank, int64_t ep) const {
  check_folded_ep(world_, ep, rank);
  std::vector<int64_t> members;
  for (int64_t i = 0; i < ep; ++i) members.push_back(rank / ep * ep + i);
  return members;
}

std::vector<int64_t> ParallelLayout::folded_expert_dp_group(int64_t rank, int64_t ep) const {
  check_folded_ep(world_, ep, rank);
  std::vector<int64_t> members;
  for (int64_t r = rank % ep; r < world_; r += ep) members.push_back(r);
  return members;
}

}  // namespace laoyao::dist
