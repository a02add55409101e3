// The rank environment of torchrun / laoyao launch, Slurm and OpenMPI, and bad values named.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "core/error.hpp"
#include "dist/rank_env.hpp"

using laoyao::dist::rank_env_from_environment;
using laoyao::dist::RankEnv;

namespace {

RankEnv read(const std::map<std::string, std::string>& vars) {
  return rank_env_from_environment([&](const char* name) -> const char* {
    const auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

}  // namespace

TEST(RankEnv, NothingSetIsOneRank) {
  const RankEnv r = read({});
  EXPECT_EQ(r.rank, 0);
  EXPECT_EQ(r.world_size, 1);
  EXPECT_EQ(r.source, "none");
  EXPECT_EQ(r.master_port, 29500);
}

TEST(RankEnv, TorchrunVariables) {
  const RankEnv r = read({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"},
                          {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "6000"}});
  EXPECT_EQ(r.source, "torchrun");
  EXPECT_EQ(r.rank, 5);
  EXPECT_EQ(r.world_size, 8);
  EXPECT_EQ(r.local_rank, 1);
  EXPECT_EQ(r.local_world_size, 4);
  EXPECT_EQ(r.master_addr, "node0");
  EXPECT_EQ(r.master_port, 6000);
}

TEST(RankEnv, SlurmAndOpenMpiForms) {
  const RankEnv s = read({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "1"},
                          {"SLURM_NTASKS_PER_NODE", "2"}});
  EXPECT_EQ(s.source, "slurm");
  EXPECT_EQ(s.rank, 3);
  EXPECT_EQ(s.local_rank, 1);
  EXPECT_EQ(s.local_world_size, 2);
  const RankEnv m = read({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "3"},
                          {"OMPI_COMM_WORLD_LOCAL_RANK", "2"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"}});
  EXPECT_EQ(m.source, "openmpi");
  EXPECT_EQ(m.rank, 2);
  EXPECT_EQ(m.world_size, 3);
  // torchrun's variables win over the cluster's.
  EXPECT_EQ(read({{"WORLD_SIZE", "2"}, {"RANK", "1"}, {"SLURM_NTASKS", "4"}, {"SLURM_PROCID", "3"}}).rank, 1);
}

TEST(RankEnv, BadValuesAreNamed) {
  auto message = [](const std::map<std::string, std::string>& vars) {
    try {
      read(vars);
    } catch (const laoyao::UsageError& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_NE(message({{"WORLD_SIZE", "two"}}).find("WORLD_SIZE='two'"), std::string::npos);
  EXPECT_NE(message({{"WORLD_SIZE", "2"}, {"RANK", "2"}}).find("RANK=2 is not below WORLD_SIZE=2"), std::string::npos);
  EXPECT_NE(message({{"WORLD_SIZE", "0"}}).find("WORLD_SIZE"), std::string::npos);
  EXPECT_NE(message({{"MASTER_PORT", "70000"}}).find("MASTER_PORT"), std::string::npos);
}
