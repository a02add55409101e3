// LoraAdapter (model/mcore/gpt_model.hpp): Megatron-Bridge's LoRA beside a linear layer.
#include <string>

#include "model/mcore/gpt_model.hpp"

namespace laoyao::model::mcore {

// Under tensor parallelism (tp_partial_grads): beside a column-parallel layer linear_in is
// whole and reads the whole input, linear_out is this rank's rows of the output; beside a
// row-parallel one linear_in is this rank's columns of the split input, and its output, summed
// over the ranks by the layer's own reduction (the adapter adds to the partial sums), passes
// through the whole linear_out on every rank. Either way the whole half's gradient is each rank's
// part, summed by finalize_grads; the input gradient is the layer's (summed, or this rank's).
LoraAdapter::LoraAdapter(const ModuleContext& m, int64_t layer, LoraOffsets w, const char* name, int64_t in,
                         int64_t out, bool row_parallel)
    : m_(m), layer_(layer), w_(w), name_(name), in_(in), out_(out), row_parallel_(row_parallel) {}

void LoraAdapter::carve(ActivationCarver& c, int64_t T) {
  if (on()) a_ = c.act(T * m_.local.lora->dim);
}

DropoutSpec LoraAdapter::drop(const Step& st) const {
  const DropoutSpec d =
      st.dropout(m_.local.lora->dropout, "dropout.layer" + std::to_string(layer_) + "." + name_ + ".lora");
  if (!row_parallel_ || !m_.tensor_parallel()) return d;
  // The whole model's mask over the whole input rows: this rank's columns of each.
  return sliced(d, static_cast<uint64_t>(in_ * m_.tp.size), static_cast<uint64_t>(m_.tp.rank),
                static_cast<uint64_t>(m_.tp.size));
}

Act LoraAdapter::input(const Step& st, Act x, Scratch& w) const {
  const DropoutSpec d = drop(st);
  if (!(d.p > 0)) return x;
  m_.backend.dropout(x, w.lora_in, st.batch.T * in_, d);
  return w.lora_in;
}

void LoraAdapter::forward(const Step& st, Act x, Act y, Scratch& w) {
  if (!on()) return;
  const LoraSpec& s = *m_.local.lora;
  m_.backend.lora_forward(input(st, x, w), w_.a, w_.b, s.scale(), a_, y, st.batch.T, in_, s.dim, out_);
}

void LoraAdapter::backward(const Step& st, Act x, Act dy, Act dx, Scratch& w) {
  if (!on()) return;
  const LoraSpec& s = *m_.local.lora;
  const int64_t T = st.batch.T;
  const DropoutSpec d = drop(st);
  if (!(d.p > 0))
    return m_.backend.lora_backward(x, w_.a, w_.b, s.scale(), a_, dy, w.lora_da, dx, T, in_, s.dim, out_, true);
  // The dropped-out input again (the same mask), its gradient in its place, then through the mask
  // onto dx: dx += dropout(d(input)).
  const Act in = input(st, x, w);
  m_.backend.lora_backward(in, w_.a, w_.b, s.scale(), a_, dy, w.lora_da, in, T, in_, s.dim, out_, false);
  m_.backend.bias_dropout_add(in, -1, dx, dx, T, in_, d);
}

}  // namespace laoyao::model::mcore
