// Deadline waits (see stream_wait.hpp): poll the stream or event; spin for the first 50 ms (a step's
// wait is usually shorter, and a spin adds no latency), then sleep 200 us between polls so that a
// hung rank does not burn a core (at most 0.4% added to a wait that long).
#include "kernels/cuda/stream_wait.hpp"

#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>

#include "kernels/cuda/cuda_check.hpp"

namespace laoyao::kernels::cuda {
namespace {

std::mutex deadline_mutex;
WaitDeadline deadline_setting;

WaitDeadline current_deadline() {
  std::lock_guard<std::mutex> lock(deadline_mutex);
  return deadline_setting;
}

// Without a deadline `block` (the runtime's own synchronisation); with one, polls `query` until it
// stops answering cudaErrorNotReady or the deadline passes.
template <class Block, class Query>
void wait_until_done(Block block, Query query, const char* call, const char* waiting_for) {
  const WaitDeadline d = current_deadline();
  if (d.seconds <= 0) return check_status(block(), call, __FILE__, __LINE__);
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    const cudaError_t st = query();
    if (st != cudaErrorNotReady) return check_status(st, call, __FILE__, __LINE__);
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (waited > d.seconds) {
      if (d.on_timeout) d.on_timeout();
      char limit[64];
      std::snprintf(limit, sizeof limit, "%g minutes", d.seconds / 60.0);
      throw Error("waited " + std::to_string(static_cast<int64_t>(waited)) + " s for the GPU to finish " +
                  waiting_for + ", longer than " + d.what + " (" + limit +
                  "): a collective that another rank never joined, or a rank that stopped?");
    }
    if (waited > 0.05) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

}  // namespace

void set_wait_deadline(WaitDeadline deadline) {
  std::lock_guard<std::mutex> lock(deadline_mutex);
  deadline_setting = std::move(deadline);
}

void stream_wait(cudaStream_t stream, const char* waiting_for) {
  wait_until_done([stream] { return cudaStreamSynchronize(stream); }, [stream] { return cudaStreamQuery(stream); },
                  "cudaStreamSynchronize(stream)", waiting_for);
}

void event_wait(cudaEvent_t event, const char* waiting_for) {
  wait_until_done([event] { return cudaEventSynchronize(event); }, [event] { return cudaEventQuery(event); },
                  "cudaEventSynchronize(event)", waiting_for);
}

}  // namespace laoyao::kernels::cuda
