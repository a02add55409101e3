// GPU ranks' process group (see process_group.hpp): Gloo for host values, NCCL for device memory.
#include <cstring>
#include <map>
#include <vector>
#include <memory>
#include <string>

#include "core/error.hpp"
#include "dist/process_group.hpp"

#if LAOYAO_HAVE_CUDA
#include <cuda_runtime.h>
#include <nccl.h>
#endif

namespace laoyao::dist {

namespace {
[[noreturn]] void no_device_collectives() {
  throw Error("this process group has no device collectives (CPU ranks): make_gpu_process_group makes one");
}
}  // namespace

void ProcessGroup::all_reduce_sum_device(float*, size_t, void*, double) { no_device_collectives(); }
void ProcessGroup::all_reduce_device(void*, size_t, DeviceType, void*) { no_device_collectives(); }
void ProcessGroup::all_gather_device(const void*, void*, size_t, DeviceType, void*) { no_device_collectives(); }
void ProcessGroup::reduce_scatter_device(const void*, void*, size_t, DeviceType, void*, double) {
  no_device_collectives();
}
void ProcessGroup::all_to_all_device(const void*, const size_t*, void*, const size_t*, DeviceType, void*, bool) {
  no_device_collectives();
}
void ProcessGroup::all_reduce_max_device(float*, size_t, void*) { no_device_collectives(); }

#if LAOYAO_HAVE_CUDA
namespace {

void check_nccl(ncclResult_t st, const char* call, int rank) {
  if (st == ncclSuccess) return;
  const char* detail = ncclGetLastError(nullptr);
  throw Error("rank " + std::to_string(rank) + ": " + call + " failed: " + ncclGetErrorString(st) +
              (detail && *detail ? std::string(": ") + detail : std::string()));
}

ncclDataType_t nccl_type(DeviceType t) {
  switch (t) {
    case DeviceType::F32: return ncclFloat32;
    case DeviceType::BF16: return ncclBfloat16;
    case DeviceType::F64: return ncclFloat64;
    case DeviceType::I32: return ncclInt32;
  }
  return ncclFloat32;
}

size_t type_bytes(DeviceType t) {
  switch (t) {
    case DeviceType::BF16: return 2;
    case DeviceType::F64: return 8;
    case DeviceType::F32:
    case DeviceType::I32: return 4;
  }
  return 4;
}

class NcclGroup final : public ProcessGroup {
 public:
  NcclGroup(std::unique_ptr<ProcessGroup> host) : host_(std::move(host)) {
    // Rank 0's unique id reaches the others through the host group: an all-reduce of its 128
    // bytes as doubles (every other rank adds zeros; byte values are exact in double).
    ncclUniqueId id;
    std::memset(&id, 0, sizeof id);
    if (rank() == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId", 0);
    double bytes[sizeof id.internal];
    for (size_t i = 0; i < sizeof id.internal; ++i) bytes[i] = static_cast<unsigned char>(id.internal[i]);
    host_->all_reduce_sum(bytes, sizeof id.internal);
    for (size_t i = 0; i < sizeof id.internal; ++i) id.internal[i] = static_cast<char>(static_cast<int>(bytes[i]));
    check_nccl(ncclCommInitRank(&comm_, size(), id, rank()), "ncclCommInitRank", rank());
  }
  ~NcclGroup() override {
    if (!comm_) return;  // aborted
    for (auto& [scale, op] : ops_) (void)ncclRedOpDestroy(op, comm_);
    (void)ncclCommDestroy(comm_);
  }
  void abort() override {
    if (!comm_) return;
    (void)ncclCommAbort(comm_);  // frees the operators too
    comm_ = nullptr;
  }
  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  void all_reduce_sum(float* data, size_t n) override { host_->all_reduce_sum(data, n); }
  void all_reduce_sum(double* data, size_t n) override { host_->all_reduce_sum(data, n); }
  void all_reduce_max(float* data, size_t n) override { host_->all_reduce_max(data, n); }
  void barrier() override { host_->barrier(); }
  void all_reduce_sum_device(float* data, size_t n, void* stream, double scale) override {
    if (n == 0) return;
    check_alive();
    check_nccl(ncclAllReduce(data, data, n, ncclFloat32, op_for(scale), comm_, static_cast<cudaStream_t>(stream)),
               "ncclAllReduce (gradients)", rank());
  }
  void all_reduce_device(void* data, size_t n, DeviceType type, void* stream) override {
    if (n == 0) return;
    check_alive();
    check_nccl(ncclAllReduce(data, data, n, nccl_type(type), ncclSum, comm_, static_cast<cudaStream_t>(stream)),
               "ncclAllReduce", rank());
  }
  void all_reduce_max_device(float* data, size_t n, void* stream) override {
    if (n == 0) return;
    check_alive();
    check_nccl(ncclAllReduce(data, data, n, ncclFloat32, ncclMax, comm_, static_cast<cudaStream_t>(stream)),
               "ncclAllReduce (max)", rank());
  }
  void all_gather_device(const void* send, void* recv, size_t n, DeviceType type, void* stream) override {
    if (n == 0) return;
    check_alive();
    check_nccl(ncclAllGather(send, recv, n, nccl_type(type), comm_, static_cast<cudaStream_t>(stream)),
               "ncclAllGather", rank());
  }
  void reduce_scatter_device(const void* send, void* recv, size_t n, DeviceType type, void* stream,
                             double scale) override {
    if (n == 0) return;
    check_alive();
    if (scale != 1.0 && type != DeviceType::F32) throw Error("reduce_scatter_device: a scale needs F32 elements");
    check_nccl(
        ncclReduceScatter(send, recv, n, nccl_type(type), op_for(scale), comm_, static_cast<cudaStream_t>(stream)),
        "ncclReduceScatter", rank());
  }
  // One NCCL group of a send and a receive per peer (empty ones left out), so that no pair waits
  // on another: NCCL runs them together.
  void all_to_all_device(const void* send, const size_t* send_counts, void* recv, const size_t* recv_counts,
                         DeviceType type, void* stream, bool with_self) override {
    check_alive();
    const size_t bytes = type_bytes(type);
    const auto* from = static_cast<const char*>(send);
    auto* to = static_cast<char*>(recv);
    auto st = static_cast<cudaStream_t>(stream);
    check_nccl(ncclGroupStart(), "ncclGroupStart", rank());
    for (int r = 0; r < size(); ++r) {
      const bool move = with_self || r != rank();
      if (move && send_counts[r] > 0)
        check_nccl(ncclSend(from, send_counts[r], nccl_type(type), r, comm_, st), "ncclSend", rank());
      if (move && recv_counts[r] > 0)
        check_nccl(ncclRecv(to, recv_counts[r], nccl_type(type), r, comm_, st), "ncclRecv", rank());
      from += send_counts[r] * bytes;
      to += recv_counts[r] * bytes;
    }
    check_nccl(ncclGroupEnd(), "ncclGroupEnd (all-to-all)", rank());
  }

 private:
  void check_alive() const {
    if (!comm_) throw Error("rank " + std::to_string(rank()) + ": a device collective after the NCCL communicator was "
                            "aborted");
  }
  // NCCL's pre-multiplied sum, sum_r(scale * x_r): the average of the data-parallel gradients in one
  // pass. One operator per scale, kept for the communicator's life.
  ncclRedOp_t op_for(double scale) {
    if (scale == 1.0) return ncclSum;
    auto it = ops_.find(scale);
    if (it != ops_.end()) return it->second;
    float s = static_cast<float>(scale);
    ncclRedOp_t op;
    check_nccl(ncclRedOpCreatePreMulSum(&op, &s, ncclFloat32, ncclScalarHostImmediate, comm_),
               "ncclRedOpCreatePreMulSum", rank());
    ops_.emplace(scale, op);
    return op;
  }

  std::unique_ptr<ProcessGroup> host_;
  ncclComm_t comm_ = nullptr;
  std::map<double, ncclRedOp_t> ops_;
};

}  // namespace

std::unique_ptr<ProcessGroup> make_gpu_process_group(const RankEnv& env, double timeout_minutes) {
  return std::make_unique<NcclGroup>(make_cpu_process_group(env, timeout_minutes));
}

std::unique_ptr<ProcessGroup> make_gpu_process_group(const RankEnv& env, double timeout_minutes,
                                                     const std::vector<int64_t>& members, const std::string& name) {
  return std::make_unique<NcclGroup>(make_cpu_process_group(env, timeout_minutes, members, name));
}
#else
std::unique_ptr<ProcessGroup> make_gpu_process_group(const RankEnv&, double) {
  throw UsageError("this laoyao was built without the CUDA backend, so GPU ranks cannot communicate");
}

std::unique_ptr<ProcessGroup> make_gpu_process_group(const RankEnv& env, double timeout_minutes,
                                                     const std::vector<int64_t>&, const std::string&) {
  return make_gpu_process_group(env, timeout_minutes);
}
#endif

}  // namespace laoyao::dist
