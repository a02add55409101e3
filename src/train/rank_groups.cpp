#include "train/rank_groups.hpp"

#include <utility>

#include "dist/parallel_layout.hpp"

namespace laoyao::train {

void RankGroups::fill(TrainOptions& opt) const {
  opt.group = world.get();
  opt.tp_group = tp.get();
  opt.dp_group = dp.get();
  opt.ep_group = ep.get();
  opt.expert_dp_group = expert_dp.get();
  opt.cp_group = cp.get();
}

std::vector<dist::ProcessGroup*> RankGroups::all() const {
  std::vector<dist::ProcessGroup*> out;
  for (dist::ProcessGroup* g : {world.get(), tp.get(), dp.get(), ep.get(), expert_dp.get(), cp.get()})
    if (g) out.push_back(g);
  return out;
}

RankGroups make_rank_groups(const config::ConfigContainer& c, int64_t world_size, int64_t rank,
                            std::unique_ptr<dist::ProcessGroup> world, const GroupFactory& make_group) {
  RankGroups g;
  g.world = std::move(world);
  const dist::ParallelLayout layout(world_size, {c.model.tensor_model_parallel_size, c.model.context_parallel_size, 1});
  if (layout.sizes().tp > 1) {  // Megatron's layout: TP ranks consecutive, DP across them
    g.tp = make_group(layout.tp_group(rank), "tp");
    g.dp = make_group(layout.dp_group(rank), "dp");
  }
  if (layout.sizes().cp > 1) {  // then the losses and gradients go over Megatron's dp_cp group
    g.cp = make_group(layout.cp_group(rank), "cp");
    g.dp = make_group(layout.dp_cp_group(rank), "dp_cp");
  }
  // Expert parallelism: consecutive data-parallel ranks (with CP, consecutive in cp + CP * dp)
  // share out the experts; the ranks holding the same experts average their gradients. With whole
  // experts under TP (expert TP size 1) the groups fold across the TP ranks: consecutive ranks
  // share out the experts.
  const int64_t tp = layout.sizes().tp;
  const bool folded = tp > 1 && c.model.expert_tensor_parallel_size.value_or(tp) == 1;
  if (const int64_t ep = c.model.expert_model_parallel_size; ep > 1 && folded) {
    g.ep = make_group(layout.folded_ep_group(rank, ep), "ep");
    if (world_size > ep) g.expert_dp = make_group(layout.folded_expert_dp_group(rank, ep), "edp");
  } else if (ep > 1) {
    g.ep = make_group(layout.ep_group(rank, ep), "ep");
    if (layout.dp() * layout.sizes().cp > ep) g.expert_dp = make_group(layout.expert_dp_group(rank, ep), "edp");
  }
  return g;
}

}  // namespace laoyao::train
