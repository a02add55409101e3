// The MoE layer under expert parallelism (CudaMoeLayers with an EP group) on one GPU: P ranks are
// threads meeting in a SharedDeviceGroup, each with tokens of its own and its share of the experts,
// against the one-rank layer run on each rank's tokens with every expert. Each rank's output,
// input gradient, router gradient and losses are that run's; each expert's weight gradients are
// the sum over the runs. Both token dispatchers: all-to-all (counts read on the host) and
// all-gather (Megatron's default: no host synchronisation). GPU only.
#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/device_buffer.hpp"
#include "kernels/cuda/gemm_cublaslt.hpp"
#include "model/cuda/moe_layers_cuda.hpp"
#include "model_cuda_test_util.hpp"
#include "moe_test_util.hpp"
#include "shared_device_group.hpp"

using namespace laoyao;
using namespace laoyao::model;
using namespace laoyao::model::test;

namespace {

// One layer's results on one rank's tokens.
struct LayerRun {
  std::vector<float> y, dx, grads;  // grads laid out by the config's place_layer
  GptModel::MoeLosses losses;
};

// The layer of config c (its experts: c.moe.local_experts()) on x, dy; ep null: one rank.
LayerRun run_layer(const GptConfig& c, int64_t T, int64_t s, const std::vector<float>& w, const std::vector<float>& x,
                   const std::vector<float>& dy, dist::ProcessGroup* ep) {
  const int64_t H = c.hidden;
  int64_t n = 0;
  const GptLayerOffsets W = place_layer(c, n);
  CudaMoeLayers moe(c, T, s, ep);
  cudaStream_t stream = nullptr;
  LAOYAO_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  kc::CublasLtGemm gemm;
  kc::DeviceBuffer d_w(sizeof(kc::bf16) * n), d_main(sizeof(float) * n), d_g(sizeof(float) * n),
      d_x(sizeof(kc::bf16) * T * H), d_dy(sizeof(kc::bf16) * T * H), d_y(sizeof(kc::bf16) * T * H),
      d_dx(sizeof(kc::bf16) * T * H);
  d_w.upload(to_bf16(w).data(), d_w.bytes);
  d_main.upload(w.data(), d_main.bytes);
  d_x.upload(to_bf16(x).data(), d_x.bytes);
  d_dy.upload(to_bf16(dy).data(), d_dy.bytes);
  LAOYAO_CUDA_CHECK(cudaMemsetAsync(d_g.ptr, 0, d_g.bytes, stream));
  const CudaMoeLayers::Context ctx{W, d_w.as<kc::bf16>(), d_g.as<float>(), gemm, stream, d_main.as<float>()};
  moe.forward(0, ctx, d_x.as<kc::bf16>(), d_y.as<kc::bf16>(), T, CudaMoeLayers::Pass::Training);
  moe.backward(0, ctx, d_x.as<kc::bf16>(), d_dy.as<kc::bf16>(), d_dx.as<kc::bf16>(), T, 0.5f);
  LayerRun out;
  out.losses = moe.take_losses(stream);
  std::vector<kc::bf16> y(static_cast<size_t>(T * H)), dx(static_cast<size_t>(T * H));
  out.grads.resize(static_cast<size_t>(n));
  d_y.download(y.data(), d_y.bytes);
  d_dx.download(dx.data(), d_dx.bytes);
  d_g.download(out.grads.data(), d_g.bytes);
  LAOYAO_CUDA_CHECK(cudaStreamDestroy(stream));
  out.y = from_bf16(y), out.dx = from_bf16(dx);
  return out;
}

void compare_ep_layer(GptConfig c, int64_t b, int64_t s, int P, bool allgather) {
  c = single_moe_layer(c);
  const int64_t T = b * s, H = c.hidden, E = c.moe.num_experts, El = E / P;
  const int64_t fc1 = c.fc1_rows(c.moe.ffn) * H, fc2 = H * c.moe.ffn;  // one expert's weights
  int64_t n = 0;
  const GptLayerOffsets W = place_layer(c, n);
  const std::vector<float> w = random_bf16(n, 0.05, "ep weights");
  std::vector<std::vector<float>> x, dy;
  for (int r = 0; r < P; ++r) {
    x.push_back(random_bf16(T * H, 1.0, "ep x " + std::to_string(r)));
    dy.push_back(random_bf16(T * H, 1e-2, "ep dy " + std::to_string(r)));
  }
  std::vector<LayerRun> want;
  for (int r = 0; r < P; ++r) want.push_back(run_layer(c, T, s, w, x[r], dy[r], nullptr));

  GptConfig ce = c;
  ce.moe.expert_parallel = P, ce.moe.allgather_dispatcher = allgather;
  int64_t ne = 0;
  const GptLayerOffsets We = place_layer(ce, ne);
  std::vector<LayerRun> got(static_cast<size_t>(P));
  const std::vector<std::string> errors = run_on_shared_gpu(P, [&](int r, SharedDeviceGroup& group) {
    // This rank's parameters: the router and the shared expert whole, experts r*El .. r*El+El-1.
    std::vector<float> wr(static_cast<size_t>(ne), 0.0f);
    auto put = [&](int64_t to, int64_t from, int64_t count) {
      if (count > 0) std::copy(w.begin() + from, w.begin() + from + count, wr.begin() + to);
    };
    put(We.router_w, W.router_w, E * H);
    put(We.experts_fc1, W.experts_fc1 + r * El * fc1, El * fc1);
    put(We.experts_fc2, W.experts_fc2 + r * El * fc2, El * fc2);
    if (W.shared_fc1 >= 0) put(We.shared_fc1, W.shared_fc1, We.shared_fc2 - We.shared_fc1);
    if (W.shared_fc2 >= 0) put(We.shared_fc2, W.shared_fc2, H * c.moe.shared_ffn);
    if (W.expert_bias >= 0) put(We.expert_bias, W.expert_bias, E);
    got[static_cast<size_t>(r)] = run_layer(ce, T, s, wr, x[r], dy[r], &group);
  });
  for (int r = 0; r < P; ++r) ASSERT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;

  for (int r = 0; r < P; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const LayerRun &g = got[static_cast<size_t>(r)], &o = want[static_cast<size_t>(r)];
    // The all-gather dispatcher rounds each rank's share of an output to bf16 before the sum.
    EXPECT_LT(rel_err(g.y.data(), o.y.data(), T * H), 5e-3);
    EXPECT_LT(rel_err(g.dx.data(), o.dx.data(), T * H), 1e-2);
    EXPECT_NEAR(g.losses.aux, o.losses.aux, 1e-5 * std::abs(o.losses.aux));
    EXPECT_NEAR(g.losses.z, o.losses.z, 1e-5 * std::abs(o.losses.z));
    EXPECT_LT(rel_err(g.grads.data() + We.router_w, o.grads.data() + W.router_w, E * H), 1e-2) << "router";
    if (W.shared_fc1 >= 0) {
      EXPECT_LT(rel_err(g.grads.data() + We.shared_fc1, o.grads.data() + W.shared_fc1, We.shared_fc2 - We.shared_fc1),
                1e-2)
          << "shared expert fc1";
    }
    // This rank's experts: the gradients of every rank's tokens.
    for (const auto& [name, off, offe, per] :
         std::vector<std::tuple<const char*, int64_t, int64_t, int64_t>>{{"fc1", W.experts_fc1, We.experts_fc1, fc1},
                                                                        {"fc2", W.experts_fc2, We.experts_fc2, fc2}}) {
      std::vector<float> sum(static_cast<size_t>(El * per), 0.0f);
      for (const LayerRun& run : want)
        for (int64_t i = 0; i < El * per; ++i) sum[static_cast<size_t>(i)] += run.grads[off + r * El * per + i];
      EXPECT_LT(rel_err(g.grads.data() + offe, sum.data(), El * per), 1e-2) << "experts " << name;
    }
  }
}

}  // namespace

TEST(CudaMoeExpertParallel, AllGatherTop2Of8OverTwoRanks) {
  compare_ep_layer(moe_config(llama_config(), 8, 2, 64, 0), 2, 48, 2, true);
}
TEST(CudaMoeExpertParallel, AllToAllTop2Of8OverTwoRanks) {
  compare_ep_layer(moe_config(llama_config(), 8, 2, 64, 0), 2, 48, 2, false);
}
TEST(CudaMoeExpertParallel, AllGatherTop8Of64WithSharedExpert) {
  compare_ep_layer(moe_config(llama_config(), 64, 8, 32, 96), 1, 128, 2, true);
}
TEST(CudaMoeExpertParallel, AllToAllTop8Of64WithSharedExpert) {
  compare_ep_layer(moe_config(llama_config(), 64, 8, 32, 96), 1, 128, 2, false);
}
// Four ranks, the sigmoid router with an expert bias and group-limited routing.
TEST(CudaMoeExpertParallel, AllGatherFourRanksSigmoidGroupsAndBias) {
  GptConfig c = moe_config(llama_config(), 32, 4, 64, 0);
  c.moe.sigmoid = true, c.moe.expert_bias = true;
  c.moe.num_groups = 8, c.moe.group_topk = 2;
  compare_ep_layer(c, 2, 40, 4, true);
}
// Fewer experts a rank (2) than a token's choices (4): a token's pairs sort over two local experts.
TEST(CudaMoeExpertParallel, AllGatherFewerLocalExpertsThanTopk) {
  compare_ep_layer(moe_config(llama_config(), 8, 4, 64, 0), 2, 40, 4, true);
}
// GeLU experts (the activation over the bound of rows) and token dropping (the dropped pairs'
// probabilities zero before they are gathered).
TEST(CudaMoeExpertParallel, AllGatherGeluWithTokenDropping) {
  GptConfig c = moe_config(small_config(4, 4), 8, 2, 48, 0);
  c.activation = Activation::GeluTanh;
  c.moe.capacity_factor = 1.0;
  compare_ep_layer(c, 2, 32, 2, true);
}
TEST(CudaMoeExpertParallel, AllToAllWithTokenDropping) {
  GptConfig c = moe_config(llama_config(), 8, 2, 64, 0);
  c.moe.capacity_factor = 1.0;
  compare_ep_layer(c, 2, 48, 2, false);
}
