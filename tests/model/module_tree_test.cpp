// The module tree (model/mcore) itself, on the CPU backend: what a backend's model facade chooses
// (full recomputation, the loss gradient taken in the forward) changes memory, not numbers.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "model/cpu/cpu_backend.hpp"
#include "model/gpt_layout.hpp"
#include "model/mcore/gpt_model.hpp"
#include "model/parameters.hpp"

using namespace laoyao::model;

namespace {

struct TreeRun {
  std::vector<float> losses, grads;
  size_t activation_bytes = 0;
};

// Two training micro-batches (gradients accumulated) of a 4-layer model with hidden and attention
// dropout, through the tree over the CPU backend.
TreeRun train(const GptConfig& c, bool recompute, bool loss_grad_in_forward) {
  const GptParameterLayout layout = build_gpt_parameters(c);
  TreeRun out;
  std::vector<float> w(static_cast<size_t>(layout.table.total));
  out.grads.assign(w.size(), 0.0f);
  init_parameters(layout.table, w.data(), 1234, false);
  CpuBackend be(c, nullptr, 0, 1);
  be.bind(w.data(), out.grads.data());
  mcore::GPTModel net(c, c, layout, mcore::TensorParallel{}, be, recompute);
  const int64_t b = 2, s = 6, T = b * s;
  net.allocate(b, s);
  std::mt19937 rng(5);
  std::uniform_int_distribution<int64_t> tok(0, c.vocab - 1);
  std::vector<int64_t> tokens(T), labels(T), positions(T);
  std::vector<float> dloss(T);
  out.losses.resize(2 * T);
  for (int call = 0; call < 2; ++call) {
    for (int64_t t = 0; t < T; ++t) tokens[t] = tok(rng), labels[t] = tok(rng), positions[t] = t % s;
    for (auto& d : dloss) d = std::uniform_real_distribution<float>(0.5f, 1.5f)(rng) / static_cast<float>(T);
    mcore::Step st;
    st.batch = {b, s, T, T, nullptr};
    st.tokens = tokens.data(), st.labels = labels.data(), st.positions = positions.data();
    st.seed = 77, st.call = static_cast<uint64_t>(call), st.training = true, st.train_step = true;
    net.forward(st, out.losses.data() + call * T, loss_grad_in_forward ? dloss.data() : nullptr);
    net.backward(st, dloss.data(), 1.0f);
  }
  out.activation_bytes = net.activation_bytes();
  return out;
}

}  // namespace

// Megatron's full recomputation (uniform chunks of 1 and 2 layers, block recomputation of the
// first 1 and 3) gives the bits of the run that keeps every activation, in less memory (block
// recomputation of one layer saves nothing: its kept input replaces what it shares); so does the
// loss gradient taken by the forward.
TEST(ModuleTree, FullRecomputationAndTheFusedLossGradientChangeMemoryNotNumbers) {
  GptConfig c;
  c.num_layers = 4, c.hidden = 16, c.heads = 2, c.query_groups = 2, c.kv_channels = 8, c.ffn = 24;
  c.vocab = 37, c.max_positions = 8, c.hidden_dropout = 0.2, c.attention_dropout = 0.1;
  const TreeRun keep = train(c, false, false);
  ASSERT_GT(keep.activation_bytes, 0u);
  EXPECT_EQ(train(c, true, false).activation_bytes, keep.activation_bytes);  // asked for none
  const TreeRun fused = train(c, false, true);
  EXPECT_EQ(fused.losses, keep.losses);
  EXPECT_EQ(fused.grads, keep.grads);
  for (const auto& [mode, n] : {std::pair{Recompute::Uniform, int64_t{1}}, std::pair{Recompute::Uniform, int64_t{2}},
                                std::pair{Recompute::Block, int64_t{1}}, std::pair{Recompute::Block, int64_t{3}}}) {
    SCOPED_TRACE(std::string(mode == Recompute::Block ? "block " : "uniform ") + std::to_string(n));
    GptConfig r = c;
    r.recompute = mode, r.recompute_num_layers = n;
    EXPECT_EQ(train(r, false, false).activation_bytes, keep.activation_bytes);  // the backend keeps all
    const TreeRun again = train(r, true, false);
    EXPECT_EQ(again.losses, keep.losses);
    EXPECT_EQ(again.grads, keep.grads);
    if (mode == Recompute::Block && n == 1)
      EXPECT_EQ(again.activation_bytes, keep.activation_bytes);
    else
      EXPECT_LT(again.activation_bytes, keep.activation_bytes);
  }
}
