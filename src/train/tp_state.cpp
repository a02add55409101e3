// A split model's parts of the whole model (see tp_state.hpp).
#include "train/tp_state.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "model/gpt_ep.hpp"
#include "model/gpt_layout.hpp"
#include "model/gpt_tp.hpp"
#include "model/parameters.hpp"

namespace laoyao::train {

namespace {

// Both kinds of split at once: EP picks a rank's experts out of the whole model, then TP splits
// them (and the rest) like the dense layers. In between sits this table: the rank's experts at the
// whole model's tensor shapes (local's full configuration, expert_parallel kept).
bool tp_and_ep(const model::GptModel& m) { return m.tp_size() > 1 && m.ep_size() > 1; }
model::ParameterTable experts_at_full_shape(const model::GptModel& local) {
  return model::build_gpt_parameters(local.config()).table;
}

}  // namespace

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
                           const std::function<void(const model::ParamSpec&, const float*)>& fill,
                           const model::ParamFilter& drawn) {
  const std::vector<model::TensorPart> parts = rank_parts(local);
  const model::ParameterTable whole = model::build_gpt_parameters(model::ep_whole_config(local.config())).table;
  // The whole tensor's values are drawn in order, a window of whole rows at a time (at least 16 MB
  // of fp32), and the window's overlap with this rank's part kept: the host never holds a whole
  // embedding table (2 GB at Llama-3's vocabulary) beside the part.
  constexpr int64_t kWindow = int64_t{1} << 22;
  std::vector<float> values, part;
  for (size_t i = 0; i < parts.size(); ++i) {
    const model::ParamSpec& l = local.table().specs[i];
    if (drawn && !drawn(l)) continue;
    const model::ParamSpec* w = whole.find(parts[i].name);
    if (!w || w->shape != parts[i].shape) throw Error("init: the whole model has no parameter " + parts[i].name);
    part.resize(static_cast<size_t>(l.numel));
    model::ParameterInit init(*w, seed, bf16);
    const int64_t rows = w->shape.empty() ? 1 : w->shape[0], row = rows > 0 ? w->numel / rows : 0;
    const int64_t step = std::max<int64_t>(1, kWindow / std::max<int64_t>(row, 1));
    int64_t copied = 0;
    for (int64_t r0 = 0; r0 < rows; r0 += step) {
      const int64_t n_rows = std::min(step, rows - r0);
      values.resize(static_cast<size_t>(n_rows * row));
      init.next(values.data(), n_rows * row);
      model::Box window = model::whole_box(w->shape);
      if (!window.start.empty()) window.start[0] = r0, window.size[0] = n_rows;
      copied += model::copy_overlap({w->name, w->shape, {window}}, values.data(), parts[i], part.data());
    }
    if (copied != l.numel) throw Error("init: " + parts[i].name + ": the part's values were not all drawn");
    fill(l, part.data());
  }
}

void init_model_weights(model::GptModel& model, uint64_t seed, bool bf16, const model::ParamFilter& drawn) {
  if (!split_model(model)) {
    model::init_parameters(model.table(), model.weights(), seed, bf16, drawn);
    return;
  }
  float* w = model.weights();
  for_each_initial_part(model, seed, bf16, [w](const model::ParamSpec& p, const float* values) {
    std::copy(values, values + p.numel, w + p.offset);
  }, drawn);
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
