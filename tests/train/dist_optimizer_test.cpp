// The distributed optimizer's shares (train/dist_optimizer.hpp): every parameter owned, each counted
// once over the ranks, moments aligned like their parameters, and the ranks' steps of their shares
// together the whole model's AdamW step, bit for bit. (The collectives run in the launch tests.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/error.hpp"
#include "optim/adamw.hpp"
#include "train/dist_optimizer.hpp"

using namespace laoyao;
using train::OptimizerShards;
using train::ShardGroup;

namespace {

// Ranks of one layout: a fake group (no collectives) of `size` with this rank's place.
ShardGroup place(int64_t rank, int64_t size) { return size > 1 ? ShardGroup{nullptr, rank, size} : ShardGroup{}; }

struct Layout {
  int64_t n;
  std::vector<std::pair<int64_t, int64_t>> experts;  // routed experts' ranges
  int64_t dp, edp;                                  // dense and expert group sizes
};

OptimizerShards plan(const Layout& l, int64_t dp_rank) {
  return train::plan_optimizer_shards(l.n, l.experts, place(dp_rank, l.dp), place(dp_rank / (l.dp / l.edp), l.edp));
}

// A table of parameters with and without weight decay tiling n elements.
model::ParameterTable table_of(const std::vector<int64_t>& sizes) {
  model::ParameterTable t;
  for (size_t i = 0; i < sizes.size(); ++i) {
    t.add(std::string(1, static_cast<char>('a' + i)), {sizes[i]}, model::Init::Zeros);
    t.specs.back().weight_decay = i % 2 == 0;
  }
  return t;
}

}  // namespace

TEST(DistOptimizer, EveryParameterIsOwnedAndCountedOnceOverTheRanks) {
  const std::vector<Layout> layouts = {
      {10, {}, 1, 1},                  // not sharded: the whole model
      {10, {}, 3, 3},                  // pieces of 3 and a tail of 1
      {2, {}, 4, 4},                   // fewer elements than ranks: all tail
      {103, {{10, 20}, {50, 31}}, 2, 1},  // EP=2 on 2 ranks: experts whole on each
      {103, {{10, 20}, {50, 31}}, 4, 2},  // EP=2 x expert-DP 2
  };
  for (const Layout& l : layouts) {
    SCOPED_TRACE("n " + std::to_string(l.n) + ", dp " + std::to_string(l.dp) + ", edp " + std::to_string(l.edp));
    // Within one expert-parallel slot (the ranks holding the same experts) and over all ranks.
    std::vector<int> owners(static_cast<size_t>(l.n), 0), counts(static_cast<size_t>(l.n), 0);
    const int64_t ep = l.dp / l.edp;
    for (int64_t r = 0; r < l.dp; ++r) {
      const OptimizerShards s = plan(l, r);
      EXPECT_EQ(s.sharded(), false) << "a fake group is no group";
      int64_t moments = 0;
      for (const auto& seg : s.owned) {
        EXPECT_GE(seg.moment, moments) << "moments in order, not overlapping";
        EXPECT_EQ(((seg.moment - seg.offset) % 4 + 4) % 4, 0) << "moments aligned like their parameters";
        moments = seg.moment + seg.count;
        for (int64_t i = seg.offset; i < seg.offset + seg.count; ++i) {
          bool expert = false;
          for (const auto& [o, c] : l.experts) expert = expert || (i >= o && i < o + c);
          // The experts of one slot (rank % ep) are the same tensors; different slots' are others.
          if (!expert || r % ep == 0) owners[i] += 1;
          if (seg.counted && (!expert || r % ep == 0)) counts[i] += 1;
        }
      }
      EXPECT_EQ(s.owned_total, moments);
      EXPECT_LE(s.owned_total, l.n + 3 * static_cast<int64_t>(s.owned.size()));
    }
    for (int64_t i = 0; i < l.n; ++i) {
      EXPECT_EQ(counts[i], 1) << "element " << i << " counted once";
      EXPECT_GE(owners[i], 1) << "element " << i << " owned";
    }
  }
  // A last rank's piece and tail are one segment; another rank's tail is owned but not counted.
  const OptimizerShards last = plan({10, {}, 3, 3}, 2), first = plan({10, {}, 3, 3}, 0);
  ASSERT_EQ(last.owned.size(), 1u);
  EXPECT_EQ(last.owned[0].offset, 6);
  EXPECT_EQ(last.owned[0].count, 4);
  ASSERT_EQ(first.owned.size(), 2u);
  EXPECT_EQ(first.owned[1].offset, 9);
  EXPECT_FALSE(first.owned[1].counted);
  // The runs: dense over the data-parallel group, experts over the expert one.
  const OptimizerShards ep = plan({103, {{10, 20}, {50, 31}}, 4, 2}, 3);
  ASSERT_EQ(ep.runs.size(), 5u);
  EXPECT_EQ(ep.runs[1].offset, 10);
  EXPECT_EQ(ep.runs[1].over.size, 2);
  EXPECT_EQ(ep.runs[1].over.rank, 1);
  EXPECT_EQ(ep.runs[2].over.size, 4);
  EXPECT_EQ(ep.runs[2].over.rank, 3);
}

// Each rank steps its owned segments of the (already averaged) gradients; the pieces it counts,
// put together, are the whole AdamW step of two steps with clipping.
TEST(DistOptimizer, TheRanksStepsOfTheirSharesAreTheWholeStep) {
  const model::ParameterTable table = table_of({7, 13, 5, 21, 9, 2});  // 57 elements
  const int64_t n = table.total;
  std::mt19937 gen(3);
  std::normal_distribution<float> normal;
  std::vector<float> w0(n), g1(n), g2(n);
  for (auto* v : {&w0, &g1, &g2})
    for (float& x : *v) x = normal(gen);
  std::vector<optim::ParamRange> ranges;
  for (const auto& p : table.specs) ranges.push_back({p.offset, p.numel, p.weight_decay ? 1.0 : 0.0});
  const optim::AdamWSettings settings{0.9, 0.95, 1e-8};
  auto norm = [&](const std::vector<float>& g) { return optim::grad_norm(g.data(), n); };

  std::vector<float> want = w0;
  {
    optim::AdamW adam(n, ranges, settings);
    for (const auto* g : {&g1, &g2}) {
      std::vector<float> grads = *g;
      optim::clip_grads(grads.data(), n, norm(*g), 1.0);
      adam.step(want.data(), grads.data(), 1e-2, 0.1);
    }
  }
  for (const Layout& l : {Layout{n, {}, 3, 3}, Layout{n, {{7, 13}, {46, 9}}, 4, 2}}) {
    std::vector<float> got(n, NAN);
    const int64_t ep = l.dp / l.edp;
    for (int64_t r = 0; r < l.dp; ++r) {
      const OptimizerShards s = plan(l, r);
      auto adam = train::make_shard_adam(table, s, settings);
      std::vector<float> w = w0, scratch;
      for (const auto* g : {&g1, &g2}) {
        std::vector<float> grads = *g;
        train::step_owned(*adam, s, w.data(), grads.data(), norm(*g), 1.0, 1e-2, 0.1, {}, scratch);
      }
      for (const auto& seg : s.owned)
        for (int64_t i = seg.offset; i < seg.offset + seg.count; ++i) {
          bool expert = false;
          for (const auto& [o, c] : l.experts) expert = expert || (i >= o && i < o + c);
          if (seg.counted && (!expert || r % ep == 0)) got[i] = w[i];
        }
    }
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(got[i], want[i]) << "element " << i << ", dp " << l.dp;
  }
}

// --overlap-grad-reduce: the dense runs cut at the model's parts (each layer, the head), so each is
// reduce-scattered whole as the backward finishes it; the experts' runs stay as they were; every
// element still owned and counted once.
TEST(DistOptimizer, OverlapCutsTheDenseRunsAtTheModelsParts) {
  model::ParameterTable t;
  for (const char* name : {"embedding.word_embeddings.weight", "decoder.layers.0.self_attention.linear_qkv.weight",
                           "decoder.layers.0.mlp.linear_fc1.weight", "decoder.layers.1.self_attention.linear_qkv.weight",
                           "decoder.layers.1.mlp.linear_fc1.weight", "decoder.final_layernorm.weight",
                           "output_layer.weight"})
    t.add(name, {10}, model::Init::Zeros);
  const std::vector<int64_t> cuts = train::overlap_bucket_cuts(t);
  EXPECT_EQ(cuts, (std::vector<int64_t>{10, 30, 50}));  // layer 0, layer 1, the head
  for (const int64_t dp : {int64_t{2}, int64_t{3}}) {
    std::vector<int> counts(70, 0);
    for (int64_t r = 0; r < dp; ++r) {
      const OptimizerShards s = train::plan_optimizer_shards(70, {}, place(r, dp), {}, cuts);
      ASSERT_EQ(s.runs.size(), 4u);
      for (size_t i = 0; i < s.runs.size(); ++i) {
        EXPECT_EQ(s.runs[i].offset, i == 0 ? 0 : cuts[i - 1]);
        EXPECT_EQ(s.runs[i].offset + s.runs[i].count, i + 1 < s.runs.size() ? cuts[i] : 70);
      }
      for (const auto& seg : s.owned)
        if (seg.counted)
          for (int64_t e = seg.offset; e < seg.offset + seg.count; ++e) ++counts[static_cast<size_t>(e)];
    }
    for (int64_t e = 0; e < 70; ++e) EXPECT_EQ(counts[static_cast<size_t>(e)], 1) << "dp " << dp << ", element " << e;
  }
  // With experts: their runs whole, the dense ones between them cut.
  const OptimizerShards s = train::plan_optimizer_shards(70, {{15, 10}}, place(0, 2), {}, cuts);
  std::vector<std::pair<int64_t, int64_t>> runs;
  for (const auto& run : s.runs) runs.push_back({run.offset, run.count});
  EXPECT_EQ(runs, (std::vector<std::pair<int64_t, int64_t>>{{0, 10}, {10, 5}, {15, 10}, {25, 5}, {30, 20}, {50, 20}}));
  EXPECT_THROW(train::plan_optimizer_shards(70, {}, place(0, 2), {}, {30, 10}), Error);
}

// --decoupled-lr on the CUDA engine: its owned segments cut into runs of one rate each
// (plan_step_runs), from the shares' AdamW ranges. Every owned element in exactly one run, at
// its own offset and moment, decoupled exactly when its parameter is an embedding or output layer.
TEST(DistOptimizer, StepRunsCutTheOwnedSegmentsWhereTheRateChanges) {
  model::ParameterTable table = table_of({7, 13, 5, 11, 9, 6});
  table.specs[1].embedding_or_output = table.specs[4].embedding_or_output = true;
  const int64_t n = table.total;
  const std::vector<Layout> layouts = {{n, {}, 1, 1}, {n, {}, 2, 2}, {n, {}, 3, 3}, {n, {{7, 13}, {36, 9}}, 2, 1}};
  for (const Layout& l : layouts) {
    SCOPED_TRACE("dp " + std::to_string(l.dp) + (l.experts.empty() ? "" : ", experts apart"));
    for (int64_t r = 0; r < l.dp; ++r) {
      SCOPED_TRACE("rank " + std::to_string(r));
      for (const std::vector<int64_t>& cuts : {std::vector<int64_t>{}, std::vector<int64_t>{20, 36}}) {
        const OptimizerShards s = train::plan_optimizer_shards(
            l.n, l.experts, place(r, l.dp), place(r / (l.dp / l.edp), l.edp), cuts);
        const auto adam = train::make_shard_adam(table, s, optim::AdamWSettings{});
        const std::vector<train::StepRun> runs = train::plan_step_runs(s, adam->ranges());
        std::vector<int> covered(static_cast<size_t>(n), 0);
        for (const train::StepRun& run : runs) {
          bool inside = false;  // the run lies in one owned segment, offsets and moments alike
          for (const train::OwnedSegment& seg : s.owned)
            inside = inside || (run.offset >= seg.offset && run.offset + run.count <= seg.offset + seg.count &&
                                run.moment - seg.moment == run.offset - seg.offset);
          EXPECT_TRUE(inside) << "run at " << run.offset;
          for (int64_t i = run.offset; i < run.offset + run.count; ++i) {
            ++covered[static_cast<size_t>(i)];
            const auto spec = std::find_if(table.specs.begin(), table.specs.end(), [&](const model::ParamSpec& p) {
              return i >= p.offset && i < p.offset + p.numel;
            });
            EXPECT_EQ(run.decoupled, spec->embedding_or_output) << "element " << i;
          }
        }
        for (const train::OwnedSegment& seg : s.owned)
          for (int64_t i = seg.offset; i < seg.offset + seg.count; ++i)
            EXPECT_EQ(covered[static_cast<size_t>(i)], 1) << "element " << i;
        int64_t owned = 0, in_runs = 0;
        for (const train::OwnedSegment& seg : s.owned) owned += seg.count;
        for (const train::StepRun& run : runs) in_runs += run.count;
        EXPECT_EQ(in_runs, owned);
      }
    }
  }
  // Ranges that leave part of a segment uncovered are refused.
  const OptimizerShards whole = train::whole_model_shards(n);
  EXPECT_THROW(train::plan_step_runs(whole, {{0, n - 1, 1.0}}), Error);
}
