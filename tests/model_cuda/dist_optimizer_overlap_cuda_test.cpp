// --overlap-grad-reduce with the distributed optimizer on GPU ranks (train/engine_cuda.cpp): the
// step's last backward reduce-scatters each run of the optimizer's shares (cut at the model's parts,
// train/dist_optimizer.hpp) as soon as the backward reports all of it, on a stream of its own. Two
// data-parallel ranks as threads on one GPU (SharedDeviceGroup); the step must end with the same
// gradient norm and the same parameters, bit for bit, as the step that reduces after the backward,
// and the ranks with the same parameters; a save's download_state of the owned segments the whole
// pull's. GPU only.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_check.hpp"
#include "model/gpt_model.hpp"
#include "optim/adamw.hpp"
#include "train/data_pipeline.hpp"
#include "train/dist_optimizer.hpp"
#include "train/engine.hpp"
#include "model_cuda_test_util.hpp"
#include "shared_device_group.hpp"

using namespace laoyao;
using namespace laoyao::model;
using namespace laoyao::model::test;

namespace {

struct StepResult {
  std::vector<float> weights;
  double norm = 0;
  // download_state (a save's, a part at a time) gave the owned segments' weights and moments as
  // the whole pull does.
  bool owned_as_whole = false;
};

// One step of two micro-batches on each of two data-parallel ranks (each its own tokens).
std::vector<StepResult> step_two_ranks(const GptConfig& c, bool overlap) {
  constexpr int dp = 2;
  constexpr int64_t b = 2, s = 32;
  std::vector<StepResult> out(dp);
  const std::vector<std::string> errors = run_on_shared_gpu(dp, [&](int r, SharedDeviceGroup& group) {
    GptModel host(c);
    random_weights(host, host.weights());
    host.set_data_parallel_group(&group);
    const train::OptimizerShards shards = train::plan_optimizer_shards(
        host.num_parameters(), {}, train::shard_group(&group), {}, train::overlap_bucket_cuts(host.table()));
    const optim::AdamWSettings settings{0.9, 0.95, 1e-8};
    auto adam = train::make_shard_adam(host.table(), shards, settings);
    auto engine = train::make_cuda_engine(host, *adam, settings, b, s, &shards);
    engine->push_state();
    engine->zero_grads();
    for (int m = 0; m < 2; ++m) {
      const Batch x = random_batch(b, s, c.vocab, 100 + 10 * r + m);
      train::MicroBatchData mb;
      mb.b = b, mb.s = s, mb.tokens = x.tokens, mb.labels = x.labels, mb.positions = x.positions;
      mb.loss_mask = x.mask;
      if (overlap && m == 1) engine->start_grad_sync(group, 1.0 / dp);
      engine->run_micro_batch(mb, DropoutKey{7, static_cast<uint64_t>(2 * m + r), true}, x.dloss.data());
    }
    engine->finalize_grads();
    engine->all_reduce_grads(group, 1.0 / dp);
    out[r].norm = engine->grad_norm();
    engine->clip_and_step(out[r].norm, 1.0, 1e-3, 0.1);
    using Buffer = train::Engine::StateBuffer;
    std::vector<std::vector<float>> owned;  // per segment: weights, exp_avg, exp_avg_sq
    for (const train::OwnedSegment& seg : shards.owned)
      for (const Buffer b : {Buffer::kWeights, Buffer::kExpAvg, Buffer::kExpAvgSq}) {
        owned.emplace_back(static_cast<size_t>(seg.count));
        engine->download_state(b, b == Buffer::kWeights ? seg.offset : seg.moment, seg.count, owned.back().data());
      }
    engine->pull_state();
    out[r].weights.assign(host.weights(), host.weights() + host.num_parameters());
    out[r].owned_as_whole = true;
    size_t k = 0;
    for (const train::OwnedSegment& seg : shards.owned)
      for (const float* whole : {host.weights() + seg.offset, adam->exp_avg().data() + seg.moment,
                                 adam->exp_avg_sq().data() + seg.moment})
        out[r].owned_as_whole = out[r].owned_as_whole && std::equal(owned[k].begin(), owned[k].end(), whole), ++k;
  });
  for (int r = 0; r < dp; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  return out;
}

}  // namespace

TEST(CudaDistOptimizer, OverlappedReductionGivesTheStepOfTheReductionAfterTheBackward) {
  GptConfig c = llama_config();
  c.num_layers = 3;
  const std::vector<StepResult> after = step_two_ranks(c, false), overlapped = step_two_ranks(c, true);
  ASSERT_EQ(after.size(), 2u);
  ASSERT_EQ(overlapped.size(), 2u);
  EXPECT_GT(after[0].norm, 0.0);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(overlapped[r].norm, after[r].norm) << "rank " << r;
    EXPECT_EQ(overlapped[r].weights, after[r].weights) << "rank " << r;
    EXPECT_TRUE(after[r].owned_as_whole && overlapped[r].owned_as_whole) << "rank " << r;
  }
  EXPECT_EQ(after[0].weights, after[1].weights) << "the ranks' parameters after the step";
}
