// --async-save: Megatron's asynchronous checkpoint save. Every rank begins the save together
// (Megatron's "saving checkpoint" line; this rank's state copied), a thread of each rank writes its
// shard while training goes on (the "scheduled an async checkpoint save" line), and the training
// loop finalizes it on every rank at once: at the start of each iteration once every rank's thread
// has finished, before the next save and at the end of training by waiting (Megatron's
// maybe_finalize_async_save), the first rank then finishing the checkpoint and printing the
// "successfully saved" line. One save is in flight at a time; a write that failed on any rank is
// an error on every rank where it is finalized.
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
  ~AsyncCheckpointSave();  // waits for a write in flight (the save is not finished, its error lost)

  // Finalizes the save in flight (waiting for it), then starts writing `save`'s shard.
  void start(std::unique_ptr<RunCheckpointSave> save, std::FILE* out);
  // Collective: the save in flight, when every rank's thread has finished (wait: once they have),
  // joined, finished and reported.
  void finalize(bool wait);
  bool in_flight() const { return save_ != nullptr; }

 private:
  std::unique_ptr<RunCheckpointSave> save_;
  std::FILE* out_ = nullptr;
  std::thread thread_;
  std::atomic<bool> done_{false};
  std::exception_ptr error_;
};

}  // namespace laoyao::train
