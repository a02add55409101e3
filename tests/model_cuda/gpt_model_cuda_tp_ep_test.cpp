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
// reference does. Both token dispatchers.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "model/cuda/gpt_model_cuda.hpp"
#include "model/gpt_ep.hpp"
#include "model/gpt_model.hpp"
#include "model/gpt_tp.hpp"
#include "model_cuda_test_util.hpp"
#include "moe_test_util.hpp"
#include "shared_device_group.hpp"
#include "train/tp_state.hpp"

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

void compare_tp_ep(bool allgather) {
  GptConfig c = moe_config(llama_config(), 4, 4, 64, 0);
  c.heads = 4, c.query_groups = 2, c.kv_channels = 64;
  c.moe.tensor_parallel = kTp;
  c.moe.allgather_dispatcher = allgather;
  c.sequence_parallel = true;
  GptModel cpu(c);
  random_weights(cpu, cpu.weights());
  const std::vector<CpuRun> runs = {run_cpu(cpu, 11), run_cpu(cpu, 12)};
  // What each EP pair's ranks should hold after the backward, in the whole model's layout.
  std::vector<std::vector<float>> whole_expected(kEp);
  for (int e = 0; e < kEp; ++e) {
    whole_expected[e] = runs[e].grads;
    for (const auto& p : cpu.table().specs)
      if (is_routed_expert(p.name))
        for (int64_t i = p.offset; i < p.offset + p.numel; ++i) whole_expected[e][i] = runs[0].grads[i] + runs[1].grads[i];
  }
  std::vector<float> whole_sum(runs[0].grads.size());
  for (size_t i = 0; i < whole_sum.size(); ++i) whole_sum[i] = runs[0].grads[i] + runs[1].grads[i];
  GptConfig local_cfg = c;
  local_cfg.moe.expert_parallel = kEp;

  std::vector<std::shared_ptr<SharedDeviceGroup::Meeting>> tp_meetings, ep_meetings;
  for (int i = 0; i < kEp; ++i)
    tp_meetings.push_back(std::make_shared<SharedDeviceGroup::Meeting>(kTp, "tp group " + std::to_string(i)));
  for (int i = 0; i < kTp; ++i)
    ep_meetings.push_back(std::make_shared<SharedDeviceGroup::Meeting>(kEp, "ep group " + std::to_string(i)));
  std::vector<RankResult> out(kRanks);
  auto rank = [&](int r) {
    const int t = r % kTp, e = r / kTp;
    SharedDeviceGroup tp(tp_meetings[e], t), ep(ep_meetings[t], e);
    GptModel local(local_cfg, &tp, &ep);  // the CPU model of this rank: its table and keep_part's map
    std::vector<float> w(static_cast<size_t>(local.num_parameters()));
    train::keep_part(cpu.table(), cpu.weights(), local, w.data());
    RankResult& o = out[r];
    o.expected.resize(w.size());
    train::keep_part(cpu.table(), whole_expected[e].data(), local, o.expected.data());
    o.share.resize(w.size());
    train::keep_part(cpu.table(), whole_sum.data(), local, o.share.data());

    const Batch& x = runs[e].x;
    const MicroBatch mb{x.b, x.s, x.tokens.data(), x.labels.data(), x.positions.data()};
    CudaGptModel gpu(local_cfg, x.b, x.s, &tp, &ep);
    gpu.upload_weights(w.data());
    gpu.zero_grads();
    gpu.forward(mb, x.mask.data(), DropoutKey{1234, 1, false}, x.dloss.data());
    gpu.backward();
    gpu.finalize_grads();
    o.losses = gpu.download_losses();
    o.grads.resize(w.size());
    gpu.download_grads(o.grads.data());
    for (const auto& p : gpu.table().specs) o.counted.push_back(gpu.counts(p, true) ? 1 : 0);
  };
  const std::vector<std::string> errors = run_on_shared_gpu(kRanks, [&](int r, SharedDeviceGroup&) {
    try {
      rank(r);
    } catch (...) {  // the others give up too, rather than wait for this rank
      tp_meetings[r / kTp]->break_off();
      ep_meetings[r % kTp]->break_off();
      throw;
    }
  });
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  if (::testing::Test::HasFailure()) return;

  const ParameterTable table = build_gpt_parameters(tp_local_config(local_cfg, kTp)).table;
  for (int r = 0; r < kRanks; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const int e = r / kTp;
    const RankResult& o = out[r];
    ASSERT_EQ(o.losses.size(), runs[e].losses.size());
    for (size_t i = 0; i < o.losses.size(); ++i)
      ASSERT_NEAR(o.losses[i], runs[e].losses[i], 3e-2) << "token " << i;
    EXPECT_LT(rel_err(o.grads.data(), o.expected.data(), static_cast<int64_t>(o.grads.size())), 2e-2);
    for (const auto& p : table.specs)
      EXPECT_LT(rel_err(o.grads.data() + p.offset, o.expected.data() + p.offset, p.numel), 6e-2) << p.name;
  }
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

}  // namespace

TEST(CudaGptModelTpEp, AllGatherDispatcherMatchesCpuModelOnEachPairsBatch) { compare_tp_ep(true); }
TEST(CudaGptModelTpEp, AllToAllDispatcherMatchesCpuModelOnEachPairsBatch) { compare_tp_ep(false); }
