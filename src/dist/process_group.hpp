// Collectives among the ranks of a job. Host values go through Gloo (Debian libgloo-dev; optional
// at build time: without it a multi-rank run is refused by name), the ranks meeting through a file
// store in a directory they share (LAOYAO_RENDEZVOUS_DIR, which `laoyao launch` creates fresh for
// a one-node job) or, without one, through the TCP store rank 0 serves on MASTER_ADDR:MASTER_PORT
// (dist/tcp_store.hpp: several hosts, torchrun, Slurm, OpenMPI). GPU ranks also hold an NCCL
// communicator for device memory (the gradients), its unique id passed over the Gloo group.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "dist/rank_env.hpp"

namespace laoyao::dist {

// Element types of device collectives.
enum class DeviceType { F32, BF16, F64, I32 };

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In place, every rank ends with the element-wise sum over ranks.
  virtual void all_reduce_sum(float* data, size_t n) = 0;
  virtual void all_reduce_sum(double* data, size_t n) = 0;
  // In place, the element-wise maximum over ranks (vocab-parallel cross entropy's logit maximum).
  virtual void all_reduce_max(float* data, size_t n) = 0;
  virtual void barrier() = 0;
  // Device memory of a GPU rank: in place, data = sum over ranks of (scale * data), enqueued on
  // `stream` (a cudaStream_t) without waiting. Only groups from make_gpu_process_group have it.
  virtual void all_reduce_sum_device(float* data, size_t n, void* stream, double scale);
  // More device collectives of GPU ranks (tensor and sequence parallelism, the distributed
  // optimizer), enqueued the same way: in place sum; all-gather of n elements per rank into recv
  // [ranks][n] (send may be recv's own slot); reduce-scatter of send [ranks][n] into this rank's n
  // elements of the sum of scale * send (recv may be send's own slot; a scale other than 1: F32 only).
  virtual void all_reduce_device(void* data, size_t n, DeviceType type, void* stream);
  virtual void all_gather_device(const void* send, void* recv, size_t n, DeviceType type, void* stream);
  virtual void reduce_scatter_device(const void* send, void* recv, size_t n, DeviceType type, void* stream,
                                     double scale = 1.0);
  // In place, the element-wise maximum over ranks of n device floats (FP8 delayed scaling's amaxes).
  virtual void all_reduce_max_device(float* data, size_t n, void* stream);
  // All-to-all with per-rank counts (expert parallelism's token exchange): send holds this rank's
  // send_counts[0] elements for rank 0, then send_counts[1] for rank 1, ...; recv gets recv_counts[r]
  // elements from each rank r, in rank order. Both count arrays (host, size() entries) must agree
  // with the peers' (rank r's send_counts[me] == this rank's recv_counts[r]). with_self false: this
  // rank's own chunk stays where it is (the caller copies it, or computes on it meanwhile); the
  // others land where they would.
  virtual void all_to_all_device(const void* send, const size_t* send_counts, void* recv, const size_t* recv_counts,
                                 DeviceType type, void* stream, bool with_self = true);
  // Stops this rank's part in every pending device collective (NCCL: ncclCommAbort, whose kernels
  // then return), when a wait has given up on another rank; the group takes no further collectives.
  virtual void abort() {}
};

bool gloo_built();

// Connects the ranks of `env` (a UsageError when Gloo is not built). A collective that waits longer
// than `timeout_minutes` fails with an Error that says so; so does a rendezvous.
std::unique_ptr<ProcessGroup> make_cpu_process_group(const RankEnv& env, double timeout_minutes);

// A group of some of the world's ranks (a tensor- or data-parallel group of ParallelLayout), named
// so that groups meet apart in the store: every member calls it with the same members (world
// ranks, this rank among them) and name; its rank() is this rank's place in `members`.
std::unique_ptr<ProcessGroup> make_cpu_process_group(const RankEnv& env, double timeout_minutes,
                                                     const std::vector<int64_t>& members, const std::string& name);

// The same Gloo group for host values plus an NCCL communicator over the ranks' current devices
// (each rank selects its GPU first: cuda_set_device(LOCAL_RANK)). A UsageError without the CUDA
// backend or Gloo.
std::unique_ptr<ProcessGroup> make_gpu_process_group(const RankEnv& env, double timeout_minutes);
// The same over some of the world's ranks (as make_cpu_process_group's subgroups).
std::unique_ptr<ProcessGroup> make_gpu_process_group(const RankEnv& env, double timeout_minutes,
                                                     const std::vector<int64_t>& members, const std::string& name);

}  // namespace laoyao::dist
