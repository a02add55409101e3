// A process group of threads that share one GPU, for tests of the GPU ranks' code on a one-GPU
// machine (NCCL takes one rank a device). Each collective waits for the caller's stream, meets the
// other threads at a barrier and moves the bytes with cudaMemcpy between their buffers (one
// address space; see the caveat at copy()); reductions sum in fp32 on the host and round once, as
// NCCL's bf16 sum of two ranks does. Every member calls the same collectives in the same order;
// none of it may be captured into a CUDA graph.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <thread>
#include <vector>

#include "dist/process_group.hpp"
#include "kernels/cuda/cuda_check.hpp"

namespace laoyao::model::test {

class SharedDeviceGroup final : public dist::ProcessGroup {
 public:
  // What the members share: make one, then a group per member thread. Its barrier gives up with
  // an error, rather than hang the test binary, when a member fails (break_off) or when the others
  // have not arrived within kTimeout; the message says which collective each member is in.
  struct Meeting {
    static constexpr std::chrono::seconds kTimeout{60};
    explicit Meeting(int n, std::string label = "group")
        : size(n), name(std::move(label)), at(static_cast<size_t>(n)), sends(static_cast<size_t>(n)),
          counts(static_cast<size_t>(n)) {}
    int size;
    std::string name;
    std::mutex mu;
    std::condition_variable cv;
    int arrived = 0;
    uint64_t generation = 0;
    bool broken = false;
    std::vector<std::string> at;        // each member's current collective
    std::vector<const void*> sends;     // each member's buffer of the current collective
    std::vector<const size_t*> counts;  // all-to-all: each member's send counts
    void wait(int rank, const std::string& what) {
      std::unique_lock<std::mutex> lock(mu);
      at[static_cast<size_t>(rank)] = what;
      const std::string who = name + " rank " + std::to_string(rank) + " in " + what;
      if (broken) throw Error("SharedDeviceGroup: " + who + ": another member failed");
      const uint64_t mine = generation;
      if (++arrived == size) {
        arrived = 0, ++generation;
        cv.notify_all();
        return;
      }
      if (!cv.wait_for(lock, kTimeout, [&] { return generation != mine || broken; })) {
        broken = true;
        cv.notify_all();
        std::string where;
        for (int r = 0; r < size; ++r) where += " [" + std::to_string(r) + "] " + at[static_cast<size_t>(r)];
        throw Error("SharedDeviceGroup: " + who + " waited " + std::to_string(kTimeout.count()) +
                    " s for the others; the members are at:" + where);
      }
      if (generation == mine) throw Error("SharedDeviceGroup: " + who + ": another member failed");
    }
    // A member failed: the others' waits, now and later, throw instead of hanging.
    void break_off() {
      std::lock_guard<std::mutex> lock(mu);
      broken = true;
      cv.notify_all();
    }
  };
  SharedDeviceGroup(std::shared_ptr<Meeting> meeting, int rank) : m_(std::move(meeting)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return m_->size; }
  void all_reduce_sum(float* data, size_t n) override { host_reduce(data, n, [](double a, double b) { return a + b; }); }
  void all_reduce_sum(double* data, size_t n) override { host_reduce(data, n, [](double a, double b) { return a + b; }); }
  void all_reduce_max(float* data, size_t n) override {
    host_reduce(data, n, [](double a, double b) { return std::max(a, b); });
  }
  void barrier() override { meet("barrier"); }

  void all_reduce_sum_device(float* data, size_t n, void* stream, double scale) override {
    publish("all_reduce_sum_device", data, stream);
    summed_in_chunks(data, 0, n, dist::DeviceType::F32, scale);
  }
  void all_gather_device(const void* send, void* recv, size_t n, dist::DeviceType type, void* stream) override {
    const size_t bytes = n * type_bytes(type);
    publish("all_gather_device", send, stream);
    for (int r = 0; r < size(); ++r)
      copy(static_cast<char*>(recv) + static_cast<size_t>(r) * bytes, m_->sends[static_cast<size_t>(r)], bytes);
    meet(what_);  // nobody's send buffer is reused before every copy from it is done
  }
  void reduce_scatter_device(const void* send, void* recv, size_t n, dist::DeviceType type, void* stream,
                             double scale) override {
    publish("reduce_scatter_device", send, stream);
    summed_in_chunks(recv, static_cast<size_t>(rank_) * n, n, type, scale);
  }
  void all_reduce_device(void* data, size_t n, dist::DeviceType type, void* stream) override {
    if (type == dist::DeviceType::F64) return exact_all_reduce<double>(data, n, stream);
    if (type == dist::DeviceType::I32) return exact_all_reduce<int32_t>(data, n, stream);
    publish("all_reduce_device", data, stream);
    summed_in_chunks(data, 0, n, type, 1.0);
  }
  void all_reduce_max_device(float* data, size_t n, void* stream) override {
    publish("all_reduce_max_device", data, stream);
    std::vector<float> out(n), part(n);
    for (int r = 0; r < size(); ++r) {
      if (n > 0)
        LAOYAO_CUDA_CHECK(cudaMemcpy(part.data(), m_->sends[static_cast<size_t>(r)], n * 4, cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < n; ++i) out[i] = r == 0 ? part[i] : std::max(out[i], part[i]);
    }
    meet(what_);
    if (n > 0) {  // (on the caller's stream, waited for: a pageable upload may return before it lands)
      auto st = static_cast<cudaStream_t>(stream);
      LAOYAO_CUDA_CHECK(cudaMemcpyAsync(data, out.data(), n * 4, cudaMemcpyHostToDevice, st));
      LAOYAO_CUDA_CHECK(cudaStreamSynchronize(st));
    }
    meet(what_);
  }
  void all_to_all_device(const void* send, const size_t* send_counts, void* recv, const size_t* recv_counts,
                         dist::DeviceType type, void* stream, bool with_self) override {
    m_->counts[static_cast<size_t>(rank_)] = send_counts;
    publish("all_to_all_device", send, stream);
    const size_t b = type_bytes(type);
    size_t at = 0;
    for (int s = 0; s < size(); ++s) {
      const size_t* theirs = m_->counts[static_cast<size_t>(s)];
      size_t from = 0;
      for (int q = 0; q < rank_; ++q) from += theirs[q];
      if (theirs[rank_] != recv_counts[s]) throw Error("SharedDeviceGroup: all-to-all counts disagree");
      if (with_self || s != rank_)
        copy(static_cast<char*>(recv) + at * b, static_cast<const char*>(m_->sends[static_cast<size_t>(s)]) + from * b,
             recv_counts[s] * b);
      at += recv_counts[s];
    }
    meet(what_);
  }

 private:
  static size_t type_bytes(dist::DeviceType t) {
    return t == dist::DeviceType::BF16 ? 2 : t == dist::DeviceType::F64 ? 8 : 4;
  }
  void publish(const char* op, const void* p, void* stream) {
    what_ = std::string(op) + " #" + std::to_string(++calls_);
    LAOYAO_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
    m_->sends[static_cast<size_t>(rank_)] = p;
    meet(what_);
  }
  void meet(const std::string& what) { m_->wait(rank_, what); }
  // out[0, n) = the sum over members of scale * (their published buffer)[first, first + n), summed
  // in fp32 on the host a chunk at a time (the host memory stays small beside a model's gradients:
  // the trainer's host-memory bench runs on these groups). Every member reads a chunk before any
  // writes it, since `out` may be a member's published buffer.
  void summed_in_chunks(void* out, size_t first, size_t n, dist::DeviceType type, double scale) {
    constexpr size_t kChunk = size_t{1} << 22;
    const size_t b = type_bytes(type);
    for (size_t at = 0; at < n; at += kChunk) {
      const size_t len = std::min(kChunk, n - at);
      std::vector<float> sum(len, 0.0f);
      for (int r = 0; r < size(); ++r) {
        const std::vector<float> part = download(m_->sends[static_cast<size_t>(r)], first + at, len, type);
        for (size_t i = 0; i < len; ++i) sum[i] += static_cast<float>(scale) * part[i];
      }
      meet(what_);
      upload(sum, static_cast<char*>(out) + at * b, type);
      meet(what_);
    }
  }
  static void copy(void* to, const void* from, size_t bytes) {
    if (bytes > 0) LAOYAO_CUDA_CHECK(cudaMemcpy(to, from, bytes, cudaMemcpyDeviceToDevice));
  }
  // Caveat: cudaMemcpy may return before a device-to-device copy, or a pageable upload's last leg,
  // is done, on the legacy stream, which the callers' non-blocking streams do not wait for. A
  // cudaDeviceSynchronize after the copies was tried (thirteenth session): the one GPU run with it
  // stopped inside CudaGptModelTp.MoeEveryExpertSequenceParallel until its time limit. Likely
  // cause, found in the fourteenth: two threads launching a grouped GEMM for the first time, one
  // before the other had allowed its shared memory (kernels/cuda/smem_attribute.hpp's SmemSite
  // now makes them wait); the failing rank left and the other waited at the barrier for ever (the
  // barrier now gives up).
  static std::vector<float> download(const void* base, size_t first, size_t n, dist::DeviceType type) {
    std::vector<float> out(n);
    if (type == dist::DeviceType::BF16) {
      std::vector<__nv_bfloat16> h(n);
      LAOYAO_CUDA_CHECK(cudaMemcpy(h.data(), static_cast<const __nv_bfloat16*>(base) + first, n * 2,
                                   cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < n; ++i) out[i] = __bfloat162float(h[i]);
    } else if (type == dist::DeviceType::F32) {
      LAOYAO_CUDA_CHECK(cudaMemcpy(out.data(), static_cast<const float*>(base) + first, n * 4, cudaMemcpyDeviceToHost));
    } else {
      throw Error("SharedDeviceGroup: reduce-scatters of bf16 or fp32 only");
    }
    return out;
  }
  static void upload(const std::vector<float>& v, void* to, dist::DeviceType type) {
    if (type == dist::DeviceType::BF16) {
      std::vector<__nv_bfloat16> h(v.size());
      for (size_t i = 0; i < v.size(); ++i) h[i] = __float2bfloat16(v[i]);  // round to nearest even
      LAOYAO_CUDA_CHECK(cudaMemcpy(to, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
    } else {
      LAOYAO_CUDA_CHECK(cudaMemcpy(to, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
    }
  }
  // A sum of device values of T in rank order, on the host (fp64 norms, int32 counts).
  template <class T>
  void exact_all_reduce(void* data, size_t n, void* stream) {
    publish("exact_all_reduce", data, stream);
    std::vector<T> sum(n, T(0)), part(n);
    for (int r = 0; r < size(); ++r) {
      if (n > 0)
        LAOYAO_CUDA_CHECK(cudaMemcpy(part.data(), m_->sends[static_cast<size_t>(r)], n * sizeof(T), cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < n; ++i) sum[i] += part[i];
    }
    meet(what_);
    if (n > 0) LAOYAO_CUDA_CHECK(cudaMemcpy(data, sum.data(), n * sizeof(T), cudaMemcpyHostToDevice));
    meet(what_);
  }
  template <class T, class Op>
  void host_reduce(T* data, size_t n, Op op) {
    what_ = "host all_reduce #" + std::to_string(++calls_);
    m_->sends[static_cast<size_t>(rank_)] = data;
    meet(what_);
    const T* first = static_cast<const T*>(m_->sends[0]);
    std::vector<T> out(first, first + n);  // in rank order: every member gets the same bits
    for (int r = 1; r < size(); ++r) {
      const T* theirs = static_cast<const T*>(m_->sends[static_cast<size_t>(r)]);
      for (size_t i = 0; i < n; ++i) out[i] = static_cast<T>(op(out[i], theirs[i]));
    }
    meet(what_);
    std::copy(out.begin(), out.end(), data);
    meet(what_);
  }

  std::shared_ptr<Meeting> m_;
  int rank_;
  int64_t calls_ = 0;  // this member's collectives so far, named in a timeout's message
  std::string what_;   // the current one
};

// fn(rank, group) on `ranks` threads, all on GPU 0, meeting in one SharedDeviceGroup; returns each
// rank's exception message ("" where it finished).
inline std::vector<std::string> run_on_shared_gpu(int ranks,
                                                  const std::function<void(int, SharedDeviceGroup&)>& fn) {
  auto meeting = std::make_shared<SharedDeviceGroup::Meeting>(ranks);
  std::vector<std::string> errors(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      try {
        LAOYAO_CUDA_CHECK(cudaSetDevice(0));
        SharedDeviceGroup group(meeting, r);
        fn(r, group);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
        meeting->break_off();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

}  // namespace laoyao::model::test
