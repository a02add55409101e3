#include "train/theoretical_memory.hpp"

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

}  // namespace laoyao::train
