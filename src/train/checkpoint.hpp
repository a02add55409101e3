// Checkpoint storage: Megatron's layout with safetensors inside (DESIGN.md §2 "Checkpoints",
// §5 "Nothing lost"; megatron-bridge.md §6).
//
//   <save>/latest_checkpointed_iteration.txt   the iteration number (Megatron's tracker), written
//                                              atomically and only after the directory is complete
//   <save>/iter_0000010/
//     model.safetensors       fp32 main parameters under Megatron-Core names (one writing rank), or
//     model.rank00003.safetensors ...   each writing rank's parts of them (several)
//     optimizer[.rankNNNNN].safetensors  Adam moments: optimizer.state.exp_avg.<param>,
//                             .exp_avg_sq.<param> (absent when saved without optimizer state)
//     run_config.yaml         the resolved config, as the caller serialised it
//     train_state.json        counters, scheduler/optimizer steps, RNG state, model-shape fields, the
//                             size and SHA-256 of each file above (checked on load), and the parts:
//                             for each file's entries that are not whole tensors, the whole tensor's
//                             shape and the boxes of it the entry holds (its data: the boxes in order)
//
// Each rank writes the parts of the tensors it holds that no lower rank holds (replicas are written
// once), so a checkpoint is written by every rank at once and is the same whatever the parallel
// layout, but for how it is cut; a rank of any layout reads its parts from the entries they meet.
// A one-rank checkpoint's model.safetensors is a plain Megatron-Core state dict.
//
// A save writes "iter_0000010.tmp.<pid>" (the ranks' files, then from the first rank
// run_config.yaml and train_state.json), fsyncs every file and the folder, then renames it into
// place (atomically exchanging it with an existing iter_0000010, so a complete directory of that
// number exists at every instant) and only then rewrites the tracker. A crash leaves at most a
// "*.tmp.*" folder, which loads never read and the next save removes.
//
// Loads go through the tracker (or an explicit step), never "the largest iter_* folder": a folder
// the tracker does not name may be one a crashed save left (Megatron-Bridge PR #5964).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "core/safetensors.hpp"
#include "model/tensor_box.hpp"
#include "train/tensor_store.hpp"

namespace laoyao::model {
struct ParameterTable;
}

namespace laoyao::train {

// A scalar in train_state.json: model-shape fields, RNG state, anything opaque to this layer.
// (Unsigned 64-bit RNG words do not fit int64: store them as strings.)
using StateValue = std::variant<int64_t, double, bool, std::string>;
using StateMap = std::map<std::string, StateValue>;
std::string state_value_str(const StateValue& v);  // 12, 0.5, true, "RMSNorm"

struct TensorRef {
  std::string name;
  std::vector<int64_t> shape;
  const float* data = nullptr;  // prod(shape) fp32 values, row-major
};

struct ParamShape {
  std::string name;
  std::vector<int64_t> shape;
};
std::vector<ParamShape> param_shapes(const model::ParameterTable& table);

struct TrainStateRecord {
  int64_t iteration = 0;  // completed iterations (Megatron's step)
  int64_t consumed_train_samples = 0;
  int64_t consumed_valid_samples = 0;
  int64_t skipped_train_samples = 0;
  int64_t skipped_iterations = 0;  // Megatron's "number of skipped iterations" total
  int64_t nan_iterations = 0;      // Megatron's "number of nan iterations" total
  int64_t scheduler_num_steps = 0; // OptimizerParamScheduler.num_steps: samples, not iterations
  int64_t optimizer_steps = 0;     // Adam's step count t (bias correction)
  double floating_point_operations_so_far = 0;
  StateMap rng;          // opaque RNG state (seed, generator words as strings, ...)
  StateMap model_shape;  // num_layers, hidden_size, ...: compared on resume (check_model_shape)
  // The LR/WD schedule's values (Megatron's opt_param_scheduler state: max_lr, min_lr,
  // lr_warmup_steps, lr_decay_steps, lr_decay_style, start_wd, end_wd, wd_incr_steps,
  // wd_incr_style), checked on resume; empty in checkpoints of laoyao before 2026-12-02.
  StateMap scheduler;
  // Set by load_checkpoint, never saved: the train_state.json these values came from (for messages).
  std::string loaded_from;
};

struct CheckpointWrite {
  std::vector<TensorRef> model;      // Megatron-Core names
  std::vector<TensorRef> optimizer;  // exp_avg_name(p) / exp_avg_sq_name(p); empty: none saved
  TrainStateRecord state;            // state.iteration must equal the iteration saved
  std::string run_config_yaml;
};

std::string exp_avg_name(const std::string& param);     // "optimizer.state.exp_avg.<param>"
std::string exp_avg_sq_name(const std::string& param);  // "optimizer.state.exp_avg_sq.<param>"
std::string iteration_dir_name(int64_t iteration);      // "iter_0000010" (Megatron's iter_{:07d})
std::string tracker_path(const std::string& dir);       // <dir>/latest_checkpointed_iteration.txt

// Writes <save_dir>/iter_NNNNNNN (one writer, whole tensors) and then the tracker; returns the
// iteration directory. I/O failures are laoyao::Error naming the path; the previous checkpoint and
// tracker are intact.
std::string save_checkpoint(const std::string& save_dir, int64_t iteration, const CheckpointWrite& w);

// A part of a whole tensor a rank writes: the part, and its data (the boxes' elements in order).
struct PartRef {
  model::TensorPart part;
  const float* data = nullptr;
};
// What one rank writes: its parts of the model (Megatron-Core names) and of the optimizer state
// (exp_avg_name / exp_avg_sq_name); either may be empty. For a part without data, `fill` writes its
// elements [from, from + count) into dst when its file reaches them, a window at a time (the
// model's and the optimizer's files are written at once, on two threads).
struct ShardWrite {
  std::vector<PartRef> model, optimizer;
  std::function<void(bool optimizer, size_t i, int64_t from, int64_t count, float* dst)> fill;
};

// The same save by `world` ranks in three steps. The first rank begins it (the folder the ranks
// write into, `scratch`, made fresh: every rank names it alike from `token`, the first rank's pid);
// then each rank writes its shard (its files and a record of them); then the first rank, once every
// rank has written, finishes it (the records merged into train_state.json, the folder installed,
// the tracker). abandon_checkpoint removes the scratch folder of a save that failed on some rank.
std::string checkpoint_scratch_dir(const std::string& save_dir, int64_t iteration, int64_t token);
void begin_checkpoint(const std::string& save_dir, const std::string& scratch);
void write_checkpoint_shard(const std::string& scratch, int64_t rank, int64_t world, const ShardWrite& w);
std::string finish_checkpoint(const std::string& save_dir, const std::string& scratch, int64_t iteration,
                              int64_t world, const TrainStateRecord& state, const std::string& run_config_yaml);
void abandon_checkpoint(const std::string& scratch);

// The tracker's iteration; nullopt when `load_dir` has no tracker. A tracker that holds anything
// but a non-negative integer is a UsageError naming it.
std::optional<int64_t> latest_iteration(const std::string& load_dir);

// Bridge's auto-resume test (checkpoint_utils.checkpoint_exists): `load_dir` is an iteration
// directory (has train_state.json) or a save root with a tracker.
bool checkpoint_exists(const std::string& load_dir);

// Removes the "iter_*.tmp.*" folders that interrupted saves left in `save_dir`; returns their
// names (for a log line). save_checkpoint calls it; callers may too, at startup.
std::vector<std::string> remove_incomplete_checkpoints(const std::string& save_dir);

// Holds "<save_dir>/.laoyao_save.lock" (an flock) while a run may write checkpoints there: two
// runs given one --save would rename their iteration directories over each other. A second run's
// lock is a UsageError naming the holder's host and pid. The lock goes with the process (a killed
// run leaves a file no one holds); the destructor removes the file, and the folder when the lock
// created it and nothing else was written.
class SaveDirLock {
 public:
  explicit SaveDirLock(const std::string& save_dir);
  ~SaveDirLock();
  SaveDirLock(const SaveDirLock&) = delete;
  SaveDirLock& operator=(const SaveDirLock&) = delete;

 private:
  std::string dir_, path_;
  int fd_ = -1;
  bool created_dir_ = false;
};

struct LoadedCheckpoint {
  std::string dir;  // the iteration directory read
  TrainStateRecord state;
  std::string run_config_yaml;
  TensorStore model;                     // Megatron-Core names
  std::optional<TensorStore> optimizer;  // exp_avg_name / exp_avg_sq_name; none when saved without

  // Copies a whole tensor's fp32 values; UsageError naming the file when absent or of another size.
  void read_model(const std::string& name, float* out, size_t n) const;
  void read_optimizer(const std::string& name, float* out, size_t n) const;
};

// Which files a load checks against their SHA-256 at once: every file (a checkpoint read whole), or
// only the tensor files it then reads from, each before its first read (a rank reading its parts).
// Either way every listed file must exist with its recorded size, and the small files are checked.
enum class CheckpointVerify { kEveryFile, kFilesRead };

// Opens and verifies a checkpoint. `load_dir` is a save root or an iteration directory itself.
// With `step`, reads iter_<step> (a missing one is a UsageError, as Bridge's ckpt_step); without,
// the tracker's iteration (no tracker: UsageError; use latest_iteration first to decide whether to
// load at all).
LoadedCheckpoint load_checkpoint(const std::string& load_dir, std::optional<int64_t> step = std::nullopt,
                                 CheckpointVerify verify = CheckpointVerify::kEveryFile);

// Resuming a different model is the "stale nemo_experiments" trap (megatron-bridge.md §6): these
// say exactly what differs, as UsageErrors. check_model_shape compares the saved model-shape
// fields with the current ones (each differing, missing or extra field named with both values);
// check_parameters requires every expected parameter (whole shapes) with its shape, fp32, its stored
// parts covering it, and no others (and the same of the optimizer state, when present), naming each
// problem with both shapes.
void check_model_shape(const LoadedCheckpoint& ckpt, const StateMap& current);
void check_parameters(const LoadedCheckpoint& ckpt, const std::vector<ParamShape>& expected);

// Weights only (--pretrained-checkpoint / checkpoint.pretrained_checkpoint). `path` is a laoyao
// save root (tracker), an iteration directory, a .safetensors file, or a folder of *.safetensors
// files holding a Megatron-Core state dict (F32, BF16 or F16; sharded over any number of files,
// each tensor in exactly one). Every expected parameter must be there with its shape. Tensors not
// expected are refused (naming them) unless allow_unexpected, and then listed in `ignored`;
// Transformer Engine's "*._extra_state" entries are always skipped.
// Megatron-Core names under the Transformer Engine spec (`...linear_qkv.layer_norm_weight`, ...)
// are read as the local spec's (`...input_layernorm.weight`, ...), and grouped MoE experts'
// (`...mlp.experts.linear_fc1.weight3`) as SequentialMLP's (`...mlp.experts.local_experts.3.
// linear_fc1.weight`); other names are unchanged.
std::string local_spec_name(const std::string& name);

struct PretrainedSource {
  TensorStore store;                 // the expected names (local spec), as stored
  std::vector<std::string> files;    // what holds them
  std::vector<std::string> ignored;  // unexpected names skipped
};
PretrainedSource open_pretrained(const std::string& path, const std::vector<ParamShape>& expected,
                                 bool allow_unexpected = false);
// A pretrained checkpoint's store (`path` names it) against the model's parameters: a UsageError
// listing each tensor missing, misshapen, unexpected or not stored whole exactly once.
void check_pretrained_store(const TensorStore& store, const std::vector<ParamShape>& expected,
                            const std::string& path);

struct PretrainedWeights {
  std::map<std::string, std::vector<float>> tensors;  // exactly the expected names
  std::vector<std::string> files;                      // what was read
  std::vector<std::string> ignored;                    // unexpected names skipped
};
// open_pretrained, every tensor read whole.
PretrainedWeights load_pretrained_weights(const std::string& path, const std::vector<ParamShape>& expected,
                                          bool allow_unexpected = false);

}  // namespace laoyao::train
