// The theoretical memory reports: Bridge's lines for three shapes, Megatron-LM's for four, the
// expected text computed with each one's formulas in Python floats (report_theoretical_memory,
// verbose; Megatron-LM's as core 0.20 has them, Bridge's as its PR #3910 does).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "config/config_container.hpp"
#include "config/front_ends.hpp"
#include "train/run_setup.hpp"
#include "train/theoretical_memory.hpp"

using namespace laoyao;

// Bridge's lines for a config (the model built as the run builds it).
std::vector<std::string> bridge_lines(const config::ConfigContainer& c, const config::Derived& d) {
  return train::bridge_theoretical_memory_lines(c, d, train::model_config(c, d));
}

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
  EXPECT_EQ(bridge_lines(c, d),
            (std::vector<std::string>{"Number of dense and embedding parameters in billions: 1.24",
                                      "Total number of parameters in billions: 1.24",
                                      "Number of dense and embedding parameters in most loaded shard in billions: 1.2359",
                                      "Theoretical memory footprints: weight and optimizer=21215.32 MB"}));
}

// 64 experts as wide as --ffn-hidden-size (top-2) at TP=2 with sequence parallelism, selective
// recomputation and the distributed optimizer over 4 data-parallel ranks: the routed experts apart
// (over ETP = TP, their optimizer state over 4 ranks), the activations with the top-k width.
TEST(TheoreticalMemory, BridgeFullFormWithActivations) {
  config::ConfigContainer c;
  c.model.num_layers = 24, c.model.hidden_size = 1024, c.model.num_attention_heads = 16;
  c.model.kv_channels = 64, c.model.num_query_groups = 4, c.model.ffn_hidden_size = 3072;
  c.model.num_moe_experts = 64, c.model.gated_linear_unit = true, c.model.activation_func = "silu";
  c.model.add_bias_linear = false;
  c.model.share_embeddings_and_output_weights = false, c.model.seq_length = 4096;
  c.model.tensor_model_parallel_size = 2, c.model.sequence_parallel = true;
  c.model.recompute_granularity = "selective";
  c.train.micro_batch_size = 2;
  c.optimizer.use_distributed_optimizer = true;
  config::Derived d;
  d.padded_vocab_size = 151936, d.data_parallel_size = 4;
  EXPECT_EQ(bridge_lines(c, d),
            (std::vector<std::string>{"Number of dense and embedding parameters in billions: 0.37",
                                      "Number of routed expert parameters in billions: 14.50",
                                      "Total number of parameters in billions: 14.87",
                                      "Number of dense and embedding parameters in most loaded shard in billions: 0.1871",
                                      "Number of routed expert parameters in most loaded shard in billions: 7.2478",
                                      "Theoretical memory footprints: weight and optimizer=63813.81 MB, "
                                      "activation=6426.03 MB, total=70239.84 MB\n"}));
  // The flagship's experts (384 wide, top-8) over EP=2 too: their optimizer state over 2 ranks.
  c.model.moe_ffn_hidden_size = 384, c.model.moe_router_topk = 8, c.model.expert_model_parallel_size = 2;
  d.padded_vocab_size = 152064;
  EXPECT_EQ(bridge_lines(c, d),
            (std::vector<std::string>{"Number of dense and embedding parameters in billions: 0.37",
                                      "Number of routed expert parameters in billions: 1.81",
                                      "Total number of parameters in billions: 2.19",
                                      "Number of dense and embedding parameters in most loaded shard in billions: 0.1872",
                                      "Number of routed expert parameters in most loaded shard in billions: 0.4530",
                                      "Theoretical memory footprints: weight and optimizer=6790.93 MB, "
                                      "activation=5276.03 MB, total=12066.96 MB\n"}));
}

namespace {

// Megatron-LM's lines for a command line's model, run on `world` ranks.
std::vector<std::string> mlm_lines(std::vector<std::string> args, int64_t world = 1) {
  const std::vector<std::string> common = {"--mock-data", "--tokenizer-type", "NullTokenizer", "--bf16", "--lr", "1e-4",
                                           "--train-iters", "1", "--eval-interval", "1", "--position-embedding-type", "rope"};
  args.insert(args.end(), common.begin(), common.end());
  const config::Resolved r = config::resolve_mlm(args, world);
  return train::mlm_theoretical_memory_lines(r.cfg, r.validated.derived,
                                             train::model_config(r.cfg, r.validated.derived));
}

}  // namespace

// Llama-3.2-1B's shape on one GPU: RMSNorm's single weight, GQA, SwiGLU, tied embeddings; the
// activation estimate without sequence parallelism.
TEST(TheoreticalMemory, MegatronLmDenseLlamaShape) {
  EXPECT_EQ(mlm_lines({"--num-layers", "16", "--hidden-size", "2048", "--num-attention-heads", "32",
                       "--group-query-attention", "--num-query-groups", "8", "--kv-channels", "64",
                       "--ffn-hidden-size", "8192", "--swiglu", "--normalization", "RMSNorm", "--disable-bias-linear",
                       "--seq-length", "8192", "--max-position-embeddings", "8192", "--micro-batch-size", "1",
                       "--global-batch-size", "1", "--vocab-size", "128256"}),
            (std::vector<std::string>{
                "Number of parameters in transformer block in billions:  0.97",
                "Number of active parameters in transformer block in billions:  0.97",
                "Number of parameters in embedding layers in billions: 0.26",
                "Total number of parameters in billions: 1.24", "Total number of active parameters in billions: 1.24",
                "Number of parameters in most loaded shard in billions: 1.2358",
                "compute_activation_memory_without_sp",
                "Activation memory footprint per transformer layer (precise, without SP): 544.0 MB",
                "Theoretical memory footprints: weight and optimizer=21214.16 MB, activation=11293.87 MB, "
                "total=32508.03 MB\n"}));
}

// The flagship's model on 8 ranks, TP=2 with sequence parallelism and selective recomputation, EP=2
// (the experts' data-parallel size 2 against the others' 4) and the distributed optimizer: total
// and active parameters (top-8 of 64), routers counted, Table 2's activations; the vocabulary
// padded to a multiple of 128 x TP (152064).
TEST(TheoreticalMemory, MegatronLmFlagshipMoeWithExpertParallelism) {
  EXPECT_EQ(mlm_lines({"--num-layers", "24", "--hidden-size", "1024", "--num-attention-heads", "16",
                       "--group-query-attention", "--num-query-groups", "4", "--kv-channels", "64",
                       "--ffn-hidden-size", "3072", "--swiglu", "--normalization", "RMSNorm", "--disable-bias-linear",
                       "--untie-embeddings-and-output-weights", "--seq-length", "4096", "--max-position-embeddings",
                       "4096", "--micro-batch-size", "2", "--global-batch-size", "8", "--vocab-size", "151936",
                       "--num-experts", "64", "--moe-ffn-hidden-size", "384", "--moe-router-topk", "8",
                       "--tensor-model-parallel-size", "2", "--sequence-parallel", "--expert-model-parallel-size", "2",
                       "--recompute-granularity", "selective", "--use-distributed-optimizer"},
                      8),
            (std::vector<std::string>{
                "Number of parameters in transformer block in billions:  1.88",
                "Number of active parameters in transformer block in billions:  0.29",
                "Number of parameters in embedding layers in billions: 0.31",
                "Total number of parameters in billions: 2.19", "Total number of active parameters in billions: 0.60",
                "Number of parameters in most loaded shard in billions: 0.6418", "compute_activation_memory with SP",
                "Activation memory footprint per transformer layer: 120.0 MB",
                "Theoretical memory footprints: weight and optimizer=6804.43 MB, activation=5276.03 MB, "
                "total=12080.46 MB\n"}));
}

// GPT-2 124M: LayerNorm (weight and bias), biases, MHA, GeLU, no MoE.
TEST(TheoreticalMemory, MegatronLmGpt2) {
  const auto lines = mlm_lines({"--num-layers", "12", "--hidden-size", "768", "--num-attention-heads", "12",
                                "--ffn-hidden-size", "3072", "--seq-length", "1024", "--max-position-embeddings",
                                "1024", "--micro-batch-size", "16", "--global-batch-size", "16", "--vocab-size",
                                "50304"});
  ASSERT_EQ(lines.size(), 9u);
  EXPECT_EQ(lines[5], "Number of parameters in most loaded shard in billions: 0.1236");
  EXPECT_EQ(lines[7], "Activation memory footprint per transformer layer (precise, without SP): 408.0 MB");
  EXPECT_EQ(lines[8], "Theoretical memory footprints: weight and optimizer=2121.85 MB, activation=6829.33 MB, "
                      "total=8951.18 MB\n");
}

// A dense first layer (--moe-layer-freq as a list) and shared experts: the dense layer counted with
// --ffn-hidden-size, the MoE layers with their shared expert and router.
TEST(TheoreticalMemory, MegatronLmDenseFirstLayerAndSharedExperts) {
  const auto lines = mlm_lines({"--num-layers", "4", "--hidden-size", "256", "--num-attention-heads", "8",
                                "--group-query-attention", "--num-query-groups", "2", "--kv-channels", "32",
                                "--ffn-hidden-size", "1024", "--swiglu", "--normalization", "RMSNorm",
                                "--disable-bias-linear", "--untie-embeddings-and-output-weights", "--seq-length", "512",
                                "--max-position-embeddings", "512", "--micro-batch-size", "4", "--global-batch-size",
                                "4", "--vocab-size", "32000", "--num-experts", "8", "--moe-ffn-hidden-size", "128",
                                "--moe-router-topk", "2", "--moe-layer-freq", "[0,1,1,1]",
                                "--moe-shared-expert-intermediate-size", "256"});
  ASSERT_EQ(lines.size(), 9u);
  EXPECT_EQ(lines[5], "Number of parameters in most loaded shard in billions: 0.0208");
  EXPECT_EQ(lines[8], "Theoretical memory footprints: weight and optimizer=356.77 MB, activation=204.24 MB, "
                      "total=561.01 MB\n");
}
