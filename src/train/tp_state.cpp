// Whole-model checkpoints under tensor or expert parallelism (see tp_state.hpp).
#include "train/tp_state.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "model/gpt_ep.hpp"
#include "model/gpt_layout.hpp"
#include "model/gpt_tp.hpp"
#include "model/parameters.hpp"
#include "train/dist_optimizer.hpp"

namespace laoyao::train {

WholeState make_whole_state(const model::GptModel& local, const optim::AdamWSettings& settings) {
  WholeState w;
  w.model = std::make_unique<model::GptModel>(model::ep_whole_config(local.config()));
  w.adam = make_whole_adam(w.model->table(), settings);
  return w;
}

namespace {

// Both kinds of split at once: EP picks a rank's experts out of the whole model, then TP splits
// them (and the rest) like the dense layers. In between sits this table: the rank's experts at the
// whole model's tensor shapes (local's full configuration, expert_parallel kept).
bool tp_and_ep(const model::GptModel& m) { return m.tp_size() > 1 && m.ep_size() > 1; }
model::ParameterTable experts_at_full_shape(const model::GptModel& local) {
  return model::build_gpt_parameters(local.config()).table;
}

// Whole experts under TP (expert TP size 1): the routed experts are TP-replicated by name but each
// rank of a TP group holds its own. Copies them by name from one table's buffer to the other's
// (zeros when `from` is null).
void copy_routed(const model::ParameterTable& from_table, const float* from, const model::ParameterTable& to_table,
                 float* to) {
  for (const auto& p : to_table.specs) {
    if (!model::is_routed_expert(p.name)) continue;
    if (!from) {
      std::fill(to + p.offset, to + p.offset + p.numel, 0.0f);
      continue;
    }
    const model::ParamSpec* f = from_table.find(p.name);
    if (!f || f->numel != p.numel) throw Error("whole experts: no local tensor " + p.name);
    std::copy(from + f->offset, from + f->offset + p.numel, to + p.offset);
  }
}

// Writes local's places into whole (its replicated tensors too when `replicated`): one kind of
// split.
void place(const model::GptModel& local, const model::ParameterTable& full, float* whole, const float* local_buf,
           bool replicated) {
  if (local.ep_size() > 1)
    model::ep_place(full, whole, local.table(), local_buf, local.ep_rank(),
                    local.config().moe.local_experts(), replicated);
  else
    model::tp_place(local.config(), full, whole, local.table(), local_buf, local.tp_rank(), local.tp_size(),
                    replicated);
}

// whole (zeros, laid out by full) = the whole model's buffer of which every rank holds local_buf
// (collective over the TP and EP groups). Each rank contributes its places, zeros elsewhere, the
// replicated tensors from a group's first rank only: the sum over the group is the whole.
void gather_buffer(const model::GptModel& local, const model::ParameterTable& full, float* whole,
                   const float* local_buf) {
  if (tp_and_ep(local)) {
    const model::ParameterTable mid = experts_at_full_shape(local);
    std::vector<float> experts(static_cast<size_t>(mid.total), 0.0f);
    model::tp_place(local.config(), mid, experts.data(), local.table(), local_buf, local.tp_rank(), local.tp_size(),
                    local.tp_rank() == 0);
    if (local.experts_folded()) copy_routed(local.table(), nullptr, mid, experts.data());  // not TP rank 0's only
    local.tp_group()->all_reduce_sum(experts.data(), experts.size());
    if (local.experts_folded()) copy_routed(local.table(), local_buf, mid, experts.data());  // this rank's own
    model::ep_place(full, whole, mid, experts.data(), local.ep_rank(), local.config().moe.local_experts(),
                    local.ep_rank() == 0);
    local.ep_group()->all_reduce_sum(whole, static_cast<size_t>(full.total));
    return;
  }
  dist::ProcessGroup* g = local.ep_size() > 1 ? local.ep_group() : local.tp_group();
  place(local, full, whole, local_buf, !g || g->rank() == 0);
  if (g && g->size() > 1) g->all_reduce_sum(whole, static_cast<size_t>(full.total));
}

}  // namespace

WholeState gather_whole_state(const model::GptModel& local, const optim::AdamW& adam,
                              const optim::AdamWSettings& settings) {
  WholeState w = make_whole_state(local, settings);
  const auto& full = w.model->table();
  gather_buffer(local, full, w.model->weights(), local.weights());
  gather_buffer(local, full, w.adam->exp_avg().data(), adam.exp_avg().data());
  gather_buffer(local, full, w.adam->exp_avg_sq().data(), adam.exp_avg_sq().data());
  w.adam->set_steps(adam.steps());
  return w;
}

void keep_part(const model::ParameterTable& whole_table, const float* whole_w, const model::GptModel& local,
               float* local_w) {
  if (tp_and_ep(local)) {
    const model::ParameterTable mid = experts_at_full_shape(local);
    std::vector<float> experts(static_cast<size_t>(mid.total));
    model::ep_shard(whole_table, whole_w, mid, experts.data(), local.ep_rank(), local.config().moe.local_experts());
    model::tp_shard(local.config(), mid, experts.data(), local.table(), local_w, local.tp_rank(), local.tp_size());
  } else if (local.ep_size() > 1) {
    model::ep_shard(whole_table, whole_w, local.table(), local_w, local.ep_rank(), local.config().moe.local_experts());
  } else {
    model::tp_shard(local.config(), whole_table, whole_w, local.table(), local_w, local.tp_rank(), local.tp_size());
  }
}

void keep_shards(const WholeState& whole, model::GptModel& local, optim::AdamW& adam) {
  const auto& full = whole.model->table();
  keep_part(full, whole.model->weights(), local, local.weights());
  keep_part(full, whole.adam->exp_avg().data(), local, adam.exp_avg().data());
  keep_part(full, whole.adam->exp_avg_sq().data(), local, adam.exp_avg_sq().data());
  adam.set_steps(whole.adam->steps());
}

std::vector<model::TensorPart> rank_parts(const model::GptModel& local) {
  const model::ParameterTable& lt = local.table();
  const bool tp = local.tp_size() > 1, ep = local.ep_size() > 1;
  // Spec by spec, what this rank's parameter is cut from (as keep_part cuts it): under TP the
  // tensor at full shape (the whole model's, or under EP too the rank's expert's), else itself;
  // under EP a routed expert is the whole model's expert of its global index.
  const model::ParameterTable full = !tp ? lt : ep ? experts_at_full_shape(local)
                                                   : model::build_gpt_parameters(local.config()).table;
  std::vector<model::TensorPart> parts;
  for (size_t i = 0; i < lt.specs.size(); ++i) {
    const model::ParamSpec& f = full.specs[i];
    model::TensorPart part;
    part.name = ep ? model::ep_whole_name(f.name, local.ep_rank(), local.config().moe.local_experts()) : f.name;
    part.shape = f.shape;
    part.boxes = tp ? model::tp_boxes(model::tp_split_of(f.name, local.config()), f.shape, local.tp_rank(),
                                      local.tp_size())
                    : std::vector<model::Box>{model::whole_box(f.shape)};
    if (part.numel() != lt.specs[i].numel)
      throw Error("the parts of " + part.name + ": " + std::to_string(part.numel()) + " elements for a parameter of " +
                  std::to_string(lt.specs[i].numel));
    parts.push_back(std::move(part));
  }
  return parts;
}

void for_each_initial_part(const model::GptModel& local, uint64_t seed, bool bf16,
                           const std::function<void(const model::ParamSpec&, const float*)>& fill) {
  const std::vector<model::TensorPart> parts = rank_parts(local);
  const model::ParameterTable whole = model::build_gpt_parameters(model::ep_whole_config(local.config())).table;
  std::vector<float> values, part;
  for (size_t i = 0; i < parts.size(); ++i) {
    const model::ParamSpec& l = local.table().specs[i];
    const model::ParamSpec* w = whole.find(parts[i].name);
    if (!w || w->shape != parts[i].shape) throw Error("init: the whole model has no parameter " + parts[i].name);
    values.resize(static_cast<size_t>(w->numel));
    model::ParameterInit(*w, seed, bf16).next(values.data(), w->numel);
    part.resize(static_cast<size_t>(l.numel));
    model::copy_overlap({w->name, w->shape, {model::whole_box(w->shape)}}, values.data(), parts[i], part.data());
    fill(l, part.data());
  }
}

void init_model_weights(model::GptModel& model, uint64_t seed, bool bf16) {
  if (!split_model(model)) {
    model::init_parameters(model.table(), model.weights(), seed, bf16);
    return;
  }
  float* w = model.weights();
  for_each_initial_part(model, seed, bf16, [w](const model::ParamSpec& p, const float* values) {
    std::copy(values, values + p.numel, w + p.offset);
  });
}

HostStateHold::HostStateHold(model::GptModel& model, optim::AdamW& adam)
    : model_(model), adam_(adam), took_weights_(!model.holds_host_weights()), took_moments_(!adam.holds_moments()) {
  if (took_weights_) model_.hold_host_weights(true);
  try {
    if (took_moments_) adam_.allocate_moments();
  } catch (...) {  // (no destructor runs for a constructor that throws)
    if (took_weights_) model_.hold_host_weights(false);
    throw;
  }
}

HostStateHold::~HostStateHold() {
  if (took_weights_) model_.hold_host_weights(false);
  if (took_moments_) adam_.free_moments();
}

}  // namespace laoyao::train
