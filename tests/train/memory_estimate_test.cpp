// The memory estimate that refuses absurd sizes before anything is allocated: its parameter count
// is a lower bound of the model's real one (so a config that fits is never refused), and the
// refusal names the front end's settings and the figure.
#include "train/memory_estimate.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "config/front_ends.hpp"
#include "core/error.hpp"
#include "model/gpt_layout.hpp"
#include "train/run_setup.hpp"

using namespace laoyao;

namespace {

config::Resolved mlm(std::vector<std::string> args, int64_t world = 1) {
  const std::vector<std::string> common = {"--mock-data", "--tokenizer-type", "NullTokenizer", "--lr", "1e-4",
                                           "--train-iters", "10", "--eval-interval", "10", "--micro-batch-size", "2",
                                           "--seq-length", "256", "--max-position-embeddings", "256"};
  args.insert(args.end(), common.begin(), common.end());
  return config::resolve_mlm(args, world);
}

int64_t real_parameters(const config::Resolved& r) {
  return model::build_gpt_parameters(train::model_config(r.cfg, r.validated.derived)).table.total;
}

}  // namespace

// Biases and norms are left out of the estimate: it stays under the real count, within a few percent.
TEST(MemoryEstimate, ParametersAreALowerBoundOfTheModelsCount) {
  const std::vector<std::vector<std::string>> shapes = {
      {"--num-layers", "4", "--hidden-size", "256", "--num-attention-heads", "4", "--vocab-size", "1000"},
      {"--num-layers", "2", "--hidden-size", "512", "--num-attention-heads", "8", "--group-query-attention",
       "--num-query-groups", "2", "--swiglu", "--normalization", "RMSNorm", "--disable-bias-linear",
       "--untie-embeddings-and-output-weights", "--position-embedding-type", "rope", "--vocab-size", "5000"},
      {"--num-layers", "2", "--hidden-size", "128", "--num-attention-heads", "4", "--num-experts", "8",
       "--moe-router-topk", "2", "--moe-ffn-hidden-size", "256", "--swiglu", "--disable-bias-linear",
       "--vocab-size", "3000"}};
  for (const auto& s : shapes) {
    const config::Resolved r = mlm(s);
    const train::MemoryEstimate e = train::estimate_memory(r.cfg, r.validated.derived, false);
    const auto real = static_cast<long double>(real_parameters(r));
    SCOPED_TRACE(s[1] + " layers, hidden " + s[3]);
    EXPECT_LE(e.parameters, real);
    EXPECT_GT(e.parameters, 0.97L * real);
    EXPECT_EQ(e.bytes_per_parameter, 16);  // CPU: fp32 weights, gradients, two Adam moments
    EXPECT_EQ(e.state_bytes, e.parameters * 16);
    // bf16 on the GPU: bf16 weights beside the fp32 main copy.
    config::Resolved bf16 = mlm([&] { auto a = s; a.push_back("--bf16"); return a; }());
    EXPECT_EQ(train::estimate_memory(bf16.cfg, bf16.validated.derived, true).bytes_per_parameter, 18);
  }
}

TEST(MemoryEstimate, ARunLargerThanTheMemoryIsRefusedNamingItsFlags) {
  const config::Resolved r = mlm({"--num-layers", "2", "--hidden-size", "1024", "--num-attention-heads", "8",
                                  "--ffn-hidden-size", "65536", "--vocab-size", "1000"});
  const train::MemoryEstimate e = train::estimate_memory(r.cfg, r.validated.derived, false);
  const auto& c = r.cfg;
  const auto& d = r.validated.derived;
  EXPECT_NO_THROW(train::check_memory_fits(c, d, config::FrontEnd::MegatronLM, false, {e.total() * 1.01L}));
  EXPECT_NO_THROW(train::check_memory_fits(c, d, config::FrontEnd::MegatronLM, false, {}));  // unknown: no check
  try {
    train::check_memory_fits(c, d, config::FrontEnd::MegatronLM, false, {e.state_bytes * 0.5L});
    FAIL() << "fitted in half its state";
  } catch (const UsageError& err) {
    const std::string m = err.what();
    EXPECT_NE(m.find("the model needs at least"), std::string::npos) << m;
    EXPECT_NE(m.find("most of them the MLPs': --num-layers 2 x --hidden-size 1024 x --ffn-hidden-size 65536"),
              std::string::npos) << m;
    EXPECT_NE(m.find("more than this machine's"), std::string::npos) << m;
  }
  // Bridge spells the same setting by its field.
  try {
    train::check_memory_fits(c, d, config::FrontEnd::Bridge, false, {e.state_bytes * 0.5L});
    FAIL();
  } catch (const UsageError& err) {
    EXPECT_NE(std::string(err.what()).find("model.ffn_hidden_size=65536"), std::string::npos) << err.what();
  }
  // Just over the state, under the total: the sum is what is refused.
  try {
    train::check_memory_fits(c, d, config::FrontEnd::MegatronLM, false, {e.total() * 0.999L});
    FAIL();
  } catch (const UsageError& err) {
    EXPECT_NE(std::string(err.what()).find("the run needs at least"), std::string::npos) << err.what();
  }
}

// On the CUDA backend the state and activations are the GPU's: a model larger than the host's memory
// but not the GPU's runs; one larger than the GPU's is refused naming the GPU. The indices stay the
// host's.
TEST(MemoryEstimate, OnTheGpuTheStateIsCheckedAgainstTheGpusMemory) {
  const config::Resolved r = mlm({"--num-layers", "2", "--hidden-size", "1024", "--num-attention-heads", "8",
                                  "--ffn-hidden-size", "65536", "--vocab-size", "1000", "--bf16"});
  const auto& c = r.cfg;
  const auto& d = r.validated.derived;
  const train::MemoryEstimate e = train::estimate_memory(c, d, true);
  const long double gpu = e.state_bytes + e.activation_bytes;
  EXPECT_NO_THROW(train::check_memory_fits(c, d, config::FrontEnd::MegatronLM, true, {e.index_bytes * 2, gpu * 1.01L}));
  try {
    train::check_memory_fits(c, d, config::FrontEnd::MegatronLM, true, {gpu * 100, e.state_bytes * 0.5L});
    FAIL() << "fitted on a GPU of half its state";
  } catch (const UsageError& err) {
    EXPECT_NE(std::string(err.what()).find("more than this GPU's"), std::string::npos) << err.what();
  }
  try {
    train::check_memory_fits(c, d, config::FrontEnd::MegatronLM, true, {gpu * 100, e.state_bytes + e.activation_bytes * 0.5L});
    FAIL() << "state and activations fitted in less than their sum";
  } catch (const UsageError& err) {
    EXPECT_NE(std::string(err.what()).find("the run needs at least"), std::string::npos) << err.what();
  }
  EXPECT_THROW(train::check_memory_fits(c, d, config::FrontEnd::MegatronLM, true, {e.index_bytes * 0.5L, gpu * 2}),
               UsageError);
}

// data-samples builds no model: only the datasets' indices count.
TEST(MemoryEstimate, TheIndicesAloneBoundWhatDataSamplesBuilds) {
  const config::Resolved r = mlm({"--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
                                  "--ffn-hidden-size", "100000000", "--vocab-size", "1000"});
  const train::MemoryEstimate e = train::estimate_memory(r.cfg, r.validated.derived, false);
  ASSERT_GT(e.state_bytes, 1e11L);
  EXPECT_NO_THROW(train::check_dataset_indices_fit(r.cfg, r.validated.derived, config::FrontEnd::MegatronLM, 1e9L));
  EXPECT_THROW(train::check_dataset_indices_fit(r.cfg, r.validated.derived, config::FrontEnd::MegatronLM,
                                                e.index_bytes * 0.5L),
               UsageError);
}

// LoRA on Llama 3 8B (llama3_8b_peft_config) fits one 80 GB GPU: the frozen base holds its bf16
// weights, no gradients or Adam state; the same model trained in full (llama3_8b_sft_config, on one GPU) does not.
TEST(MemoryEstimate, PeftCountsTheFrozenBasesWeightsAlone) {
  const auto resolve = [](const std::string& recipe) {
    config::RecipeInvocation inv;
    inv.recipe = recipe;
    inv.overrides = {"tokenizer.vocab_size=128256", "dataset.dataset_root=/nonexistent/rows",
                     "checkpoint.pretrained_checkpoint=/nonexistent/hf", "model.tensor_model_parallel_size=1"};
    return config::resolve_recipe(inv, 1);
  };
  const config::Resolved peft = resolve("llama3_8b_peft_config"), sft = resolve("llama3_8b_sft_config");
  const train::MemoryEstimate lora = train::estimate_memory(peft.cfg, peft.validated.derived, true);
  EXPECT_EQ(lora.bytes_per_parameter, 2);
  EXPECT_GT(lora.parameters, 6.5e9L);  // the layers; the vocabulary is the tokenizer files'
  const long double h100 = 79.2L * 1024 * 1024 * 1024;
  EXPECT_NO_THROW(train::check_memory_fits(peft.cfg, peft.validated.derived, config::FrontEnd::Bridge, true,
                                           {0, h100}));
  EXPECT_EQ(train::estimate_memory(sft.cfg, sft.validated.derived, true).bytes_per_parameter, 18);
  EXPECT_THROW(train::check_memory_fits(sft.cfg, sft.validated.derived, config::FrontEnd::Bridge, true, {0, h100}),
               UsageError);
}
