// Collectives among the ranks of a job. On CPU ranks they go through Gloo (Debian libgloo-dev;
// optional at build time: without it a multi-rank CPU run is refused by name), the ranks meeting
// through a file store in a directory they share (LAOYAO_RENDEZVOUS_DIR, which `laoyao launch`
// creates fresh for each job). NCCL for GPU ranks is not built yet.
#pragma once
#include <cstddef>
#include <memory>
#include <string>

#include "dist/rank_env.hpp"

namespace laoyao::dist {

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In place, every rank ends with the element-wise sum over ranks.
  virtual void all_reduce_sum(float* data, size_t n) = 0;
  virtual void all_reduce_sum(double* data, size_t n) = 0;
  virtual void barrier() = 0;
};

bool gloo_built();

// Connects the ranks of `env` (a UsageError when Gloo is not built or LAOYAO_RENDEZVOUS_DIR is not
// set). A collective that waits longer than `timeout_minutes` fails with an Error that says so.
std::unique_ptr<ProcessGroup> make_cpu_process_group(const RankEnv& env, double timeout_minutes);

}  // namespace laoyao::dist
