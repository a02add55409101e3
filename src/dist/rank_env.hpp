// Which rank this process is, from the environment the cluster's launcher sets: torchrun /
// `laoyao launch` (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT),
// Slurm (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE) or OpenMPI
// (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK,
// OMPI_COMM_WORLD_LOCAL_SIZE), checked in that order. Nothing set: a single rank.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

namespace laoyao::dist {

struct RankEnv {
  int64_t rank = 0, world_size = 1;
  int64_t local_rank = 0, local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string source = "none";  // "torchrun", "slurm", "openmpi" or "none"
};

// Reads the variables through `getenv` (std::getenv by default; tests pass their own). A value
// that is not a number, or a rank outside [0, world size), is a UsageError naming the variable.
using GetEnv = std::function<const char*(const char*)>;
RankEnv rank_env_from_environment(const GetEnv& getenv = nullptr);

}  // namespace laoyao::dist
