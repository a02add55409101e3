// An owning device allocation: cudaMalloc in the constructor, cudaFree in the destructor, movable,
// never copied. Allocation happens only where a DeviceBuffer is constructed (set-up code), never
// inside an op: ops take raw pointers into buffers their caller owns.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/byte_runs.hpp"
#include "kernels/cuda/cuda_check.hpp"

namespace laoyao::kernels::cuda {

struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  int device = -1;  // the device that was current at allocation

  DeviceBuffer() = default;
  // Allocates `bytes` on the current device (cudaMalloc memory is 256-byte aligned).
  explicit DeviceBuffer(size_t n) : bytes(n) {
    LAOYAO_CUDA_CHECK(cudaGetDevice(&device));
    if (n > 0) LAOYAO_CUDA_CHECK(cudaMalloc(&ptr, n));
  }
  ~DeviceBuffer() { release(); }

  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : ptr(std::exchange(o.ptr, nullptr)), bytes(std::exchange(o.bytes, 0)), device(std::exchange(o.device, -1)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      release();
      ptr = std::exchange(o.ptr, nullptr);
      bytes = std::exchange(o.bytes, 0);
      device = std::exchange(o.device, -1);
    }
    return *this;
  }

  template <class T>
  T* as() const {
    return static_cast<T*>(ptr);
  }

  // Synchronous copies of the whole buffer (set-up and checks only; the step uses async copies).
  void upload(const void* host, size_t n) const {
    if (n > bytes) throw Error("DeviceBuffer::upload: " + std::to_string(n) + " bytes into " + std::to_string(bytes));
    LAOYAO_CUDA_CHECK(cudaMemcpy(ptr, host, n, cudaMemcpyHostToDevice));
    // From pageable memory cudaMemcpy returns once the bytes are staged, before the DMA into the
    // buffer ends; the legacy stream it ran on does not order our non-blocking streams, so a
    // kernel launched next could read the old contents (it did: parts of a weight upload, now and
    // then, in a two-GPU test). Wait for the copy itself.
    LAOYAO_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
  }
  void download(void* host, size_t n) const {
    if (n > bytes) throw Error("DeviceBuffer::download: " + std::to_string(n) + " bytes from " + std::to_string(bytes));
    LAOYAO_CUDA_CHECK(cudaMemcpy(host, ptr, n, cudaMemcpyDeviceToHost));
  }

 private:
  // A destructor cannot throw: a failing cudaFree (a context already torn down at exit) is
  // dropped. cudaFree is made with the owning device current, then the caller's is restored.
  void release() noexcept {
    if (!ptr) return;
    int current = -1;
    const bool switch_device = cudaGetDevice(&current) == cudaSuccess && current != device;
    if (switch_device) (void)cudaSetDevice(device);
    (void)cudaFree(ptr);
    if (switch_device) (void)cudaSetDevice(current);
    (void)cudaGetLastError();
    ptr = nullptr;
    bytes = 0;
  }
};

// Sets n bytes of device memory at p to `value` and waits for it (set-up only).
inline void fill_bytes(void* p, int value, int64_t n) {
  if (n <= 0) return;
  LAOYAO_CUDA_CHECK(cudaMemset(p, value, static_cast<size_t>(n)));
  LAOYAO_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
}

// Writes n flag bytes at device memory p: zeros, then each run's value over its bytes in order (a
// later run wins; core/byte_runs.hpp), built on the host a window of at most 16 MB at a time and
// copied in (set-up only; a host copy of the whole would be the size of the model). Not one
// cudaMemset a run: weight-decay flags set that way made every later step of the smallest bench
// shape 3% slower (docs/benchmarks.md), for a reason not found.
inline void upload_byte_runs(uint8_t* p, int64_t n, const std::vector<ByteRun>& runs) {
  constexpr int64_t kWindow = int64_t(1) << 24;
  std::vector<uint8_t> host;
  for (int64_t w0 = 0; w0 < n; w0 += kWindow) {
    host.resize(static_cast<size_t>(std::min(n - w0, kWindow)));
    paint_byte_runs(host.data(), w0, static_cast<int64_t>(host.size()), runs);
    LAOYAO_CUDA_CHECK(cudaMemcpy(p + w0, host.data(), host.size(), cudaMemcpyHostToDevice));
    LAOYAO_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));  // as DeviceBuffer::upload
  }
}

// Page-locked host memory (cudaMallocHost), so that a cudaMemcpyAsync from it is a real
// asynchronous DMA in stream order (from pageable memory the driver stages and may block).
struct PinnedHostBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;

  PinnedHostBuffer() = default;
  explicit PinnedHostBuffer(size_t n) : bytes(n) {
    if (n > 0) LAOYAO_CUDA_CHECK(cudaMallocHost(&ptr, n));
  }
  ~PinnedHostBuffer() {
    if (ptr) (void)cudaFreeHost(ptr);
  }
  PinnedHostBuffer(const PinnedHostBuffer&) = delete;
  PinnedHostBuffer& operator=(const PinnedHostBuffer&) = delete;
  PinnedHostBuffer(PinnedHostBuffer&& o) noexcept : ptr(std::exchange(o.ptr, nullptr)), bytes(std::exchange(o.bytes, 0)) {}
  PinnedHostBuffer& operator=(PinnedHostBuffer&& o) noexcept {
    if (this != &o) {
      if (ptr) (void)cudaFreeHost(ptr);
      ptr = std::exchange(o.ptr, nullptr);
      bytes = std::exchange(o.bytes, 0);
    }
    return *this;
  }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr);
  }
};

}  // namespace laoyao::kernels::cuda
