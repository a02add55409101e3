// Gloo groups inside one process: four threads play four ranks of a TP=2 x DP=2 layout, each
// connecting the world, its tensor-parallel and its data-parallel group, and checking that every
// collective reaches exactly its group's members.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "core/runtime_options.hpp"
#include "dist/parallel_layout.hpp"
#include "dist/process_group.hpp"

using namespace laoyao::dist;

TEST(ProcessGroup, SubgroupsReduceOverTheirMembersOnly) {
  if (!gloo_built()) GTEST_SKIP() << "built without Gloo";
  const auto dir = std::filesystem::temp_directory_path() / ("laoyao_pg_test_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const laoyao::ScopedRuntimeOptions rendezvous([&](laoyao::RuntimeOptions& o) { o.rendezvous_dir = dir.string(); });
  const int world = 4;
  const ParallelLayout layout(world, {2, 1, 1});
  std::vector<std::string> errors(world);
  std::vector<std::vector<float>> got(world);
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r)
    ranks.emplace_back([&, r] {
      try {
        RankEnv env;
        env.rank = r, env.world_size = world, env.local_rank = r, env.local_world_size = world;
        auto all = make_cpu_process_group(env, 1.0);
        auto tp = make_cpu_process_group(env, 1.0, layout.tp_group(r), "tp");
        auto dp = make_cpu_process_group(env, 1.0, layout.dp_group(r), "dp");
        float x[3] = {float(1 << r), float(1 << r), float(r)};
        all->all_reduce_sum(x, 1);  // 1 + 2 + 4 + 8
        tp->all_reduce_sum(x + 1, 1);
        dp->all_reduce_max(x + 2, 1);
        got[r] = {x[0], x[1], x[2], float(tp->rank()), float(tp->size()), float(dp->rank())};
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : ranks) t.join();
  std::filesystem::remove_all(dir);
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(errors[r], "") << "rank " << r;
    EXPECT_EQ(got[r][0], 15.0f) << "rank " << r;
    // TP groups {0,1} {2,3}: 1+2 and 4+8. DP groups {0,2} {1,3}: max of the ranks.
    EXPECT_EQ(got[r][1], r < 2 ? 3.0f : 12.0f) << "rank " << r;
    EXPECT_EQ(got[r][2], float(r % 2 == 0 ? 2 : 3)) << "rank " << r;
    EXPECT_EQ(got[r][3], float(r % 2)) << "rank " << r;
    EXPECT_EQ(got[r][4], 2.0f);
    EXPECT_EQ(got[r][5], float(r / 2)) << "rank " << r;
  }
}
