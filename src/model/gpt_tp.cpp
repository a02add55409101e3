// A GPT model's parameters over tensor-parallel ranks (see gpt_tp.hpp).
#include "model/gpt_tp.hpp"

#include <algorithm>

#include "core/error.hpp"

namespace laoyao::model {
namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// Visits each element block a rank holds: copy(full_offset, local_offset, count) for every
// contiguous run, in local order.
template <class F>
void for_each_run(TpSplit split, const ParamSpec& full, const ParamSpec& local, int64_t rank, int64_t tp, F&& copy) {
  const int64_t rows = full.shape[0], cols = full.shape.size() > 1 ? full.shape[1] : 1;
  switch (split) {
    case TpSplit::Replicated:
      copy(full.offset, local.offset, full.numel);
      return;
    case TpSplit::Rows: {
      const int64_t n = rows / tp;
      copy(full.offset + rank * n * cols, local.offset, n * cols);
      return;
    }
    case TpSplit::SwigluRows: {  // [gate; up], each half split on its own
      const int64_t half = rows / 2, n = half / tp;
      copy(full.offset + rank * n * cols, local.offset, n * cols);
      copy(full.offset + (half + rank * n) * cols, local.offset + n * cols, n * cols);
      return;
    }
    case TpSplit::Cols: {
      const int64_t n = cols / tp;
      for (int64_t r = 0; r < rows; ++r) copy(full.offset + r * cols + rank * n, local.offset + r * n, n);
      return;
    }
  }
}

void check_same_names(const ParameterTable& full, const ParameterTable& local) {
  if (full.specs.size() != local.specs.size())
    throw Error("tensor-parallel parameters: the full and local tables differ");
  for (size_t i = 0; i < full.specs.size(); ++i)
    if (full.specs[i].name != local.specs[i].name)
      throw Error("tensor-parallel parameters: " + full.specs[i].name + " against " + local.specs[i].name);
}

}  // namespace

TpSplit tp_split_of(const std::string& name, const GptConfig& full) {
  if (name == "embedding.word_embeddings.weight" || name == "output_layer.weight") return TpSplit::Rows;
  // LoRA: a column-parallel layer's linear_out split as the layer's rows, a row-parallel layer's
  // linear_in as its columns; the other halves whole (tp_partial_grads).
  if (name.find(".adapter.linear_") != std::string::npos) {
    const bool in = ends_with(name, ".adapter.linear_in.weight");
    if (name.find("linear_qkv.adapter.") != std::string::npos) return in ? TpSplit::Replicated : TpSplit::Rows;
    if (name.find("linear_fc1.adapter.") != std::string::npos)
      return in ? TpSplit::Replicated : full.activation == Activation::SwiGLU ? TpSplit::SwigluRows : TpSplit::Rows;
    return in ? TpSplit::Cols : TpSplit::Replicated;  // linear_proj, linear_fc2
  }
  if (ends_with(name, "self_attention.linear_qkv.weight") || ends_with(name, "self_attention.linear_qkv.bias"))
    return TpSplit::Rows;
  // Multi-latent attention: the up projections are column-parallel (rows by heads); the down
  // projections and latent norms whole on every rank (tp_partial_grads).
  if (ends_with(name, "self_attention.linear_q_proj.weight") || ends_with(name, "self_attention.linear_q_up_proj.weight") ||
      ends_with(name, "self_attention.linear_kv_up_proj.weight"))
    return TpSplit::Rows;
  // An MoE layer's experts (routed and shared) are MLPs split as the dense one (expert tensor
  // parallelism = tensor parallelism); the router is replicated. With an expert TP size of 1 the
  // routed experts stay whole (expert parallelism shares them out instead).
  const bool routed = name.find("mlp.experts.local_experts.") != std::string::npos;
  if (routed && !full.moe.experts_split_by_tp()) return TpSplit::Replicated;
  const bool expert = routed || name.find("mlp.shared_experts.") != std::string::npos;
  if (ends_with(name, "mlp.linear_fc1.weight") || ends_with(name, "mlp.linear_fc1.bias") ||
      (expert && ends_with(name, ".linear_fc1.weight")))
    return full.activation == Activation::SwiGLU ? TpSplit::SwigluRows : TpSplit::Rows;
  if (ends_with(name, "self_attention.linear_proj.weight") || ends_with(name, "mlp.linear_fc2.weight") ||
      (expert && ends_with(name, ".linear_fc2.weight")))
    return TpSplit::Cols;
  return TpSplit::Replicated;
}

std::vector<Box> tp_boxes(TpSplit split, const std::vector<int64_t>& full_shape, int64_t rank, int64_t tp) {
  Box b = whole_box(full_shape);
  switch (split) {
    case TpSplit::Replicated:
      return {b};
    case TpSplit::Rows:
      b.size[0] /= tp, b.start[0] = rank * b.size[0];
      return {b};
    case TpSplit::SwigluRows: {  // [gate; up], each half split on its own
      const int64_t half = full_shape[0] / 2, n = half / tp;
      b.size[0] = n, b.start[0] = rank * n;
      Box up = b;
      up.start[0] = half + rank * n;
      return {b, up};
    }
    case TpSplit::Cols:
      b.size[1] /= tp, b.start[1] = rank * b.size[1];
      return {b};
  }
  return {b};
}

std::vector<std::pair<int64_t, int64_t>> tp_partial_grads(const GptParameterLayout& local) {
  std::vector<std::pair<int64_t, int64_t>> out;
  const auto& specs = local.table.specs;  // in offset order
  auto add = [&](int64_t off) {
    if (off < 0) return;
    const auto it = std::lower_bound(specs.begin(), specs.end(), off,
                                     [](const ParamSpec& p, int64_t o) { return p.offset < o; });
    out.emplace_back(off, it->numel);
  };
  for (const GptLayerOffsets& L : local.layers) {
    add(L.qkv_lora.a), add(L.fc1_lora.a), add(L.proj_lora.b), add(L.fc2_lora.b);
    for (int64_t off : {L.q_down_w, L.q_ln_w, L.q_ln_b, L.kv_down_w, L.kv_ln_w, L.kv_ln_b}) add(off);
  }
  std::sort(out.begin(), out.end());
  return out;
}

void check_moe_tensor_parallel(const GptConfig& c) {
  if (!c.sequence_parallel)
    throw UsageError("Mixture-of-Experts layers with tensor parallelism need sequence parallelism "
                     "(--sequence-parallel, model.sequence_parallel), as Megatron-Core's MoELayer asks in training");
}

void check_token_ids(const int64_t* tokens, int64_t T, int64_t vocab, const char* who) {
  for (int64_t t = 0; t < T; ++t)
    if (tokens[t] < 0 || tokens[t] >= vocab)
      throw Error(std::string(who) + ": token id " + std::to_string(tokens[t]) + " outside the vocabulary of " +
                  std::to_string(vocab));
}

GptConfig tp_local_config(const GptConfig& full, int64_t tp) {
  if (tp < 1) throw UsageError("the tensor-parallel size must be positive");
  auto check = [&](int64_t n, const char* what) {
    if (n % tp != 0)
      throw UsageError(std::string(what) + " (" + std::to_string(n) + ") is not divisible by the tensor-parallel size (" +
                       std::to_string(tp) + ")");
  };
  check(full.heads, "the number of attention heads");
  check(full.query_groups, "the number of query groups");
  // The dense MLP's ffn only where a layer has one (a model of MoE layers only never splits it).
  bool dense_mlp = full.moe.num_experts <= 0;
  for (int64_t l = 0; l < full.num_layers && !dense_mlp; ++l) dense_mlp = !full.is_moe_layer(l);
  if (dense_mlp) check(full.ffn, "the ffn hidden size");
  check(full.vocab, "the padded vocabulary size");
  const bool moe = full.moe.num_experts > 0;
  const bool split_experts = moe && full.moe.experts_split_by_tp();
  if (split_experts) check(full.moe.ffn, "the MoE ffn hidden size");
  if (moe && full.moe.shared_ffn > 0) check(full.moe.shared_ffn, "the shared expert's intermediate size");
  GptConfig local = full;
  local.heads /= tp;
  local.query_groups /= tp;
  if (dense_mlp) local.ffn /= tp;
  local.vocab /= tp;
  if (split_experts) local.moe.ffn /= tp;
  if (moe) local.moe.shared_ffn /= tp;
  return local;
}

void tp_shard(const GptConfig& full, const ParameterTable& full_table, const float* full_w,
              const ParameterTable& local_table, float* local_w, int64_t rank, int64_t tp) {
  check_same_names(full_table, local_table);
  for (size_t i = 0; i < full_table.specs.size(); ++i) {
    const ParamSpec &f = full_table.specs[i], &l = local_table.specs[i];
    for_each_run(tp_split_of(f.name, full), f, l, rank, tp, [&](int64_t from, int64_t to, int64_t n) {
      std::copy(full_w + from, full_w + from + n, local_w + to);
    });
  }
}

void tp_place(const GptConfig& full, const ParameterTable& full_table, float* full_w,
              const ParameterTable& local_table, const float* local_w, int64_t rank, int64_t tp, bool replicated) {
  check_same_names(full_table, local_table);
  for (size_t i = 0; i < full_table.specs.size(); ++i) {
    const ParamSpec &f = full_table.specs[i], &l = local_table.specs[i];
    const TpSplit split = tp_split_of(f.name, full);
    if (split == TpSplit::Replicated && !replicated) continue;
    for_each_run(split, f, l, rank, tp, [&](int64_t to, int64_t from, int64_t n) {
      std::copy(local_w + from, local_w + from + n, full_w + to);
    });
  }
}

void tp_unshard(const GptConfig& full, const ParameterTable& full_table, float* full_w,
                const ParameterTable& local_table, const std::vector<const float*>& locals) {
  const int64_t tp = static_cast<int64_t>(locals.size());
  for (int64_t r = 0; r < tp; ++r)
    tp_place(full, full_table, full_w, local_table, locals[static_cast<size_t>(r)], r, tp, r == 0);
}

}  // namespace laoyao::model
