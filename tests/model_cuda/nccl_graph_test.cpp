// NCCL collectives inside a CUDA graph, as the expert-parallel step with the all-gather dispatcher
// captures them (model/cuda/moe_gather_dispatch_cuda.cpp): enqueued on a second stream forked from
// the captured one by an event and joined back. One rank (one GPU), so the collectives are copies;
// what is checked is that capture takes them and that each replay moves the buffers' contents of
// that moment. GPU only.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "core/runtime_options.hpp"
#include "core/device.hpp"
#include "dist/process_group.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/device_buffer.hpp"

using namespace laoyao;
namespace kc = laoyao::kernels::cuda;

TEST(NcclGraph, ForkedCollectivesReplayWithTheirBuffersContents) {
  if (!dist::gloo_built()) GTEST_SKIP() << "built without Gloo";
  const auto dir = std::filesystem::temp_directory_path() / ("laoyao_nccl_graph_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const ScopedRuntimeOptions rendezvous([&](RuntimeOptions& o) { o.rendezvous_dir = dir.string(); });
  dist::RankEnv env;
  env.rank = 0, env.world_size = 1, env.local_rank = 0, env.local_world_size = 1;
  auto group = dist::make_gpu_process_group(env, 1.0);
  const size_t n = 4096;
  kc::DeviceBuffer send(n * sizeof(float)), gathered(n * sizeof(float)), reduced(n * sizeof(float));
  cudaStream_t main = nullptr, comm = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
  LAOYAO_CUDA_CHECK(cudaStreamCreateWithFlags(&main, cudaStreamNonBlocking));
  LAOYAO_CUDA_CHECK(cudaStreamCreateWithFlags(&comm, cudaStreamNonBlocking));
  LAOYAO_CUDA_CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  LAOYAO_CUDA_CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
  group->all_gather_device(send.ptr, gathered.ptr, n, dist::DeviceType::F32, main);  // connects, outside capture
  LAOYAO_CUDA_CHECK(cudaStreamSynchronize(main));

  cudaGraph_t graph = nullptr;
  LAOYAO_CUDA_CHECK(cudaStreamBeginCapture(main, cudaStreamCaptureModeThreadLocal));
  LAOYAO_CUDA_CHECK(cudaEventRecord(fork, main));
  LAOYAO_CUDA_CHECK(cudaStreamWaitEvent(comm, fork, 0));
  group->all_gather_device(send.ptr, gathered.ptr, n, dist::DeviceType::F32, comm);
  group->reduce_scatter_device(gathered.ptr, reduced.ptr, n, dist::DeviceType::F32, comm, 0.5);
  LAOYAO_CUDA_CHECK(cudaEventRecord(join, comm));
  LAOYAO_CUDA_CHECK(cudaStreamWaitEvent(main, join, 0));
  LAOYAO_CUDA_CHECK(cudaStreamEndCapture(main, &graph));
  cudaGraphExec_t exec = nullptr;
  LAOYAO_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 3; ++replay) {
    std::vector<float> x(n);
    for (size_t i = 0; i < n; ++i) x[i] = static_cast<float>(i % 97) + 100.0f * static_cast<float>(replay);
    send.upload(x.data(), send.bytes);
    LAOYAO_CUDA_CHECK(cudaGraphLaunch(exec, main));
    LAOYAO_CUDA_CHECK(cudaStreamSynchronize(main));
    std::vector<float> g(n), r(n);
    gathered.download(g.data(), gathered.bytes);
    reduced.download(r.data(), reduced.bytes);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(g[i], x[i]) << "all-gather, replay " << replay << ", element " << i;
      ASSERT_EQ(r[i], 0.5f * x[i]) << "reduce-scatter, replay " << replay << ", element " << i;
    }
  }
  LAOYAO_CUDA_CHECK(cudaGraphExecDestroy(exec));
  LAOYAO_CUDA_CHECK(cudaGraphDestroy(graph));
  for (cudaEvent_t e : {fork, join}) LAOYAO_CUDA_CHECK(cudaEventDestroy(e));
  for (cudaStream_t s : {main, comm}) LAOYAO_CUDA_CHECK(cudaStreamDestroy(s));
  std::filesystem::remove_all(dir);
}
