// The MoE ops of src/kernels/cuda/moe.hpp against the CPU reference (kernels/cpu/moe.hpp), on fresh
// random inputs (laoyao::Rng, never zeros); bf16 tensors are rounded on the host first, so the CPU
// and the GPU read identical values. Tolerances (kernels_test.cpp's header explains the bf16 ones):
//  - the routing's choices, the tokens per expert and the permutation maps: identical (the GPU
//    ranks the same fp32 values as the CPU, ties by the lower expert);
//  - fp32 router outputs (probs, scores, lse): 2e-6 relative (the same formulas, the double sums
//    in another order, expf as a rounded double exp);
//  - loss values (fp32, sums of fp32 partials in double): kFp32Sum relative;
//  - bf16 outputs rounded once from fp32 math (dlogits, permute / unpermute): 2^-7 relative plus
//    kFp32Sum times the sum of |terms|, or a small fraction of the largest entry where terms of
//    several losses may cancel (dlogits).
// GPU only: these tests need device 0 (tests/*_cuda are labelled `gpu`).
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <string_view>
#include <vector>

#include "core/counter_normal.hpp"
#include "core/error.hpp"
#include "core/rng.hpp"
#include "kernels/cpu/moe.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/device_buffer.hpp"
#include "kernels/cuda/elementwise.hpp"
#include "kernels/cuda/moe.hpp"
#include "cuda_test_util.hpp"

namespace laoyao::kernels::cuda_test {
namespace {

constexpr double kRouterRel = 2e-6;       // fp32 router outputs against the CPU's
constexpr double kDlogitsFloor = 1e-4;    // dlogits: times the largest |want| (cancelling terms)

// ---- host data

// k distinct experts per token, drawn from `pool` (a partial Fisher-Yates shuffle per token).
std::vector<int64_t> random_routing(int64_t T, int64_t k, const std::vector<int64_t>& pool, uint64_t seed,
                                    std::string_view name) {
  Rng rng(seed, name);
  std::vector<int64_t> idx(static_cast<size_t>(T * k)), p = pool;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const auto r = static_cast<int64_t>(j + rng.next_u64() % static_cast<uint64_t>(p.size() - j));
      std::swap(p[j], p[r]);
      idx[t * k + j] = p[j];
    }
  return idx;
}

std::vector<int64_t> all_experts(int64_t E) {
  std::vector<int64_t> v(static_cast<size_t>(E));
  std::iota(v.begin(), v.end(), int64_t{0});
  return v;
}

std::vector<int32_t> to_int32(const std::vector<int64_t>& v) { return {v.begin(), v.end()}; }

// ---- device data

// A buffer of n elements filled with 0xff bytes (int -1, float NaN, bf16 NaN), so that an element
// an op fails to write shows.
template <class T>
DeviceBuffer poisoned(size_t n) {
  DeviceBuffer d(std::max<size_t>(n * sizeof(T), 1));
  LAOYAO_CUDA_CHECK(cudaMemset(d.ptr, 0xff, d.bytes));
  LAOYAO_CUDA_CHECK(cudaDeviceSynchronize());
  return d;
}

// |got - want| <= rel |want| + floor.
void expect_rel(const std::vector<float>& got, const std::vector<double>& want, double rel, double floor,
                const std::string& what) {
  std::vector<double> tol(want.size());
  for (size_t i = 0; i < want.size(); ++i) tol[i] = rel * std::abs(want[i]) + floor;
  expect_within(got, want, tol, what);
}

void expect_same_ints(const std::vector<int32_t>& got, const std::vector<int64_t>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < want.size(); ++i)
    if (got[i] != want[i] && bad++ == 0) first = i;
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << want.size() << " differ; first " << first << " got "
                     << got[first] << " want " << want[first];
}

// ---- routers

struct RouterCase {
  const char* name;
  int64_t E, k;
  bool sigmoid = false, pre_softmax = false;
  float scale = 0.0f;  // topk scaling factor, 0: none
  int64_t groups = 0, group_topk = 0;  // group-limited routing, 0: none
  bool sqrt_softplus = false;  // with sigmoid: --moe-router-score-function sqrtsoftplus
};

cpu::MoeRouterParams cpu_params(const RouterCase& c) {
  cpu::MoeRouterParams p;
  p.score_function = !c.sigmoid         ? cpu::MoeScoreFunction::Softmax
                     : c.sqrt_softplus ? cpu::MoeScoreFunction::SqrtSoftplus
                                       : cpu::MoeScoreFunction::Sigmoid;
  p.pre_softmax = c.pre_softmax;
  if (c.scale != 0.0f) p.topk_scaling_factor = c.scale;
  p.num_groups = c.groups, p.group_topk = c.group_topk;
  return p;
}

cuda::MoeRouterSpec gpu_spec(const RouterCase& c) {
  cuda::MoeRouterSpec s;
  s.num_experts = c.E, s.topk = c.k, s.pre_softmax = c.pre_softmax;
  s.sigmoid = c.sigmoid, s.sqrt_softplus = c.sqrt_softplus;
  s.topk_scaling_factor = c.scale;
  s.num_groups = c.groups, s.group_topk = c.group_topk;
  return s;
}

// What the CPU reference's router computes on logits[T, E].
struct CpuRouting {
  std::vector<int64_t> idx, aux_idx, counts;
  std::vector<float> probs, scores;
  std::vector<double> lse;
};

CpuRouting cpu_routing(const std::vector<float>& logits, int64_t T, const RouterCase& c) {
  CpuRouting r;
  r.idx.resize(T * c.k), r.aux_idx.resize(T * c.k), r.probs.resize(T * c.k), r.scores.resize(T * c.E);
  cpu::moe_router_topk_forward(logits.data(), nullptr, r.idx.data(), r.probs.data(), T, c.E, c.k, cpu_params(c));
  cpu::moe_aux_loss_scores(logits.data(), r.scores.data(), r.aux_idx.data(), T, c.E, c.k,
                           cpu_params(c).score_function);
  r.counts.assign(c.E, 0);
  for (int64_t e : r.idx) ++r.counts[e];
  for (int64_t t = 0; t < T; ++t) {
    const float* z = logits.data() + t * c.E;
    const double m = *std::max_element(z, z + c.E);
    double s = 0.0;
    for (int64_t e = 0; e < c.E; ++e) s += std::exp(z[e] - m);
    r.lse.push_back(m + std::log(s));
  }
  return r;
}

// The GPU router's outputs on device.
struct GpuRouting {
  DeviceBuffer idx, probs, scores, lse, counts;
  GpuRouting(int64_t T, int64_t E, int64_t k)
      : idx(poisoned<int32_t>(T * k)),
        probs(poisoned<float>(T * k)),
        scores(poisoned<float>(T * E)),
        lse(poisoned<float>(T)),
        counts(poisoned<int32_t>(E)) {}
};

class CudaMoe : public CudaStreamTest {
 protected:
  void route(const DeviceBuffer& logits, int64_t T, const RouterCase& c, GpuRouting& g) const {
    cuda::moe_router_forward(logits.as<float>(), T, gpu_spec(c), g.idx.as<int32_t>(), g.probs.as<float>(),
                             g.scores.as<float>(), g.lse.as<float>(), g.counts.as<int32_t>(), stream_);
  }

  // The router's outputs against the CPU's: choices and counts identical, fp32 values close.
  void check_routing(const GpuRouting& g, const CpuRouting& want, int64_t T, const RouterCase& c) const {
    sync();
    expect_same_ints(from_device<int32_t>(g.idx, T * c.k), want.idx, "topk_idx");
    expect_same_ints(from_device<int32_t>(g.counts, c.E), want.counts, "tokens_per_expert");
    expect_rel(from_device<float>(g.probs, T * c.k), to_double(want.probs), kRouterRel, 1e-9, "topk_probs");
    expect_rel(from_device<float>(g.scores, T * c.E), to_double(want.scores), kRouterRel, 1e-9, "scores");
    expect_rel(from_device<float>(g.lse, T), want.lse, kRouterRel, 1e-6, "lse");
  }

  void capacity_drop_matches_cpu(int64_t s);  // T = 500 tokens as sequences of s
};

// ---------------------------------------------------------------- router forward

TEST_F(CudaMoe, RouterForwardMatchesCpu) {
  const int64_t T = 301;  // not a multiple of the warps per block
  const RouterCase cases[] = {
      {"softmax E64 k8", 64, 8},
      {"softmax pre_softmax E64 k8", 64, 8, false, true},
      {"sigmoid E64 k8", 64, 8, true},
      {"softmax scaled E64 k8", 64, 8, false, false, 2.5f},
      {"softmax E8 k2", 8, 2},
      {"sigmoid scaled E8 k2", 8, 2, true, false, 1.5f},
      {"softmax E40 k3", 40, 3},
      {"softmax pre_softmax scaled E40 k3", 40, 3, false, true, 0.75f},
      {"sigmoid E40 k3", 40, 3, true},
      {"sigmoid E200 k1", 200, 1, true},       // k = 1: no renormalisation
      {"softmax E33 k33", 33, 33},              // k = E across two register slots
      {"sigmoid E96 k40", 96, 40, true},        // k > 32: two choices per lane
      {"softmax pre_softmax E512 k6", 512, 6, false, true},  // the largest E
      {"sqrtsoftplus E64 k8", 64, 8, true, false, 0.0f, 0, 0, true},
      {"sqrtsoftplus scaled E40 k3", 40, 3, true, false, 1.5f, 0, 0, true},
      {"sqrtsoftplus E200 k1", 200, 1, true, false, 0.0f, 0, 0, true},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const auto logits = randn(T * c.E, 3, std::string("router.logits.") + c.name, 1.5);
    const auto want = cpu_routing(logits, T, c);
    auto dl = to_device(logits);
    GpuRouting g(T, c.E, c.k);
    route(dl, T, c, g);
    check_routing(g, want, T, c);
  }
}

// Aux-loss-free balancing: a sigmoid router's expert bias chooses the experts (the CPU's choices
// and counts, which the bias changes), the probs and the aux scores stay unbiased.
TEST_F(CudaMoe, RouterForwardWithAnExpertBiasMatchesCpu) {
  const int64_t T = 301;
  const RouterCase cases[] = {{"sigmoid E64 k8", 64, 8, true}, {"sigmoid scaled E40 k3", 40, 3, true, false, 1.5f},
                              {"sigmoid E200 k1", 200, 1, true},
                              {"sqrtsoftplus E64 k8", 64, 8, true, false, 0.0f, 0, 0, true}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const auto logits = randn(T * c.E, 3, std::string("router.bias.logits.") + c.name, 1.5);
    const auto bias = randn(c.E, 4, std::string("router.bias.") + c.name, 0.1);
    CpuRouting want = cpu_routing(logits, T, c);
    const std::vector<int64_t> unbiased = want.idx;
    cpu::moe_router_topk_forward(logits.data(), bias.data(), want.idx.data(), want.probs.data(), T, c.E, c.k,
                                 cpu_params(c));
    want.counts.assign(c.E, 0);
    for (int64_t e : want.idx) ++want.counts[e];
    EXPECT_NE(want.idx, unbiased) << "the bias changed no choice: the case tests nothing";
    auto dl = to_device(logits), db = to_device(bias);
    GpuRouting g(T, c.E, c.k);
    DeviceBuffer aux_idx = poisoned<int32_t>(T * c.k), aux_n = poisoned<int32_t>(c.E);
    cuda::moe_router_forward(dl.as<float>(), T, gpu_spec(c), g.idx.as<int32_t>(), g.probs.as<float>(),
                             g.scores.as<float>(), g.lse.as<float>(), g.counts.as<int32_t>(), stream_, db.as<float>(),
                             aux_idx.as<int32_t>(), aux_n.as<int32_t>());
    check_routing(g, want, T, c);
    expect_same_ints(from_device<int32_t>(aux_idx, T * c.k), unbiased, "aux_topk_idx (unbiased)");
  }
  const RouterCase softmax{"softmax E8 k2", 8, 2};
  DeviceBuffer b = to_device(std::vector<float>(8, 0.0f));
  EXPECT_THROW(cuda::moe_router_forward(nullptr, 4, gpu_spec(softmax), nullptr, nullptr, nullptr, nullptr, nullptr,
                                        stream_, b.as<float>()),
               Error);
}

// Group-limited routing (with and without an expert bias): the CPU's choices among the best
// groups, and apart from them the aux losses' unbiased top-k over every expert.
TEST_F(CudaMoe, RouterForwardWithGroupsMatchesCpu) {
  const int64_t T = 301;
  struct Case {
    RouterCase c;
    bool bias;
  };
  const Case cases[] = {
      {{"softmax E64 k8 groups 8/4", 64, 8, false, false, 0.0f, 8, 4}, false},
      {{"softmax pre_softmax E40 k4 groups 4/2", 40, 4, false, true, 0.0f, 4, 2}, false},
      {{"sigmoid scaled E64 k6 groups 8/3 + bias", 64, 6, true, false, 2.5f, 8, 3}, true},
      {{"sigmoid E256 k8 groups 8/4 + bias", 256, 8, true, false, 0.0f, 8, 4}, true},  // DeepSeek-V3's router
      {{"sigmoid E96 k40 groups 3/2", 96, 40, true, false, 0.0f, 3, 2}, false},          // k > 32
  };
  for (const auto& [c, with_bias] : cases) {
    SCOPED_TRACE(c.name);
    const auto logits = randn(T * c.E, 3, std::string("router.groups.logits.") + c.name, 1.5);
    const auto bias = randn(c.E, 4, std::string("router.groups.bias.") + c.name, 0.1);
    CpuRouting want = cpu_routing(logits, T, c);  // aux_idx: the unbiased top-k over every expert
    std::vector<int64_t> aux_counts(c.E, 0);
    for (int64_t e : want.aux_idx) ++aux_counts[e];
    cpu::moe_router_topk_forward(logits.data(), with_bias ? bias.data() : nullptr, want.idx.data(), want.probs.data(),
                                 T, c.E, c.k, cpu_params(c));
    want.counts.assign(c.E, 0);
    for (int64_t e : want.idx) ++want.counts[e];
    EXPECT_NE(want.idx, want.aux_idx) << "the groups changed no choice: the case tests nothing";
    auto dl = to_device(logits), db = to_device(bias);
    GpuRouting g(T, c.E, c.k);
    DeviceBuffer aux_idx = poisoned<int32_t>(T * c.k), aux_n = poisoned<int32_t>(c.E);
    cuda::moe_router_forward(dl.as<float>(), T, gpu_spec(c), g.idx.as<int32_t>(), g.probs.as<float>(),
                             g.scores.as<float>(), g.lse.as<float>(), g.counts.as<int32_t>(), stream_,
                             with_bias ? db.as<float>() : nullptr, aux_idx.as<int32_t>(), aux_n.as<int32_t>());
    check_routing(g, want, T, c);
    expect_same_ints(from_device<int32_t>(aux_idx, T * c.k), want.aux_idx, "aux_topk_idx");
    expect_same_ints(from_device<int32_t>(aux_n, c.E), aux_counts, "aux_tokens_per_expert");
  }
  // The aux scores with groups need the aux top-k; bad groups are named.
  RouterCase c{"softmax E64 k8 groups 8/4", 64, 8, false, false, 0.0f, 8, 4};
  DeviceBuffer d = poisoned<float>(64);
  EXPECT_THROW(cuda::moe_router_forward(d.as<float>(), 1, gpu_spec(c), nullptr, nullptr, d.as<float>(), nullptr,
                                        nullptr, stream_),
               Error);
  c.groups = 5;
  EXPECT_THROW(cuda::moe_router_forward(d.as<float>(), 1, gpu_spec(c), nullptr, nullptr, nullptr, nullptr, nullptr,
                                        stream_),
               Error);
}

// The bias update (GptModel::update_expert_bias's rule): loads summed over micro-batches, each
// expert's bias moved by the rate toward the mean load (none when equal), the loads zeroed.
TEST_F(CudaMoe, ExpertBiasUpdateMatchesCpu) {
  // 32 experts: load / 32 is exact in double, so the mean (8) is too and expert 7, at the mean
  // load, keeps its bias.
  const int64_t E = 32;
  std::vector<int32_t> a(E), b(E);
  for (int64_t e = 0; e < E; ++e) a[e] = static_cast<int32_t>((e * 37) % 11), b[e] = static_cast<int32_t>((e * 13) % 7);
  a[7] += static_cast<int32_t>(8 - (a[7] + b[7]));
  int64_t total = 0;
  for (int64_t e = 0; e < E; ++e) total += a[e] + b[e];
  a[1] += static_cast<int32_t>(E * 8 - total);  // expert 1 takes the difference (-3)
  ASSERT_GE(a[1], 0);
  const auto bias0 = randn(E, 6, "bias.update", 0.05);
  auto da = to_device(a), db = to_device(b), dbias = to_device(bias0);
  DeviceBuffer load = to_device(std::vector<int32_t>(E, 0));
  cuda::moe_accumulate_load(da.as<int32_t>(), load.as<int32_t>(), E, stream_);
  cuda::moe_accumulate_load(db.as<int32_t>(), load.as<int32_t>(), E, stream_);
  const float rate = 0.01f;
  cuda::moe_update_expert_bias(load.as<int32_t>(), dbias.as<float>(), E, rate, stream_);
  sync();
  const auto got = from_device<float>(dbias, E);
  const auto zeroed = from_device<int32_t>(load, E);
  double mean = 0.0;
  for (int64_t e = 0; e < E; ++e) mean += static_cast<double>(a[e] + b[e]) / static_cast<double>(E);
  ASSERT_EQ(mean, 8.0);
  int moved_up = 0, moved_down = 0;
  for (int64_t e = 0; e < E; ++e) {
    const double offset = mean - (a[e] + b[e]);
    float want = bias0[e];
    want += offset > 0 ? rate : offset < 0 ? -rate : 0.0f;
    EXPECT_EQ(got[e], want) << "expert " << e;
    EXPECT_EQ(zeroed[e], 0) << "expert " << e;
    moved_up += offset > 0, moved_down += offset < 0;
  }
  EXPECT_EQ(got[7], bias0[7]) << "the mean's expert keeps its bias";
  EXPECT_GT(moved_up, 0);
  EXPECT_GT(moved_down, 0);
}

// Equal scores go to the lower expert: rows of few distinct values, one row all equal.
TEST_F(CudaMoe, RouterTiesGoToTheLowerExpert) {
  const int64_t T = 97;
  const RouterCase cases[] = {
      {"softmax E40 k3", 40, 3},
      {"softmax pre_softmax E40 k3", 40, 3, false, true},
      {"sigmoid E40 k3", 40, 3, true},
      {"softmax E64 k8", 64, 8},
      {"sigmoid E64 k8", 64, 8, true},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    auto logits = randn(T * c.E, 5, std::string("router.ties.") + c.name);
    for (auto& x : logits) x = 0.25f * std::round(2.0f * x) + 0.125f;  // steps of 1/4, never 0
    for (int64_t e = 0; e < c.E; ++e) logits[e] = 0.375f;              // token 0: all equal
    const auto want = cpu_routing(logits, T, c);
    for (int64_t j = 0; j < c.k; ++j) ASSERT_EQ(want.idx[j], j) << "the CPU reference's tie rule";
    auto dl = to_device(logits);
    GpuRouting g(T, c.E, c.k);
    route(dl, T, c, g);
    check_routing(g, want, T, c);
  }
}

// ---------------------------------------------------------------- losses forward

TEST_F(CudaMoe, AuxLossesForwardMatchesCpu) {
  const int64_t b = 2, s = 300, T = b * s;  // a sequence is one full and one partial chunk
  const RouterCase cases[] = {
      {"softmax E64 k8", 64, 8},
      {"sigmoid E40 k3", 40, 3, true},
      {"softmax pre_softmax E8 k2", 8, 2, false, true},
      {"sqrtsoftplus E40 k3", 40, 3, true, false, 0.0f, 0, 0, true},
  };
  struct Losses {
    const char* name;
    float aux, seq, z;
  };
  const Losses settings[] = {{"all three", 1e-2f, 3e-3f, 1e-3f}, {"aux_loss", 2e-2f, 0, 0},
                             {"seq_aux_loss", 0, 5e-3f, 0},       {"z-loss", 0, 0, 4e-3f}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const auto logits = randn(T * c.E, 7, std::string("losses.logits.") + c.name, 1.5);
    const auto want = cpu_routing(logits, T, c);
    ASSERT_EQ(want.aux_idx, want.idx) << "the aux losses' top-k is the routing's";
    auto dl = to_device(logits);
    GpuRouting g(T, c.E, c.k);
    route(dl, T, c, g);
    for (const auto& l : settings) {
      SCOPED_TRACE(l.name);
      cuda::MoeAuxLossSpec spec;
      spec.aux_coeff = l.aux, spec.seq_aux_coeff = l.seq, spec.z_coeff = l.z, spec.seq_length = s;
      const size_t nstats = cuda::moe_aux_stats_floats(T, c.E, spec);
      EXPECT_EQ(nstats == 0, l.aux == 0 && l.seq == 0);
      auto stats = poisoned<float>(nstats);
      const std::vector<float> before = {0.5f, 0.25f, 0.125f};  // the losses are ADDED
      auto sums = to_device(before);
      cuda::moe_aux_losses_forward(g.scores.as<float>(), g.lse.as<float>(), g.idx.as<int32_t>(),
                                   g.counts.as<int32_t>(), T, gpu_spec(c), spec, nstats ? stats.as<float>() : nullptr,
                                   sums.as<float>(), stream_);
      sync();
      const auto got = from_device<float>(sums, 3);
      const double want_loss[3] = {
          l.aux > 0 ? cpu::moe_aux_loss_forward(want.scores.data(), want.aux_idx.data(), T, c.E, c.k, l.aux) : 0.0,
          l.seq > 0 ? cpu::moe_seq_aux_loss_forward(want.scores.data(), want.aux_idx.data(), b, s, c.E, c.k, l.seq)
                    : 0.0,
          l.z > 0 ? cpu::moe_z_loss_forward(logits.data(), T, c.E, l.z) : 0.0};
      const char* names[3] = {"aux_loss", "seq_aux_loss", "z_loss"};
      for (int i = 0; i < 3; ++i) {
        if (want_loss[i] == 0.0) {
          EXPECT_EQ(got[i], before[i]) << names[i] << " is off: nothing added";
          continue;
        }
        EXPECT_GT(want_loss[i], 0.0) << names[i];
        // The sum with `before` rounds once more in fp32.
        EXPECT_NEAR(got[i] - before[i], want_loss[i], kFp32Sum * want_loss[i] + 1e-7) << names[i];
      }
    }
  }
}

// ---------------------------------------------------------------- router backward

struct LossCoeffs {
  float aux = 0, seq = 0, z = 0;
};

// dlogits of the CPU reference: the routing's gradient plus each enabled loss's with dloss = aux_scale.
std::vector<double> cpu_router_grad(const std::vector<float>& logits, const CpuRouting& r,
                                    const std::vector<float>& dprobs, int64_t T, int64_t s, const RouterCase& c,
                                    const LossCoeffs& l, float aux_scale) {
  std::vector<float> dz(T * c.E);
  const auto p = cpu_params(c);
  cpu::moe_router_topk_backward(logits.data(), r.idx.data(), dprobs.data(), dz.data(), T, c.E, c.k, p);
  if (l.aux > 0)
    cpu::moe_aux_loss_backward(logits.data(), r.scores.data(), r.aux_idx.data(), T, c.E, c.k, p.score_function, l.aux,
                               aux_scale, dz.data());
  if (l.seq > 0)
    cpu::moe_seq_aux_loss_backward(logits.data(), r.scores.data(), r.aux_idx.data(), T / s, s, c.E, c.k,
                                   p.score_function, l.seq, aux_scale, dz.data());
  if (l.z > 0) cpu::moe_z_loss_backward(logits.data(), T, c.E, l.z, aux_scale, dz.data());
  return to_double(dz);
}

TEST_F(CudaMoe, RouterBackwardMatchesCpu) {
  const int64_t b = 2, s = 150, T = b * s;
  const float aux_scale = 0.37f;
  const RouterCase routers[] = {
      {"softmax E64 k8", 64, 8},
      {"softmax pre_softmax E64 k8", 64, 8, false, true},
      {"sigmoid E64 k8", 64, 8, true},
      {"softmax scaled E8 k2", 8, 2, false, false, 2.5f},
      {"sigmoid scaled E8 k2", 8, 2, true, false, 1.5f},
      {"softmax pre_softmax E40 k3", 40, 3, false, true},
      {"sigmoid E40 k3", 40, 3, true},
      {"softmax E40 k1", 40, 1},  // the prob is identically 1: only the losses' gradient
      {"sigmoid E200 k1", 200, 1, true},
      {"softmax pre_softmax E96 k40", 96, 40, false, true},
      {"sqrtsoftplus scaled E64 k8", 64, 8, true, false, 2.5f, 0, 0, true},
      {"sqrtsoftplus E40 k1", 40, 1, true, false, 0.0f, 0, 0, true},
  };
  // The routing's gradient alone; each loss alone, without dprobs (zero on purpose: each loss's
  // gradient is then checked at its own scale); everything together. The coefficients are
  // large enough for the losses' gradients to show next to the routing's.
  struct Setting {
    const char* name;
    LossCoeffs l;
    bool dprobs;
  };
  const Setting settings[] = {{"routing", {}, true},
                              {"aux_loss alone", {50.0f, 0, 0}, false},
                              {"seq_aux_loss alone", {0, 30.0f, 0}, false},
                              {"z-loss alone", {0, 0, 20.0f}, false},
                              {"all", {50.0f, 30.0f, 20.0f}, true}};
  for (const auto& c : routers) {
    SCOPED_TRACE(c.name);
    const auto logits = randn(T * c.E, 9, std::string("backward.logits.") + c.name, 1.5);
    const auto r = cpu_routing(logits, T, c);
    ASSERT_EQ(r.aux_idx, r.idx) << "the aux losses' top-k is the routing's";
    auto dl = to_device(logits);
    GpuRouting g(T, c.E, c.k);
    route(dl, T, c, g);
    sync();
    ASSERT_NO_FATAL_FAILURE(expect_same_ints(from_device<int32_t>(g.idx, T * c.k), r.idx, "topk_idx"));
    for (const auto& st : settings) {
      SCOPED_TRACE(st.name);
      const auto dprobs = st.dprobs ? randn(T * c.k, 9, std::string("backward.dprobs.") + c.name)
                                    : std::vector<float>(T * c.k, 0.0f);
      auto ddp = to_device(dprobs);
      cuda::MoeAuxLossSpec spec;
      spec.aux_coeff = st.l.aux, spec.seq_aux_coeff = st.l.seq, spec.z_coeff = st.l.z, spec.seq_length = s;
      const size_t nstats = cuda::moe_aux_stats_floats(T, c.E, spec);
      auto stats = poisoned<float>(nstats);
      auto sums = poisoned<float>(3);
      LAOYAO_CUDA_CHECK(cudaMemsetAsync(sums.ptr, 0, sums.bytes, stream_));
      float* stats_ptr = nstats ? stats.as<float>() : nullptr;
      if (st.l.aux > 0 || st.l.seq > 0 || st.l.z > 0)
        cuda::moe_aux_losses_forward(g.scores.as<float>(), g.lse.as<float>(), g.idx.as<int32_t>(),
                                     g.counts.as<int32_t>(), T, gpu_spec(c), spec, stats_ptr, sums.as<float>(),
                                     stream_);
      auto dz = poisoned<bf16>(T * c.E);
      cuda::moe_router_backward(dl.as<float>(), g.idx.as<int32_t>(), ddp.as<float>(), g.lse.as<float>(), stats_ptr, T,
                                gpu_spec(c), spec, aux_scale, dz.as<bf16>(), stream_);
      sync();
      const auto got = from_device_bf16(dz, T * c.E);
      const auto want = cpu_router_grad(logits, r, dprobs, T, s, c, st.l, aux_scale);
      if (!(c.k == 1 && !c.sigmoid && !c.pre_softmax && st.name == std::string("routing"))) {
        ASSERT_GT(max_abs(want), 0.0) << "a zero reference checks nothing";
      }
      expect_bf16_close(got, want, kDlogitsFloor, "dlogits");

      // Deterministic: the same call gives the same bits.
      cuda::moe_router_backward(dl.as<float>(), g.idx.as<int32_t>(), ddp.as<float>(), g.lse.as<float>(), stats_ptr, T,
                                gpu_spec(c), spec, aux_scale, dz.as<bf16>(), stream_);
      sync();
      expect_equal(from_device_bf16(dz, T * c.E), got, "dlogits again");
    }
  }
}

// ---------------------------------------------------------------- global_aux_loss

// The running mean of two training forwards' counts (the first with another data-parallel rank's
// folded in), then the loss and its router gradient against the CPU's formulas with those counts
// and a token total of T * 2; an evaluation forward (no counts) adds nothing.
TEST_F(CudaMoe, GlobalAuxLossMatchesCpu) {
  const int64_t T = 300;
  const float coeff = 40.0f, aux_scale = 0.37f;  // large: the gradient shows at bf16's resolution
  const RouterCase cases[] = {{"softmax E64 k8", 64, 8}, {"sigmoid E40 k3", 40, 3, true}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const auto logits = randn(T * c.E, 21, std::string("global.logits.") + c.name, 1.5);
    const auto r = cpu_routing(logits, T, c);
    auto dl = to_device(logits);
    GpuRouting g(T, c.E, c.k);
    route(dl, T, c, g);
    // Two forwards' counts summed over two ranks: this rank's plus another's (a permutation of them).
    const auto own = from_device<int32_t>(g.counts, c.E);
    std::vector<int32_t> first(c.E), second(c.E);
    for (int64_t e = 0; e < c.E; ++e) {
      first[e] = own[e] + own[(e * 7 + 3) % c.E];
      second[e] = own[(e * 5 + 1) % c.E] + own[(e + 2) % c.E];
    }
    auto d1 = to_device(first), d2 = to_device(second);
    DeviceBuffer running(sizeof(double) * c.E), mean(sizeof(float) * c.E);
    LAOYAO_CUDA_CHECK(cudaMemsetAsync(running.ptr, 0, running.bytes, stream_));
    cuda::moe_global_counts_accumulate(d1.as<int32_t>(), running.as<double>(), mean.as<float>(), c.E, 1, stream_);
    cuda::moe_global_counts_accumulate(d2.as<int32_t>(), running.as<double>(), mean.as<float>(), c.E, 2, stream_);
    sync();
    const auto got_mean = from_device<float>(mean, c.E);
    std::vector<double> counts(c.E);
    for (int64_t e = 0; e < c.E; ++e) {
      counts[e] = (double(first[e]) + second[e]) / 2.0;
      ASSERT_EQ(got_mean[e], static_cast<float>(counts[e])) << "expert " << e;
    }

    cuda::MoeAuxLossSpec spec;
    spec.global_aux_coeff = coeff, spec.data_parallel_size = 2;
    const size_t nstats = cuda::moe_aux_stats_floats(T, c.E, spec);
    ASSERT_GT(nstats, 0u);
    auto stats = poisoned<float>(nstats);
    const std::vector<float> before = {0.5f, 0.25f, 0.125f, 0.0625f};
    auto sums = to_device(before);
    // An evaluation forward: no counts, nothing added.
    cuda::moe_aux_losses_forward(g.scores.as<float>(), g.lse.as<float>(), g.idx.as<int32_t>(), g.counts.as<int32_t>(),
                                 T, gpu_spec(c), spec, stats.as<float>(), sums.as<float>(), stream_);
    sync();
    expect_equal(from_device<float>(sums, 4), before, "loss sums after an evaluation forward");
    cuda::moe_aux_losses_forward(g.scores.as<float>(), g.lse.as<float>(), g.idx.as<int32_t>(), g.counts.as<int32_t>(),
                                 T, gpu_spec(c), spec, stats.as<float>(), sums.as<float>(), stream_, mean.as<float>());
    sync();
    const auto got = from_device<float>(sums, 4);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(got[i], before[i]) << "loss " << i << " is off";
    const std::vector<double> fcounts(got_mean.begin(), got_mean.end());
    const double want = cpu::moe_global_aux_loss_forward(r.scores.data(), fcounts.data(), T, 2.0 * T, c.E, c.k, coeff);
    ASSERT_GT(want, 0.0);
    EXPECT_NEAR(got[3] - before[3], want, kFp32Sum * want + 1e-7) << "global_aux_loss";

    // The gradient alone (dprobs zero): the CPU's with dloss = aux_scale.
    auto ddp = to_device(std::vector<float>(T * c.k, 0.0f));
    auto dz = poisoned<bf16>(T * c.E);
    cuda::moe_router_backward(dl.as<float>(), g.idx.as<int32_t>(), ddp.as<float>(), g.lse.as<float>(),
                              stats.as<float>(), T, gpu_spec(c), spec, aux_scale, dz.as<bf16>(), stream_);
    sync();
    std::vector<float> wz(T * c.E, 0.0f);
    const auto p = cpu_params(c);
    cpu::moe_global_aux_loss_backward(logits.data(), r.scores.data(), fcounts.data(), T, 2.0 * T, c.E, c.k,
                                      p.score_function, coeff, aux_scale, wz.data());
    const auto wantz = to_double(wz);
    ASSERT_GT(max_abs(wantz), 0.0) << "a zero reference checks nothing";
    expect_bf16_close(from_device_bf16(dz, T * c.E), wantz, kDlogitsFloor, "dlogits (global_aux_loss)");
  }
  EXPECT_THROW(cuda::moe_global_counts_accumulate(nullptr, nullptr, nullptr, 8, 0, stream_), laoyao::Error);
}

// ---------------------------------------------------------------- permutation

TEST_F(CudaMoe, PermutationMatchesCpu) {
  struct Case {
    const char* name;
    int64_t T, E, k;
    int64_t stride;  // experts drawn from the multiples of stride (the others get no tokens)
  };
  const Case cases[] = {{"E64 k8, 4 chunks", 1000, 64, 8, 1},  {"E8 k2", 777, 8, 2, 1},
                        {"E40 k3", 300, 40, 3, 1},             {"E512 k4, few tokens", 5, 512, 4, 1},
                        {"E64 k8, empty experts", 600, 64, 8, 3}, {"E16 k16 = E", 513, 16, 16, 1}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    std::vector<int64_t> pool;
    for (int64_t e = 0; e < c.E; e += c.stride) pool.push_back(e);
    const auto idx = random_routing(c.T, c.k, pool, 13, std::string("perm.") + c.name);
    const int64_t N = c.T * c.k;
    std::vector<int64_t> counts(c.E), sorted(N), rows(N);
    cpu::moe_permutation(idx.data(), c.T, c.E, c.k, counts.data(), sorted.data(), rows.data());
    std::vector<int64_t> offsets(c.E + 1, 0);
    for (int64_t e = 0; e < c.E; ++e) offsets[e + 1] = offsets[e] + counts[e];

    auto didx = to_device(to_int32(idx)), dcounts = to_device(to_int32(counts));
    auto doff = poisoned<int32_t>(c.E + 1), dsorted = poisoned<int32_t>(N), drows = poisoned<int32_t>(N);
    DeviceBuffer scratch(std::max<size_t>(cuda::moe_permutation_scratch_bytes(c.T, c.E), 1));
    cuda::moe_permutation(didx.as<int32_t>(), dcounts.as<int32_t>(), c.T, c.E, c.k, doff.as<int32_t>(),
                          dsorted.as<int32_t>(), drows.as<int32_t>(), scratch.ptr, stream_);
    sync();
    expect_same_ints(from_device<int32_t>(doff, c.E + 1), offsets, "offsets");
    expect_same_ints(from_device<int32_t>(dsorted, N), sorted, "sorted_token");
    expect_same_ints(from_device<int32_t>(drows, N), rows, "permuted_row");
  }
}

// The GPU router's choices and counts feed the permutation as in the layer.
TEST_F(CudaMoe, PermutationOfTheRoutersChoices) {
  const int64_t T = 1000;
  const RouterCase c{"softmax E64 k8", 64, 8};
  const auto logits = randn(T * c.E, 15, "perm.router.logits", 1.5);
  const auto r = cpu_routing(logits, T, c);
  std::vector<int64_t> counts(c.E), sorted(T * c.k), rows(T * c.k);
  cpu::moe_permutation(r.idx.data(), T, c.E, c.k, counts.data(), sorted.data(), rows.data());
  auto dl = to_device(logits);
  GpuRouting g(T, c.E, c.k);
  route(dl, T, c, g);
  auto doff = poisoned<int32_t>(c.E + 1), dsorted = poisoned<int32_t>(T * c.k), drows = poisoned<int32_t>(T * c.k);
  DeviceBuffer scratch(cuda::moe_permutation_scratch_bytes(T, c.E));
  cuda::moe_permutation(g.idx.as<int32_t>(), g.counts.as<int32_t>(), T, c.E, c.k, doff.as<int32_t>(),
                        dsorted.as<int32_t>(), drows.as<int32_t>(), scratch.ptr, stream_);
  sync();
  expect_same_ints(from_device<int32_t>(dsorted, T * c.k), sorted, "sorted_token");
  expect_same_ints(from_device<int32_t>(drows, T * c.k), rows, "permuted_row");
  std::vector<int64_t> offsets(c.E + 1, 0);
  for (int64_t e = 0; e < c.E; ++e) offsets[e + 1] = offsets[e] + counts[e];
  expect_same_ints(from_device<int32_t>(doff, c.E + 1), offsets, "offsets");
}

// Enough tokens for the router grids to stride (more than kRouterMaxBlocks * 4 tokens), the loss
// statistics to have hundreds of chunks and the permutation's scan to carry over tiles (more than
// 256 chunks of 256 tokens).
TEST_F(CudaMoe, LargeBatchMatchesCpu) {
  const int64_t T = 70001, s = T;
  const RouterCase c{"softmax E64 k8", 64, 8};
  const auto logits = randn(T * c.E, 29, "large.logits", 1.5);
  const auto r = cpu_routing(logits, T, c);
  auto dl = to_device(logits);
  GpuRouting g(T, c.E, c.k);
  route(dl, T, c, g);
  check_routing(g, r, T, c);

  // aux_loss and the z-loss: values, then the router's gradient.
  const LossCoeffs l{50.0f, 0.0f, 20.0f};
  cuda::MoeAuxLossSpec spec;
  spec.aux_coeff = l.aux, spec.z_coeff = l.z;
  auto stats = poisoned<float>(cuda::moe_aux_stats_floats(T, c.E, spec));
  auto sums = to_device(std::vector<float>{0.0f, 0.0f, 0.0f});
  cuda::moe_aux_losses_forward(g.scores.as<float>(), g.lse.as<float>(), g.idx.as<int32_t>(), g.counts.as<int32_t>(), T,
                               gpu_spec(c), spec, stats.as<float>(), sums.as<float>(), stream_);
  const auto dprobs = randn(T * c.k, 29, "large.dprobs");
  auto ddp = to_device(dprobs);
  auto dz = poisoned<bf16>(T * c.E);
  cuda::moe_router_backward(dl.as<float>(), g.idx.as<int32_t>(), ddp.as<float>(), g.lse.as<float>(),
                            stats.as<float>(), T, gpu_spec(c), spec, 0.37f, dz.as<bf16>(), stream_);
  sync();
  const auto got = from_device<float>(sums, 3);
  const double aux = cpu::moe_aux_loss_forward(r.scores.data(), r.aux_idx.data(), T, c.E, c.k, l.aux);
  const double z = cpu::moe_z_loss_forward(logits.data(), T, c.E, l.z);
  EXPECT_NEAR(got[0], aux, kFp32Sum * aux) << "aux_loss";
  EXPECT_NEAR(got[2], z, kFp32Sum * z) << "z_loss";
  expect_bf16_close(from_device_bf16(dz, T * c.E), cpu_router_grad(logits, r, dprobs, T, s, c, l, 0.37f),
                    kDlogitsFloor, "dlogits");

  std::vector<int64_t> counts(c.E), sorted(T * c.k), rows(T * c.k);
  cpu::moe_permutation(r.idx.data(), T, c.E, c.k, counts.data(), sorted.data(), rows.data());
  auto doff = poisoned<int32_t>(c.E + 1), dsorted = poisoned<int32_t>(T * c.k), drows = poisoned<int32_t>(T * c.k);
  DeviceBuffer scratch(cuda::moe_permutation_scratch_bytes(T, c.E));
  cuda::moe_permutation(g.idx.as<int32_t>(), g.counts.as<int32_t>(), T, c.E, c.k, doff.as<int32_t>(),
                        dsorted.as<int32_t>(), drows.as<int32_t>(), scratch.ptr, stream_);
  sync();
  expect_same_ints(from_device<int32_t>(dsorted, T * c.k), sorted, "sorted_token");
  expect_same_ints(from_device<int32_t>(drows, T * c.k), rows, "permuted_row");
}

// ---------------------------------------------------------------- permute / unpermute

// A routing and its permutation maps, on the host (int64) and the device (int32).
struct Maps {
  int64_t T, E, k, N;
  std::vector<int64_t> sorted, rows;
  DeviceBuffer dsorted, drows;
};

Maps make_maps(int64_t T, int64_t E, int64_t k, std::string_view name) {
  Maps m{T, E, k, T * k, {}, {}, {}, {}};
  const auto idx = random_routing(T, k, all_experts(E), 17, name);
  std::vector<int64_t> counts(E);
  m.sorted.resize(m.N), m.rows.resize(m.N);
  cpu::moe_permutation(idx.data(), T, E, k, counts.data(), m.sorted.data(), m.rows.data());
  m.dsorted = to_device(to_int32(m.sorted));
  m.drows = to_device(to_int32(m.rows));
  return m;
}

// Token dropping against the CPU's capacity mask in Megatron's token order ([s, b] flattened, the
// CPU's pairs gathered position by position): random routing over 16 experts, probs with many
// exact ties (eighths), both policies, capacities from none kept to all kept, 4 sequences of 125
// and one of 500 (where the two orders agree); then by tensor parallelism's shares.
TEST_F(CudaMoe, CapacityDropMatchesCpu) {
  for (const int64_t s : {int64_t{125}, int64_t{500}}) {
    SCOPED_TRACE("s = " + std::to_string(s));
    capacity_drop_matches_cpu(s);
  }
}

void CudaMoe::capacity_drop_matches_cpu(int64_t s) {
  const int64_t T = 500, E = 16, k = 4, N = T * k, b = T / s;
  const auto idx = random_routing(T, k, all_experts(E), 23, "capacity.idx");
  Rng rng(23, "capacity.probs");
  std::vector<float> probs(N);
  for (auto& p : probs) p = 0.125f * static_cast<float>(rng.next_u64() % 8);
  std::vector<int64_t> counts(E), sorted(N), rows(N);
  cpu::moe_permutation(idx.data(), T, E, k, counts.data(), sorted.data(), rows.data());
  std::vector<int32_t> offsets(E + 1, 0);
  for (int64_t e = 0; e < E; ++e) offsets[e + 1] = offsets[e] + static_cast<int32_t>(counts[e]);
  auto didx = to_device(to_int32(idx)), drows = to_device(to_int32(rows)), doff = to_device(offsets);
  auto dsorted = to_device(to_int32(sorted));
  auto scratch = poisoned<float>(N);
  // The pairs in Megatron's order: its i-th token is position i / b of sequence i % b.
  auto token = [&](int64_t i) { return (i / b) + (i % b) * s; };
  std::vector<int64_t> idx_m(N);
  std::vector<float> probs_m(N);
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j = 0; j < k; ++j) {
      idx_m[i * k + j] = idx[token(i) * k + j];
      probs_m[i * k + j] = probs[token(i) * k + j];
    }
  for (const bool by_position : {false, true})
    for (const int64_t cap : {int64_t{0}, int64_t{40}, int64_t{125}, int64_t{N}}) {
      SCOPED_TRACE("capacity " + std::to_string(cap) + (by_position ? ", by position" : ", by probs"));
      std::vector<uint8_t> kept_m(N), want_kept(N);
      cpu::moe_capacity_mask(idx_m.data(), probs_m.data(), T, E, k, cap, by_position, kept_m.data());
      for (int64_t i = 0; i < T; ++i)
        for (int64_t j = 0; j < k; ++j) want_kept[token(i) * k + j] = kept_m[i * k + j];
      auto dprobs = to_device(probs);
      auto dkept = poisoned<uint8_t>(N);
      cuda::moe_capacity_drop(didx.as<int32_t>(), doff.as<int32_t>(), dsorted.as<int32_t>(), drows.as<int32_t>(),
                              dprobs.as<float>(), T, s, k, cap, by_position, dkept.as<uint8_t>(), scratch.as<float>(),
                              stream_);
      auto ddp = to_device(probs);  // any nonzero gradient: the dropped pairs' must become 0
      cuda::moe_mask_dropped(ddp.as<float>(), dkept.as<uint8_t>(), N, stream_);
      sync();
      const auto kept = from_device<uint8_t>(dkept, N);
      const auto got = from_device<float>(dprobs, N), masked = from_device<float>(ddp, N);
      size_t bad = 0;
      for (int64_t i = 0; i < N; ++i) {
        const float want = want_kept[i] ? probs[i] : 0.0f;
        bad += kept[i] != want_kept[i] || got[i] != want || masked[i] != want;
      }
      EXPECT_EQ(bad, 0u);
    }
  // Tensor parallelism's shares of the sequence (5 of 125 positions, 4 of 500), each dropping apart
  // with its own tokens' capacity: against moe_capacity_mask_by_share.
  const int64_t shares = s % 5 == 0 ? 5 : 4;
  for (const bool by_position : {false, true})
    for (const double f : {0.25, 1.0}) {
      SCOPED_TRACE(std::to_string(shares) + " shares, factor " + std::to_string(f) +
                   (by_position ? ", by position" : ", by probs"));
      std::vector<uint8_t> want_kept(N);
      cpu::moe_capacity_mask_by_share(idx.data(), probs.data(), b, s, shares, E, k, f, by_position, want_kept.data());
      auto dprobs = to_device(probs);
      auto dkept = poisoned<uint8_t>(N);
      cuda::moe_capacity_drop(didx.as<int32_t>(), doff.as<int32_t>(), dsorted.as<int32_t>(), drows.as<int32_t>(),
                              dprobs.as<float>(), T, s, k, cpu::moe_expert_capacity(T / shares, E, k, f), by_position,
                              dkept.as<uint8_t>(), scratch.as<float>(), stream_, shares);
      sync();
      const auto kept = from_device<uint8_t>(dkept, N);
      const auto got = from_device<float>(dprobs, N);
      size_t bad = 0, dropped = 0;
      for (int64_t i = 0; i < N; ++i) {
        bad += kept[i] != want_kept[i] || got[i] != (want_kept[i] ? probs[i] : 0.0f);
        dropped += !want_kept[i];
      }
      EXPECT_EQ(bad, 0u);
      if (f < 1.0) {
        EXPECT_GT(dropped, 0u);  // the case drops something
      }
    }
}

// --moe-router-force-load-balancing's logits: the CPU's counter normals (double log/sqrt/cos on both
// sides, rounded to float: equal but for a last-bit difference of the device's libm).
TEST_F(CudaMoe, RandomLogitsMatchTheCpusNormals) {
  const int64_t n = 100003;
  const uint64_t key = rng_stream_key(1234, "router.layer5.random_logits.7");
  auto d = poisoned<float>(n);
  auto dkey = to_device(std::vector<uint64_t>{key});
  cuda::moe_random_logits(d.as<float>(), n, dkey.as<uint64_t>(), stream_);
  sync();
  const std::vector<float> got = from_device<float>(d, n);
  std::vector<double> want(n);
  for (int64_t i = 0; i < n; ++i) want[i] = counter_normal(key, static_cast<uint64_t>(i));
  expect_rel(got, want, 1e-6, 1e-7, "random logits");
}

TEST_F(CudaMoe, PermuteForwardBackwardMatchCpu) {
  const int64_t H = 136;  // a multiple of 8, not of 32 vectors
  const Maps m = make_maps(300, 16, 4, "permute.maps");
  const int64_t T = m.T, k = m.k, N = m.N;

  const auto x = randn_bf16(T * H, 19, "permute.x");
  std::vector<float> want(N * H);
  cpu::moe_permute_forward(x.data(), m.sorted.data(), want.data(), N, H);
  auto dx = to_device_bf16(x);
  auto dperm = poisoned<bf16>(N * H);
  cuda::moe_permute_forward(dx.as<bf16>(), m.dsorted.as<int32_t>(), dperm.as<bf16>(), N, H, stream_);
  sync();
  expect_equal(from_device_bf16(dperm, N * H), want, "permuted (a copy)");

  const auto dp = randn_bf16(N * H, 19, "permute.dpermuted");
  std::vector<float> sum(T * H);
  cpu::moe_permute_backward(dp.data(), m.rows.data(), sum.data(), T, k, H);
  std::vector<double> abssum(T * H, 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j)
      for (int64_t h = 0; h < H; ++h) abssum[t * H + h] += std::abs(dp[m.rows[t * k + j] * H + h]);
  auto ddp = to_device_bf16(dp);
  for (const bool accumulate : {false, true}) {
    SCOPED_TRACE(accumulate ? "accumulate" : "overwrite");
    const auto dx0 = randn_bf16(T * H, 19, "permute.dx0");
    auto ddx = accumulate ? to_device_bf16(dx0) : poisoned<bf16>(T * H);
    cuda::moe_permute_backward(ddp.as<bf16>(), m.drows.as<int32_t>(), ddx.as<bf16>(), T, k, H, accumulate, stream_);
    sync();
    std::vector<double> w(T * H), tol(T * H);
    for (int64_t i = 0; i < T * H; ++i) {
      w[i] = static_cast<double>(sum[i]) + (accumulate ? dx0[i] : 0.0);
      tol[i] = kBf16Rel * std::abs(w[i]) + kFp32Sum * (abssum[i] + (accumulate ? std::abs(dx0[i]) : 0.0));
    }
    expect_within(from_device_bf16(ddx, T * H), w, tol, "dx");
  }
}

TEST_F(CudaMoe, UnpermuteForwardBackwardMatchCpu) {
  const int64_t H = 264;
  const Maps m = make_maps(257, 40, 3, "unpermute.maps");
  const int64_t T = m.T, k = m.k, N = m.N;
  const auto out = randn_bf16(N * H, 23, "unpermute.expert_out");
  std::vector<float> probs(T * k);
  {
    Rng rng(23, "unpermute.probs");
    for (auto& p : probs) p = static_cast<float>(0.05 + 0.95 * rng.uniform());
  }
  auto dout = to_device_bf16(out), dprobs_in = to_device(probs);

  std::vector<float> y(T * H);
  cpu::moe_unpermute_forward(out.data(), m.rows.data(), probs.data(), y.data(), T, k, H);
  std::vector<double> abssum(T * H, 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j)
      for (int64_t h = 0; h < H; ++h) abssum[t * H + h] += std::abs(probs[t * k + j] * out[m.rows[t * k + j] * H + h]);
  const auto addend = randn_bf16(T * H, 23, "unpermute.addend");
  auto dadd = to_device_bf16(addend);
  for (const bool with_addend : {false, true}) {
    SCOPED_TRACE(with_addend ? "with the shared expert's addend" : "no addend");
    auto dy = poisoned<bf16>(T * H);
    cuda::moe_unpermute_forward(dout.as<bf16>(), m.drows.as<int32_t>(), dprobs_in.as<float>(),
                                with_addend ? dadd.as<bf16>() : nullptr, dy.as<bf16>(), T, k, H, stream_);
    sync();
    std::vector<double> w(T * H), tol(T * H);
    for (int64_t i = 0; i < T * H; ++i) {
      w[i] = static_cast<double>(y[i]) + (with_addend ? addend[i] : 0.0);
      tol[i] = kBf16Rel * std::abs(w[i]) + kFp32Sum * (abssum[i] + (with_addend ? std::abs(addend[i]) : 0.0));
    }
    expect_within(from_device_bf16(dy, T * H), w, tol, "y");
  }
  // The residual add fused into the combine: bit for bit the combine, then residual_dropout_add
  // without dropout (the separate ops the model runs when dropout is on).
  {
    const auto res = randn_bf16(T * H, 23, "unpermute.residual");
    auto dres = to_device_bf16(res);
    auto separate = poisoned<bf16>(T * H), fused = poisoned<bf16>(T * H);
    cuda::moe_unpermute_forward(dout.as<bf16>(), m.drows.as<int32_t>(), dprobs_in.as<float>(), dadd.as<bf16>(),
                                separate.as<bf16>(), T, k, H, stream_);
    cuda::residual_dropout_add(separate.as<bf16>(), dres.as<bf16>(), separate.as<bf16>(), T * H, cuda::DropoutSpec{},
                               stream_);
    cuda::moe_unpermute_forward(dout.as<bf16>(), m.drows.as<int32_t>(), dprobs_in.as<float>(), dadd.as<bf16>(),
                                fused.as<bf16>(), T, k, H, stream_, dres.as<bf16>());
    sync();
    expect_equal(from_device_bf16(fused, T * H), from_device_bf16(separate, T * H), "y with the residual");
  }

  // Backward: dexpert_out is one fp32 product rounded to bf16, the CPU's product rounded the same.
  const auto gy = randn_bf16(T * H, 23, "unpermute.dy");
  std::vector<float> dexp(N * H), dprobs(T * k);
  cpu::moe_unpermute_backward(out.data(), m.rows.data(), probs.data(), gy.data(), dexp.data(), dprobs.data(), T, k, H);
  for (auto& v : dexp) v = round_to_bf16(v);
  std::vector<double> dot_abs(T * k, 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j)
      for (int64_t h = 0; h < H; ++h) dot_abs[t * k + j] += std::abs(gy[t * H + h] * out[m.rows[t * k + j] * H + h]);
  auto dgy = to_device_bf16(gy);
  auto ddexp = poisoned<bf16>(N * H);
  auto ddprobs = poisoned<float>(T * k);
  cuda::moe_unpermute_backward(dout.as<bf16>(), m.drows.as<int32_t>(), dprobs_in.as<float>(), dgy.as<bf16>(),
                               ddexp.as<bf16>(), ddprobs.as<float>(), T, k, H, stream_);
  sync();
  expect_equal(from_device_bf16(ddexp, N * H), dexp, "dexpert_out");
  std::vector<double> tol(T * k);
  for (int64_t i = 0; i < T * k; ++i) tol[i] = kFp32Sum * dot_abs[i];
  expect_within(from_device<float>(ddprobs, T * k), to_double(dprobs), tol, "dprobs");
}

// ---------------------------------------------------------------- argument checks

TEST_F(CudaMoe, BadArgumentsThrow) {
  // Every check runs on the host before anything is enqueued, so null buffers are fine here.
  auto spec = [](int64_t E, int64_t k) {
    cuda::MoeRouterSpec s;
    s.num_experts = E, s.topk = k;
    return s;
  };
  const cuda::MoeAuxLossSpec none;
  for (const auto& s : {spec(513, 2), spec(0, 1), spec(8, 0), spec(8, 9)}) {
    SCOPED_TRACE("E = " + std::to_string(s.num_experts) + ", k = " + std::to_string(s.topk));
    EXPECT_THROW(cuda::moe_router_forward(nullptr, 4, s, nullptr, nullptr, nullptr, nullptr, nullptr, stream_),
                 laoyao::Error);
    EXPECT_THROW(cuda::moe_router_backward(nullptr, nullptr, nullptr, nullptr, nullptr, 4, s, none, 1.0f, nullptr,
                                           stream_),
                 laoyao::Error);
    EXPECT_THROW(cuda::moe_aux_losses_forward(nullptr, nullptr, nullptr, nullptr, 4, s, none, nullptr, nullptr,
                                              stream_),
                 laoyao::Error);
    if (s.topk <= s.num_experts) {  // (k > E is the all-gather dispatcher's local sort: allowed)
      EXPECT_THROW(cuda::moe_permutation(nullptr, nullptr, 4, s.num_experts, s.topk, nullptr, nullptr, nullptr,
                                         nullptr, stream_),
                   laoyao::Error);
    }
  }

  // seq_aux_loss needs a seq_length that divides T.
  const auto r = spec(8, 2);
  for (const int64_t seq_length : {int64_t{7}, int64_t{0}}) {
    SCOPED_TRACE("seq_length = " + std::to_string(seq_length));
    cuda::MoeAuxLossSpec l;
    l.seq_aux_coeff = 1e-3f, l.seq_length = seq_length;
    EXPECT_THROW(cuda::moe_aux_stats_floats(600, 8, l), laoyao::Error);
    EXPECT_THROW(cuda::moe_aux_losses_forward(nullptr, nullptr, nullptr, nullptr, 600, r, l, nullptr, nullptr, stream_),
                 laoyao::Error);
    EXPECT_THROW(cuda::moe_router_backward(nullptr, nullptr, nullptr, nullptr, nullptr, 600, r, l, 1.0f, nullptr,
                                           stream_),
                 laoyao::Error);
  }
  // A loss without its inputs.
  cuda::MoeAuxLossSpec aux;
  aux.aux_coeff = 1e-2f;
  EXPECT_THROW(cuda::moe_aux_losses_forward(nullptr, nullptr, nullptr, nullptr, 16, r, aux, nullptr, nullptr, stream_),
               laoyao::Error);
  cuda::MoeAuxLossSpec z;
  z.z_coeff = 1e-3f;
  EXPECT_THROW(cuda::moe_aux_losses_forward(nullptr, nullptr, nullptr, nullptr, 16, r, z, nullptr, nullptr, stream_),
               laoyao::Error);
  EXPECT_THROW(cuda::moe_router_backward(nullptr, nullptr, nullptr, nullptr, nullptr, 16, r, z, 1.0f, nullptr, stream_),
               laoyao::Error);

  // Rows of 16-byte vectors: H a multiple of 8, 16-byte aligned buffers.
  DeviceBuffer buf(4096);
  bf16* p = buf.as<bf16>();
  for (const int64_t H : {int64_t{12}, int64_t{0}}) {
    SCOPED_TRACE("H = " + std::to_string(H));
    EXPECT_THROW(cuda::moe_permute_forward(p, nullptr, p, 4, H, stream_), laoyao::Error);
    EXPECT_THROW(cuda::moe_permute_backward(p, nullptr, p, 4, 2, H, false, stream_), laoyao::Error);
    EXPECT_THROW(cuda::moe_unpermute_forward(p, nullptr, nullptr, nullptr, p, 4, 2, H, stream_), laoyao::Error);
    EXPECT_THROW(cuda::moe_unpermute_backward(p, nullptr, nullptr, p, p, nullptr, 4, 2, H, stream_), laoyao::Error);
  }
  EXPECT_THROW(cuda::moe_permute_forward(p + 1, nullptr, p, 4, 16, stream_), laoyao::Error);
  EXPECT_THROW(cuda::moe_unpermute_forward(p, nullptr, nullptr, p + 4, p, 4, 2, 16, stream_), laoyao::Error);
  sync();
  LAOYAO_CUDA_CHECK(cudaGetLastError());  // nothing was launched
}

}  // namespace
}  // namespace laoyao::kernels::cuda_test
