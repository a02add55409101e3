// The model's parameters: one flat fp32 buffer of weights and one of gradients, with a table of
// Megatron-Core names, shapes and offsets (state-dict order), so checkpoints map one to one.
#pragma once
#include <functional>
#include <cstdint>
#include <string>
#include <vector>

#include "core/rng.hpp"

namespace laoyao::model {

enum class Init { Normal, Uniform, Zeros, Ones };

struct ParamSpec {
  std::string name;             // "decoder.layers.0.self_attention.linear_qkv.weight"
  std::vector<int64_t> shape;   // [out, in] for linears
  int64_t offset = 0;           // into the flat buffers
  int64_t numel = 0;
  Init init = Init::Zeros;
  double std = 0;               // Init::Normal's std; Init::Uniform's bound (U(-std, std))
  bool weight_decay = true;     // false for biases and 1-D parameters (Megatron's wd_mult 0)
  // The word embeddings and the output layer (Megatron-Core's is_embedding_or_output_parameter:
  // --decoupled-lr's parameters).
  bool embedding_or_output = false;
  // A buffer, not a parameter (Megatron's register_buffer: the router's expert_bias): saved in
  // checkpoints, never given a gradient (so the optimizer leaves it), not counted or normed as a
  // parameter.
  bool buffer = false;
  // Not trained (PEFT's base model): read by the forward, given no gradient and no optimizer state.
  bool frozen = false;
};

// Megatron's exceptions to "no weight decay for biases and 1-D parameters", by name as its
// no_weight_decay_cond: --apply-wd-to-qk-layernorm decays q/k layernorm weights, an embedding init
// std (default_skip_embedding_weight_decay) exempts names containing "embedding".
struct WeightDecayRule {
  bool apply_to_qk_layernorm = false;
  bool skip_embeddings = false;
};

struct ParameterTable {
  std::vector<ParamSpec> specs;
  int64_t total = 0;
  WeightDecayRule weight_decay;  // set before the parameters are added
  // The trained parameters are [trainable_offset, total): under PEFT the frozen base lies before
  // them; the gradients, the optimizer's state and its ranges cover that tail only, at offset -
  // trainable_offset (0 without PEFT: everything trains).
  int64_t trainable_offset = 0;

  // Appends a parameter; returns its offset.
  int64_t add(std::string name, std::vector<int64_t> shape, Init init, double std = 0);
  const ParamSpec* find(const std::string& name) const;
  bool has_buffers() const;  // any spec with `buffer` (the norms and zero counts leave them out)
  // Marks every parameter so far frozen: what is added next is all that trains.
  void freeze_all();
  int64_t trainable() const { return total - trainable_offset; }
  bool has_frozen() const { return trainable_offset > 0; }
};

// Fills `weights` (size table.total) with Megatron's init distributions, drawing from laoyao's
// generator keyed by (seed, parameter name). With round_bf16, values are rounded to bf16 (the
// bf16 model's weights, which the fp32 main copy starts from).
// `drawn` (when given) picks the parameters drawn; the others are left as they are (a checkpoint
// about to be read overwrites them).
using ParamFilter = std::function<bool(const ParamSpec&)>;
void init_parameters(const ParameterTable& table, float* weights, uint64_t seed, bool round_bf16,
                     const ParamFilter& drawn = {});
// One parameter's initial values in order, a chunk at a time (a device engine fills its memory
// through a bounded host buffer): the values init_parameters gives it.
class ParameterInit {
 public:
  ParameterInit(const ParamSpec& p, uint64_t seed, bool round_bf16);
  void next(float* w, int64_t n);  // the next n values

 private:
  const ParamSpec& p_;
  bool round_bf16_;
  Rng rng_;
};

}  // namespace laoyao::model
