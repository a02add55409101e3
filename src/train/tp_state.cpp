// Whole-model checkpoints under tensor parallelism (see tp_state.hpp).
#include "train/tp_state.hpp"

#include <vector>

#include "model/gpt_layout.hpp"
#include "model/gpt_tp.hpp"

namespace laoyao::train {
namespace {

std::unique_ptr<optim::AdamW> adam_for(const model::ParameterTable& table, const optim::AdamWSettings& s) {
  std::vector<optim::ParamRange> ranges;
  for (const auto& p : table.specs) ranges.push_back({p.offset, p.numel, p.weight_decay ? 1.0 : 0.0});
  return std::make_unique<optim::AdamW>(table.total, ranges, s);
}

}  // namespace

WholeState make_whole_state(const model::GptModel& local, const optim::AdamWSettings& settings) {
  WholeState w;
  w.model = std::make_unique<model::GptModel>(local.config());
  w.adam = adam_for(w.model->table(), settings);
  return w;
}

WholeState gather_whole_state(const model::GptModel& local, const optim::AdamW& adam,
                              const optim::AdamWSettings& settings) {
  WholeState w = make_whole_state(local, settings);
  const model::GptConfig& c = local.config();
  const auto& full = w.model->table();
  const int64_t r = local.tp_rank(), tp = local.tp_size();
  // Each rank's places, zeros elsewhere, the replicated tensors from rank 0 only: the sum over the
  // group is the whole model.
  model::tp_place(c, full, w.model->weights(), local.table(), local.weights(), r, tp, r == 0);
  model::tp_place(c, full, w.adam->exp_avg().data(), local.table(), adam.exp_avg().data(), r, tp, r == 0);
  model::tp_place(c, full, w.adam->exp_avg_sq().data(), local.table(), adam.exp_avg_sq().data(), r, tp, r == 0);
  if (dist::ProcessGroup* g = local.tp_group(); g && tp > 1) {
    const size_t n = static_cast<size_t>(full.total);
    g->all_reduce_sum(w.model->weights(), n);
    g->all_reduce_sum(w.adam->exp_avg().data(), n);
    g->all_reduce_sum(w.adam->exp_avg_sq().data(), n);
  }
  w.adam->set_steps(adam.steps());
  return w;
}

void keep_shards(const WholeState& whole, model::GptModel& local, optim::AdamW& adam) {
  const model::GptConfig& c = local.config();
  const auto& full = whole.model->table();
  const int64_t r = local.tp_rank(), tp = local.tp_size();
  model::tp_shard(c, full, whole.model->weights(), local.table(), local.weights(), r, tp);
  model::tp_shard(c, full, whole.adam->exp_avg().data(), local.table(), adam.exp_avg().data(), r, tp);
  model::tp_shard(c, full, whole.adam->exp_avg_sq().data(), local.table(), adam.exp_avg_sq().data(), r, tp);
  adam.set_steps(whole.adam->steps());
}

}  // namespace laoyao::train
