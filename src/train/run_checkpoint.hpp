// The training loop's side of checkpoints: what a laoyao run saves (fp32 main parameters, Adam
// state, counters, the resolved config, the model-shape fields) and how it resumes (--load),
// starts from pretrained weights (--pretrained-checkpoint) or fine-tunes (--finetune), with
// Megatron's messages. Storage itself is train/checkpoint.hpp.
#pragma once
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "config/config_container.hpp"
#include "model/gpt_model.hpp"
#include "optim/adamw.hpp"
#include "train/checkpoint.hpp"

namespace laoyao::train {

// The fields a checkpoint's model must share with the config to be resumed.
StateMap model_shape_fields(const config::ConfigContainer& c, const config::Derived& d);

// Writes the checkpoint of `model` and `adam` at `iteration` to checkpoint.save (the iteration
// directory, then the tracker; most_recent_k prunes), with Megatron's two lines.
void save_run_checkpoint(const config::ConfigContainer& c, const config::Derived& d, int64_t iteration,
                         const model::GptModel& model, const optim::AdamW& adam, TrainStateRecord state,
                         std::FILE* out);

// The same in two halves, for --async-save: copy_run_checkpoint prints the first line and copies
// the state, so that training may change it while write_run_checkpoint (another thread) writes
// the copy; report_saved_checkpoint prints the second line once it is written.
struct RunCheckpointCopy {
  std::string save_dir;
  int64_t iteration = 0, most_recent_k = -1;
  std::vector<float> weights, exp_avg, exp_avg_sq;  // what `write` points into
  CheckpointWrite write;
};
std::unique_ptr<RunCheckpointCopy> copy_run_checkpoint(const config::ConfigContainer& c, const config::Derived& d,
                                                       int64_t iteration, const model::GptModel& model,
                                                       const optim::AdamW& adam, TrainStateRecord state,
                                                       std::FILE* out);
void write_run_checkpoint(const RunCheckpointCopy& copy);
void report_saved_checkpoint(const std::string& save_dir, int64_t iteration, std::FILE* out);

// Loads what the config asks for into model/adam. Returns the saved training state when a run is
// resumed (--load with a checkpoint there, not --finetune); nullopt when the run starts at
// iteration 0 (from scratch, pretrained weights or a fine-tuning load).
std::optional<TrainStateRecord> restore_run_checkpoint(const config::ConfigContainer& c, const config::Derived& d,
                                                       model::GptModel& model, optim::AdamW& adam, std::FILE* out);

}  // namespace laoyao::train
