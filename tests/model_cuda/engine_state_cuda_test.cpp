// A GPU rank's state lives on its device (train/engine_cuda.cpp): the engine initialises the weights
// there, a parameter at a time, to the values the host's init gives, with zero moments; the host
// model and AdamW hold nothing except while a checkpoint passes through them (HostStateHold). A
// step from the device's own init is the step from the same weights pushed from the host. PEFT's
// frozen base is its bf16 weights alone. GPU only.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "model/gpt_model.hpp"
#include "optim/adamw.hpp"
#include "train/data_pipeline.hpp"
#include "train/dist_optimizer.hpp"
#include "train/engine.hpp"
#include "train/tp_state.hpp"
#include "model_cuda_test_util.hpp"

using namespace laoyao;
using namespace laoyao::model;
using namespace laoyao::model::test;

namespace {

constexpr uint64_t kSeed = 1234;
constexpr int64_t kB = 2, kS = 32;
const optim::AdamWSettings kAdam{0.9, 0.95, 1e-8};

// One training step of one micro-batch; the weights and moments after it, through the host.
struct AfterStep {
  std::vector<float> weights, exp_avg, exp_avg_sq;
};
AfterStep step_and_read(train::Engine& engine, GptModel& host, optim::AdamW& adam, const GptConfig& c) {
  const Batch x = random_batch(kB, kS, c.vocab, 5);
  train::MicroBatchData mb;
  mb.b = kB, mb.s = kS, mb.tokens = x.tokens, mb.labels = x.labels, mb.positions = x.positions;
  mb.loss_mask = x.mask;
  engine.zero_grads();
  engine.run_micro_batch(mb, DropoutKey{kSeed, 1, false}, x.dloss.data());
  const double norm = engine.grad_norm();
  engine.clip_and_step(norm, 1.0, 1e-3, 0.1);
  const train::HostStateHold hold(host, adam);
  engine.pull_state();
  const auto n = static_cast<size_t>(host.num_parameters());
  return {{host.weights(), host.weights() + n}, adam.exp_avg(), adam.exp_avg_sq()};
}

}  // namespace

TEST(CudaEngineState, InitialisesOnTheDeviceTheHostsValuesAndHoldsNothingOnTheHost) {
  GptConfig c = small_config(4, 2);
  c.tied_embeddings = false;
  for (const bool bf16 : {true, false}) {
    SCOPED_TRACE(bf16 ? "bf16-rounded init" : "fp32 init");
    GptModel host(c, nullptr, nullptr, nullptr, /*host_state=*/false);
    auto adam = train::make_whole_adam(host.table(), kAdam, /*hold_moments=*/false);
    EXPECT_FALSE(host.holds_host_weights());
    EXPECT_FALSE(adam->holds_moments());
    auto engine = train::make_cuda_engine(host, *adam, kAdam, kB, kS);
    engine->initialize_weights(kSeed, bf16);
    EXPECT_FALSE(host.holds_host_weights()) << "initialised on the device, not through the host";

    GptModel reference(c);
    train::init_model_weights(reference, kSeed, bf16);
    const auto n = static_cast<size_t>(host.num_parameters());
    {
      const train::HostStateHold hold(host, *adam);
      ASSERT_TRUE(host.holds_host_weights() && adam->holds_moments());
      engine->pull_state();
      EXPECT_TRUE(std::equal(host.weights(), host.weights() + n, reference.weights())) << "the same bits";
      EXPECT_TRUE(std::all_of(adam->exp_avg().begin(), adam->exp_avg().end(), [](float v) { return v == 0.0f; }));
      EXPECT_TRUE(std::all_of(adam->exp_avg_sq().begin(), adam->exp_avg_sq().end(), [](float v) { return v == 0.0f; }));
      EXPECT_EQ(adam->steps(), 0);
    }
    EXPECT_FALSE(host.holds_host_weights()) << "the hold gives back what it took";
    EXPECT_FALSE(adam->holds_moments());

    // The same step from the same weights pushed from a host that holds them.
    GptModel pushed_host(c);
    train::init_model_weights(pushed_host, kSeed, bf16);
    auto pushed_adam = train::make_whole_adam(pushed_host.table(), kAdam);
    auto pushed = train::make_cuda_engine(pushed_host, *pushed_adam, kAdam, kB, kS);
    pushed->push_state();
    const AfterStep a = step_and_read(*engine, host, *adam, c);
    const AfterStep b = step_and_read(*pushed, pushed_host, *pushed_adam, c);
    EXPECT_EQ(a.weights, b.weights);
    EXPECT_EQ(a.exp_avg, b.exp_avg);
    EXPECT_EQ(a.exp_avg_sq, b.exp_avg_sq);
    EXPECT_NE(a.weights, std::vector<float>(reference.weights(), reference.weights() + n)) << "the step moved them";
    EXPECT_FALSE(host.holds_host_weights());
  }
}

// PEFT's frozen base lives on the device as its bf16 weights alone (no fp32 main copy): it reads
// back as the bf16 rounding of what was written, the adapters as written; the parameters' norm
// counts the base from those bf16 values (as Megatron's calc_params_l2_norm reads a parameter
// without a main copy); a step moves the adapters alone.
TEST(CudaEngineState, PeftsFrozenBaseHoldsItsBf16WeightsAlone) {
  GptConfig c = small_config(4, 2);
  LoraSpec lora;
  lora.dim = 8, lora.alpha = 16;
  c.lora = lora;
  GptModel host(c, nullptr, nullptr, nullptr, /*host_state=*/false);
  ASSERT_GT(host.table().trainable_offset, 0);
  auto adam = train::make_whole_adam(host.table(), kAdam, /*hold_moments=*/false);
  auto engine = train::make_cuda_engine(host, *adam, kAdam, kB, kS);
  engine->initialize_weights(kSeed, /*bf16=*/false);  // fp32 values: the base's are rounded on the way

  GptModel reference(c);
  train::init_model_weights(reference, kSeed, false);
  const int64_t base = host.table().trainable_offset, n = host.num_parameters();
  std::vector<float> want(reference.weights(), reference.weights() + n);
  double sum = 0;
  int64_t rounded = 0;
  for (int64_t i = 0; i < n; ++i) {
    float& w = want[static_cast<size_t>(i)];
    if (i < base && round_to_bf16(w) != w) ++rounded, w = round_to_bf16(w);
    sum += static_cast<double>(w) * w;
  }
  ASSERT_GT(rounded, 0) << "the init's fp32 values are not all bf16 values already";
  std::vector<float> got(static_cast<size_t>(n), -1.0f);
  engine->download_state(train::Engine::StateBuffer::kWeights, 0, n, got.data());
  EXPECT_EQ(got, want);
  // A range across the base's end, from another offset.
  std::vector<float> part(64, -1.0f);
  engine->download_state(train::Engine::StateBuffer::kWeights, base - 32, 64, part.data());
  EXPECT_TRUE(std::equal(part.begin(), part.end(), want.begin() + (base - 32)));
  EXPECT_NEAR(engine->params_norm(), std::sqrt(sum), 1e-6 * std::sqrt(sum));

  const AfterStep after = step_and_read(*engine, host, *adam, c);
  EXPECT_TRUE(std::equal(after.weights.begin(), after.weights.begin() + base, want.begin())) << "the base stays";
  EXPECT_FALSE(std::equal(after.weights.begin() + base, after.weights.end(), want.begin() + base)) << "adapters move";
  // Written again, the base's norm is read again.
  std::vector<float> halves(static_cast<size_t>(base));
  for (int64_t i = 0; i < base; ++i) halves[static_cast<size_t>(i)] = want[static_cast<size_t>(i)] * 0.5f;
  engine->upload_state(train::Engine::StateBuffer::kWeights, 0, base, halves.data());
  double moved = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double v = i < base ? halves[static_cast<size_t>(i)] : after.weights[static_cast<size_t>(i)];
    moved += v * v;
  }
  EXPECT_NEAR(engine->params_norm(), std::sqrt(moved), 1e-6 * std::sqrt(moved));
}
