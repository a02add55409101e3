#include "train/theoretical_memory.hpp"

#include <algorithm>
#include <cstdint>

#include "train/training_log.hpp"

namespace laoyao::train {
namespace {

constexpr double kMegabyte = 1024.0 * 1024.0;

// The model's sizes as both reports read them, in doubles (Python's ints are exact there).
struct Dims {
  double h, H, G, kv, V, L;
  int64_t moe_layers = 0;  // the MoE layers of --moe-layer-freq
  Dims(const model::GptConfig& g, const config::Derived& d)
      : h(static_cast<double>(g.hidden)), H(static_cast<double>(g.heads)), G(static_cast<double>(g.query_groups)),
        kv(static_cast<double>(g.kv_channels)), V(static_cast<double>(d.padded_vocab_size)),
        L(static_cast<double>(g.num_layers)) {
    for (int64_t l = 0; l < g.num_layers; ++l) moe_layers += g.is_moe_layer(l);
  }
  // A layer's attention parameters (QKV and the projection, no biases) in both reports' order.
  double attention() const { return 2.0 * h * h * ((1.0 + (G / H)) * ((kv * H) / h)); }
};

// The report's last line, with activations (its f-string ends in a newline).
std::string footprints_line(double weights_mb, double activation_mb) {
  using pyfmt::fixed;
  return "Theoretical memory footprints: weight and optimizer=" + fixed(weights_mb, 2) + " MB, activation=" +
         fixed(activation_mb, 2) + " MB, total=" + fixed(weights_mb + activation_mb, 2) + " MB\n";
}

// Table 2 of Korthikanti et al. (2022) with sequence parallelism and selective recomputation, as
// both reports' compute_activation_memory sums it for the first pipeline stage (before the split
// over the ranks): `per_layer` bytes for each of L layers, the embedding's input and its dropout,
// the output layer's input and the loss. Each term in their order of operations.
double sp_activation_bytes(double per_layer, double L, double s, double b, double h, double V) {
  constexpr double pp = 1.0;
  double activation = per_layer * L;
  activation += 8.0 * s * b * pp;                // the embedding's input
  activation += s * b * h * pp;                  // its dropout
  activation += s * b * h * 4.0 * (1.0 + (V / h));  // the output layer's input, the loss
  return activation;
}

}  // namespace

// Bridge's (utils/theoretical_memory_utils.py since its PR #3910), each expression in its order of
// operations.
std::vector<std::string> bridge_theoretical_memory_lines(const config::ConfigContainer& c, const config::Derived& d,
                                                         const model::GptConfig& g) {
  using pyfmt::fixed;
  const auto& m = c.model;
  const Dims dims(g, d);
  const double h = dims.h, V = dims.V, L = dims.L, ffn = static_cast<double>(g.ffn);
  const int64_t tp = m.tensor_model_parallel_size, ep = m.expert_model_parallel_size;
  const int64_t etp = m.expert_tensor_parallel_size.value_or(tp), pp = 1, cp = 1;
  const double factor = g.activation == model::Activation::SwiGLU ? 3.0 : 2.0;  // SwiGLU: three projections
  const double attention = dims.attention();
  const double layernorms = 4.0 * h, final_layernorm = 2.0 * h;  // LayerNorms with biases, whatever the norm
  const double dense_mlp = factor * h * ffn;
  const double shared_expert = factor * h * static_cast<double>(g.moe.shared_ffn);
  const double routed = factor * h * static_cast<double>(g.moe.ffn) * static_cast<double>(g.moe.num_experts);
  double dense_transformer = 0.0, routed_experts = 0.0;  // summed layer by layer, as Python's sum()
  for (int64_t l = 0; l < g.num_layers; ++l) {
    const bool is_moe = g.is_moe_layer(l);
    dense_transformer += attention + layernorms + (is_moe ? shared_expert : dense_mlp);
    routed_experts += is_moe ? routed : 0.0;
  }
  dense_transformer += final_layernorm;
  const double embedding_size = h * V;
  const double embeddings = g.tied_embeddings ? embedding_size : embedding_size + embedding_size;
  const double total = dense_transformer + routed_experts + embeddings;
  double embedding_shard = embedding_size / static_cast<double>(tp);
  if (!g.tied_embeddings) embedding_shard += embedding_size / static_cast<double>(tp);
  const double dense_shard = dense_transformer / static_cast<double>(pp * tp) + embedding_shard;
  auto bytes_per_parameter = [&](int64_t optimizer_shard) {
    return c.optimizer.use_distributed_optimizer ? 6.0 + (12.0 / static_cast<double>(std::max<int64_t>(1, optimizer_shard)))
                                                 : 18.0;
  };
  double weights = dense_shard * bytes_per_parameter(d.data_parallel_size * cp);
  std::vector<std::string> out = {"Number of dense and embedding parameters in billions: " +
                                  fixed((dense_transformer + embeddings) / 1e9, 2)};
  if (routed_experts > 0) out.push_back("Number of routed expert parameters in billions: " + fixed(routed_experts / 1e9, 2));
  out.push_back("Total number of parameters in billions: " + fixed(total / 1e9, 2));
  out.push_back("Number of dense and embedding parameters in most loaded shard in billions: " + fixed(dense_shard / 1e9, 4));
  if (routed_experts > 0) {
    const double routed_shard = routed_experts / static_cast<double>(pp * ep * etp);
    const int64_t expert_optimizer_shard = std::max<int64_t>(1, (d.data_parallel_size * tp * cp) / std::max<int64_t>(1, ep * etp));
    weights += routed_shard * bytes_per_parameter(expert_optimizer_shard);
    out.push_back("Number of routed expert parameters in most loaded shard in billions: " + fixed(routed_shard / 1e9, 4));
  }
  weights /= kMegabyte;
  if (!m.sequence_parallel || m.recompute_granularity.value_or("") != "selective") {
    out.push_back("Theoretical memory footprints: weight and optimizer=" + fixed(weights, 2) + " MB");
    return out;
  }
  // Table 2 of Korthikanti et al. (2022), the MLP's width the layers' mean (an MoE layer's its top-k
  // experts' and shared expert's), first pipeline stage.
  const int64_t moe_layers = dims.moe_layers;
  const double moe_width = static_cast<double>(moe_layers * (g.moe.ffn * g.moe.topk + g.moe.shared_ffn));
  const double ffn_ratio = (static_cast<double>((g.num_layers - moe_layers) * g.ffn) + moe_width) / (L * h);
  const double s = static_cast<double>(m.seq_length), b = static_cast<double>(c.train.micro_batch_size.value_or(1));
  double activation = sp_activation_bytes(s * b * h * (18.0 + (4.0 * ffn_ratio)), L, s, b, h, V);
  activation = activation / static_cast<double>(tp * cp) / kMegabyte;
  out.push_back(footprints_line(weights, activation));
  return out;
}

// Megatron-LM's, each expression in its order of operations (Python ints exact in doubles here).
std::vector<std::string> mlm_theoretical_memory_lines(const config::ConfigContainer& c, const config::Derived& d,
                                                      const model::GptConfig& g) {
  using pyfmt::fixed;
  const auto& m = c.model;
  const Dims dims(g, d);
  const double h = dims.h, V = dims.V, L = dims.L;
  const double tp = static_cast<double>(m.tensor_model_parallel_size), pp = 1.0;
  const bool moe = g.moe.num_experts > 0;
  const double experts = moe ? static_cast<double>(g.moe.num_experts) : 1.0;
  const double gated = g.activation == model::Activation::SwiGLU ? 3.0 / 2.0 : 1.0;
  const double shared_ffn = static_cast<double>(g.moe.shared_ffn);
  const double moe_layers = static_cast<double>(dims.moe_layers);
  const double dense_layers = L - moe_layers, moe_ffn = moe ? static_cast<double>(g.moe.ffn) : 0.0;
  const double norm_size = g.norm == model::Norm::RMSNorm ? 1.0 : 2.0;  // RMSNorm has no bias

  const double attention = dims.attention();
  const double embedding_size = h * V, final_layernorm = norm_size * h;
  const double embedding_layers = g.tied_embeddings ? embedding_size : 2.0 * embedding_size;
  const double dense_mlp = 2.0 * h * static_cast<double>(g.ffn) * gated;
  const double shared_expert = 2.0 * h * shared_ffn * gated;
  const double routed = 2.0 * h * moe_ffn * experts * gated;
  const double active_routed = moe ? 2.0 * h * moe_ffn * static_cast<double>(g.moe.topk) * gated : 0.0;
  const double layernorms = 2.0 * h * norm_size;
  const double router = moe ? h * experts + (g.add_bias_linear ? experts : 0.0) : 0.0;
  const double dense_layer = attention + dense_mlp + layernorms;
  const double moe_layer = attention + shared_expert + routed + layernorms + router;
  const double active_moe_layer = attention + shared_expert + active_routed + layernorms + router;
  const double block = dense_layer * dense_layers + moe_layer * moe_layers + final_layernorm;
  const double active_block = dense_layer * dense_layers + active_moe_layer * moe_layers + final_layernorm;
  const double total = block + embedding_layers, active = active_block + embedding_layers;
  std::vector<std::string> out = {
      "Number of parameters in transformer block in billions:  " + fixed(block / 1e9, 2),
      "Number of active parameters in transformer block in billions:  " + fixed(active_block / 1e9, 2),
      "Number of parameters in embedding layers in billions: " + fixed(embedding_layers / 1e9, 2),
      "Total number of parameters in billions: " + fixed(total / 1e9, 2),
      "Total number of active parameters in billions: " + fixed(active / 1e9, 2)};

  // Each part on the most loaded rank: TP-sharded, replicated, and the routed experts over ETP x EP.
  const int64_t etp = m.expert_tensor_parallel_size.value_or(m.tensor_model_parallel_size);
  const int64_t ep = m.expert_model_parallel_size;
  const int64_t expert_dp = d.world_size / (etp * ep);
  const double tp_block = (attention + dense_mlp) * dense_layers + (attention + shared_expert) * moe_layers;
  const double replicated_block = layernorms * dense_layers + (layernorms + router) * moe_layers + final_layernorm;
  const double expert_block = routed * moe_layers;
  double tp_shard = ((tp_block / pp) + embedding_size) / tp;
  const double replicated_shard = replicated_block / pp;
  const double expert_shard = (expert_block / pp) / static_cast<double>(etp * ep);
  double most_loaded = tp_shard + replicated_shard + expert_shard;
  if (!g.tied_embeddings) tp_shard += embedding_size / tp, most_loaded += embedding_size / tp;
  out.push_back("Number of parameters in most loaded shard in billions: " + fixed(most_loaded / 1e9, 4));
  auto bytes_per_parameter = [&](int64_t dp) {
    return c.optimizer.use_distributed_optimizer ? 6.0 + (12.0 / static_cast<double>(dp)) : 18.0;
  };
  const double weights = ((tp_shard + replicated_shard) * bytes_per_parameter(d.data_parallel_size) +
                          expert_shard * bytes_per_parameter(expert_dp)) /
                         kMegabyte;

  const double s = static_cast<double>(m.seq_length), b = static_cast<double>(c.train.micro_batch_size.value_or(1));
  double activation = 0.0;
  if (m.sequence_parallel && m.recompute_granularity.value_or("") == "selective") {
    out.push_back("compute_activation_memory with SP");
    const double per_layer = (s * b * h) * (18.0 + (4.0 * (static_cast<double>(g.ffn) / h)));
    out.push_back("Activation memory footprint per transformer layer: " + fixed(per_layer / kMegabyte / tp, 1) +
                  " MB");
    activation = sp_activation_bytes(per_layer, L, s, b, h, V) / tp;
  } else {
    out.push_back("compute_activation_memory_without_sp");
    const double per_layer = s * b * h * (10.0 + (24.0 / tp));
    out.push_back("Activation memory footprint per transformer layer (precise, without SP): " +
                  fixed(per_layer / kMegabyte, 1) + " MB");
    activation = per_layer * L;
    activation += 8.0 * s * b * pp;
    activation += s * b * h * pp;
    const double logits = s * b * V / tp, final_ln_output = s * b * h;
    activation += (logits + final_ln_output) * 2.0;
    activation *= 1.05;  // its allowance for temporaries
  }
  activation /= kMegabyte;
  out.push_back(footprints_line(weights, activation));
  return out;
}

}  // namespace laoyao::train
