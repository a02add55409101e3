// Bridge's theoretical memory report: its lines for two shapes, the expected text computed with
// Bridge's formulas in Python floats (report_theoretical_memory, verbose).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "config/config_container.hpp"
#include "train/theoretical_memory.hpp"

using namespace laoyao;

// A Llama-3.2-1B shape (tied embeddings, SwiGLU, GQA): the short form, without sequence
// parallelism and selective recomputation.
TEST(TheoreticalMemory, BridgeShortFormForALlamaShape) {
  config::ConfigContainer c;
  c.model.num_layers = 16, c.model.hidden_size = 2048, c.model.num_attention_heads = 32;
  c.model.kv_channels = 64, c.model.num_query_groups = 8, c.model.ffn_hidden_size = 8192;
  c.model.gated_linear_unit = true, c.model.activation_func = "silu";
  c.model.share_embeddings_and_output_weights = true, c.model.seq_length = 8192;
  config::Derived d;
  d.padded_vocab_size = 128256;
  EXPECT_EQ(train::bridge_theoretical_memory_lines(c, d),
            (std::vector<std::string>{"Number of parameters in transformer layers in billions:  0.97",
                                      "Number of parameters in embedding layers in billions: 0.26",
                                      "Total number of parameters in billions: 1.24",
                                      "Number of parameters in most loaded shard in billions: 1.2359",
                                      "Theoretical memory footprints: weight and optimizer=21215.32 MB"}));
}

// The flagship's shape at TP=2 with sequence parallelism, selective recomputation and the
// distributed optimizer over 4 data-parallel ranks: the activations too (Bridge's MLP term
// counts ffn_hidden_size once per expert).
TEST(TheoreticalMemory, BridgeFullFormWithActivations) {
  config::ConfigContainer c;
  c.model.num_layers = 24, c.model.hidden_size = 1024, c.model.num_attention_heads = 16;
  c.model.kv_channels = 64, c.model.num_query_groups = 4, c.model.ffn_hidden_size = 3072;
  c.model.num_moe_experts = 64, c.model.gated_linear_unit = true, c.model.activation_func = "silu";
  c.model.share_embeddings_and_output_weights = false, c.model.seq_length = 4096;
  c.model.tensor_model_parallel_size = 2, c.model.sequence_parallel = true;
  c.model.recompute_granularity = "selective";
  c.train.micro_batch_size = 2;
  c.optimizer.use_distributed_optimizer = true;
  config::Derived d;
  d.padded_vocab_size = 151936, d.data_parallel_size = 4;
  EXPECT_EQ(train::bridge_theoretical_memory_lines(c, d),
            (std::vector<std::string>{"Number of parameters in transformer layers in billions:  14.56",
                                      "Number of parameters in embedding layers in billions: 0.31",
                                      "Total number of parameters in billions: 14.87",
                                      "Number of parameters in most loaded shard in billions: 7.4348",
                                      "Activation memory footprint per transformer layer: 120.0 MB",
                                      "Theoretical memory footprints: weight and optimizer=63813.81 MB, "
                                      "activation=5274.03 MB, total=69087.84 MB\n"}));
}
