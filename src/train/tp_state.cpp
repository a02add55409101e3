// Whole-model checkpoints under tensor or expert parallelism (see tp_state.hpp).
#include "train/tp_state.hpp"

#include <vector>

#include "model/gpt_ep.hpp"
#include "model/gpt_layout.hpp"
#include "model/gpt_tp.hpp"
#include "train/dist_optimizer.hpp"

namespace laoyao::train {

WholeState make_whole_state(const model::GptModel& local, const optim::AdamWSettings& settings) {
  WholeState w;
  w.model = std::make_unique<model::GptModel>(model::ep_whole_config(local.config()));
  w.adam = make_whole_adam(w.model->table(), settings);
  return w;
}

namespace {

// Writes local's places into whole (its replicated tensors too when `replicated`).
void place(const model::GptModel& local, const model::ParameterTable& full, float* whole, const float* local_buf,
           bool replicated) {
  if (local.ep_size() > 1)
    model::ep_place(full, whole, local.table(), local_buf, local.ep_rank(),
                    local.config().moe.local_experts(), replicated);
  else
    model::tp_place(local.config(), full, whole, local.table(), local_buf, local.tp_rank(), local.tp_size(),
                    replicated);
}

}  // namespace

WholeState gather_whole_state(const model::GptModel& local, const optim::AdamW& adam,
                              const optim::AdamWSettings& settings) {
  WholeState w = make_whole_state(local, settings);
  const auto& full = w.model->table();
  dist::ProcessGroup* g = local.ep_size() > 1 ? local.ep_group() : local.tp_group();
  const bool first = !g || g->rank() == 0;
  // Each rank's places, zeros elsewhere, the replicated tensors from the group's first rank only:
  // the sum over the group is the whole model.
  place(local, full, w.model->weights(), local.weights(), first);
  place(local, full, w.adam->exp_avg().data(), adam.exp_avg().data(), first);
  place(local, full, w.adam->exp_avg_sq().data(), adam.exp_avg_sq().data(), first);
  if (g && g->size() > 1) {
    const size_t n = static_cast<size_t>(full.total);
    g->all_reduce_sum(w.model->weights(), n);
    g->all_reduce_sum(w.adam->exp_avg().data(), n);
    g->all_reduce_sum(w.adam->exp_avg_sq().data(), n);
  }
  w.adam->set_steps(adam.steps());
  return w;
}

void keep_part(const model::ParameterTable& whole_table, const float* whole_w, const model::GptModel& local,
               float* local_w) {
  if (local.ep_size() > 1)
    model::ep_shard(whole_table, whole_w, local.table(), local_w, local.ep_rank(), local.config().moe.local_experts());
  else
    model::tp_shard(local.config(), whole_table, whole_w, local.table(), local_w, local.tp_rank(), local.tp_size());
}

void keep_shards(const WholeState& whole, model::GptModel& local, optim::AdamW& adam) {
  const auto& full = whole.model->table();
  keep_part(full, whole.model->weights(), local, local.weights());
  keep_part(full, whole.adam->exp_avg().data(), local, adam.exp_avg().data());
  keep_part(full, whole.adam->exp_avg_sq().data(), local, adam.exp_avg_sq().data());
  adam.set_steps(whole.adam->steps());
}

}  // namespace laoyao::train
