// Where a stream's time goes, by category, for finding overheads (LAOYAO_MOE_PHASES=1 for the MoE
// layers): mark(c) records an event, and the time from the previous mark to it counts to category
// c. take() waits for the last event and returns the sums since the last take. Off (no events,
// nothing recorded) unless enabled (core/runtime_options.hpp: LAOYAO_MODEL_PHASES and the like).
#pragma once
#include <cuda_runtime.h>

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda/cuda_check.hpp"

namespace laoyao::model {

class StreamTimeline {
 public:
  StreamTimeline(bool enabled, int categories) : enabled_(enabled), sums_(static_cast<size_t>(categories), 0.0) {}
  ~StreamTimeline() {
    for (cudaEvent_t e : events_) (void)cudaEventDestroy(e);
  }
  StreamTimeline(const StreamTimeline&) = delete;
  StreamTimeline& operator=(const StreamTimeline&) = delete;

  bool enabled() const { return enabled_; }
  // Whether marks on `stream` are recorded now: on, and the stream is not being captured into a
  // CUDA graph (its replays are not timed: LAOYAO_CUDA_GRAPHS=0 times such steps).
  bool recording(cudaStream_t stream) const {
    if (!enabled_) return false;
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    LAOYAO_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
    return capture == cudaStreamCaptureStatusNone;
  }
  // The start of a span of marks (its time counts nowhere).
  void begin(cudaStream_t stream) { mark(-1, stream); }
  // Nothing is recorded unless recording(stream).
  void mark(int category, cudaStream_t stream) {
    if (!recording(stream)) return;
    if (marks_.size() == events_.size()) {
      cudaEvent_t e;
      LAOYAO_CUDA_CHECK(cudaEventCreate(&e));
      events_.push_back(e);
    }
    LAOYAO_CUDA_CHECK(cudaEventRecord(events_[marks_.size()], stream));
    marks_.push_back(category);
  }
  // Milliseconds per category since the last take (zeros when off).
  std::vector<double> take() {
    if (enabled_ && !marks_.empty()) {
      LAOYAO_CUDA_CHECK(cudaEventSynchronize(events_[marks_.size() - 1]));
      for (size_t i = 1; i < marks_.size(); ++i) {
        if (marks_[i] < 0) continue;
        float ms = 0;
        LAOYAO_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[i - 1], events_[i]));
        sums_[static_cast<size_t>(marks_[i])] += ms;
      }
    }
    marks_.clear();
    std::vector<double> out(sums_.size(), 0.0);
    std::swap(out, sums_);
    return out;
  }

 private:
  bool enabled_ = false;
  std::vector<cudaEvent_t> events_;
  std::vector<int> marks_;
  std::vector<double> sums_;
};

}  // namespace laoyao::model
