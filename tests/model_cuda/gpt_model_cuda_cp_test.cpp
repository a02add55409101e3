// Context parallelism on the GPU: threads play the CP ranks on one GPU, meeting in a
// SharedDeviceGroup (its collectives copy between their buffers), each holding its two chunks of
// every sequence (Megatron's split, model/backend.hpp cp_place).
//   - CudnnCpAttention against cuDNN's attention over the whole sequences (CP = 1): every rank's
//     output, statistics and q, k, v gradients at its tokens' places;
//   - the whole model's step: every rank's per-token losses against the CPU reference model of the
//     whole sequences at the same places, and the ranks' gradients, summed (the trainer's dp_cp
//     reduction), against the reference's.
#include <gtest/gtest.h>

#include <cmath>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/device.hpp"
#include "core/rng.hpp"
#include "kernels/cuda/attention_cudnn.hpp"
#include "kernels/cuda/attention_cudnn_cp.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/device_buffer.hpp"
#include "model/backend.hpp"
#include "model/cuda/gpt_model_cuda.hpp"
#include "model/gpt_ep.hpp"
#include "model/gpt_model.hpp"
#include "model/gpt_tp.hpp"
#include "model_cuda_test_util.hpp"
#include "moe_test_util.hpp"
#include "shared_device_group.hpp"

using namespace laoyao;
using namespace laoyao::model;
using namespace laoyao::model::test;
namespace kc = laoyao::kernels::cuda;
using bf16 = __nv_bfloat16;

namespace {

// body(rank, group) on cp threads sharing GPU 0; fails the test with each rank's error.
void run_ranks(int cp, const std::function<void(int, SharedDeviceGroup&)>& body) {
  const std::vector<std::string> errors = run_on_shared_gpu(cp, body);
  for (int r = 0; r < cp; ++r) ASSERT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
}

// Rank r's token t (of its b * s) is token global(t) of the whole b * S.
int64_t global_token(int64_t t, int64_t s, int64_t r, int64_t cp) {
  return t / s * s * cp + cp_place(t % s, s, r, cp);
}

// ---- the attention alone

struct AttentionCase {
  int64_t b, S, H, G, D;
  int cp;
  kc::QkvRows rows;
  bool ring;  // --cp-comm-type p2p's ring, else all_gather's one exchange
};

// Fused rows [T][G, Q + 2, D] and the rows' layout (fused as is; split: q [T, H*D], then k and v
// [T, G, 2, D]), one way or the other (to_rows: fused in).
std::vector<bf16> convert_rows(const std::vector<bf16>& from, int64_t T, const AttentionCase& k, bool to_rows) {
  if (k.rows == kc::QkvRows::Fused) return from;
  const int64_t Q = k.H / k.G, row = k.G * (Q + 2) * k.D;
  std::vector<bf16> out(from.size());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t g = 0; g < k.G; ++g)
      for (int64_t j = 0; j < (Q + 2) * k.D; ++j) {
        const int64_t head = j / k.D, d = j % k.D, fused = t * row + g * (Q + 2) * k.D + j;
        const int64_t split = head < Q ? t * k.H * k.D + (g * Q + head) * k.D + d
                                       : T * k.H * k.D + (t * k.G + g) * 2 * k.D + (head - Q) * k.D + d;
        out[static_cast<size_t>(to_rows ? split : fused)] = from[static_cast<size_t>(to_rows ? fused : split)];
      }
  return out;
}
std::vector<bf16> as_rows(const std::vector<bf16>& fused, int64_t T, const AttentionCase& k) {
  return convert_rows(fused, T, k, true);
}
std::vector<bf16> as_fused(const std::vector<bf16>& rows, int64_t T, const AttentionCase& k) {
  return convert_rows(rows, T, k, false);
}

std::vector<bf16> random_bf16(int64_t n, uint64_t seed, double scale) {
  Rng rng(seed, "cp attention");
  std::vector<bf16> v(static_cast<size_t>(n));
  for (auto& x : v) x = __float2bfloat16(static_cast<float>(scale * rng.normal()));
  return v;
}

std::vector<float> to_float(const std::vector<bf16>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = __bfloat162float(v[i]);
  return out;
}

template <class T>
kc::DeviceBuffer device_copy(const std::vector<T>& v) {
  kc::DeviceBuffer d(sizeof(T) * v.size());
  d.upload(v.data(), d.bytes);
  return d;
}

template <class T>
std::vector<T> host_copy(const kc::DeviceBuffer& d, size_t n) {
  std::vector<T> v(n);
  d.download(v.data(), sizeof(T) * n);
  return v;
}

void compare_cp_attention(const AttentionCase& k) {
  cuda_set_device(0);
  const int64_t Q = k.H / k.G, row = k.G * (Q + 2) * k.D, T = k.b * k.S, hd = k.H * k.D, s = k.S / k.cp;
  const float scale = 1.0f / std::sqrt(static_cast<float>(k.D));
  const std::vector<bf16> qkv = random_bf16(T * row, 3, 1.0), dctx = random_bf16(T * hd, 5, 0.1);

  // CP = 1: the whole sequences.
  std::vector<float> ref_ctx, ref_lse, ref_dqkv;
  {
    cudaStream_t stream = nullptr;
    LAOYAO_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    kc::CudnnAttention whole({k.b, k.S, k.H, k.G, k.D, scale}, stream, k.rows);
    kc::DeviceBuffer x = device_copy(as_rows(qkv, T, k)), dy = device_copy(dctx);
    kc::DeviceBuffer ctx(sizeof(bf16) * T * hd), lse(sizeof(float) * k.b * k.H * k.S), dx(sizeof(bf16) * T * row);
    whole.forward(x.as<bf16>(), ctx.as<bf16>(), lse.as<float>(), k.b);
    whole.backward(x.as<bf16>(), ctx.as<bf16>(), dy.as<bf16>(), lse.as<float>(), dx.as<bf16>(), k.b);
    LAOYAO_CUDA_CHECK(cudaStreamSynchronize(stream));
    ref_ctx = to_float(host_copy<bf16>(ctx, static_cast<size_t>(T * hd)));
    ref_lse = host_copy<float>(lse, static_cast<size_t>(k.b * k.H * k.S));
    ref_dqkv = to_float(as_fused(host_copy<bf16>(dx, static_cast<size_t>(T * row)), T, k));
    LAOYAO_CUDA_CHECK(cudaStreamDestroy(stream));
  }

  std::vector<std::vector<float>> ctx(k.cp), lse(k.cp), dqkv(k.cp);
  run_ranks(k.cp, [&](int r, SharedDeviceGroup& group) {
    const int64_t t_local = k.b * s;
    std::vector<bf16> my_qkv(static_cast<size_t>(t_local * row)), my_dctx(static_cast<size_t>(t_local * hd));
    for (int64_t t = 0; t < t_local; ++t) {
      const int64_t g = global_token(t, s, r, k.cp);
      std::copy_n(qkv.begin() + g * row, row, my_qkv.begin() + t * row);
      std::copy_n(dctx.begin() + g * hd, hd, my_dctx.begin() + t * hd);
    }
    cudaStream_t stream = nullptr;
    LAOYAO_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    {
      kc::CudnnAttention local({k.b, s, k.H, k.G, k.D, scale}, stream, k.rows);
      kc::CudnnCpAttention attention(local, r, k.cp, stream, cp_collectives(&group, stream, k.ring));
      if (attention.ring() != k.ring) throw Error("the attention took the other exchange");
      kc::DeviceBuffer x = device_copy(as_rows(my_qkv, t_local, k)), dy = device_copy(my_dctx);
      kc::DeviceBuffer out(sizeof(bf16) * t_local * hd), l(sizeof(float) * k.b * k.H * s),
          dx(sizeof(bf16) * t_local * row);
      attention.forward(x.as<bf16>(), out.as<bf16>(), l.as<float>(), k.b);
      attention.backward(x.as<bf16>(), out.as<bf16>(), dy.as<bf16>(), l.as<float>(), dx.as<bf16>(), k.b);
      LAOYAO_CUDA_CHECK(cudaStreamSynchronize(stream));
      ctx[r] = to_float(host_copy<bf16>(out, static_cast<size_t>(t_local * hd)));
      lse[r] = host_copy<float>(l, static_cast<size_t>(k.b * k.H * s));
      dqkv[r] = to_float(as_fused(host_copy<bf16>(dx, static_cast<size_t>(t_local * row)), t_local, k));
    }
    LAOYAO_CUDA_CHECK(cudaStreamDestroy(stream));
  });
  if (::testing::Test::HasFatalFailure()) return;

  // Each rank's values put at their places in the whole.
  std::vector<float> got_ctx(ref_ctx.size()), got_lse(ref_lse.size()), got_dqkv(ref_dqkv.size());
  for (int r = 0; r < k.cp; ++r)
    for (int64_t t = 0; t < k.b * s; ++t) {
      const int64_t g = global_token(t, s, r, k.cp), bi = t / s, place = g % k.S;
      std::copy_n(ctx[r].begin() + t * hd, hd, got_ctx.begin() + g * hd);
      std::copy_n(dqkv[r].begin() + t * row, row, got_dqkv.begin() + g * row);
      for (int64_t h = 0; h < k.H; ++h)
        got_lse[static_cast<size_t>((bi * k.H + h) * k.S + place)] = lse[r][static_cast<size_t>((bi * k.H + h) * s + t % s)];
    }
  EXPECT_LT(rel_err(got_ctx.data(), ref_ctx.data(), T * hd), 1e-2);
  for (size_t i = 0; i < ref_lse.size(); ++i) ASSERT_NEAR(got_lse[i], ref_lse[i], 2e-4) << "statistic " << i;
  // The gradients of q, of k and of v apart (a wrong share of one would hide in the sum).
  for (int64_t part = 0; part < 3; ++part) {
    std::vector<float> a, ref;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t g = 0; g < k.G; ++g) {
        const int64_t at = t * row + g * (Q + 2) * k.D + (part == 0 ? 0 : (Q + part - 1) * k.D);
        const int64_t n = part == 0 ? Q * k.D : k.D;
        a.insert(a.end(), got_dqkv.begin() + at, got_dqkv.begin() + at + n);
        ref.insert(ref.end(), ref_dqkv.begin() + at, ref_dqkv.begin() + at + n);
      }
    EXPECT_LT(rel_err(a.data(), ref.data(), static_cast<int64_t>(a.size())), 2e-2) << "gradient of " << "qkv"[part];
  }
}

// ---- the whole model

constexpr float kAuxScale = 0.5f;  // the MoE losses' gradient scale, the same on both sides

GptConfig whole_config(GptConfig c) {
  c.context_parallel = 1;
  return c;
}

// The CPU model of the whole sequences (CP = 1) on a random batch: its per-token losses,
// gradients and MoE losses, the reference every CP rank is compared with at its tokens' places.
struct WholeRun {
  GptModel cpu;
  Batch x;
  DropoutKey key{1234, 7, false};
  std::vector<float> loss;
  GptModel::MoeLosses moe;
  WholeRun(const GptConfig& c, int64_t b, int64_t S) : cpu(whole_config(c)), x(random_batch(b, S, c.vocab)) {
    random_weights(cpu, cpu.weights());
    const MicroBatch whole{x.b, x.s, x.tokens.data(), x.labels.data(), x.positions.data()};
    loss.resize(static_cast<size_t>(b * S));
    if (c.moe.num_experts > 0) cpu.set_moe_aux_loss_scale(kAuxScale);
    cpu.zero_grads();
    cpu.forward(whole, key, loss.data());
    cpu.backward(x.dloss.data());
    if (c.moe.num_experts > 0) moe = cpu.take_moe_losses();
  }
};

// CP rank r's micro-batch: its b * s tokens of the whole batch, in its order.
struct RankBatch {
  std::vector<int64_t> tokens, labels, positions;
  std::vector<float> mask, dloss;
  MicroBatch mb;
  RankBatch(const Batch& x, int64_t s, int r, int cp) {
    const int64_t T = x.b * s;
    for (int64_t t = 0; t < T; ++t) {
      const size_t g = static_cast<size_t>(global_token(t, s, r, cp));
      tokens.push_back(x.tokens[g]), labels.push_back(x.labels[g]), positions.push_back(x.positions[g]);
      mask.push_back(x.mask[g]), dloss.push_back(x.dloss[g]);
    }
    mb = {x.b, s, tokens.data(), labels.data(), positions.data()};
  }
};

// One step of a rank's model on its batch; its per-token losses and gradients (of the trained
// parameters), its MoE losses when it has MoE layers.
void train_rank(CudaGptModel& gpu, const RankBatch& in, const DropoutKey& key, std::vector<float>& losses,
                std::vector<float>& grads, GptModel::MoeLosses* moe) {
  if (moe) gpu.set_moe_aux_loss_scale(kAuxScale);
  gpu.zero_grads();
  gpu.forward(in.mb, in.mask.data(), key, in.dloss.data());
  gpu.backward();
  gpu.finalize_grads();
  losses = gpu.download_losses();
  if (moe) *moe = gpu.take_moe_losses();
  grads.assign(static_cast<size_t>(gpu.num_trainable()), 0.0f);
  gpu.download_grads(grads.data());
}

// Every CP rank's per-token losses are the reference's at its tokens' places (rank_of: the CP
// rank of a result), and the gradients summed over the CP ranks the whole model's.
void expect_whole(WholeRun& ref, int cp, int64_t s, const std::vector<std::vector<float>>& losses,
                  const std::function<int(size_t)>& rank_of, const std::vector<float>& summed_grads) {
  for (size_t i = 0; i < losses.size(); ++i)
    for (size_t t = 0; t < losses[i].size(); ++t) {
      const size_t g = static_cast<size_t>(global_token(static_cast<int64_t>(t), s, rank_of(i), cp));
      EXPECT_NEAR(losses[i][t], ref.loss[g], 3e-2) << "rank " << i << " token " << t << " (place " << g << ")";
    }
  GptModel& cpu = ref.cpu;
  EXPECT_LT(rel_err(summed_grads.data(), cpu.grads(), cpu.num_trainable()), 2e-2);
  for (const auto& p : cpu.table().specs)
    EXPECT_LT(rel_err(summed_grads.data() + p.offset, cpu.grads() + p.offset, p.numel), 6e-2) << p.name;
}

// tp > 1: the ranks a grid of tp x cp (tensor-parallel rank minor, as Megatron orders them), each
// holding its TP shard (sequence parallel), meeting its TP group and its CP group.
// MoE layers: each rank routes its own tokens, the aux losses counting every rank's (summed over
// the CP group), the z-loss its share; the balancing losses summed over the ranks, and the z-losses
// averaged, are the whole sequences'.
void compare_cp_model(GptConfig c, int cp, int64_t b, int64_t S, int tp = 1) {
  c.sequence_parallel = tp > 1;
  const bool moe = c.moe.num_experts > 0;
  WholeRun ref(c, b, S);
  GptModel& cpu = ref.cpu;
  c.context_parallel = cp;
  const int64_t s = S / cp, n = int64_t(cp) * tp;
  const ParameterTable local = build_gpt_parameters(tp_local_config(c, tp)).table;
  std::vector<std::vector<float>> losses(n), grads(n);
  std::vector<GptModel::MoeLosses> moe_losses(static_cast<size_t>(n));
  std::vector<std::string> paths(n);
  std::vector<std::shared_ptr<SharedDeviceGroup::Meeting>> tp_meetings, cp_meetings;
  for (int i = 0; i < cp; ++i) tp_meetings.push_back(std::make_shared<SharedDeviceGroup::Meeting>(tp, "tp"));
  for (int i = 0; i < tp; ++i) cp_meetings.push_back(std::make_shared<SharedDeviceGroup::Meeting>(cp, "cp"));
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < n; ++rank)
    ranks.emplace_back([&, rank] {
      const int t_rank = rank % tp, c_rank = rank / tp;
      try {
        cuda_set_device(0);
        SharedDeviceGroup tp_group(tp_meetings[size_t(c_rank)], t_rank), cp_group(cp_meetings[size_t(t_rank)], c_rank);
        const RankBatch in(ref.x, s, c_rank, cp);
        std::vector<float> w(static_cast<size_t>(local.total));
        if (tp > 1)
          tp_shard(c, cpu.table(), cpu.weights(), local, w.data(), t_rank, tp);
        else
          w.assign(cpu.weights(), cpu.weights() + cpu.num_parameters());
        CudaGptModel gpu(c, b, s, tp > 1 ? &tp_group : nullptr, nullptr, nullptr, &cp_group);
        paths[size_t(rank)] = gpu.attention_path();
        gpu.upload_weights(w.data());
        train_rank(gpu, in, ref.key, losses[size_t(rank)], grads[size_t(rank)],
                   moe ? &moe_losses[size_t(rank)] : nullptr);
      } catch (const std::exception& e) {
        errors[size_t(rank)] = e.what();
        for (auto& m : tp_meetings) m->break_off();
        for (auto& m : cp_meetings) m->break_off();
      }
    });
  for (auto& t : ranks) t.join();
  for (int rank = 0; rank < n; ++rank) ASSERT_EQ(errors[size_t(rank)], "") << "rank " << rank;
  SCOPED_TRACE(std::string("attention: ") + paths[0]);
  // Each CP rank's whole-model gradient (its TP shards put together), summed over the CP ranks.
  std::vector<float> sum(static_cast<size_t>(cpu.num_parameters()), 0.0f), one(sum.size());
  for (int c_rank = 0; c_rank < cp; ++c_rank) {
    if (tp > 1) {
      std::vector<const float*> shards;
      for (int t_rank = 0; t_rank < tp; ++t_rank) shards.push_back(grads[size_t(c_rank * tp + t_rank)].data());
      tp_unshard(c, cpu.table(), one.data(), local, shards);
    } else {
      one = grads[size_t(c_rank)];
    }
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += one[i];
  }
  expect_whole(ref, cp, s, losses, [tp](size_t i) { return static_cast<int>(i) / tp; }, sum);
  if (!moe) return;
  // (Every TP rank of a CP rank routes the same tokens and logs the same losses: the first's count.)
  GptModel::MoeLosses got;
  for (int c_rank = 0; c_rank < cp; ++c_rank) {
    const GptModel::MoeLosses& r = moe_losses[size_t(c_rank * tp)];
    got.aux += r.aux, got.seq_aux += r.seq_aux, got.z += r.z / cp;
  }
  EXPECT_NEAR(got.aux, ref.moe.aux, 2e-2 * ref.moe.aux) << "load_balancing_loss";
  EXPECT_NEAR(got.seq_aux, ref.moe.seq_aux, 2e-2 * ref.moe.seq_aux) << "seq_load_balancing_loss";
  EXPECT_NEAR(got.z, ref.moe.z, 2e-2 * ref.moe.z) << "z_loss";
}

// Expert parallelism over the CP ranks (Megatron's EP group of the flattened data- and
// context-parallel ranks; here the two CP ranks are the EP group too): each rank holds half the
// experts, which get both ranks' tokens, so each rank's expert gradients are the whole sequences'
// and its other gradients its share; their sum over the ranks, each expert from its own rank, is
// the whole model's.
void compare_cp_ep_model(GptConfig c, bool allgather) {
  constexpr int cp = 2;
  const int64_t b = 2, S = 48, s = S / cp, El = c.moe.num_experts / cp;
  c.moe.allgather_dispatcher = allgather;
  WholeRun ref(c, b, S);
  GptModel& cpu = ref.cpu;
  c.context_parallel = cp;
  GptConfig local_cfg = c;
  local_cfg.moe.expert_parallel = cp;
  const ParameterTable local = build_gpt_parameters(local_cfg).table;
  auto ep_meeting = std::make_shared<SharedDeviceGroup::Meeting>(cp, "ep");
  std::vector<std::vector<float>> losses(cp), placed(cp);
  run_ranks(cp, [&](int r, SharedDeviceGroup& cp_group) {
    SharedDeviceGroup ep_group(ep_meeting, r);
    try {
      const RankBatch in(ref.x, s, r, cp);
      std::vector<float> w(static_cast<size_t>(local.total)), g;
      ep_shard(cpu.table(), cpu.weights(), local, w.data(), r, El);
      CudaGptModel gpu(local_cfg, b, s, nullptr, &ep_group, nullptr, &cp_group);
      gpu.upload_weights(w.data());
      GptModel::MoeLosses moe;
      train_rank(gpu, in, ref.key, losses[size_t(r)], g, &moe);
      placed[size_t(r)].assign(static_cast<size_t>(cpu.num_parameters()), 0.0f);
      ep_place(cpu.table(), placed[size_t(r)].data(), local, g.data(), r, El, true);
    } catch (...) {
      ep_meeting->break_off();
      throw;
    }
  });
  if (::testing::Test::HasFatalFailure()) return;
  std::vector<float> sum(static_cast<size_t>(cpu.num_parameters()), 0.0f);
  for (const auto& p : placed)
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += p[i];
  expect_whole(ref, cp, s, losses, [](size_t i) { return static_cast<int>(i); }, sum);
}

}  // namespace

// all_gather: the remote keys gathered in place order, two blocks.
TEST(CudnnCpAttention, TwoRanksFusedGqaRowsMatchWholeSequences) {
  compare_cp_attention({2, 64, 4, 2, 64, 2, kc::QkvRows::Fused, false});
}
TEST(CudnnCpAttention, TwoRanksFusedMhaRowsMatchWholeSequences) {
  compare_cp_attention({1, 128, 2, 2, 128, 2, kc::QkvRows::Fused, false});
}
TEST(CudnnCpAttention, FourRanksSplitRowsMatchWholeSequences) {
  compare_cp_attention({2, 128, 4, 2, 64, 4, kc::QkvRows::Split, false});
}
TEST(CudnnCpAttention, FourRanksFusedRowsMatchWholeSequences) {
  compare_cp_attention({1, 256, 8, 2, 64, 4, kc::QkvRows::Fused, false});
}
// p2p: the ring, a block per step against an earlier rank's first chunk or a later rank's two;
// the key and value gradients travelling home (four ranks: three steps, both kinds of block).
TEST(CudnnCpAttention, RingTwoRanksFusedGqaRowsMatchWholeSequences) {
  compare_cp_attention({2, 64, 4, 2, 64, 2, kc::QkvRows::Fused, true});
}
TEST(CudnnCpAttention, RingFourRanksSplitRowsMatchWholeSequences) {
  compare_cp_attention({2, 128, 4, 2, 64, 4, kc::QkvRows::Split, true});
}
TEST(CudnnCpAttention, RingFourRanksFusedMhaRowsMatchWholeSequences) {
  compare_cp_attention({1, 256, 4, 4, 64, 4, kc::QkvRows::Fused, true});
}

// GPT: LayerNorm, biases, learned positions (the ranks' places), tied output, MHA.
TEST(CudaGptModelCp, GptTwoRanksMatchCpuModel) { compare_cp_model(small_config(4, 4), 2, 2, 48); }
// Llama: RoPE (the table in each rank's token order), GQA over fused rows.
TEST(CudaGptModelCp, LlamaTwoRanksMatchCpuModel) { compare_cp_model(llama_config(), 2, 2, 48); }
TEST(CudaGptModelCp, LlamaFourRanksMatchCpuModel) { compare_cp_model(llama_config(), 4, 1, 64); }
// (The model tests take p2p's ring, Megatron's default; this one all_gather's exchange.)
TEST(CudaGptModelCp, LlamaFourRanksAllGatherMatchCpuModel) {
  GptConfig c = llama_config();
  c.cp_ring = false;
  compare_cp_model(c, 4, 1, 64);
}
// Qwen3: the QK norm applying RoPE in its pass, GQA over split rows.
TEST(CudaGptModelCp, Qwen3TwoRanksMatchCpuModel) {
  GptConfig c = qwen3_config();
  c.heads = 4, c.query_groups = 2, c.kv_channels = 64;
  compare_cp_model(c, 2, 2, 48);
}
// TP = 2 (sequence parallel) x CP = 2: four ranks, each with its heads of its chunks.
TEST(CudaGptModelCp, LlamaTensorParallelTwoByContextParallelTwo) {
  GptConfig c = llama_config();
  c.heads = 4, c.query_groups = 2, c.kv_channels = 64;
  compare_cp_model(c, 2, 2, 48, 2);
}

// Mixture of Experts (every expert chosen: no near-tie of bf16 activations can flip a choice
// against the CPU's): the aux loss's tokens per expert and the z-loss over two ranks, the
// sequence-level aux loss's per sequence over four, and with TP = 2 (the experts split).
TEST(CudaGptModelCp, MoeTwoRanksMatchCpuModel) {
  GptConfig c = moe_config(llama_config(), 4, 4, 64, 64);
  compare_cp_model(c, 2, 2, 48);
}
TEST(CudaGptModelCp, MoeSequenceAuxLossFourRanksMatchCpuModel) {
  GptConfig c = moe_config(qwen3_config(), 4, 4, 64, 0);
  c.moe.aux_loss_coeff = 0, c.moe.seq_aux_loss_coeff = 1e-2;
  compare_cp_model(c, 4, 2, 64);
}
TEST(CudaGptModelCp, MoeExpertParallelOverTheContextParallelRanks) {
  GptConfig c = moe_config(llama_config(), 4, 4, 64, 64);
  compare_cp_ep_model(c, false);  // the all-to-all dispatcher
  compare_cp_ep_model(c, true);   // all-gather
}
TEST(CudaGptModelCp, MoeTensorParallelTwoByContextParallelTwo) {
  GptConfig c = moe_config(llama_config(), 4, 4, 64, 64);
  c.heads = 4, c.query_groups = 2, c.kv_channels = 64;
  compare_cp_model(c, 2, 2, 48, 2);
}

// What GPU ranks refuse under CP, by name (the CPU ranks train it).
TEST(CudaGptModelCp, RefusesWhatItDoesNotBuildByName) {
  GptConfig c = llama_config();
  c.context_parallel = 2;
  EXPECT_EQ(cuda_unsupported_features(c), "");
  GptConfig dropout = c;
  dropout.hidden_dropout = 0.1;
  EXPECT_NE(cuda_unsupported_features(dropout).find("context parallelism (model.context_parallel_size 2) with dropout"),
            std::string::npos);
  GptConfig docs = c;
  docs.document_attention = true;
  EXPECT_NE(cuda_unsupported_features(docs).find("with documents or packed sequences"), std::string::npos);
  GptConfig moe = moe_config(c, 4, 2, 64, 0);
  EXPECT_EQ(cuda_unsupported_features(moe), "");
  moe.moe.expert_parallel = 2;  // (over the flattened data- and context-parallel ranks)
  EXPECT_EQ(cuda_unsupported_features(moe), "");
  moe.moe.expert_parallel = 1, moe.moe.force_load_balancing = true;
  EXPECT_NE(cuda_unsupported_features(moe).find("with --moe-router-force-load-balancing"), std::string::npos);
  GptConfig mla = mla_config(64);
  mla.context_parallel = 2;
  EXPECT_NE(cuda_unsupported_features(mla).find("with multi-latent attention"), std::string::npos);
  // A group unlike the configured CP size.
  auto meeting = std::make_shared<SharedDeviceGroup::Meeting>(1, "cp");
  cuda_set_device(0);
  SharedDeviceGroup one(meeting, 0);
  EXPECT_THROW(CudaGptModel(c, 1, 24, nullptr, nullptr, nullptr, &one), Error);
}
