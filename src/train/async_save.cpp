#include "train/async_save.hpp"

#include <utility>

namespace laoyao::train {

AsyncCheckpointSave::~AsyncCheckpointSave() {
  if (thread_.joinable()) thread_.join();
}

void AsyncCheckpointSave::start(std::unique_ptr<RunCheckpointSave> save, std::FILE* out) {
  finalize(true);
  save_ = std::move(save);
  out_ = out;
  done_ = false;
  error_ = nullptr;
  try {
    thread_ = std::thread([this] {
      try {
        write_run_checkpoint(*save_);
      } catch (...) {
        error_ = std::current_exception();
      }
      done_ = true;
    });
  } catch (...) {  // no thread: this rank's write failed
    error_ = std::current_exception();
    done_ = true;
  }
  if (save_->rank == 0) {
    std::fprintf(out_, "  scheduled an async checkpoint save at iteration %7lld to %s\n",
                 static_cast<long long>(save_->iteration), save_->save_dir.c_str());
    std::fflush(out_);
  }
}

void AsyncCheckpointSave::finalize(bool wait) {
  if (!save_) return;
  if (!wait) {  // every rank's thread done, or none finalizes yet
    double pending = done_ ? 0.0 : 1.0;
    if (save_->world && save_->world_size > 1) save_->world->all_reduce_sum(&pending, 1);
    if (pending > 0) return;
  }
  if (thread_.joinable()) thread_.join();
  const std::unique_ptr<RunCheckpointSave> save = std::move(save_);
  finish_run_checkpoint(*save, std::exchange(error_, nullptr), out_);
}

}  // namespace laoyao::train
