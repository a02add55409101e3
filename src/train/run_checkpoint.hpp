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
#include "train/rank_checkpoint.hpp"

namespace laoyao::train {

// The fields a checkpoint's model must share with the config to be resumed.
StateMap model_shape_fields(const config::ConfigContainer& c, const config::Derived& d);

// A save on one rank (every rank of the run makes one): where the ranks write, this rank's shard
// (pointing into the copies below for --async-save, else into the live state), and what the first
// rank finishes it with.
struct RunCheckpointSave {
  std::string save_dir, scratch;
  int64_t iteration = 0, most_recent_k = -1;
  dist::ProcessGroup* world = nullptr;  // null: one rank
  int64_t rank = 0, world_size = 1;
  std::vector<float> weights, exp_avg, exp_avg_sq;  // the copies (--async-save)
  ShardWrite shard;
  TrainStateRecord state;
  std::string run_config_yaml;
};

// Collective: Megatron's first line (first rank), the scratch folder agreed and made, this rank's
// shard built: of a copy of the state when `copy` (training may change it while the shard is
// written), else of the live state (model's host weights; adam's moments with save_optim).
std::unique_ptr<RunCheckpointSave> begin_run_checkpoint(const config::ConfigContainer& c, const config::Derived& d,
                                                        int64_t iteration, const RankState& r, TrainStateRecord state,
                                                        bool copy, std::FILE* out);
// This rank's files (from any thread).
void write_run_checkpoint(const RunCheckpointSave& s);
// Collective, once every rank has written (write_error: this rank's failure, or null): the first
// rank finishes the checkpoint (train_state.json, the folder in place, the tracker, most_recent_k)
// and prints Megatron's second line. A failure on any rank removes the scratch folder and throws on
// every rank (the failing rank its own error).
void finish_run_checkpoint(const RunCheckpointSave& s, std::exception_ptr write_error, std::FILE* out);
// The three at once, without copies.
void save_run_checkpoint(const config::ConfigContainer& c, const config::Derived& d, int64_t iteration,
                         const RankState& r, TrainStateRecord state, std::FILE* out);

// Loads what the config asks for into this rank's model (host weights) and adam (moments laid out
// by `shards`): only its parts, from the checkpoint's files that hold them. Returns the saved
// training state when a run is resumed (--load with a checkpoint there, not --finetune); nullopt
// when the run starts at iteration 0 (from scratch, pretrained weights or a fine-tuning load).
std::optional<TrainStateRecord> restore_run_checkpoint(const config::ConfigContainer& c, const config::Derived& d,
                                                       model::GptModel& model, optim::AdamW& adam,
                                                       const OptimizerShards& shards, std::FILE* out);

}  // namespace laoyao::train
