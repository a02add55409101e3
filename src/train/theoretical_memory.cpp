#include "train/theoretical_memory.hpp"

#include <algorithm>
#include <cstdint>

#include "train/training_log.hpp"

namespace laoyao::train {

// Each expression in Bridge's order of operations (Python floats), so the printed digits agree.
std::vector<std::string> bridge_theoretical_memory_lines(const config::ConfigContainer& c, const config::Derived& d) {
  using pyfmt::fixed;
  constexpr double kMegabyte = 1024.0 * 1024.0;
  const auto& m = c.model;
  const double L = static_cast<double>(m.num_layers), h = static_cast<double>(m.hidden_size);
  const double H = static_cast<double>(m.num_attention_heads);
  const double kv = static_cast<double>(m.kv_channels.value_or(m.hidden_size / m.num_attention_heads));
  const double G = static_cast<double>(m.num_query_groups.value_or(m.num_attention_heads));
  const double ffn = static_cast<double>(m.ffn_hidden_size.value_or(4 * m.hidden_size));
  const double experts = static_cast<double>(m.num_moe_experts.value_or(1));
  const double gated = m.gated_linear_unit && m.activation_func == "silu" ? 3.0 / 2.0 : 1.0;
  const double V = static_cast<double>(d.padded_vocab_size), tp = static_cast<double>(m.tensor_model_parallel_size);
  const double pp = 1.0;
  const double query_ratio = (kv * H) / h;
  const double layers = static_cast<double>(2 * m.num_layers * m.hidden_size * m.hidden_size) *
                        ((1.0 + G / H) * query_ratio + (ffn / h) * experts * gated + 2.0 / h + 1.0 / (L * h));
  const double embedding = h * V;
  const double embeddings = m.share_embeddings_and_output_weights ? embedding : 2.0 * embedding;
  std::vector<std::string> out = {
      "Number of parameters in transformer layers in billions:  " + fixed(layers / 1e9, 2),
      "Number of parameters in embedding layers in billions: " + fixed(embeddings / 1e9, 2),
      "Total number of parameters in billions: " + fixed((layers + embeddings) / 1e9, 2)};
  double most_loaded = (layers / pp + embedding) / tp;
  if (!m.share_embeddings_and_output_weights) most_loaded += embedding / tp;
  out.push_back("Number of parameters in most loaded shard in billions: " + fixed(most_loaded / 1e9, 4));
  const double bytes_per_parameter =
      c.optimizer.use_distributed_optimizer ? 6.0 + 12.0 / static_cast<double>(d.data_parallel_size) : 18.0;
  const double weights = most_loaded * bytes_per_parameter / kMegabyte;
  if (!m.sequence_parallel || m.recompute_granularity.value_or("") != "selective") {
    out.push_back("Theoretical memory footprints: weight and optimizer=" + fixed(weights, 2) + " MB");
    return out;
  }
  // Table 2 of Korthikanti et al. (2022), as Bridge's compute_activation_memory (first stage).
  const double s = static_cast<double>(m.seq_length), b = static_cast<double>(c.train.micro_batch_size.value_or(1));
  const int64_t sbh = m.seq_length * c.train.micro_batch_size.value_or(1) * m.hidden_size;
  double activation = static_cast<double>(sbh) * (18.0 + 4.0 * (ffn / h));
  out.push_back("Activation memory footprint per transformer layer: " + fixed(activation / kMegabyte / tp, 1) + " MB");
  activation *= L;
  activation += 8.0 * s * b * pp;                                     // the embedding's input
  activation += s * b * h * pp;                                       // its dropout
  activation += static_cast<double>(sbh) * 4.0 * (1.0 + V / h);       // the output layer's input, the loss
  const double activations = activation / tp / kMegabyte;
  out.push_back("Theoretical memory footprints: weight and optimizer=" + fixed(weights, 2) + " MB, activation=" +
                fixed(activations, 2) + " MB, total=" + fixed(weights + activations, 2) + " MB\n");
  return out;
}

// Megatron-LM's, each expression in its order of operations (Python ints exact in doubles here).
std::vector<std::string> mlm_theoretical_memory_lines(const config::ConfigContainer& c, const config::Derived& d,
                                                      const model::GptConfig& g) {
  using pyfmt::fixed;
  constexpr double kMegabyte = 1024.0 * 1024.0;
  const auto& m = c.model;
  const double h = static_cast<double>(g.hidden), H = static_cast<double>(g.heads);
  const double G = static_cast<double>(g.query_groups), kv = static_cast<double>(g.kv_channels);
  const double V = static_cast<double>(d.padded_vocab_size), L = static_cast<double>(g.num_layers);
  const double tp = static_cast<double>(m.tensor_model_parallel_size), pp = 1.0;
  const bool moe = g.moe.num_experts > 0;
  const double experts = moe ? static_cast<double>(g.moe.num_experts) : 1.0;
  const double gated = g.activation == model::Activation::SwiGLU ? 3.0 / 2.0 : 1.0;
  const double shared_ffn = static_cast<double>(g.moe.shared_ffn);
  const double moe_layers = moe ? static_cast<double>(std::count(g.moe.layers.begin(), g.moe.layers.end(), true)) : 0.0;
  const double dense_layers = L - moe_layers, moe_ffn = moe ? static_cast<double>(g.moe.ffn) : 0.0;
  const double norm_size = g.norm == model::Norm::RMSNorm ? 1.0 : 2.0;  // RMSNorm has no bias

  const double query_ratio = (kv * H) / h;
  const double attention = 2.0 * h * h * ((1.0 + (G / H)) * query_ratio);
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
    activation = (s * b * h) * (18.0 + (4.0 * (static_cast<double>(g.ffn) / h)));
    out.push_back("Activation memory footprint per transformer layer: " + fixed(activation / kMegabyte / tp, 1) +
                  " MB");
    activation *= L;
    activation += 8.0 * s * b * pp;                   // the embedding's input
    activation += s * b * h * pp;                     // its dropout
    activation += s * b * h * 4.0 * (1.0 + (V / h)); // the output layer's input and the loss
    activation /= tp;
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
  out.push_back("Theoretical memory footprints: weight and optimizer=" + fixed(weights, 2) + " MB, activation=" +
                fixed(activation, 2) + " MB, total=" + fixed(weights + activation, 2) + " MB\n");
  return out;
}

}  // namespace laoyao::train
