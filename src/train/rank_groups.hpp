// A rank's process groups, laid out as Megatron's parallel_state does (order tp-cp-ep-dp): the
// world, and where the run asks for them the tensor-, data- (dp_cp with context parallelism),
// context-, expert- and expert-data-parallel groups. Written once for every way ranks meet: Gloo
// or NCCL between processes (`laoyao launch`), or threads sharing one GPU (the host-memory bench).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "config/config_container.hpp"
#include "dist/process_group.hpp"
#include "train/trainer.hpp"

namespace laoyao::train {

struct RankGroups {
  std::unique_ptr<dist::ProcessGroup> world, tp, dp, ep, expert_dp, cp;

  // The groups, in the TrainOptions the trainer reads.
  void fill(TrainOptions& opt) const;
  // Every group this rank holds (null entries left out).
  std::vector<dist::ProcessGroup*> all() const;
};

// Makes the group of `members` (world ranks, this rank among them) named `name`; every member calls
// it with the same members and name.
using GroupFactory =
    std::function<std::unique_ptr<dist::ProcessGroup>(const std::vector<int64_t>& members, const std::string& name)>;

// The groups of world rank `rank` of `world_size` for config `c`; `world` is the rank's world group,
// kept as given. A UsageError when the sizes do not divide as Megatron requires.
RankGroups make_rank_groups(const config::ConfigContainer& c, int64_t world_size, int64_t rank,
                            std::unique_ptr<dist::ProcessGroup> world, const GroupFactory& make_group);

}  // namespace laoyao::train
