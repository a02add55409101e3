// Helpers shared by the config tests.
#pragma once
#include <string>
#include <vector>

#include "config/fields.hpp"

namespace laoyao::config::test {

// Paths of the fields whose values differ ("" when equal), for readable failures.
inline std::vector<std::string> differing_fields(ConfigContainer a, ConfigContainer b) {
  auto fa = fields_of(a), fb = fields_of(b);
  std::vector<std::string> out;
  for (size_t k = 0; k < fa.size(); ++k)
    if (!(fa[k].get() == fb[k].get()))
      out.push_back(fa[k].path + ": " + to_override_text(fa[k].get()) + " vs " + to_override_text(fb[k].get()));
  return out;
}

inline Value get(ConfigContainer& c, const std::string& path) {
  auto fs = fields_of(c);
  Field* f = find_field(fs, path);
  if (!f) throw std::runtime_error("no field " + path);
  return f->get();
}

// "Billion laughs": nine levels of aliases of aliases (a: &a [x,...], b: &b [*a,...], ...), 342
// bytes that are 9^9 scalars when copied out.
inline std::string billion_laughs_yaml() {
  std::string text = "a: &a [x,x,x,x,x,x,x,x,x]\n";
  std::string prev = "a";
  for (char k = 'b'; k <= 'i'; ++k) {
    text += std::string(1, k) + ": &" + k + " [";
    for (int r = 0; r < 9; ++r) text += (r ? ",*" : "*") + prev;
    text += "]\n";
    prev = std::string(1, k);
  }
  return text;
}

// The seed command lines of the issue (shared/reference/megatron-bridge.md §4.2).
inline std::vector<std::string> seed_mlm_args() {
  return {"--num-layers", "2", "--hidden-size", "256", "--num-attention-heads", "4", "--ffn-hidden-size", "1024",
          "--seq-length", "512", "--max-position-embeddings", "512", "--micro-batch-size", "4",
          "--global-batch-size", "32", "--train-iters", "10", "--eval-iters", "2", "--eval-interval", "10",
          "--mock-data", "--bf16", "--use-mcore-models", "--tokenizer-type", "NullTokenizer", "--vocab-size",
          "32000", "--lr", "3e-4", "--min-lr", "3e-5", "--seed", "1234", "--log-interval", "1"};
}

inline std::vector<std::string> seed_bridge_overrides() {
  return {"model.num_layers=2", "model.hidden_size=256", "model.num_attention_heads=4", "model.ffn_hidden_size=1024",
          "model.seq_length=512", "dataset.seq_length=512", "train.train_iters=10", "train.global_batch_size=32",
          "train.micro_batch_size=4", "validation.eval_interval=10", "validation.eval_iters=2", "optimizer.lr=3e-4",
          "optimizer.min_lr=3e-5", "scheduler.lr_warmup_iters=1", "scheduler.lr_decay_iters=10", "rng.seed=1234",
          "logger.log_interval=1"};
}

// The two-GPU pair: TP 2 with sequence parallelism, 4 layers, seq 1024, vocab 1024, lr 1e-4.
inline std::vector<std::string> seed_mlm_args_tp2() {
  return {"--tensor-model-parallel-size", "2", "--sequence-parallel", "--num-layers", "4", "--hidden-size", "256",
          "--num-attention-heads", "4", "--ffn-hidden-size", "1024", "--seq-length", "1024",
          "--max-position-embeddings", "1024", "--micro-batch-size", "4", "--global-batch-size", "32",
          "--train-iters", "10", "--eval-iters", "2", "--eval-interval", "10", "--mock-data", "--bf16",
          "--use-mcore-models", "--tokenizer-type", "NullTokenizer", "--vocab-size", "1024", "--lr", "1e-4",
          "--min-lr", "1e-5", "--seed", "1234", "--log-interval", "1"};
}

inline std::vector<std::string> seed_bridge_overrides_tp2() {
  return {"model.tensor_model_parallel_size=2", "model.sequence_parallel=true", "model.num_layers=4",
          "model.hidden_size=256", "model.num_attention_heads=4", "model.ffn_hidden_size=1024",
          "model.seq_length=1024", "dataset.seq_length=1024", "train.train_iters=10", "train.global_batch_size=32",
          "train.micro_batch_size=4", "validation.eval_interval=10", "validation.eval_iters=2", "optimizer.lr=1e-4",
          "optimizer.min_lr=1e-5", "scheduler.lr_warmup_iters=1", "scheduler.lr_decay_iters=10", "rng.seed=1234",
          "logger.log_interval=1", "tokenizer.vocab_size=1024"};
}

}  // namespace laoyao::config::test
