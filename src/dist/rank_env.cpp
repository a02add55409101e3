#include "dist/rank_env.hpp"

#include <cstdlib>
#include <optional>
#include <string>

#include "core/error.hpp"

namespace laoyao::dist {
namespace {

std::optional<int64_t> number(const GetEnv& env, const char* name, int64_t min_value) {
  const char* v = env(name);
  if (!v || !*v) return std::nullopt;
  char* end = nullptr;
  const long long n = std::strtoll(v, &end, 10);
  if (*end != '\0' || n < min_value)
    throw UsageError(std::string("environment variable ") + name + "='" + v + "' is not an integer >= " +
                     std::to_string(min_value));
  return n;
}

}  // namespace

RankEnv rank_env_from_environment(const GetEnv& getenv_in) {
  const GetEnv env = getenv_in ? getenv_in : GetEnv([](const char* n) -> const char* { return std::getenv(n); });
  struct Names {
    const char *source, *rank, *world, *local_rank, *local_world;
  };
  const Names forms[] = {
      {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
      {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
      {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
       "OMPI_COMM_WORLD_LOCAL_SIZE"},
  };
  RankEnv r;
  for (const Names& f : forms) {
    const auto world = number(env, f.world, 1);
    if (!world) continue;
    r.source = f.source;
    r.world_size = *world;
    r.rank = number(env, f.rank, 0).value_or(0);
    r.local_rank = number(env, f.local_rank, 0).value_or(r.rank);
    r.local_world_size = number(env, f.local_world, 1).value_or(r.world_size);
    if (r.rank >= r.world_size)
      throw UsageError(std::string(f.rank) + "=" + std::to_string(r.rank) + " is not below " + f.world + "=" +
                       std::to_string(r.world_size));
    if (r.local_rank >= r.local_world_size)
      throw UsageError(std::string(f.local_rank) + "=" + std::to_string(r.local_rank) + " is not below the " +
                       std::to_string(r.local_world_size) + " ranks of its node");
    break;
  }
  if (const char* addr = env("MASTER_ADDR"); addr && *addr) r.master_addr = addr;
  if (const auto port = number(env, "MASTER_PORT", 1)) {
    if (*port > 65535) throw UsageError("environment variable MASTER_PORT=" + std::to_string(*port) + " is not a port");
    r.master_port = static_cast<int>(*port);
  }
  return r;
}

}  // namespace laoyao::dist
