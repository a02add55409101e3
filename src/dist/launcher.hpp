// `laoyao launch`: starts the ranks of one node the way torch.distributed.run does (RANK,
// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT in each rank's
// environment), prefixes every output line with its rank, and never hangs on a failure: when one
// rank exits non-zero or dies, the others get SIGTERM (their whole process groups), then SIGKILL
// after a grace period, and the launch exits non-zero naming the rank.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace laoyao::dist {

struct LaunchOptions {
  int64_t nproc_per_node = 1, nnodes = 1, node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::vector<std::string> command;  // what every rank runs (argv; found on PATH)
  double grace_seconds = 5.0;        // SIGTERM to SIGKILL
  std::FILE* out = stdout;           // where the ranks' prefixed lines and the launcher's messages go
};

// Returns 0 when every rank exited 0, else 1. SIGINT/SIGTERM to the launcher stop the ranks too.
int launch(const LaunchOptions& options);

}  // namespace laoyao::dist
