// A split model's rank and the whole model: which parts of the whole (Megatron-Core-named,
// full-shape) tensors this rank's parameters are, its initial weights (the same whatever the TP or
// EP size), and a hold of host state for pulling a GPU rank's whole state (tests).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>

#include "model/gpt_model.hpp"
#include "model/tensor_box.hpp"
#include "optim/adamw.hpp"

namespace laoyao::train {

// This rank's part (TP shards or EP experts) of whole-model weights laid out by whole_table.
void keep_part(const model::ParameterTable& whole_table, const float* whole_w, const model::GptModel& local,
               float* local_w);
// Whether the model is split over a model-parallel group (tensor or expert parallelism).
inline bool split_model(const model::GptModel& m) { return m.tp_size() > 1 || m.ep_size() > 1; }

// The run's initial weights into model.weights() (held on the host). bf16 runs start from
// bf16-rounded weights (Megatron initialises the bf16 params; the fp32 main copy is made from
// them). A split model's rank initialises the whole model from the same seed and keeps its part
// (Megatron's --use-cpu-initialization): the weights do not depend on the TP or EP size.
// `drawn` as model::init_parameters'.
void init_model_weights(model::GptModel& model, uint64_t seed, bool bf16, const model::ParamFilter& drawn = {});
// Where each of local's parameters lies in the whole model (Megatron-Core names at full shape): the
// whole tensor (under EP a routed expert's global index) and the boxes of it this rank holds, in
// table order. A replicated parameter is its whole tensor.
std::vector<model::TensorPart> rank_parts(const model::GptModel& local);

// The same for a split model a parameter at a time: fill(p, values) for each of local's
// parameters, in table order, with its p.numel initial values (the host holds one whole tensor at
// a time, not the whole model); the parameters `drawn` picks, when given.
void for_each_initial_part(const model::GptModel& local, uint64_t seed, bool bf16,
                           const std::function<void(const model::ParamSpec&, const float*)>& fill,
                           const model::ParamFilter& drawn = {});

// Holds the host weights of `model` and the moments of `adam` for its lifetime, where they are not
// held already (a GPU rank's, to pull or push its whole state), and frees what it took.
class HostStateHold {
 public:
  HostStateHold(model::GptModel& model, optim::AdamW& adam);
  ~HostStateHold();
  HostStateHold(const HostStateHold&) = delete;
  HostStateHold& operator=(const HostStateHold&) = delete;

 private:
  model::GptModel& model_;
  optim::AdamW& adam_;
  bool took_weights_, took_moments_;
};

}  // namespace laoyao::train
