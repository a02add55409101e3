// Packed and unpacked fine-tuning rows train alike: the same examples, as rows of their own (Bridge's
// unpacked collate) or packed into one row (positions and attention restarting per example), give
// the same per-token losses where the loss mask is on and the same gradients (Bridge's packed
// sequences change the batching, not the model's numbers).
#include <gtest/gtest.h>

#include <cmath>

#include "data/sft_packing.hpp"
#include "model/gpt_model.hpp"
#include "model/parameters.hpp"

using namespace laoyao;
using namespace laoyao::model;

namespace {

data::SftExample example(std::vector<int64_t> ids, int64_t context) {
  data::SftExample ex;
  ex.input_ids = std::move(ids);
  ex.context_length = context;
  ex.loss_mask.assign(ex.input_ids.size(), 0);
  for (size_t i = static_cast<size_t>(context); i < ex.input_ids.size(); ++i) ex.loss_mask[i] = 1;
  return ex;
}

}  // namespace

TEST(SftPackedRows, PackedAndUnpackedRowsGiveTheSameMaskedLossesAndGradients) {
  GptConfig c;  // Llama-style: RMSNorm, SwiGLU, RoPE, GQA, untied
  c.num_layers = 2, c.hidden = 16, c.heads = 4, c.query_groups = 2, c.kv_channels = 4, c.ffn = 24, c.vocab = 32;
  c.max_positions = 16, c.norm = Norm::RMSNorm, c.activation = Activation::SwiGLU, c.positions = Positions::Rope;
  c.add_bias_linear = false, c.add_qkv_bias = false, c.tied_embeddings = false, c.init_std = 0.3;
  c.embedding_init_std = 0.3, c.document_attention = true;
  GptModel m(c);
  init_parameters(m.table(), m.weights(), 11, false);
  const int64_t eos = 31;
  const std::vector<data::SftExample> examples = {example({3, 7, 9, 12, 5, eos}, 3), example({4, 8, 2, 6, 1, 10, 11, eos}, 2)};
  // Unpacked: one row each, padded with EOS to 12.
  const int64_t s = 12;
  std::vector<float> unpacked_loss(2 * s), mask_u(2 * s);
  std::vector<int64_t> tok_u, lab_u, pos_u;
  for (const auto& ex : examples) {
    const data::SftRow r = data::sft_row(ex, s, eos);
    tok_u.insert(tok_u.end(), r.tokens.begin(), r.tokens.end());
    lab_u.insert(lab_u.end(), r.labels.begin(), r.labels.end());
    for (int64_t t = 0; t < s; ++t) pos_u.push_back(t);
    std::copy(r.loss_mask.begin(), r.loss_mask.end(), mask_u.begin() + (&ex - examples.data()) * s);
  }
  // Packed: both in one row of 12 (5 + 7 shifted tokens).
  data::SftPack pack;
  for (const auto& ex : examples) {
    pack.seq_start.push_back(static_cast<int64_t>(pack.input_ids.size()));
    pack.input_ids.insert(pack.input_ids.end(), ex.input_ids.begin(), ex.input_ids.end());
    pack.loss_mask.insert(pack.loss_mask.end(), ex.loss_mask.begin() + 1, ex.loss_mask.end());
    pack.loss_mask.push_back(0);
  }
  const data::PackedRow p = data::packed_row(pack, s, eos);
  ASSERT_EQ(p.cu_seqlens, (std::vector<int64_t>{0, 5, 12}));
  // Both rows' losses weighted by their masks over the same token count (Megatron's per-token mean).
  float tokens = 0;
  for (float x : mask_u) tokens += x;
  std::vector<float> dloss_u(mask_u), dloss_p(p.loss_mask);
  for (auto& x : dloss_u) x /= tokens;
  for (auto& x : dloss_p) x /= tokens;

  m.zero_grads();
  m.forward({2, s, tok_u.data(), lab_u.data(), pos_u.data()}, {}, unpacked_loss.data());
  m.backward(dloss_u.data());
  const std::vector<float> grads_u(m.grads(), m.grads() + m.num_parameters());
  std::vector<float> packed_loss(s);
  m.zero_grads();
  m.forward({1, s, p.tokens.data(), p.labels.data(), p.positions.data(), p.key_start.data()}, {}, packed_loss.data());
  m.backward(dloss_p.data());

  // Token k of example e: row e position k unpacked; cu_seqlens[e] + k packed.
  for (size_t e = 0; e < examples.size(); ++e)
    for (int64_t k = 0; k < p.cu_seqlens[e + 1] - p.cu_seqlens[e]; ++k) {
      const size_t u = e * s + static_cast<size_t>(k), q = static_cast<size_t>(p.cu_seqlens[e] + k);
      ASSERT_EQ(mask_u[u], p.loss_mask[q]) << e << "," << k;
      if (mask_u[u] == 0) continue;
      EXPECT_NEAR(packed_loss[q], unpacked_loss[u], 1e-5 * (1 + std::abs(unpacked_loss[u]))) << e << "," << k;
    }
  double diff = 0, norm = 0;
  for (int64_t i = 0; i < m.num_parameters(); ++i) {
    diff += std::pow(double(m.grads()[i]) - grads_u[static_cast<size_t>(i)], 2);
    norm += std::pow(double(grads_u[static_cast<size_t>(i)]), 2);
  }
  EXPECT_GT(norm, 0);
  EXPECT_LT(std::sqrt(diff), 1e-5 * std::sqrt(norm));
}
