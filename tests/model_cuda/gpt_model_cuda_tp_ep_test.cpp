// Tensor and expert parallelism together on GPUs: four threads on GPU 0 play the ranks of TP=2 x
// EP=2 (Megatron's order: the TP pair (0, 1) and (2, 3), the EP pairs (0, 2) and (1, 3)), each TP
// group and each EP group meeting in a SharedDeviceGroup. The EP ranks are data-parallel replicas:
// each pair trains a micro-batch of its own, sequence parallel, and every rank holds its TP share
// of its EP rank's experts. Against the CPU model of the whole on each pair's micro-batch:
// - every rank's per-token losses are its pair's batch's;
// - its gradients are its part (train::keep_part) of that batch's, but for the routed experts,
//   whose gradients sum both batches' (each expert saw the tokens of both pairs);
// - replicated tensors get the same bits on both ranks of a TP pair;
// - the ranks' counted parameters (CudaGptModel::counts) make up the whole model once.
// Every expert is chosen (top-4 of 4), so that no near-tie routes a token otherwise than the
// reference does. Both token dispatchers. Then the CUDA engine on the same ranks, with and without
// the distributed optimizer: after the data-parallel reduction every rank's gradient norm is the
// whole model's, summed over the TP group and then the EP (or data-parallel) one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/cuda/gpt_model_cuda.hpp"
#include "model/gpt_ep.hpp"
#include "model/gpt_model.hpp"
#include "model/gpt_tp.hpp"
#include "optim/adamw.hpp"
#include "train/data_pipeline.hpp"
#include "train/dist_optimizer.hpp"
#include "train/engine.hpp"
#include "train/tp_state.hpp"
#include "model_cuda_test_util.hpp"
#include "moe_test_util.hpp"
#include "shared_device_group.hpp"

using namespace laoyao;
using namespace laoyao::model;
using namespace laoyao::model::test;

namespace {

constexpr int kTp = 2, kEp = 2, kRanks = kTp * kEp;

struct CpuRun {
  Batch x;
  std::vector<float> losses, grads;
};

CpuRun run_cpu(GptModel& cpu, uint64_t seed) {
  CpuRun r{random_batch(2, 48, cpu.config().vocab, seed), {}, {}};
  const MicroBatch mb{r.x.b, r.x.s, r.x.tokens.data(), r.x.labels.data(), r.x.positions.data()};
  r.losses.resize(static_cast<size_t>(r.x.b * r.x.s));
  cpu.zero_grads();
  cpu.forward(mb, DropoutKey{1234, 1, false}, r.losses.data());
  cpu.backward(r.x.dloss.data());
  r.grads.assign(cpu.grads(), cpu.grads() + cpu.num_parameters());
  return r;
}

struct RankResult {
  std::vector<float> losses, grads, expected;
  std::vector<float> share;  // this rank's part of both batches' summed gradients
  std::vector<uint8_t> counted;
};

// The GPU model of this rank on its batch x from weights w: forward, backward, finalize_grads;
// its per-token losses, gradients and counted flags into o. same_experts: with whole experts in EP
// groups inside a TP group, the ranks holding this rank's experts.
void run_gpu_rank(const GptConfig& local_cfg, const Batch& x, const std::vector<float>& w, dist::ProcessGroup* tp,
                  dist::ProcessGroup* ep, RankResult& o, dist::ProcessGroup* same_experts = nullptr) {
  const MicroBatch mb{x.b, x.s, x.tokens.data(), x.labels.data(), x.positions.data()};
  CudaGptModel gpu(local_cfg, x.b, x.s, tp, ep, same_experts);
  gpu.upload_weights(w.data());
  gpu.zero_grads();
  gpu.forward(mb, x.mask.data(), DropoutKey{1234, 1, false}, x.dloss.data());
  gpu.backward();
  gpu.finalize_grads();
  o.losses = gpu.download_losses();
  o.grads.resize(w.size());
  gpu.download_grads(o.grads.data());
  for (const auto& p : gpu.table().specs) o.counted.push_back(gpu.counts(p, true) ? 1 : 0);
}

// Each rank's losses are its TP group's batch's (runs[rank / tp]) and its gradients o.expected.
void expect_ranks_match(const std::vector<RankResult>& out, const std::vector<CpuRun>& runs,
                        const ParameterTable& table, int tp = kTp) {
  for (size_t r = 0; r < out.size(); ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const RankResult& o = out[r];
    const CpuRun& run = runs[r / static_cast<size_t>(tp)];
    ASSERT_EQ(o.losses.size(), run.losses.size());
    for (size_t i = 0; i < o.losses.size(); ++i) ASSERT_NEAR(o.losses[i], run.losses[i], 3e-2) << "token " << i;
    EXPECT_LT(rel_err(o.grads.data(), o.expected.data(), static_cast<int64_t>(o.grads.size())), 2e-2);
    for (const auto& p : table.specs)
      EXPECT_LT(rel_err(o.grads.data() + p.offset, o.expected.data() + p.offset, p.numel), 6e-2) << p.name;
  }
}

// Llama's pieces, 4 experts every one of which each token chooses, sequence parallel at TP=2.
// drop: token dropping at capacity factor 0.5 by position (each TP rank's share of the sequence
// apart; by position, so that the choice depends on the routing alone, which choosing every
// expert makes the same on both sides).
GptConfig tp_ep_config(bool allgather, bool drop = false) {
  GptConfig c = moe_config(llama_config(), 4, 4, 64, 0);
  c.heads = 4, c.query_groups = 2, c.kv_channels = 64;
  c.moe.tensor_parallel = kTp;
  c.moe.allgather_dispatcher = allgather;
  c.sequence_parallel = true;
  if (drop) c.moe.capacity_factor = 0.5, c.moe.drop_by_position = true;
  return c;
}

// The rank of each thread and its groups: the TP pairs (0, 1) and (2, 3), the EP pairs (0, 2) and
// (1, 3), which are the data-parallel pairs too (a meeting of their own).
struct Meetings {
  std::vector<std::shared_ptr<SharedDeviceGroup::Meeting>> tp, ep, dp;
  Meetings() {
    using M = SharedDeviceGroup::Meeting;
    for (int i = 0; i < kEp; ++i) tp.push_back(std::make_shared<M>(kTp, "tp group " + std::to_string(i)));
    for (int i = 0; i < kTp; ++i) {
      ep.push_back(std::make_shared<M>(kEp, "ep group " + std::to_string(i)));
      dp.push_back(std::make_shared<M>(kEp, "dp group " + std::to_string(i)));
    }
  }
  // fn(rank, tp, ep, dp, nullptr) on the four threads (split experts: no rank holds another's);
  // a rank that fails lets the others give up.
  std::vector<std::string> run(const std::function<void(int, SharedDeviceGroup&, SharedDeviceGroup&,
                                                         SharedDeviceGroup&, SharedDeviceGroup*)>& fn) {
    return run_on_shared_gpu(kRanks, [&](int r, SharedDeviceGroup&) {
      const int t = r % kTp, e = r / kTp;
      SharedDeviceGroup tp_group(tp[e], t), ep_group(ep[t], e), dp_group(dp[t], e);
      try {
        fn(r, tp_group, ep_group, dp_group, nullptr);
      } catch (...) {
        tp[e]->break_off(), ep[t]->break_off(), dp[t]->break_off();
        throw;
      }
    });
  }
};

void compare_tp_ep(bool allgather, bool drop = false) {
  const GptConfig c = tp_ep_config(allgather, drop);
  GptModel cpu(c);
  random_weights(cpu, cpu.weights());
  const std::vector<CpuRun> runs = {run_cpu(cpu, 11), run_cpu(cpu, 12)};
  std::vector<float> whole_sum(runs[0].grads.size());
  for (size_t i = 0; i < whole_sum.size(); ++i) whole_sum[i] = runs[0].grads[i] + runs[1].grads[i];
  // What each EP pair's ranks should hold after the backward, in the whole model's layout.
  std::vector<std::vector<float>> whole_expected(kEp);
  for (int e = 0; e < kEp; ++e) {
    whole_expected[e] = runs[e].grads;
    for (const auto& p : cpu.table().specs)
      if (is_routed_expert(p.name))
        std::copy_n(whole_sum.begin() + p.offset, p.numel, whole_expected[e].begin() + p.offset);
  }
  GptConfig local_cfg = c;
  local_cfg.moe.expert_parallel = kEp;

  std::vector<RankResult> out(kRanks);
  const std::vector<std::string> errors = Meetings().run([&](int r, SharedDeviceGroup& tp, SharedDeviceGroup& ep,
                                                              SharedDeviceGroup&, SharedDeviceGroup*) {
    const int e = r / kTp;
    GptModel local(local_cfg, &tp, &ep);  // the CPU model of this rank: its table and keep_part's map
    std::vector<float> w(static_cast<size_t>(local.num_parameters()));
    train::keep_part(cpu.table(), cpu.weights(), local, w.data());
    RankResult& o = out[r];
    o.expected.resize(w.size());
    train::keep_part(cpu.table(), whole_expected[e].data(), local, o.expected.data());
    o.share.resize(w.size());
    train::keep_part(cpu.table(), whole_sum.data(), local, o.share.data());

    run_gpu_rank(local_cfg, runs[e].x, w, &tp, &ep, o);
  });
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  if (::testing::Test::HasFailure()) return;

  const ParameterTable table = build_gpt_parameters(tp_local_config(local_cfg, kTp)).table;
  expect_ranks_match(out, runs, table);
  // Replicated tensors: the same bits on both ranks of each TP pair.
  for (int e = 0; e < kEp; ++e)
    for (const auto& p : table.specs) {
      if (tp_split_of(p.name, c) != TpSplit::Replicated) continue;
      for (int64_t i = p.offset; i < p.offset + p.numel; ++i)
        ASSERT_EQ(out[e * kTp].grads[i], out[e * kTp + 1].grads[i]) << p.name << " at " << i;
    }
  // The counted parameters' squares, summed over the ranks, are the whole model's once (with the
  // gradients as the data-parallel reduction leaves them: both batches' sum on every rank).
  double whole = 0, counted = 0;
  for (float g : whole_sum) whole += double(g) * g;
  for (const RankResult& o : out)
    for (size_t k = 0; k < table.specs.size(); ++k)
      if (o.counted[k])
        for (int64_t i = table.specs[k].offset; i < table.specs[k].offset + table.specs[k].numel; ++i)
          counted += double(o.share[i]) * o.share[i];
  EXPECT_NEAR(counted, whole, 1e-9 * whole);
}

struct EngineNorms {
  std::vector<double> ranks;  // each rank's grad_norm()
  double whole = 0;           // the CPU model's, of both batches' gradients averaged
};

// fn(rank, tp, ep, dp, same): same is the group of the ranks holding this rank's experts, the host
// model's expert_dp_group (null when none does).
using RankGroups =
    std::function<void(int, SharedDeviceGroup&, SharedDeviceGroup&, SharedDeviceGroup&, SharedDeviceGroup*)>;
using RunRanks = std::function<std::vector<std::string>(const RankGroups&)>;

// The CUDA engine on `ranks` ranks (run_ranks gives each its TP group of c.moe.tensor_parallel,
// its EP group (of ep_size ranks), its data-parallel and same-experts groups), one micro-batch
// each of the two TP groups, reduced over the data-parallel pairs (with or without the
// distributed optimizer), then the gradient norm.
EngineNorms engine_norms_on(const GptConfig& c, uint64_t seed, int ep_size, bool dist_opt, int ranks,
                            const RunRanks& run_ranks) {
  const int tp_size = static_cast<int>(c.moe.tensor_parallel);
  GptModel cpu(c);
  random_weights(cpu, cpu.weights());
  const std::vector<CpuRun> runs = {run_cpu(cpu, seed), run_cpu(cpu, seed + 1)};
  EngineNorms out;
  for (size_t i = 0; i < runs[0].grads.size(); ++i) {
    const double g = 0.5 * (double(runs[0].grads[i]) + runs[1].grads[i]);
    out.whole += g * g;
  }
  out.whole = std::sqrt(out.whole);
  GptConfig local_cfg = c;
  local_cfg.moe.expert_parallel = ep_size;
  out.ranks.assign(static_cast<size_t>(ranks), 0.0);
  const std::vector<std::string> errors = run_ranks([&](int r, SharedDeviceGroup& tp, SharedDeviceGroup& ep,
                                                        SharedDeviceGroup& dp, SharedDeviceGroup* same) {
    GptModel host(local_cfg, &tp, &ep, same);
    train::keep_part(cpu.table(), cpu.weights(), host, host.weights());
    host.set_data_parallel_group(&dp);
    const int64_t n = host.num_parameters();
    // As the trainer plans them: the experts apart under expert parallelism only.
    const std::vector<std::pair<int64_t, int64_t>> experts =
        host.ep_size() > 1 ? host.routed_expert_ranges() : std::vector<std::pair<int64_t, int64_t>>{};
    const train::OptimizerShards shards =
        dist_opt ? train::plan_optimizer_shards(n, experts, train::shard_group(&dp),
                                                train::shard_group(host.expert_dp_group()))
                 : train::whole_model_shards(n);
    const optim::AdamWSettings settings{0.9, 0.95, 1e-8};
    std::vector<optim::ParamRange> ranges;
    for (const auto& p : host.table().specs) ranges.push_back({p.offset, p.numel, p.weight_decay ? 1.0 : 0.0});
    std::unique_ptr<optim::AdamW> adam = dist_opt ? train::make_shard_adam(host.table(), shards, settings)
                                                  : std::make_unique<optim::AdamW>(n, ranges, settings);
    auto engine = train::make_cuda_engine(host, *adam, settings, 2, 48, &shards);
    engine->push_state();
    engine->zero_grads();
    const Batch& x = runs[static_cast<size_t>(r / tp_size)].x;
    train::MicroBatchData mb;
    mb.b = x.b, mb.s = x.s, mb.tokens = x.tokens, mb.labels = x.labels, mb.positions = x.positions;
    mb.loss_mask = x.mask;
    engine->run_micro_batch(mb, DropoutKey{1234, 1, false}, x.dloss.data());
    engine->finalize_grads();
    engine->all_reduce_grads(dp, 0.5);
    out.ranks[static_cast<size_t>(r)] = engine->grad_norm();
  });
  for (int r = 0; r < ranks; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  return out;
}

// Every rank's norm is the same, the whole model's of both batches averaged; the distributed
// optimizer's the same but for the order of the sums.
void expect_whole_norms(const EngineNorms& plain, const EngineNorms& sharded) {
  ASSERT_FALSE(::testing::Test::HasFailure());
  EXPECT_GT(plain.whole, 0.0);
  for (size_t r = 0; r < plain.ranks.size(); ++r) {
    EXPECT_EQ(plain.ranks[r], plain.ranks[0]) << "rank " << r;
    EXPECT_EQ(sharded.ranks[r], sharded.ranks[0]) << "rank " << r;
  }
  EXPECT_NEAR(plain.ranks[0], plain.whole, 2e-2 * plain.whole);
  EXPECT_NEAR(sharded.ranks[0], plain.ranks[0], 1e-6 * plain.ranks[0]);
}

EngineNorms engine_norms(bool dist_opt) {
  return engine_norms_on(tp_ep_config(true), 11, kEp, dist_opt, kRanks,
                         [](const RankGroups& fn) { return Meetings().run(fn); });
}

}  // namespace

TEST(CudaGptModelTpEp, EngineGradientNormIsTheWholeModelsWithAndWithoutTheDistributedOptimizer) {
  expect_whole_norms(engine_norms(false), engine_norms(true));
}

TEST(CudaGptModelTpEp, AllGatherDispatcherMatchesCpuModelOnEachPairsBatch) { compare_tp_ep(true); }
TEST(CudaGptModelTpEp, AllToAllDispatcherMatchesCpuModelOnEachPairsBatch) { compare_tp_ep(false); }
// Token dropping under TP: each rank's share of the sequence drops apart, as the CPU model's.
TEST(CudaGptModelTpEp, TokenDroppingByShareMatchesCpuModel) {
  for (const bool allgather : {true, false}) {
    SCOPED_TRACE(allgather ? "all-gather dispatcher" : "all-to-all dispatcher");
    compare_tp_ep(allgather, true);
  }
}

// Whole experts under tensor parallelism (expert TP size 1, Megatron-Core's parallel folding):
// every rank holds whole experts (all of them, or under EP its EP rank's share), and only its
// sequence-parallel share's pairs go to them. The EP groups are EP consecutive ranks: the TP pair,
// both TP pairs (EP=4 at TP=2), or half a TP group (EP=2 at TP=4, where the ranks holding the same
// experts share a TP group and finalize_grads sums them). One TP group, or a second training a
// second batch. Against the CPU model of the whole on each TP group's batch: the per-token losses,
// every rank's gradients after finalize_grads (its part, the experts whole), and each norm group's
// counted parameters make up the whole model once. CudaMoeLayers' other pairs get no row: a pair
// routed twice or never shows in the experts' gradients. Then the CUDA engine on two TP groups
// (data-parallel pairs), whose reduction (with or without the distributed optimizer) leaves every
// rank the whole model's gradient norm.
namespace {

// At TP=4 every rank keeps one head and one query group.
GptConfig whole_experts_config(bool allgather, bool drop = false, int tp = kTp) {
  GptConfig c = tp_ep_config(allgather, drop);
  c.moe.expert_tensor_parallel = 1;
  c.moe.tensor_parallel = tp;
  c.query_groups = std::max<int64_t>(c.query_groups, tp);
  return c;
}

// The ranks of the whole-experts layouts: TP groups of tp consecutive ranks; the EP groups folded
// across them, ep consecutive ranks; the ranks of the same TP place are the data-parallel groups;
// the ranks of the same EP place (r % ep) hold the same experts.
struct WholeExpertsRanks {
  int ranks, tp_size, groups, ep_size;
  std::vector<std::shared_ptr<SharedDeviceGroup::Meeting>> tp, ep, dp, same;
  WholeExpertsRanks(int n, int tp_ranks, int ep_ranks)
      : ranks(n), tp_size(tp_ranks), groups(n / tp_ranks), ep_size(ep_ranks) {
    using M = SharedDeviceGroup::Meeting;
    for (int e = 0; e < groups; ++e) tp.push_back(std::make_shared<M>(tp_size, "tp group " + std::to_string(e)));
    for (int g = 0; g < n / ep_size; ++g) ep.push_back(std::make_shared<M>(ep_size, "ep group " + std::to_string(g)));
    for (int t = 0; t < tp_size; ++t) dp.push_back(std::make_shared<M>(groups, "dp group " + std::to_string(t)));
    for (int q = 0; q < ep_size; ++q) same.push_back(std::make_shared<M>(n / ep_size, "same experts " + std::to_string(q)));
  }
  // The group GptModel takes as its expert data-parallel one: the data-parallel pairs when EP = TP,
  // the same-experts ranks when EP < TP, none when EP > TP (every rank its own experts) or without
  // EP (every rank all of them: the TP group and the data-parallel reduction sum them).
  bool has_same() const { return ep_size > 1 && ep_size <= tp_size && ranks > ep_size; }
  // fn(rank, tp, ep, dp, same); a rank that fails lets the others give up.
  std::vector<std::string> run(const RankGroups& fn) {
    return run_on_shared_gpu(ranks, [&](int r, SharedDeviceGroup&) {
      const int t = r % tp_size, e = r / tp_size, g = r / ep_size, q = r % ep_size;
      SharedDeviceGroup tp_group(tp[e], t), ep_group(ep[g], q), dp_group(dp[t], e), same_group(same[q], r / ep_size);
      try {
        fn(r, tp_group, ep_group, dp_group, has_same() ? &same_group : nullptr);
      } catch (...) {
        tp[e]->break_off(), ep[g]->break_off(), dp[t]->break_off(), same[q]->break_off();
        throw;
      }
    });
  }
};

void compare_whole_experts(int ranks, int ep, bool allgather, bool drop = false, int tp = kTp) {
  const GptConfig c = whole_experts_config(allgather, drop, tp);
  GptModel cpu(c);
  random_weights(cpu, cpu.weights());
  WholeExpertsRanks layout(ranks, tp, std::max(ep, 1));
  const int groups = layout.groups;
  std::vector<CpuRun> runs;
  for (int e = 0; e < groups; ++e) runs.push_back(run_cpu(cpu, 21 + e));
  // Experts that saw (or are summed over) every TP group's batch: an EP group of several TP groups,
  // or same-experts ranks across several TP groups (EP groups inside a TP group).
  const bool experts_summed = ep > tp || (ep > 1 && ep < tp && groups > 1);
  std::vector<float> whole_sum(runs[0].grads.size(), 0.0f);
  for (const CpuRun& run : runs)
    for (size_t i = 0; i < whole_sum.size(); ++i) whole_sum[i] += run.grads[i];
  std::vector<std::vector<float>> whole_expected;
  for (int e = 0; e < groups; ++e) {
    whole_expected.push_back(runs[e].grads);
    if (experts_summed)
      for (const auto& p : cpu.table().specs)
        if (is_routed_expert(p.name))
          std::copy_n(whole_sum.begin() + p.offset, p.numel, whole_expected[e].begin() + p.offset);
  }
  GptConfig local_cfg = c;
  local_cfg.moe.expert_parallel = ep;

  std::vector<RankResult> out(static_cast<size_t>(ranks));
  const std::vector<std::string> errors = layout.run([&](int r, SharedDeviceGroup& tpg, SharedDeviceGroup& epg,
                                                         SharedDeviceGroup&, SharedDeviceGroup* same) {
    const int e = r / tp;
    SharedDeviceGroup* ep_group = ep > 1 ? &epg : nullptr;
    dist::ProcessGroup* same_experts = ep > 1 && ep < tp ? same : nullptr;
    GptModel local(local_cfg, &tpg, ep_group, same_experts);  // this rank's table and keep_part's map
    std::vector<float> w(static_cast<size_t>(local.num_parameters()));
    train::keep_part(cpu.table(), cpu.weights(), local, w.data());
    RankResult& o = out[r];
    o.expected.resize(w.size());
    train::keep_part(cpu.table(), whole_expected[e].data(), local, o.expected.data());
    run_gpu_rank(local_cfg, runs[e].x, w, &tpg, ep_group, o, local.folded_expert_dp_group());
  });
  for (int r = 0; r < ranks; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  if (::testing::Test::HasFailure()) return;

  const ParameterTable table = build_gpt_parameters(tp_local_config(local_cfg, tp)).table;
  expect_ranks_match(out, runs, table, tp);
  // The counted parameters' squares over each group the norms sum over (the TP group, or the EP
  // group of several) are its model's once: its first TP group's batch's, the experts' as held.
  const int group = std::max(ep, tp);
  for (int g = 0; g < ranks / group; ++g) {
    const std::vector<float>& first = whole_expected[g * group / tp];
    double whole = 0, counted = 0;
    for (float v : first) whole += double(v) * v;
    for (int r = g * group; r < (g + 1) * group; ++r)
      for (size_t k = 0; k < table.specs.size(); ++k)
        if (out[r].counted[k])
          for (int64_t i = table.specs[k].offset; i < table.specs[k].offset + table.specs[k].numel; ++i)
            counted += double(out[r].expected[i]) * out[r].expected[i];
    EXPECT_NEAR(counted, whole, 1e-9 * whole) << "group " << g;
  }
}

// The CUDA engine on two TP groups with whole experts: TP=2 x DP=2 (every rank all experts),
// TP=2 x EP=2 x DP=2 (the data-parallel pairs hold the same experts), TP=2 x EP=4 x DP=2 (every
// rank its own experts), or on eight ranks TP=4 x EP=2 x DP=2 (four ranks hold each expert: two TP
// places of each data-parallel rank).
EngineNorms whole_experts_engine_norms(int tp, int ep, bool dist_opt) {
  GptConfig c = whole_experts_config(true, false, tp);
  return engine_norms_on(c, 21, ep, dist_opt, 2 * tp,
                         [tp, ep](const RankGroups& fn) { return WholeExpertsRanks(2 * tp, tp, ep).run(fn); });
}

}  // namespace

TEST(CudaGptModelTpEp, WholeExpertsUnderTensorParallelismMatchCpuModel) {
  {
    SCOPED_TRACE("TP=2, every expert on both ranks");
    compare_whole_experts(2, 1, false);
  }
  {
    SCOPED_TRACE("TP=2 x EP=2 on two ranks, all-to-all dispatcher");
    compare_whole_experts(2, 2, false);
  }
  {
    SCOPED_TRACE("TP=2 x EP=2 on two ranks, all-gather dispatcher");
    compare_whole_experts(2, 2, true);
  }
  {
    SCOPED_TRACE("TP=2 x EP=2 x DP=2 on four ranks");
    compare_whole_experts(4, 2, true);
  }
  {
    SCOPED_TRACE("TP=2 x DP=2 on four ranks, every expert on every rank");
    compare_whole_experts(4, 1, false);
  }
  {
    SCOPED_TRACE("TP=2 x EP=2 on two ranks, token dropping by share");
    compare_whole_experts(2, 2, true, true);
  }
  {
    SCOPED_TRACE("TP=2, token dropping by share");
    compare_whole_experts(2, 1, false, true);
  }
  {
    SCOPED_TRACE("TP=2 x EP=4 on four ranks (an EP group of both TP pairs), all-to-all dispatcher");
    compare_whole_experts(4, 4, false);
  }
  {
    SCOPED_TRACE("TP=2 x EP=4 on four ranks, all-gather dispatcher");
    compare_whole_experts(4, 4, true);
  }
}

// EP groups inside a TP group: the ranks holding the same experts share the TP group (and, with a
// second TP group, lie across the data-parallel ranks too); finalize_grads sums their experts.
TEST(CudaGptModelTpEp, WholeExpertsInExpertGroupsInsideTensorGroupMatchCpuModel) {
  for (const bool allgather : {false, true}) {
    SCOPED_TRACE(allgather ? "all-gather dispatcher" : "all-to-all dispatcher");
    {
      SCOPED_TRACE("TP=4 x EP=2 on four ranks");
      compare_whole_experts(4, 2, allgather, false, 4);
    }
    {
      SCOPED_TRACE("TP=4 x EP=2 x DP=2 on eight ranks");
      compare_whole_experts(8, 2, allgather, false, 4);
    }
  }
  {
    SCOPED_TRACE("TP=4 x EP=2 on four ranks, token dropping by share");
    compare_whole_experts(4, 2, true, true, 4);
  }
}

TEST(CudaGptModelTpEp, WholeExpertsEngineGradientNormIsTheWholeModels) {
  for (const auto& [tp, ep] : {std::pair{kTp, 1}, std::pair{kTp, kTp}, std::pair{kTp, 2 * kTp}, std::pair{4, 2}}) {
    SCOPED_TRACE("TP=" + std::to_string(tp) + " x EP=" + std::to_string(ep));
    expect_whole_norms(whole_experts_engine_norms(tp, ep, false), whole_experts_engine_norms(tp, ep, true));
  }
}
