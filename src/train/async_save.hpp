// --async-save: Megatron's asynchronous checkpoint save. The writing rank copies the state (the
// "saving checkpoint" line), a thread of its own writes the copy while training goes on (the
// "scheduled an async checkpoint save" line), and the training loop finalizes it: at the start of
// each iteration if the thread has finished, before the next save and at the end of training by
// waiting (Megatron's maybe_finalize_async_save), printing the "successfully saved" line then.
// One save is in flight at a time; a write that failed is rethrown where it is finalized.
#pragma once
#include <atomic>
#include <cstdio>
#include <exception>
#include <memory>
#include <thread>

#include "train/run_checkpoint.hpp"

namespace laoyao::train {

class AsyncCheckpointSave {
 public:
  AsyncCheckpointSave() = default;
  AsyncCheckpointSave(const AsyncCheckpointSave&) = delete;
  AsyncCheckpointSave& operator=(const AsyncCheckpointSave&) = delete;
  ~AsyncCheckpointSave();  // waits for a save in flight (its error, if any, is lost)

  // Finalizes the save in flight (waiting for it), then starts writing `copy`.
  void start(std::unique_ptr<RunCheckpointCopy> copy, std::FILE* out);
  // The save in flight, when its thread has finished (wait: once it has): joined, reported.
  void finalize(bool wait);
  bool in_flight() const { return copy_ != nullptr; }

 private:
  std::unique_ptr<RunCheckpointCopy> copy_;
  std::FILE* out_ = nullptr;
  std::thread thread_;
  std::atomic<bool> done_{false};
  std::exception_ptr error_;
};

}  // namespace laoyao::train
