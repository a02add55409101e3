// The dense recipes, shrunk to two small layers, train on the CPU with their exact architecture
// (RMSNorm, SwiGLU, GQA, RoPE with Llama 3 scaling, QK layernorm, tied or untied embeddings).
#include <gtest/gtest.h>

#include <cstdio>

#include "config/front_ends.hpp"
#include "train/trainer.hpp"

using namespace laoyao;

namespace {

train::TrainSummary train_recipe(const std::string& recipe, std::vector<std::string> extra) {
  config::RecipeInvocation inv;
  inv.recipe = recipe;
  inv.mode = "pretrain";
  inv.overrides = {"model.num_layers=2",       "model.hidden_size=64",        "model.ffn_hidden_size=128",
                   "model.num_attention_heads=4", "model.num_query_groups=2",  "model.kv_channels=16",
                   "dataset.seq_length=64",    "train.train_iters=40",        "train.global_batch_size=4",
                   "train.micro_batch_size=2", "scheduler.lr_warmup_iters=2", "optimizer.lr=3e-3",
                   "validation.eval_interval=40", "validation.eval_iters=1",  "tokenizer.vocab_size=128",
                   "logger.log_interval=10",   "checkpoint.save=null",        "checkpoint.load=null",
                   "model.context_parallel_size=1"};
  inv.overrides.insert(inv.overrides.end(), extra.begin(), extra.end());
  config::Resolved r = config::resolve_recipe(inv, 1);
  train::TrainOptions opt;
  opt.flavor = train::LogFlavor::kBridge;
  opt.out = std::tmpfile();
  auto s = train::train(r.cfg, r.validated.derived, opt);
  std::fclose(opt.out);
  return s;
}

void expect_learns(const train::TrainSummary& s) {
  ASSERT_EQ(s.lm_loss.size(), 40u);
  double head = (s.lm_loss[0] + s.lm_loss[1]) / 2, tail = (s.lm_loss[38] + s.lm_loss[39]) / 2;
  EXPECT_LT(tail, head - 1.0) << "first " << head << " last " << tail;
}

}  // namespace

TEST(RecipeTraining, Llama32_1bShape) { expect_learns(train_recipe("llama32_1b_pretrain_config", {})); }
TEST(RecipeTraining, Llama3_8bShape) { expect_learns(train_recipe("llama3_8b_pretrain_config", {})); }
TEST(RecipeTraining, Qwen3_8bShape) {
  expect_learns(train_recipe("qwen3_8b_pretrain_config",
                             {"tokenizer.tokenizer_type=NullTokenizer", "tokenizer.tokenizer_model=null"}));
}
