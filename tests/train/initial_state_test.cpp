// Where a run's initial state comes from and where it is held (train/tp_state.hpp): a split rank's
// initial weights cut one whole tensor at a time are the whole model's initial weights' part (as
// keep_part cuts a whole buffer), for tensor, expert, and both parallelisms, split or whole experts;
// a parameter's init in chunks is its init at once; the host model and AdamW hold storage only when
// asked, and HostStateHold gives back what it took; what a rank writes of a checkpoint tiles its state.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/rng.hpp"
#include "dist/process_group.hpp"
#include "model/gpt_ep.hpp"
#include "model/gpt_layout.hpp"
#include "model/gpt_model.hpp"
#include "model/parameters.hpp"
#include "model/tensor_box.hpp"
#include "optim/adamw.hpp"
#include "train/dist_optimizer.hpp"
#include "train/rank_checkpoint.hpp"
#include "train/tp_state.hpp"

using namespace laoyao;
using namespace laoyao::model;

namespace {

// A group that only says who is in it: building a model's shards takes no collective.
class PositionOnlyGroup final : public dist::ProcessGroup {
 public:
  PositionOnlyGroup(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_reduce_sum(float*, size_t) override { throw Error("no collective expected"); }
  void all_reduce_sum(double*, size_t) override { throw Error("no collective expected"); }
  void all_reduce_max(float*, size_t) override { throw Error("no collective expected"); }
  void barrier() override { throw Error("no collective expected"); }

 private:
  int rank_, size_;
};

GptConfig dense() {
  GptConfig c;
  c.num_layers = 2, c.hidden = 32, c.heads = 4, c.query_groups = 2, c.kv_channels = 8, c.ffn = 64, c.vocab = 64;
  c.max_positions = 16, c.tied_embeddings = false;
  return c;
}

GptConfig moe(int64_t ep, bool whole_experts) {
  GptConfig c = dense();
  c.norm = Norm::RMSNorm, c.activation = Activation::SwiGLU, c.positions = Positions::Rope;
  c.add_bias_linear = false, c.add_qkv_bias = false, c.sequence_parallel = true;
  c.moe.num_experts = 4, c.moe.topk = 2, c.moe.ffn = 16, c.moe.shared_ffn = 8, c.moe.layers = {false, true};
  c.moe.expert_parallel = ep;
  if (whole_experts) c.moe.expert_tensor_parallel = 1;
  return c;
}

// keep_part's cut of the whole model's initial buffer: what every rank held before.
std::vector<float> cut_from_whole(const GptModel& local, uint64_t seed, bool bf16) {
  const ParameterTable whole = build_gpt_parameters(ep_whole_config(local.config())).table;
  std::vector<float> w(static_cast<size_t>(whole.total));
  init_parameters(whole, w.data(), seed, bf16);
  std::vector<float> part(static_cast<size_t>(local.num_parameters()));
  train::keep_part(whole, w.data(), local, part.data());
  return part;
}

}  // namespace

TEST(InitialState, ASplitRanksInitialWeightsAreItsPartOfTheWholeModels) {
  struct Case {
    std::string name;
    GptConfig cfg;
    int tp, ep;
  };
  GptConfig tp_moe = moe(2, false);
  tp_moe.moe.tensor_parallel = 2;
  // A vocabulary of 140,000 x 32: the tables are drawn in two row windows of 4M values (131,072
  // rows, then the rest), each overlapping both ranks' halves.
  GptConfig wide_vocab = dense();
  wide_vocab.vocab = 140000;
  const Case cases[] = {{"TP=2, dense", dense(), 2, 1},
                        {"TP=2, tables drawn in two windows", wide_vocab, 2, 1},
                        {"EP=2", moe(2, false), 1, 2},
                        {"TP=2 x EP=2, experts split by TP", tp_moe, 2, 2},
                        {"TP=2 x EP=2, whole experts", moe(2, true), 2, 2}};
  for (const Case& k : cases) {
    for (int tp_rank = 0; tp_rank < k.tp; ++tp_rank)
      for (int ep_rank = 0; ep_rank < k.ep; ++ep_rank)
        for (const bool bf16 : {true, false}) {
          SCOPED_TRACE(k.name + ", TP rank " + std::to_string(tp_rank) + ", EP rank " + std::to_string(ep_rank) +
                       (bf16 ? ", bf16" : ", fp32"));
          PositionOnlyGroup tp(tp_rank, k.tp), ep(ep_rank, k.ep);
          GptModel local(k.cfg, k.tp > 1 ? &tp : nullptr, k.ep > 1 ? &ep : nullptr);
          ASSERT_TRUE(train::split_model(local));
          train::init_model_weights(local, 99, bf16);
          const std::vector<float> want = cut_from_whole(local, 99, bf16);
          ASSERT_EQ(std::vector<float>(local.weights(), local.weights() + local.num_parameters()), want);
          // What for_each_initial_part hands out is each parameter at its place, in table order.
          int64_t next = 0;
          train::for_each_initial_part(local, 99, bf16, [&](const ParamSpec& p, const float* values) {
            EXPECT_GE(p.offset, next) << p.name;
            next = p.offset + p.numel;
            EXPECT_TRUE(std::equal(values, values + p.numel, want.begin() + p.offset)) << p.name;
          });
          EXPECT_EQ(next, local.table().specs.back().offset + local.table().specs.back().numel);
        }
  }
}

TEST(InitialState, AParametersInitInChunksIsItsInitAtOnce) {
  const ParameterTable table = build_gpt_parameters(dense()).table;
  std::vector<float> at_once(static_cast<size_t>(table.total));
  init_parameters(table, at_once.data(), 5, true);
  int normal = 0;
  for (const ParamSpec& p : table.specs) {
    normal += p.init == Init::Normal;
    ParameterInit init(p, 5, true);
    std::vector<float> chunked(static_cast<size_t>(p.numel));
    for (int64_t done = 0; done < p.numel;) {  // uneven chunks: 7, 1, 7, 1, ...
      const int64_t n = std::min<int64_t>(p.numel - done, done % 2 == 0 ? 7 : 1);
      init.next(chunked.data() + done, n);
      done += n;
    }
    EXPECT_TRUE(std::equal(chunked.begin(), chunked.end(), at_once.begin() + p.offset)) << p.name;
  }
  EXPECT_GT(normal, 4);
}

TEST(InitialState, HostStorageIsHeldOnlyWhenAskedAndTheHoldGivesBackWhatItTook) {
  const GptConfig c = dense();
  const optim::AdamWSettings s;
  GptModel bare(c, nullptr, nullptr, nullptr, /*host_state=*/false);
  EXPECT_FALSE(bare.holds_host_weights());
  EXPECT_EQ(bare.weights(), nullptr);
  auto bare_adam = train::make_whole_adam(bare.table(), s, /*hold_moments=*/false);
  EXPECT_FALSE(bare_adam->holds_moments());
  EXPECT_EQ(bare_adam->num_params(), bare.num_parameters());
  std::vector<float> g(static_cast<size_t>(bare.num_parameters()), 0.1f);
  EXPECT_THROW(bare_adam->step(g.data(), g.data(), 1e-3, 0.0), Error) << "no moments to step";
  {
    const train::HostStateHold hold(bare, *bare_adam);
    ASSERT_TRUE(bare.holds_host_weights() && bare_adam->holds_moments());
    EXPECT_TRUE(std::all_of(bare.weights(), bare.weights() + bare.num_parameters(), [](float v) { return v == 0; }));
    EXPECT_EQ(bare_adam->exp_avg().size(), static_cast<size_t>(bare.num_parameters()));
  }
  EXPECT_FALSE(bare.holds_host_weights());
  EXPECT_FALSE(bare_adam->holds_moments());

  GptModel held(c);  // the CPU backend's: always held, and a hold leaves it so
  auto adam = train::make_whole_adam(held.table(), s);
  held.weights()[3] = 1.5f;
  { const train::HostStateHold hold(held, *adam); }
  EXPECT_TRUE(held.holds_host_weights() && adam->holds_moments());
  EXPECT_EQ(held.weights()[3], 1.5f) << "a hold of what is held touches nothing";
}

// Checkpoints by part: each rank's parameters as parts of the whole tensors (rank_parts), so that
// what the ranks of one layout hold fills the parts of any other's, whatever the two sizes. Each
// layout's data here is keep_part's cut of one random whole model.
namespace {

struct Layout {
  std::string name;
  GptConfig cfg;
  int tp, ep;
};

struct RankState {
  std::unique_ptr<PositionOnlyGroup> tp, ep;
  std::unique_ptr<GptModel> model;
  std::vector<float> data;
  std::vector<TensorPart> parts;
};

std::vector<RankState> ranks_of(const Layout& l, const ParameterTable& whole, const std::vector<float>& whole_w) {
  std::vector<RankState> out;
  for (int t = 0; t < l.tp; ++t)
    for (int e = 0; e < l.ep; ++e) {
      RankState r;
      r.tp = std::make_unique<PositionOnlyGroup>(t, l.tp);
      r.ep = std::make_unique<PositionOnlyGroup>(e, l.ep);
      r.model = std::make_unique<GptModel>(l.cfg, l.tp > 1 ? r.tp.get() : nullptr, l.ep > 1 ? r.ep.get() : nullptr,
                                           nullptr, false);
      r.data.resize(static_cast<size_t>(r.model->num_parameters()));
      train::keep_part(whole, whole_w.data(), *r.model, r.data.data());
      r.parts = train::rank_parts(*r.model);
      out.push_back(std::move(r));
    }
  return out;
}

}  // namespace

TEST(InitialState, PartsHeldAtOneLayoutFillThePartsOfAnother) {
  GptConfig dense4 = dense();
  dense4.query_groups = 4;
  GptConfig tp_moe = moe(2, false);
  tp_moe.moe.tensor_parallel = 2;
  GptConfig one_moe = moe(1, false);
  const std::vector<std::pair<Layout, Layout>> moves = {
      {{"TP=2", dense4, 2, 1}, {"TP=4", dense4, 4, 1}},
      {{"TP=4", dense4, 4, 1}, {"one rank", dense4, 1, 1}},
      {{"TP=2 x EP=2", tp_moe, 2, 2}, {"EP=2", moe(2, false), 1, 2}},
      {{"EP=2", moe(2, false), 1, 2}, {"TP=2 x EP=2, whole experts", moe(2, true), 2, 2}},
      {{"TP=2 x EP=2, whole experts", moe(2, true), 2, 2}, {"one rank", one_moe, 1, 1}}};
  for (const auto& [from, to] : moves) {
    SCOPED_TRACE(from.name + " to " + to.name);
    const ParameterTable whole = build_gpt_parameters(ep_whole_config(from.cfg)).table;
    ASSERT_EQ(whole.total, build_gpt_parameters(ep_whole_config(to.cfg)).table.total);
    std::vector<float> whole_w(static_cast<size_t>(whole.total));
    Rng rng(11, "parts");
    for (float& v : whole_w) v = static_cast<float>(rng.normal());
    const std::vector<RankState> savers = ranks_of(from, whole, whole_w), loaders = ranks_of(to, whole, whole_w);
    for (const RankState& l : loaders) {
      std::vector<float> got(l.data.size(), std::numeric_limits<float>::quiet_NaN());
      const auto& lspecs = l.model->table().specs;
      for (size_t i = 0; i < lspecs.size(); ++i)
        for (const RankState& s : savers) {
          const auto& sspecs = s.model->table().specs;
          for (size_t j = 0; j < sspecs.size(); ++j)
            if (s.parts[j].name == l.parts[i].name)
              copy_overlap(s.parts[j], s.data.data() + sspecs[j].offset, l.parts[i], got.data() + lspecs[i].offset);
        }
      for (const auto& p : lspecs) {
        const auto first = got.begin() + p.offset, last = first + p.numel;
        EXPECT_TRUE(std::none_of(first, last, [](float v) { return std::isnan(v); })) << p.name << ": not covered";
        EXPECT_TRUE(std::equal(first, last, l.data.begin() + p.offset)) << p.name;
      }
    }
  }
}

// What a rank writes of a checkpoint (train/rank_checkpoint.hpp): its owned segments' parts. Over
// the data-parallel ranks of a distributed optimizer (runs cut at the model's parts, tails on the
// last rank) the counted parts tile the rank's TP part of every tensor once; each part's weights sit
// at its offset and its moments at its moment offset, element for element; a load's parts (tails
// on every rank) cover the moments each rank steps.
TEST(RankCheckpoint, OwnedPartsTileTheTensorsOverTheDataParallelRanks) {
  for (const int tp_rank : {0, 1}) {
    PositionOnlyGroup tp(tp_rank, 2);
    GptModel local(dense(), &tp, nullptr);
    const ParameterTable& table = local.table();
    std::vector<float> weights(static_cast<size_t>(table.total));
    for (size_t i = 0; i < weights.size(); ++i) weights[i] = static_cast<float>(i) + 0.5f;
    const std::vector<TensorPart> parts = train::rank_parts(local);
    std::vector<std::vector<float>> rebuilt(parts.size());
    for (size_t i = 0; i < parts.size(); ++i) rebuilt[i].assign(static_cast<size_t>(parts[i].numel()), -1.0f);
    std::vector<int64_t> covered(parts.size(), 0);
    for (int dp_rank = 0; dp_rank < 3; ++dp_rank) {
      SCOPED_TRACE("TP rank " + std::to_string(tp_rank) + ", DP rank " + std::to_string(dp_rank) + " of 3");
      PositionOnlyGroup dp(dp_rank, 3);
      const train::OptimizerShards shards = train::plan_optimizer_shards(
          table.total, {}, train::shard_group(&dp), {}, train::overlap_bucket_cuts(table));
      // Moments laid out as the rank's AdamW holds them: each owned element's weight, to check against.
      std::vector<float> moments(static_cast<size_t>(shards.owned_total), -2.0f);
      for (const train::OwnedSegment& seg : shards.owned)
        std::copy(weights.begin() + seg.offset, weights.begin() + seg.offset + seg.count, moments.begin() + seg.moment);
      for (const bool counted : {true, false}) {
        int64_t total = 0;
        for (const train::StatePart& p : train::owned_parts(parts, table, shards, counted)) {
          const int64_t n = p.part.numel();
          total += n;
          ASSERT_TRUE(std::equal(moments.begin() + p.moment, moments.begin() + p.moment + n, weights.begin() + p.offset))
              << p.part.name;
          if (!counted) continue;
          covered[p.param] += n;
          copy_overlap(p.part, weights.data() + p.offset, parts[p.param], rebuilt[p.param].data());
        }
        int64_t owned = 0;
        for (const train::OwnedSegment& seg : shards.owned) owned += counted && !seg.counted ? 0 : seg.count;
        EXPECT_EQ(total, owned) << (counted ? "counted" : "every owned segment");
      }
    }
    for (size_t i = 0; i < parts.size(); ++i) {
      const ParamSpec& p = table.specs[i];
      EXPECT_EQ(covered[i], p.numel) << p.name;
      EXPECT_TRUE(std::equal(rebuilt[i].begin(), rebuilt[i].end(), weights.begin() + p.offset)) << p.name;
    }
  }
}
