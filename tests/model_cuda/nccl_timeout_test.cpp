// --distributed-timeout-minutes on GPU ranks: a device collective that the other rank never joins
// makes the host's deadline wait give up after its time, abort the NCCL communicator (so that the
// stuck kernel returns and the stream drains) and say what it waited for. Two threads play the two
// ranks, each with its own GPU; skipped with fewer than two GPUs (the nvidia-h200-x2 machine).
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "core/runtime_options.hpp"
#include "core/device.hpp"
#include "core/error.hpp"
#include "dist/process_group.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/device_buffer.hpp"
#include "kernels/cuda/stream_wait.hpp"

using namespace laoyao;
namespace kc = laoyao::kernels::cuda;

TEST(NcclTimeout, AWaitOnACollectiveNobodyJoinsGivesUpAndAborts) {
  if (cuda_device_count() < 2) GTEST_SKIP() << "needs two GPUs (the nvidia-h200-x2 machine)";
  if (!dist::gloo_built()) GTEST_SKIP() << "built without Gloo";
  const auto dir = std::filesystem::temp_directory_path() / ("laoyao_nccl_timeout_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const ScopedRuntimeOptions rendezvous([&](RuntimeOptions& o) { o.rendezvous_dir = dir.string(); });
  std::promise<void> gave_up;
  std::shared_future<void> gave_up_seen = gave_up.get_future().share();
  std::string message, errors[2];
  double waited = 0;
  bool drained = false;
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      try {
        cuda_set_device(r);
        dist::RankEnv env;
        env.rank = r, env.world_size = 2, env.local_rank = r, env.local_world_size = 2;
        auto group = dist::make_gpu_process_group(env, 1.0);
        kc::DeviceBuffer buf(1024 * sizeof(float));
        LAOYAO_CUDA_CHECK(cudaMemset(buf.ptr, 0, buf.bytes));
        cudaStream_t stream = nullptr;
        LAOYAO_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        // One collective together first: NCCL connects the ranks at a communicator's first
        // collective, inside the host call, so only later ones leave the host free to wait.
        group->all_reduce_device(buf.ptr, 1024, dist::DeviceType::F32, stream);
        LAOYAO_CUDA_CHECK(cudaStreamSynchronize(stream));
        if (r == 1) {  // joins no further collective: waits until rank 0 has given up, then leaves too
          gave_up_seen.wait();
          group->abort();
          (void)cudaStreamDestroy(stream);
          return;
        }
        dist::ProcessGroup* g = group.get();
        kc::set_wait_deadline({2.0, [g] { g->abort(); }, "the test's deadline"});
        group->all_reduce_device(buf.ptr, 1024, dist::DeviceType::F32, stream);
        const auto start = std::chrono::steady_clock::now();
        try {
          kc::stream_wait(stream, "an all-reduce nobody joins");
        } catch (const Error& e) {
          message = e.what();
        }
        waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        kc::set_wait_deadline({});
        gave_up.set_value();
        // The aborted collective's kernel returns: the stream drains (bounded poll).
        for (int i = 0; i < 1000 && !drained; ++i) {
          drained = cudaStreamQuery(stream) != cudaErrorNotReady;
          if (!drained) std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        (void)cudaGetLastError();
        (void)cudaStreamDestroy(stream);
      } catch (const std::exception& e) {
        errors[r] = e.what();
        if (r == 0) gave_up.set_value();
      }
    });
  for (auto& t : ranks) t.join();
  std::filesystem::remove_all(dir);
  ASSERT_EQ(errors[0], "");
  ASSERT_EQ(errors[1], "");
  EXPECT_NE(message.find("waited"), std::string::npos) << message;
  EXPECT_NE(message.find("an all-reduce nobody joins"), std::string::npos) << message;
  EXPECT_NE(message.find("the test's deadline (0.0333333 minutes)"), std::string::npos) << message;
  EXPECT_GE(waited, 2.0);
  EXPECT_LT(waited, 30.0);
  EXPECT_TRUE(drained) << "the stream still runs the aborted all-reduce";
}
