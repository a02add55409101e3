// Megatron-Core's tensor-parallel layers on CPU ranks against the unsharded layers: threads play
// the ranks of a tensor-parallel group (Gloo), each holding its shards; the outputs and gradients
// they produce, put together, are the single-rank layer's (fp32, up to the order of the sums).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "core/runtime_options.hpp"
#include "core/error.hpp"
#include "core/rng.hpp"
#include "dist/parallel_layout.hpp"
#include "dist/process_group.hpp"
#include "kernels/cpu/ops.hpp"
#include "model/gpt_ep.hpp"
#include "model/gpt_layout.hpp"
#include "model/gpt_model.hpp"
#include "model/gpt_tp.hpp"
#include "model/tensor_parallel.hpp"

using namespace laoyao;
using namespace laoyao::model;

namespace {

std::vector<float> randn(int64_t n, const char* stream, double scale = 1.0) {
  Rng rng(42, stream);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<float>(scale * rng.normal());
  return v;
}

void expect_close(const float* got, const float* want, int64_t n, const std::string& what) {
  for (int64_t i = 0; i < n; ++i)
    ASSERT_NEAR(got[i], want[i], 1e-4 * (1.0 + std::abs(want[i]))) << what << " [" << i << "]";
}

// The zero counts of two runs that sum in different orders may differ by gradient elements that
// are zero in exact arithmetic but not in fp32 (a key bias's: softmax ignores a constant added to
// all of a query's scores), which land on 0.0f in one order and not the other. Returns how many
// elements are exactly zero in one of got/want and not the other; each must be rounding-level
// (|value| <= 1e-6 * scale, scale a gradient norm) in both.
int64_t rounding_zero_flips(const float* got, const float* want, int64_t n, double scale, const std::string& what) {
  int64_t flips = 0;
  for (int64_t i = 0; i < n; ++i) {
    if ((got[i] == 0.0f) == (want[i] == 0.0f)) continue;
    ++flips;
    EXPECT_LE(std::abs(got[i]), 1e-6 * scale) << what << " [" << i << "]: zero in one run only, and not rounding";
    EXPECT_LE(std::abs(want[i]), 1e-6 * scale) << what << " [" << i << "]: zero in one run only, and not rounding";
  }
  return flips;
}

// Runs fn(rank, group) on `ranks` threads, each with its own Gloo group over all of them.
void run_ranks(int ranks, const std::function<void(int, dist::ProcessGroup*)>& fn) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("laoyao_tp_test_" + std::to_string(::getpid()) + "_" + std::to_string(ranks));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const ScopedRuntimeOptions rendezvous([&](RuntimeOptions& o) { o.rendezvous_dir = dir.string(); });
  std::vector<std::string> errors(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      try {
        dist::RankEnv env;
        env.rank = r, env.world_size = ranks;
        auto group = dist::make_cpu_process_group(env, 1.0);
        fn(r, group.get());
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  std::filesystem::remove_all(dir);
  for (int r = 0; r < ranks; ++r) ASSERT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
}

}  // namespace

TEST(TensorParallel, ShardsSplitEvenlyAndRefuseTheRest) {
  EXPECT_EQ(tp::shard_of(12, 2, 3).start, 8);
  EXPECT_EQ(tp::shard_of(12, 2, 3).size, 4);
  EXPECT_THROW(tp::shard_of(10, 0, 4), Error);
  const std::vector<float> m = {0, 1, 2, 3, 4, 5, 6, 7};  // [2, 4]
  EXPECT_EQ(tp::shard_rows(m.data(), 2, 4, {1, 1}), (std::vector<float>{4, 5, 6, 7}));
  EXPECT_EQ(tp::shard_cols(m.data(), 2, 4, {2, 2}), (std::vector<float>{2, 3, 6, 7}));
}

// An MLP as Megatron splits it: fc1 column-parallel, fc2 row-parallel; forward and backward.
TEST(TensorParallel, ColumnThenRowParallelLinearsMatchTheUnshardedMlp) {
  if (!dist::gloo_built()) GTEST_SKIP() << "built without Gloo";
  const int64_t T = 5, K = 6, F = 8, N = 7;
  const auto x = randn(T * K, "tp.x"), w1 = randn(F * K, "tp.w1", 0.3), b1 = randn(F, "tp.b1", 0.3);
  const auto w2 = randn(N * F, "tp.w2", 0.3), b2 = randn(N, "tp.b2", 0.3), dout = randn(T * N, "tp.dout");
  std::vector<float> h(T * F), out(T * N), dh(T * F), dx(T * K), dw1(F * K, 0.f), db1(F, 0.f), dw2(N * F, 0.f),
      db2(N, 0.f);
  kernels::cpu::linear_forward(x.data(), w1.data(), b1.data(), h.data(), T, K, F);
  kernels::cpu::linear_forward(h.data(), w2.data(), b2.data(), out.data(), T, F, N);
  kernels::cpu::linear_backward(h.data(), w2.data(), dout.data(), dh.data(), dw2.data(), db2.data(), T, F, N);
  kernels::cpu::linear_backward(x.data(), w1.data(), dh.data(), dx.data(), dw1.data(), db1.data(), T, K, F);

  for (const int t : {2, 4}) {
    SCOPED_TRACE("TP=" + std::to_string(t));
    run_ranks(t, [&](int r, dist::ProcessGroup* g) {
      const tp::Shard s = tp::shard_of(F, r, t);
      const auto w1_l = tp::shard_rows(w1.data(), F, K, s), b1_l = tp::shard_rows(b1.data(), F, 1, s);
      const auto w2_l = tp::shard_cols(w2.data(), N, F, s);
      std::vector<float> h_l(T * s.size), o(T * N), dh_l(T * s.size), dx_r(T * K), dw1_l(s.size * K, 0.f),
          db1_l(s.size, 0.f), dw2_l(N * s.size, 0.f), db2_r(N, 0.f);
      tp::column_parallel_forward(x.data(), w1_l.data(), b1_l.data(), h_l.data(), T, K, s.size);
      tp::row_parallel_forward(h_l.data(), w2_l.data(), b2.data(), o.data(), T, s.size, N, g);
      tp::row_parallel_backward(h_l.data(), w2_l.data(), dout.data(), dh_l.data(), dw2_l.data(), db2_r.data(), T,
                                s.size, N);
      tp::column_parallel_backward(x.data(), w1_l.data(), dh_l.data(), dx_r.data(), dw1_l.data(), db1_l.data(), T, K,
                                   s.size, g);
      expect_close(o.data(), out.data(), T * N, "output (every rank)");
      expect_close(dx_r.data(), dx.data(), T * K, "d input (every rank)");
      expect_close(db2_r.data(), db2.data(), N, "fc2 bias grad (replicated)");
      expect_close(h_l.data(), tp::shard_cols(h.data(), T, F, s).data(), T * s.size, "fc1 output shard");
      expect_close(dw1_l.data(), tp::shard_rows(dw1.data(), F, K, s).data(), s.size * K, "fc1 weight grad shard");
      expect_close(db1_l.data(), tp::shard_rows(db1.data(), F, 1, s).data(), s.size, "fc1 bias grad shard");
      expect_close(dw2_l.data(), tp::shard_cols(dw2.data(), N, F, s).data(), N * s.size, "fc2 weight grad shard");
    });
  }
}

// The word embedding and the loss over a vocabulary split over the group, targets in every shard.
TEST(TensorParallel, VocabParallelEmbeddingAndCrossEntropyMatchTheUnshardedOnes) {
  if (!dist::gloo_built()) GTEST_SKIP() << "built without Gloo";
  const int64_t T = 9, C = 4, V = 12;
  const auto table = randn(V * C, "tp.table"), logits = randn(T * V, "tp.logits", 3.0), dy = randn(T * C, "tp.dy");
  const auto dloss = randn(T, "tp.dloss");
  std::vector<int64_t> ids(T), targets(T);
  for (int64_t t = 0; t < T; ++t) ids[t] = (t * 5) % V, targets[t] = (t * 7 + 3) % V;
  std::vector<float> emb(T * C), dtable(V * C, 0.f), loss(T), lse(T), dlogits = logits;
  kernels::cpu::embedding_forward(ids.data(), table.data(), emb.data(), T, C, V, /*accumulate=*/false);
  kernels::cpu::embedding_backward(ids.data(), dy.data(), dtable.data(), T, C);
  kernels::cpu::cross_entropy_forward(logits.data(), targets.data(), loss.data(), lse.data(), T, V);
  kernels::cpu::cross_entropy_backward(dlogits.data(), targets.data(), lse.data(), dloss.data(), T, V);

  for (const int t : {2, 3}) {
    SCOPED_TRACE("TP=" + std::to_string(t));
    run_ranks(t, [&](int r, dist::ProcessGroup* g) {
      const tp::Shard s = tp::shard_of(V, r, t);
      const auto table_l = tp::shard_rows(table.data(), V, C, s);
      std::vector<float> e(T * C), dtable_l(s.size * C, 0.f), l(T), stats(2 * T);
      tp::vocab_parallel_embedding_forward(ids.data(), table_l.data(), e.data(), T, C, s, g);
      tp::vocab_parallel_embedding_backward(ids.data(), dy.data(), dtable_l.data(), T, C, s);
      expect_close(e.data(), emb.data(), T * C, "embedding (every rank)");
      expect_close(dtable_l.data(), tp::shard_rows(dtable.data(), V, C, s).data(), s.size * C, "table grad shard");
      auto z = tp::shard_cols(logits.data(), T, V, s);
      tp::vocab_parallel_cross_entropy_forward(z.data(), targets.data(), l.data(), stats.data(), T, s, g);
      tp::vocab_parallel_cross_entropy_backward(z.data(), targets.data(), stats.data(), dloss.data(), T, s);
      expect_close(l.data(), loss.data(), T, "loss (every rank)");
      expect_close(z.data(), tp::shard_cols(dlogits.data(), T, V, s).data(), T * s.size, "logit grad shard");
    });
  }
}

// ---- the whole GptModel at TP=2 and 4 against TP=1 (the same full weights, split as Megatron-Core
// splits them): every rank's per-token losses, and the ranks' gradients put back together.
namespace {

void random_full_weights(const ParameterTable& t, float* w) {
  Rng rng(11, "tp.weights");
  for (const auto& p : t.specs)
    for (int64_t i = 0; i < p.numel; ++i)  // biases and norm weights too: a zero would hide a bug
      w[p.offset + i] = static_cast<float>((p.init == Init::Ones ? 1.0 : 0.0) + 0.1 * rng.normal());
}

// Two sequences of 12 random tokens and labels, and a loss gradient for each token.
struct TestBatch {
  static constexpr int64_t b = 2, s = 12, T = b * s;
  std::vector<int64_t> tokens = std::vector<int64_t>(T), labels = std::vector<int64_t>(T),
                       positions = std::vector<int64_t>(T);
  std::vector<float> dloss;
  TestBatch(int64_t vocab, uint64_t seed, const char* stream, const char* dloss_stream)
      : dloss(randn(T, dloss_stream, 0.1)) {
    Rng rng(seed, stream);
    for (int64_t t = 0; t < T; ++t) {
      tokens[t] = static_cast<int64_t>(rng.next_u64() % static_cast<uint64_t>(vocab));
      labels[t] = static_cast<int64_t>(rng.next_u64() % static_cast<uint64_t>(vocab));
      positions[t] = t % s;
    }
  }
  std::vector<int32_t> key_start;  // documents (GptConfig::document_attention), else empty
  MicroBatch micro_batch() const {
    return {b, s, tokens.data(), labels.data(), positions.data(), key_start.empty() ? nullptr : key_start.data()};
  }
};

void check_tensor_parallel_model(const GptConfig& c, const std::vector<int>& sizes) {
  TestBatch batch(c.vocab, 3, "tp.batch", "tp.model.dloss");
  if (c.document_attention)  // documents of 5, 1 and 6 tokens, then 8 and 4
    batch.key_start = {0, 0, 0, 0, 0, 5, 6, 6, 6, 6, 6, 6, 0, 0, 0, 0, 0, 0, 0, 0, 8, 8, 8, 8};
  const int64_t T = TestBatch::T;
  const std::vector<float>& dloss = batch.dloss;
  const MicroBatch mb = batch.micro_batch();
  const DropoutKey key{1234, 77, true};
  GptModel ref(c);
  random_full_weights(ref.table(), ref.weights());
  std::vector<float> want_loss(T);
  ref.zero_grads();
  ref.forward(mb, key, want_loss.data());
  ref.backward(dloss.data());

  for (const int tp : sizes) {
    SCOPED_TRACE("TP=" + std::to_string(tp));
    std::vector<std::vector<float>> grads(static_cast<size_t>(tp)), losses(static_cast<size_t>(tp));
    std::vector<int64_t> zeros(static_cast<size_t>(tp));
    ParameterTable local_table;
    run_ranks(tp, [&](int r, dist::ProcessGroup* g) {
      GptModel m(c, g);
      tp_shard(c, ref.table(), ref.weights(), m.table(), m.weights(), r, tp);
      losses[r].resize(T);
      m.zero_grads();
      m.forward(mb, key, losses[r].data());
      m.backward(dloss.data());
      m.finalize_grads();  // sequence parallel: the norms' gradients summed over the group
      // (At table offsets: PEFT's frozen base has none, zeros here.)
      grads[r].assign(static_cast<size_t>(m.num_parameters()), 0.0f);
      std::copy(m.grads(), m.grads() + m.num_trainable(), grads[r].begin() + m.table().trainable_offset);
      // The whole model's norms and zero count, on every rank (replicated tensors counted once).
      EXPECT_NEAR(m.grad_norm(), ref.grad_norm(), 1e-4 * ref.grad_norm()) << "rank " << r;
      EXPECT_NEAR(m.params_norm(), ref.params_norm(), 1e-5 * ref.params_norm()) << "rank " << r;
      zeros[r] = m.count_zero_grads();  // checked below, against the gathered gradients
      if (r == 0) local_table = m.table();
    });
    for (int r = 0; r < tp; ++r) expect_close(losses[r].data(), want_loss.data(), T, "loss, rank " + std::to_string(r));
    std::vector<float> got(static_cast<size_t>(ref.num_parameters()));
    std::vector<const float*> locals;
    for (const auto& gr : grads) locals.push_back(gr.data());
    tp_unshard(c, ref.table(), got.data(), local_table, locals);
    const int64_t from = ref.table().trainable_offset;
    for (const auto& p : ref.table().specs)
      if (!p.frozen)
        expect_close(got.data() + p.offset, ref.grads() + (p.offset - from), p.numel, "grad of " + p.name);
    const int64_t flips =
        rounding_zero_flips(got.data() + from, ref.grads(), ref.num_trainable(), ref.grad_norm(), "grads");
    for (int r = 0; r < tp; ++r) EXPECT_LE(std::abs(zeros[r] - ref.count_zero_grads()), flips) << "rank " << r;
  }
}

GptConfig tiny_gpt() {
  GptConfig c;
  c.num_layers = 2, c.hidden = 32, c.heads = 4, c.query_groups = 4, c.kv_channels = 8, c.ffn = 64, c.vocab = 64;
  c.max_positions = 16, c.hidden_dropout = 0.1, c.attention_dropout = 0.1;
  return c;
}

}  // namespace

TEST(TensorParallel, GptWithDropoutMatchesOneRank) {
  if (!dist::gloo_built()) GTEST_SKIP() << "built without Gloo";
  check_tensor_parallel_model(tiny_gpt(), {2, 4});
}

TEST(TensorParallel, LlamaStyleWithQkNormMatchesOneRank) {
  if (!dist::gloo_built()) GTEST_SKIP() << "built without Gloo";
  GptConfig c = tiny_gpt();
  c.norm = Norm::RMSNorm, c.activation = Activation::SwiGLU, c.positions = Positions::Rope;
  c.query_groups = 2, c.tied_embeddings = false, c.add_bias_linear = false, c.add_qkv_bias = false;
  c.qk_layernorm = true;
  check_tensor_parallel_model(c, {2});
}

// Sequence parallelism: norms, dropout and residuals on each rank's share of every sequence.
TEST(TensorParallel, SequenceParallelGptAndLlamaMatchOneRank) {
  if (!dist::gloo_built()) GTEST_SKIP() << "built without Gloo";
  GptConfig c = tiny_gpt();
  c.sequence_parallel = true;
  check_tensor_parallel_model(c, {2, 4});
  c.norm = Norm::RMSNorm, c.activation = Activation::SwiGLU, c.positions = Positions::Rope;
  c.query_groups = 2, c.tied_embeddings = false, c.add_bias_linear = false, c.add_qkv_bias = false;
  c.qk_layernorm = true;
  check_tensor_parallel_model(c, {2});
}

// Multi-latent attention: the up projections split by heads, the down projections and latent norms
// whole on every rank with their gradients summed over the group (finalize_grads).
TEST(TensorParallel, MultiLatentAttentionMatchesOneRank) {
  if (!dist::gloo_built()) GTEST_SKIP() << "built without Gloo";
  GptConfig c = tiny_gpt();
  c.norm = Norm::RMSNorm, c.activation = Activation::SwiGLU, c.positions = Positions::Rope;
  c.tied_embeddings = false, c.add_bias_linear = false, c.add_qkv_bias = false;
  MlaSpec m;
  m.q_lora_rank = 12, m.kv_lora_rank = 10, m.qk_head_dim = 6, m.qk_pos_emb_head_dim = 4, m.v_head_dim = 5;
  m.softmax_scale = 0.3;
  c.mla = m;
  c.kv_channels = m.v_head_dim;
  check_tensor_parallel_model(c, {2, 4});
  c.mla->q_lora_rank = 0;
  c.sequence_parallel = true;
  check_tensor_parallel_model(c, {2});
}

// Multi-token prediction: the embedding, norms and eh_proj of its layers whole on every rank, their
// transformer layers split as the decoder's, the output layer vocabulary-parallel.
TEST(TensorParallel, MultiTokenPredictionMatchesOneRank) {
  if (!dist::gloo_built()) GTEST_SKIP() << "built without Gloo";
  GptConfig c = tiny_gpt();
  c.mtp_num_layers = 2, c.mtp_loss_scaling_factor = 0.5;
  check_tensor_parallel_model(c, {2, 4});
  c.sequence_parallel = true;
  c.norm = Norm::RMSNorm, c.activation = Activation::SwiGLU, c.positions = Positions::Rope;
  c.query_groups = 2, c.tied_embeddings = false, c.add_bias_linear = false, c.add_qkv_bias = false;
  check_tensor_parallel_model(c, {2});
}

// LoRA: the column-parallel layers' adapters with linear_in whole and linear_out split as the
// layer's rows, the row-parallel ones' with linear_in split as the layer's columns and linear_out
// whole; the whole adapters' gradients summed over the group (finalize_grads).
TEST(TensorParallel, LoraMatchesOneRank) {
  if (!dist::gloo_built()) GTEST_SKIP() << "built without Gloo";
  GptConfig c = tiny_gpt();
  LoraSpec lora;
  lora.dim = 4, lora.alpha = 8, lora.dropout = 0.2;
  c.lora = lora;
  check_tensor_parallel_model(c, {2, 4});
  c.sequence_parallel = true;
  c.norm = Norm::RMSNorm, c.activation = Activation::SwiGLU, c.positions = Positions::Rope;
  c.query_groups = 2, c.tied_embeddings = false, c.add_bias_linear = false, c.add_qkv_bias = false;
  check_tensor_parallel_model(c, {2});
}

// --reset-attention-mask: each rank's heads attend within the documents (sequence parallel too).
TEST(TensorParallel, DocumentsMatchOneRank) {
  if (!dist::gloo_built()) GTEST_SKIP() << "built without Gloo";
  GptConfig c = tiny_gpt();
  c.document_attention = true;
  check_tensor_parallel_model(c, {2});
  c.sequence_parallel = true;
  check_tensor_parallel_model(c, {4});
}

// Mixture of Experts under tensor parallelism (sequence parallel, the experts split over the same
// ranks): a dense first layer, routed SwiGLU experts with a shared expert, aux, sequence-aux and z
// losses, dropout; then GeLU experts with the sigmoid router and group-limited routing. Every
// rank's losses and the gathered gradients are the single rank's.
GptConfig tiny_moe() {
  GptConfig c = tiny_gpt();
  c.norm = Norm::RMSNorm, c.activation = Activation::SwiGLU, c.positions = Positions::Rope;
  c.query_groups = 4, c.tied_embeddings = false, c.add_bias_linear = false, c.add_qkv_bias = false;
  c.qk_layernorm = true, c.sequence_parallel = true;
  c.moe.num_experts = 4, c.moe.topk = 2, c.moe.ffn = 16, c.moe.shared_ffn = 8, c.moe.layers = {false, true};
  c.moe.aux_loss_coeff = 0.05, c.moe.seq_aux_loss_coeff = 0.02, c.moe.z_loss_coeff = 0.01;
  return c;
}

TEST(TensorParallel, MixtureOfExpertsWithSequenceParallelismMatchesOneRank) {
  if (!dist::gloo_built()) GTEST_SKIP() << "built without Gloo";
  GptConfig c = tiny_moe();
  check_tensor_parallel_model(c, {2, 4});
  c.activation = Activation::GeluErf, c.moe.sigmoid = true, c.moe.num_experts = 8, c.moe.topk = 4;
  c.moe.num_groups = 4, c.moe.group_topk = 2, c.moe.shared_ffn = 0, c.moe.layers = {true, true};
  c.ffn = 65;  // no layer has a dense MLP: its size need not split
  check_tensor_parallel_model(c, {2});
}

// Token dropping under tensor parallelism: Megatron's ranks each route their share of the
// sequence and drop within it. Every rank here routes the gathered sequence and drops by the same
// shares, so TP ranks reproduce a one-rank model told the TP size (moe.tensor_parallel), for both
// policies; that model's losses differ from the whole sequence's dropping (the shares matter).
TEST(TensorParallel, MixtureOfExpertsDropsByEachRanksShare) {
  if (!dist::gloo_built()) GTEST_SKIP() << "built without Gloo";
  for (const bool by_position : {false, true}) {
    SCOPED_TRACE(by_position ? "position policy" : "probs policy");
    GptConfig c = tiny_moe();
    c.moe.capacity_factor = 0.5, c.moe.drop_by_position = by_position;
    for (const int tp : {2, 4}) {
      c.moe.tensor_parallel = tp;
      check_tensor_parallel_model(c, {tp});
    }
    // The one-rank model's losses with and without the shares.
    const int64_t b = 2, s = 12, T = b * s;
    std::vector<int64_t> tokens(T), positions(T);
    for (int64_t t = 0; t < T; ++t) tokens[t] = (7 * t + 3) % c.vocab, positions[t] = t % s;
    const MicroBatch mb{b, s, tokens.data(), tokens.data(), positions.data()};
    std::vector<std::vector<float>> losses;
    for (const int64_t shares : {int64_t{1}, int64_t{2}}) {
      c.moe.tensor_parallel = shares;
      GptModel m(c);
      random_full_weights(m.table(), m.weights());
      losses.emplace_back(T);
      m.forward(mb, DropoutKey{1234, 77, false}, losses.back().data());
    }
    EXPECT_NE(losses[0], losses[1]) << "dropping by two shares changed nothing: the test would not see it";
  }
}

// Whole experts under tensor parallelism (--expert-tensor-parallel-size 1, Megatron-Core's
// "parallel folding"): the expert-parallel groups are folded across the TP ranks (consecutive
// ranks), each rank holds whole experts, and only its share of the sequence goes to them. TP=2 x
// EP=2 on 2 ranks (the EP group is the TP group) and TP=4 x EP=2 on 4 (two EP groups in one TP
// group; the ranks holding the same experts sum their gradients), TP=4 x EP=4, and TP=2 without
// EP (every TP rank holds every expert): every rank's losses are the
// single rank's, its gradients are its part of the single rank's, and the norms count every part
// once.
namespace {

void check_whole_experts(const GptConfig& c, int tp, int ep) {
  const TestBatch batch(c.vocab, 5, "tp.whole_experts.batch", "tp.whole_experts.dloss");
  const int64_t T = TestBatch::T;
  const std::vector<float>& dloss = batch.dloss;
  const MicroBatch mb = batch.micro_batch();
  const DropoutKey key{1234, 77, true};
  GptConfig ranks_cfg = c;
  ranks_cfg.moe.expert_parallel = ep, ranks_cfg.moe.expert_tensor_parallel = 1, ranks_cfg.moe.tensor_parallel = tp;
  GptModel ref(ep_whole_config(c));
  random_full_weights(ref.table(), ref.weights());
  std::vector<float> want_loss(T);
  ref.zero_grads();
  ref.forward(mb, key, want_loss.data());
  ref.backward(dloss.data());
  const dist::ParallelLayout layout(tp, {tp, 1, 1});
  std::vector<int64_t> zeros(static_cast<size_t>(tp)), flips(static_cast<size_t>(tp));
  run_ranks(tp, [&](int r, dist::ProcessGroup* world) {
    dist::RankEnv env;
    env.rank = r, env.world_size = tp;
    // (Without expert parallelism the trainer makes no expert groups: every TP rank holds every expert.)
    std::unique_ptr<dist::ProcessGroup> ep_group, edp_group;
    if (ep > 1) {
      ep_group = dist::make_cpu_process_group(env, 1.0, layout.folded_ep_group(r, ep), "ep");
      edp_group = dist::make_cpu_process_group(env, 1.0, layout.folded_expert_dp_group(r, ep), "edp");
    }
    GptModel m(ranks_cfg, world, ep_group.get(), edp_group.get());
    ASSERT_TRUE(m.experts_folded());
    ASSERT_EQ(m.expert_dp_group(), nullptr);  // finalize_grads sums the experts' gradients itself
    // This rank's part of a whole-model buffer: its experts (at full shape), then its TP shard.
    const ParameterTable mid = build_gpt_parameters(ranks_cfg).table;
    auto part = [&](const float* whole, float* local) {
      std::vector<float> experts(static_cast<size_t>(mid.total));
      ep_shard(ref.table(), whole, mid, experts.data(), m.ep_rank(), ranks_cfg.moe.local_experts());
      tp_shard(ranks_cfg, mid, experts.data(), m.table(), local, r, tp);
    };
    part(ref.weights(), m.weights());
    std::vector<float> losses(T), want_grads(static_cast<size_t>(m.num_parameters()));
    m.zero_grads();
    m.forward(mb, key, losses.data());
    m.backward(dloss.data());
    m.finalize_grads();
    expect_close(losses.data(), want_loss.data(), T, "loss, rank " + std::to_string(r));
    part(ref.grads(), want_grads.data());
    for (const auto& p : m.table().specs)
      expect_close(m.grads() + p.offset, want_grads.data() + p.offset, p.numel,
                   "rank " + std::to_string(r) + ": grad of " + p.name);
    EXPECT_NEAR(m.grad_norm(), ref.grad_norm(), 1e-4 * ref.grad_norm()) << "rank " << r;
    EXPECT_NEAR(m.params_norm(), ref.params_norm(), 1e-5 * ref.params_norm()) << "rank " << r;
    zeros[r] = m.count_zero_grads();
    flips[r] = rounding_zero_flips(m.grads(), want_grads.data(), m.num_parameters(), ref.grad_norm(),
                                   "rank " + std::to_string(r) + " grads");
  });
  int64_t all_flips = 0;  // (a replicated tensor's flips counted on every rank: a looser bound)
  for (int64_t f : flips) all_flips += f;
  for (int r = 0; r < tp; ++r) EXPECT_LE(std::abs(zeros[r] - ref.count_zero_grads()), all_flips) << "rank " << r;
}

}  // namespace

TEST(TensorParallel, WholeExpertsFoldedAcrossTensorParallelRanksMatchOneRank) {
  if (!dist::gloo_built()) GTEST_SKIP() << "built without Gloo";
  GptConfig c = tiny_moe();  // a dense first layer, a shared expert (split by TP), aux/seq-aux/z losses
  c.moe.num_experts = 8;
  for (const auto& [tp, ep] : {std::pair{2, 2}, std::pair{4, 2}, std::pair{4, 4}, std::pair{2, 1}}) {
    SCOPED_TRACE("TP=" + std::to_string(tp) + " EP=" + std::to_string(ep));
    check_whole_experts(c, tp, ep);
  }
  // The expert ffn need not split over TP when the experts stay whole; token dropping by shares too.
  c.moe.ffn = 10, c.moe.capacity_factor = 0.5;
  c.moe.tensor_parallel = 2;  // the one-rank reference drops by the two ranks' shares
  check_whole_experts(c, 2, 2);
}

TEST(TensorParallel, MixtureOfExpertsRefusesWhatItCannotSplitByName) {
  auto refused = [](const GptConfig& c, const std::string& want) {
    try {
      check_moe_tensor_parallel(c);
      ADD_FAILURE() << "no error for " << want;
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  GptConfig c = tiny_moe();
  EXPECT_NO_THROW(check_moe_tensor_parallel(c));
  c.sequence_parallel = false;
  refused(c, "--sequence-parallel");
  c = tiny_moe();
  c.moe.capacity_factor = 1.0;  // token dropping: by each rank's share (the test above)
  EXPECT_NO_THROW(check_moe_tensor_parallel(c));
  c = tiny_moe();
  c.ffn = 65;  // the dense first layer's MLP cannot split; with MoE layers only there is none
  try {
    tp_local_config(c, 2);
    ADD_FAILURE() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("the ffn hidden size (65)"), std::string::npos) << e.what();
  }
  c.moe.layers = {true, true};
  EXPECT_EQ(tp_local_config(c, 2).ffn, 65);
  c = tiny_moe();
  c.moe.ffn = 6;  // splits in two, not in four
  EXPECT_NO_THROW(tp_local_config(c, 2));
  try {
    tp_local_config(c, 4);
    ADD_FAILURE() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("the MoE ffn hidden size (6)"), std::string::npos) << e.what();
  }
}

TEST(TensorParallel, ShapesThatDoNotSplitAreRefusedByName) {
  GptConfig c = tiny_gpt();
  c.query_groups = 2;
  try {
    tp_local_config(c, 4);
    ADD_FAILURE() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("query groups (2)"), std::string::npos) << e.what();
  }
}
