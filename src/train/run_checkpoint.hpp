// The training loop's side of checkpoints: what a laoyao run saves (fp32 main parameters, Adam
// state, counters, the resolved config, the model-shape fields) and how it resumes (--load),
// starts from pretrained weights (--pretrained-checkpoint) or fine-tunes (--finetune), with
// Megatron's messages. Storage itself is train/checkpoint.hpp.
#pragma once
#include <cstdio>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "config/config_container.hpp"
#include "model/gpt_model.hpp"
#include "optim/adamw.hpp"
#include "train/checkpoint.hpp"
#include "train/engine.hpp"
#include "train/rank_checkpoint.hpp"

namespace laoyao::train {

// The fields a checkpoint's model must share with the config to be resumed.
StateMap model_shape_fields(const config::ConfigContainer& c, const config::Derived& d);

// A save on one rank (every rank of the run makes one): where the ranks write, the parts this rank
// writes and their data (pointing into the copies below for --async-save, else into the live
// state), and what the first rank finishes it with.
struct RunCheckpointSave {
  std::string save_dir, scratch;
  int64_t iteration = 0, most_recent_k = -1;
  bool save_optim = true;
  dist::ProcessGroup* world = nullptr;  // null: one rank
  int64_t rank = 0, world_size = 1;
  std::vector<StatePart> parts;                     // what this rank writes (maybe nothing)
  std::vector<float> weights, exp_avg, exp_avg_sq;  // the parts' data, copied (--async-save)
  ShardWrite shard;
  TrainStateRecord state;
  std::string run_config_yaml;
};

// Collective: Megatron's first line (first rank), the scratch folder agreed and made, the parts
// this rank writes chosen. Its state is needed on the host only when it writes any. `state` holds
// the run's counters (its optimizer_steps the engine's).
std::unique_ptr<RunCheckpointSave> begin_run_checkpoint(const config::ConfigContainer& c, const config::Derived& d,
                                                        int64_t iteration, const RankState& r, TrainStateRecord state,
                                                        std::FILE* out);
// The parts' data from the engine: streamed a part at a time as the files are written, or with
// `copy` (--async-save: training changes the state while the shard is written) copied to the host
// now. The moments only with save_optim.
void attach_run_checkpoint_state(RunCheckpointSave& s, Engine& engine, bool copy);
// This rank's files (from any thread).
void write_run_checkpoint(const RunCheckpointSave& s);
// Collective, once every rank has written (write_error: this rank's failure, or null): the first
// rank finishes the checkpoint (train_state.json, the folder in place, the tracker, most_recent_k)
// and prints Megatron's second line. A failure on any rank removes the scratch folder and throws on
// every rank (the failing rank its own error).
void finish_run_checkpoint(const RunCheckpointSave& s, std::exception_ptr write_error, std::FILE* out);

// The parameters whose initial values the run needs: those restore_run_checkpoint will not
// overwrite (none with a pretrained checkpoint or a checkpoint to load, without PEFT; under PEFT the
// adapters unless a run's checkpoint holds them, the base unless a pretrained one does). Drawing
// an 8B base at random only to read it over takes the host minutes.
model::ParamFilter initial_params_drawn(const config::CheckpointConfig& k, const model::GptModel& model);

// Loads what the config asks for into the engine, which holds the run's initial state: this rank's
// parts only (its weights, its owned segments' moments laid out by `shards`), from the
// checkpoint's files that hold them, a part at a time. Returns the saved training state when a run
// is resumed (--load with a checkpoint there, not --finetune); nullopt when the run starts at
// iteration 0 (from scratch, pretrained weights or a fine-tuning load).
std::optional<TrainStateRecord> restore_run_checkpoint(const config::ConfigContainer& c, const config::Derived& d,
                                                       const model::GptModel& model, const OptimizerShards& shards,
                                                       Engine& engine, std::FILE* out);

}  // namespace laoyao::train
