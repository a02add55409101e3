// Host waits on the GPU with a deadline. The training step's waits (the loss, the grad norm, a
// staging slot) go through these, so that on GPU ranks a collective that another rank never joins
// fails after --distributed-timeout-minutes with a message, instead of hanging: on the deadline
// the process-wide on_timeout runs first (it aborts the NCCL communicators, whose kernels then
// return, so the process can unwind), then laoyao::Error is thrown.
#pragma once
#include <cuda_runtime.h>

#include <functional>

namespace laoyao::kernels::cuda {

struct WaitDeadline {
  double seconds = 0;  // <= 0: wait as long as it takes (one GPU: nothing can hang on another rank)
  std::function<void()> on_timeout;
  const char* what = "";  // the setting that bounds the wait, for the message
};

// Process-wide (the ranks of a job set it once, before training).
void set_wait_deadline(WaitDeadline deadline);

// Until every operation enqueued on `stream` (or recorded by `event`) is done; `waiting_for` names
// what the host needs, for the message.
void stream_wait(cudaStream_t stream, const char* waiting_for);
void event_wait(cudaEvent_t event, const char* waiting_for);

}  // namespace laoyao::kernels::cuda
