#include "train/async_save.hpp"

#include <utility>

namespace laoyao::train {

AsyncCheckpointSave::~AsyncCheckpointSave() {
  if (thread_.joinable()) thread_.join();
}

void AsyncCheckpointSave::start(std::unique_ptr<RunCheckpointCopy> copy, std::FILE* out) {
  finalize(true);
  copy_ = std::move(copy);
  out_ = out;
  done_ = false;
  error_ = nullptr;
  try {
    thread_ = std::thread([this] {
      try {
        write_run_checkpoint(*copy_);
      } catch (...) {
        error_ = std::current_exception();
      }
      done_ = true;
    });
  } catch (...) {  // no thread: nothing in flight
    copy_.reset();
    throw;
  }
  std::fprintf(out_, "  scheduled an async checkpoint save at iteration %7lld to %s\n",
               static_cast<long long>(copy_->iteration), copy_->save_dir.c_str());
  std::fflush(out_);
}

void AsyncCheckpointSave::finalize(bool wait) {
  if (!copy_ || (!wait && !done_)) return;
  thread_.join();
  const std::unique_ptr<RunCheckpointCopy> copy = std::move(copy_);
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  report_saved_checkpoint(copy->save_dir, copy->iteration, out_);
}

}  // namespace laoyao::train
