#include "train/memory_estimate.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "train/run_setup.hpp"

namespace laoyao::train {
namespace {

using ld = long double;

// One term of a sum, with the settings that drive it (for the message).
struct Part {
  ld value = 0;
  std::string drivers;
};

Part largest(const std::vector<Part>& parts) {
  return *std::max_element(parts.begin(), parts.end(), [](const Part& a, const Part& b) { return a.value < b.value; });
}

std::string figure(ld v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2Lg", v);
  return buf;
}

std::string gib(ld bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1Lf GiB", bytes / (1024.0L * 1024.0L * 1024.0L));
  return buf;
}

// The settings as the user's front end spells them: "--hidden-size 1024" or "model.hidden_size=1024".
struct Namer {
  config::FrontEnd fe;
  std::string operator()(const std::string& path, int64_t v) const {
    const std::string name = config::display_name(path, fe);
    return name + (name.rfind("--", 0) == 0 ? " " : "=") + std::to_string(v);
  }
};

int64_t moe_layer_count(const config::ModelConfig& m) {
  if (!m.num_moe_experts || *m.num_moe_experts <= 0) return 0;
  const std::vector<bool> layers = moe_layer_pattern(m);
  return std::count(layers.begin(), layers.end(), true);
}

struct Shape {
  ld h, L, heads, groups, kv, ffn, V, b, s, tp;
  bool swiglu;
  explicit Shape(const config::ConfigContainer& c, const config::Derived& d) {
    const auto& m = c.model;
    h = static_cast<ld>(m.hidden_size), L = static_cast<ld>(m.num_layers);
    heads = static_cast<ld>(m.num_attention_heads);
    groups = static_cast<ld>(m.num_query_groups.value_or(m.num_attention_heads));
    kv = static_cast<ld>(m.kv_channels.value_or(m.hidden_size / std::max<int64_t>(1, m.num_attention_heads)));
    ffn = static_cast<ld>(m.ffn_hidden_size.value_or(4 * m.hidden_size));
    V = static_cast<ld>(std::max<int64_t>(1, d.padded_vocab_size));
    b = static_cast<ld>(c.train.micro_batch_size.value_or(1));
    s = static_cast<ld>(m.seq_length) / static_cast<ld>(std::max<int64_t>(1, m.context_parallel_size));
    tp = static_cast<ld>(std::max<int64_t>(1, m.tensor_model_parallel_size));
    swiglu = m.gated_linear_unit;
  }
  // An MLP of width f: fc1 (two halves with SwiGLU) and fc2.
  ld mlp(ld f) const { return h * f * (swiglu ? 2 : 1) + f * h; }
};

std::string vocabulary(const config::ConfigContainer& c, const config::Derived& d, const Namer& name) {
  // The model's own vocabulary is used as is; else it is the tokenizer's, padded (apply_vocab_rule).
  const bool own = c.model.vocab_size && !c.model.should_pad_vocab;
  std::string from = own                      ? name("model.vocab_size", *c.model.vocab_size)
                     : c.tokenizer.vocab_size ? name("tokenizer.vocab_size", *c.tokenizer.vocab_size)
                                              : "the tokenizer's";
  return "a vocabulary of " + std::to_string(d.padded_vocab_size) + " (" + from + ", padded)";
}

std::vector<Part> parameter_parts(const config::ConfigContainer& c, const config::Derived& d, const Shape& x,
                                  const Namer& name) {
  const auto& m = c.model;
  const ld moe_layers = static_cast<ld>(moe_layer_count(m));
  const ld experts = static_cast<ld>(m.num_moe_experts.value_or(0));
  const ld expert_shards = static_cast<ld>(std::max<int64_t>(1, m.expert_model_parallel_size) *
                                           std::max<int64_t>(1, m.expert_tensor_parallel_size.value_or(1)));
  const std::string layers = name("model.num_layers", m.num_layers), hidden = name("model.hidden_size", m.hidden_size);
  std::vector<Part> parts;
  parts.push_back({x.V * x.h * (m.share_embeddings_and_output_weights ? 1 : 2) / x.tp,
                   "the word embeddings': " + hidden + " x " + vocabulary(c, d, name)});
  if (m.position_embedding_type == "learned_absolute") {
    const int64_t positions = m.max_position_embeddings.value_or(m.seq_length);
    parts.push_back({static_cast<ld>(positions) * x.h,
                     "the position table's: " + hidden + " x " +
                         (m.max_position_embeddings ? name("model.max_position_embeddings", positions)
                                                    : name("model.seq_length", positions))});
  }
  const ld attention = x.L * (x.h * (x.heads + 2 * x.groups) * x.kv + x.heads * x.kv * x.h) / x.tp;
  parts.push_back({attention, "the attention's: " + layers + " x " + hidden + " x " +
                                  name("model.num_attention_heads", m.num_attention_heads) + " heads of " +
                                  name("model.kv_channels", m.kv_channels.value_or(0))});
  const int64_t ffn = static_cast<int64_t>(x.ffn);
  parts.push_back({(x.L - moe_layers) * x.mlp(x.ffn) / x.tp,
                   "the MLPs': " + layers + " x " + hidden + " x " + name("model.ffn_hidden_size", ffn)});
  if (moe_layers > 0) {
    const int64_t moe_ffn = m.moe_ffn_hidden_size.value_or(ffn);
    parts.push_back({moe_layers * experts * x.mlp(static_cast<ld>(moe_ffn)) / expert_shards,
                     "the routed experts': " + name("model.num_moe_experts", *m.num_moe_experts) + " x " +
                         name("model.moe_ffn_hidden_size", moe_ffn) + " x " + hidden + " in each of " +
                         std::to_string(static_cast<int64_t>(moe_layers)) + " MoE layer(s)"});
    const int64_t shared = m.moe_shared_expert_intermediate_size.value_or(0);
    parts.push_back({moe_layers * (x.mlp(static_cast<ld>(shared)) / x.tp + x.h * experts),
                     "the shared experts' and routers': " + name("model.moe_shared_expert_intermediate_size", shared) +
                         ", " + name("model.num_moe_experts", *m.num_moe_experts) + " x " + hidden});
  }
  return parts;
}

std::vector<Part> activation_parts(const config::ConfigContainer& c, const config::Derived& d, const Shape& x,
                                   bool cuda, const Namer& name) {
  const auto& m = c.model;
  const bool half = cuda && (m.bf16 || m.fp16);  // the CPU backend computes in fp32
  const ld value_bytes = half ? 2 : 4, tokens = x.b * x.s;
  const std::string layers = name("model.num_layers", m.num_layers);
  std::vector<Part> parts;
  parts.push_back({x.L * tokens * x.h * value_bytes / (m.sequence_parallel ? x.tp : 1),
                   "each layer's input: " + layers + " x " + name("model.hidden_size", m.hidden_size)});
  // The CPU reference attention keeps its softmax probabilities for the backward; the CUDA
  // backend's fused attention keeps none.
  if (!cuda)
    parts.push_back({x.L * x.b * (x.heads / x.tp) * x.s * x.s * 4,
                     "the attention probabilities: " + layers + " x " +
                         name("model.num_attention_heads", m.num_attention_heads) + " heads x " +
                         name("model.seq_length", m.seq_length) + " squared"});
  parts.push_back({tokens * x.V / x.tp * value_bytes, "the logits: " + vocabulary(c, d, name)});
  return parts;
}

ld bytes_per_parameter(const config::ConfigContainer& c, const config::Derived& d, bool cuda) {
  const bool half = cuda && (c.model.bf16 || c.model.fp16);
  const ld weights = half ? 2 : 4, grads = 4, main = half ? 4 : 0;
  // PEFT trains only its adapters (a small fraction, left out of this lower bound): the frozen base
  // certainly holds its weights alone.
  if (c.peft.scheme) return weights;
  const ld state = c.optimizer.optimizer == "adam" ? 8 : (c.optimizer.sgd_momentum != 0 ? 4 : 0);
  // The distributed optimizer shards the main weights and the state: at most over every rank.
  const ld shards = c.optimizer.use_distributed_optimizer ? static_cast<ld>(std::max<int64_t>(1, d.world_size)) : 1;
  return weights + grads + (main + state) / shards;
}

ld sum(const std::vector<Part>& parts) {
  ld total = 0;
  for (const auto& p : parts) total += p.value;
  return total;
}

}  // namespace

MemoryEstimate estimate_memory(const config::ConfigContainer& c, const config::Derived& d, bool cuda) {
  const Namer name{config::FrontEnd::Bridge};
  const Shape x(c, d);
  MemoryEstimate e;
  e.parameters = sum(parameter_parts(c, d, x, name));
  e.bytes_per_parameter = bytes_per_parameter(c, d, cuda);
  e.state_bytes = e.parameters * e.bytes_per_parameter;
  e.activation_bytes = sum(activation_parts(c, d, x, cuda, name));
  if (!c.dataset.dataset_name && !c.dataset.dataset_root)
    e.index_bytes = 24.0L * static_cast<ld>(d.train_samples + d.valid_samples + d.test_samples);
  return e;
}

long double peak_resident_bytes() {
  rusage u{};
  if (getrusage(RUSAGE_SELF, &u) != 0) return 0;
  return static_cast<ld>(u.ru_maxrss) * 1024;  // kilobytes on Linux
}

long double physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<ld>(pages) * static_cast<ld>(page) : 0;
}

namespace {

void check_indices(const config::ConfigContainer& c, const config::Derived& d, config::FrontEnd fe, ld index_bytes,
                   ld memory_bytes) {
  if (index_bytes <= memory_bytes) return;
  const Namer name{fe};
  const auto& t = c.train;
  const std::string budget =
      t.train_iters ? name("train.train_iters", *t.train_iters) + " x " +
                          name("train.global_batch_size", t.global_batch_size.value_or(1))
                    : name("train.train_samples", t.train_samples.value_or(0));
  throw UsageError("the datasets' sample and shuffle indices need at least " + figure(index_bytes) + " bytes (" +
                   figure(static_cast<ld>(d.train_samples)) + " training samples from " + budget + ", " +
                   figure(static_cast<ld>(d.valid_samples + d.test_samples)) + " for validation and test from " +
                   name("validation.eval_iters", c.validation.eval_iters) + "; 24 bytes a sample): more than this "
                   "machine's " + gib(memory_bytes) + " of memory");
}

}  // namespace

void check_dataset_indices_fit(const config::ConfigContainer& c, const config::Derived& d, config::FrontEnd fe,
                               long double memory_bytes) {
  if (memory_bytes > 0) check_indices(c, d, fe, estimate_memory(c, d, false).index_bytes, memory_bytes);
}

void check_memory_fits(const config::ConfigContainer& c, const config::Derived& d, config::FrontEnd fe, bool cuda,
                       MemoryLimits limits) {
  const Namer name{fe};
  const Shape x(c, d);
  const MemoryEstimate e = estimate_memory(c, d, cuda);
  // The model's state and a micro-batch's activations are the GPU's on the CUDA backend, the host's
  // (with the indices) on the CPU.
  const long double memory_bytes = cuda ? limits.device : limits.host;
  const std::string machine = (cuda ? ": more than this GPU's " : ": more than this machine's ") + gib(memory_bytes) +
                              " of memory";
  if (memory_bytes > 0 && e.state_bytes > memory_bytes) {
    const Part top = largest(parameter_parts(c, d, x, name));
    throw UsageError("the model needs at least " + figure(e.state_bytes) +
                     " bytes for its weights, gradients and optimizer state (" + figure(e.parameters) +
                     " parameters on this rank x " + figure(e.bytes_per_parameter) + " bytes; most of them " +
                     top.drivers + ")" + machine);
  }
  const std::string tokens = name("train.micro_batch_size", c.train.micro_batch_size.value_or(1)) + " x " +
                             name("model.seq_length", c.model.seq_length) + " tokens";
  if (memory_bytes > 0 && e.activation_bytes > memory_bytes) {
    const Part top = largest(activation_parts(c, d, x, cuda, name));
    throw UsageError("one micro-batch needs at least " + figure(e.activation_bytes) + " bytes of activations (" +
                     tokens + "; most of it " + top.drivers + ")" + machine);
  }
  if (limits.host > 0) check_indices(c, d, fe, e.index_bytes, limits.host);
  if (memory_bytes <= 0) return;
  if (cuda && e.state_bytes + e.activation_bytes > memory_bytes)
    throw UsageError("the run needs at least " + figure(e.state_bytes + e.activation_bytes) + " bytes: " +
                     figure(e.state_bytes) + " for the model's weights, gradients and optimizer state and " +
                     figure(e.activation_bytes) + " for one micro-batch's activations (" + tokens + ")" + machine);
  if (!cuda && e.total() > memory_bytes)
    throw UsageError("the run needs at least " + figure(e.total()) + " bytes: " + figure(e.state_bytes) +
                     " for the model's weights, gradients and optimizer state, " + figure(e.activation_bytes) +
                     " for one micro-batch's activations (" + tokens + ") and " + figure(e.index_bytes) +
                     " for the datasets' indices" + machine);
}

}  // namespace laoyao::train
