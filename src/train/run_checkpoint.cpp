#include "train/run_checkpoint.hpp"

#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "config/yaml_io.hpp"
#include "core/error.hpp"
#include "core/hf_hub.hpp"
#include "core/runtime_options.hpp"
#include "train/hf_import.hpp"
#include "train/run_setup.hpp"
#include "train/training_log.hpp"

namespace laoyao::train {

StateMap model_shape_fields(const config::ConfigContainer& c, const config::Derived& d) {
  const auto& m = c.model;
  return {
      {"num_layers", m.num_layers},
      {"hidden_size", m.hidden_size},
      {"num_attention_heads", m.num_attention_heads},
      {"num_query_groups", m.num_query_groups.value_or(m.num_attention_heads)},
      {"kv_channels", m.kv_channels.value_or(m.hidden_size / m.num_attention_heads)},
      {"ffn_hidden_size", m.ffn_hidden_size.value_or(4 * m.hidden_size)},
      {"padded_vocab_size", d.padded_vocab_size},
      {"max_position_embeddings", m.max_position_embeddings.value_or(m.seq_length)},
      {"normalization", m.normalization},
      {"gated_linear_unit", m.gated_linear_unit},
      {"add_bias_linear", m.add_bias_linear},
      {"share_embeddings_and_output_weights", m.share_embeddings_and_output_weights},
      {"position_embedding_type", m.position_embedding_type},
  };
}

namespace {

// Megatron-Core's OptimizerParamScheduler state, in the order its load_state_dict checks it, with
// the names its messages use.
struct SchedulerField {
  const char* key;
  const char* name;
};
constexpr SchedulerField kSchedulerFields[] = {
    {"max_lr", "learning rate"},
    {"min_lr", "minimum learning rate"},
    {"lr_warmup_steps", "warmup iterations"},
    {"lr_decay_steps", "total number of iterations"},
    {"lr_decay_style", "learning rate decay style"},
    {"start_wd", "start weight decay"},
    {"end_wd", "end weight decay"},
    {"wd_incr_steps", "total number of weight decay iterations"},
    {"wd_incr_style", "weight decay incr style"},
};

// The run's schedule as that state (steps in samples, as Megatron's).
StateMap scheduler_fields(const config::ConfigContainer& c) {
  const optim::ParamSchedule s = param_schedule(c);
  StateMap m;
  m["max_lr"] = s.max_lr;
  m["min_lr"] = s.min_lr;
  if (s.warmup_steps == static_cast<double>(static_cast<int64_t>(s.warmup_steps)))
    m["lr_warmup_steps"] = static_cast<int64_t>(s.warmup_steps);
  else
    m["lr_warmup_steps"] = s.warmup_steps;  // (a warmup fraction's)
  m["lr_decay_steps"] = s.decay_steps;
  m["lr_decay_style"] = s.decay_style;
  m["start_wd"] = s.start_wd;
  m["end_wd"] = s.end_wd;
  m["wd_incr_steps"] = s.wd_incr_steps;
  m["wd_incr_style"] = s.wd_incr_style;
  return m;
}

// A value as Python's str() prints it.
std::string python_str(const StateValue& v) {
  if (const double* d = std::get_if<double>(&v)) return pyfmt::float_str(*d);
  if (const std::string* text = std::get_if<std::string>(&v)) return *text;
  return state_value_str(v);
}

// Megatron-Core's _check_and_set for each field, on resume: with override_opt_param_scheduler the
// config's values win (" > overriding ..."), else they must equal the checkpoint's (" > using
// checkpoint value ..."). A checkpoint without the state (laoyao's before 2026-12-02) is not checked.
void check_scheduler(const StateMap& saved, const StateMap& current, bool override_scheduler, std::FILE* out) {
  if (saved.empty()) return;
  for (const SchedulerField& f : kSchedulerFields) {
    const auto s = saved.find(f.key), now = current.find(f.key);
    if (s == saved.end() || now == current.end()) continue;
    if (override_scheduler) {
      std::fprintf(out, " > overriding %s value to %s\n", f.name, python_str(now->second).c_str());
      continue;
    }
    if (python_str(s->second) != python_str(now->second))
      throw UsageError("OptimizerParamScheduler: class input value " + python_str(now->second) +
                       " and checkpoint value " + python_str(s->second) + " for " + f.name +
                       " do not match (resuming with another schedule needs --override-opt_param-scheduler / "
                       "scheduler.override_opt_param_scheduler=true)");
    std::fprintf(out, " > using checkpoint value %s for %s\n", python_str(s->second).c_str(), f.name);
  }
  std::fflush(out);
}

// The train state and run_config.yaml of the checkpoint at `iteration`.
void describe_run(const config::ConfigContainer& c, const config::Derived& d, int64_t iteration,
                  TrainStateRecord& state, std::string& run_config_yaml) {
  state.iteration = iteration;
  state.model_shape = model_shape_fields(c, d);
  state.scheduler = scheduler_fields(c);
  state.rng = {{"seed", c.rng.seed}, {"dropout_streams", std::string("keyed by (seed, iteration, micro-batch)")}};
  config::ConfigContainer copy = c;
  run_config_yaml = config::to_yaml(copy) + runtime_options_yaml_comment(runtime_options());
}

// Whether any rank failed (collective over `world`; null: this rank alone).
bool failed_anywhere(dist::ProcessGroup* world, bool failed) {
  if (!world || world->size() == 1) return failed;
  double n = failed ? 1.0 : 0.0;
  world->all_reduce_sum(&n, 1);
  return n > 0;
}

// Runs `step` (on this rank when `here`), then agrees with every rank on whether it failed anywhere:
// this rank's own error is rethrown, another's is an Error saying where to look.
template <class F>
void on_every_rank(dist::ProcessGroup* world, bool here, const char* what, F&& step,
                   const std::string& scratch) {
  std::exception_ptr error;
  if (here) {
    try {
      step();
    } catch (...) {
      error = std::current_exception();
    }
  }
  if (!failed_anywhere(world, error != nullptr)) return;
  abandon_checkpoint(scratch);
  if (error) std::rethrow_exception(error);
  throw Error(std::string("checkpoint save: ") + what + " failed on another rank (its log says why)");
}

void print_saving(const std::string& save, int64_t iteration, std::FILE* out) {
  std::fprintf(out, "saving checkpoint at iteration %7lld to %s in laoyao safetensors format\n",
               static_cast<long long>(iteration), save.c_str());
  std::fflush(out);
}

// Megatron keeps every checkpoint unless most_recent_k > 0.
void keep_most_recent(const std::string& save, int64_t most_recent_k) {
  if (most_recent_k <= 0) return;
  namespace fs = std::filesystem;
  std::vector<int64_t> iters;
  for (const auto& e : fs::directory_iterator(save)) {
    const std::string n = e.path().filename().string();
    if (e.is_directory() && n.size() == 12 && n.rfind("iter_", 0) == 0 &&
        n.find_first_not_of("0123456789", 5) == std::string::npos)
      iters.push_back(std::stoll(n.substr(5)));
  }
  std::sort(iters.begin(), iters.end());
  for (size_t k = 0; k + static_cast<size_t>(most_recent_k) < iters.size(); ++k)
    fs::remove_all(fs::path(save) / iteration_dir_name(iters[k]));
}

}  // namespace

void report_saved_checkpoint(const std::string& save, int64_t iteration, std::FILE* out) {
  std::fprintf(out, "  successfully saved checkpoint from iteration %7lld to %s [ t 1/1, p 1/1 ]\n",
               static_cast<long long>(iteration), save.c_str());
  std::fflush(out);
}

std::unique_ptr<RunCheckpointSave> begin_run_checkpoint(const config::ConfigContainer& c, const config::Derived& d,
                                                        int64_t iteration, const RankState& r, TrainStateRecord state,
                                                        std::FILE* out) {
  auto s = std::make_unique<RunCheckpointSave>();
  s->save_dir = *c.checkpoint.save;
  s->iteration = iteration;
  s->most_recent_k = c.checkpoint.most_recent_k;
  s->save_optim = c.checkpoint.save_optim;
  s->world = r.world;
  s->rank = r.world ? r.world->rank() : 0;
  s->world_size = r.world ? r.world->size() : 1;
  if (s->rank == 0) print_saving(s->save_dir, iteration, out);
  // Every rank writes into one folder, named by the first rank's pid.
  double token = s->rank == 0 ? static_cast<double>(::getpid()) : 0.0;
  if (r.world && r.world->size() > 1) r.world->all_reduce_sum(&token, 1);
  s->scratch = checkpoint_scratch_dir(s->save_dir, iteration, static_cast<int64_t>(token));
  on_every_rank(r.world, s->rank == 0, "making the checkpoint folder", [&] { begin_checkpoint(s->save_dir, s->scratch); },
                s->scratch);
  s->parts = parts_to_write(r);
  describe_run(c, d, iteration, state, s->run_config_yaml);
  s->state = std::move(state);
  return s;
}

void attach_run_checkpoint_state(RunCheckpointSave& s, Engine& engine, bool copy) {
  if (!copy) {
    s.shard = rank_shard(s.parts, engine, s.save_optim);
    return;
  }
  // The parts one after another in the copies.
  int64_t total = 0;
  for (const StatePart& p : s.parts) total += p.part.numel();
  s.weights.resize(static_cast<size_t>(total));
  if (s.save_optim) s.exp_avg.resize(s.weights.size()), s.exp_avg_sq.resize(s.weights.size());
  int64_t at = 0;
  for (const StatePart& p : s.parts) {
    const int64_t n = p.part.numel();
    engine.download_state(Engine::StateBuffer::kWeights, p.offset, n, s.weights.data() + at);
    if (s.save_optim) {
      engine.download_state(Engine::StateBuffer::kExpAvg, p.moment, n, s.exp_avg.data() + at);
      engine.download_state(Engine::StateBuffer::kExpAvgSq, p.moment, n, s.exp_avg_sq.data() + at);
    }
    at += n;
  }
  s.shard = rank_shard(s.parts, s.weights, s.exp_avg, s.exp_avg_sq);
}

void write_run_checkpoint(const RunCheckpointSave& s) {
  write_checkpoint_shard(s.scratch, s.rank, s.world_size, s.shard);
}

void finish_run_checkpoint(const RunCheckpointSave& s, std::exception_ptr write_error, std::FILE* out) {
  on_every_rank(s.world, true, "writing a shard", [&] {
    if (write_error) std::rethrow_exception(write_error);
  }, s.scratch);
  on_every_rank(s.world, s.rank == 0, "finishing the checkpoint", [&] {
    finish_checkpoint(s.save_dir, s.scratch, s.iteration, s.world_size, s.state, s.run_config_yaml);
    keep_most_recent(s.save_dir, s.most_recent_k);
  }, s.scratch);
  if (s.rank == 0) report_saved_checkpoint(s.save_dir, s.iteration, out);
}

namespace {

// The pretrained checkpoint's weights (PEFT: the frozen base's; its adapters keep their initial
// values). A Hugging Face folder (or hub id) is converted as import-hf would, its config.json
// checked against the run's model first.
void read_pretrained(const config::CheckpointConfig& k, const model::GptModel& model, Engine& engine, std::FILE* out) {
  const auto base = whole_param_shapes(model, ParamSet::kBase);
  const PretrainedSource w =
      is_hf_folder(*k.pretrained_checkpoint)
          ? open_hf_pretrained(*k.pretrained_checkpoint, model.config(), base)
          : open_pretrained(resolve_hf_path(*k.pretrained_checkpoint, "checkpoint.pretrained_checkpoint"), base);
  read_rank_weights(w.store, model, engine, ParamSet::kBase);
  std::fprintf(out, "  loaded pretrained weights from %s (%zu file%s): weights only, starting at iteration 0\n",
               k.pretrained_checkpoint->c_str(), w.files.size(), w.files.size() == 1 ? "" : "s");
  std::fflush(out);
}

}  // namespace

model::ParamFilter initial_params_drawn(const config::CheckpointConfig& k, const model::GptModel& model) {
  const bool resumes = k.load && checkpoint_exists(*k.load), pretrained = k.pretrained_checkpoint.has_value();
  if (saved_params(model) != ParamSet::kTrained)
    return resumes || pretrained ? model::ParamFilter([](const model::ParamSpec&) { return false; })
                                 : model::ParamFilter();
  return [resumes, pretrained](const model::ParamSpec& p) { return p.frozen ? !pretrained : !resumes; };
}

std::optional<TrainStateRecord> restore_run_checkpoint(const config::ConfigContainer& c, const config::Derived& d,
                                                       const model::GptModel& model, const OptimizerShards& shards,
                                                       Engine& engine, std::FILE* out) {
  const auto& k = c.checkpoint;
  // Under PEFT the pretrained checkpoint gives the frozen base, and the run's own checkpoints the
  // adapters (and their moments); without PEFT a run's checkpoint holds everything and a pretrained
  // one is read only when there is none to resume.
  const ParamSet saved = saved_params(model);
  const bool peft = saved == ParamSet::kTrained;
  if (peft && k.pretrained_checkpoint) read_pretrained(k, model, engine, out);
  const auto expected = whole_param_shapes(model, saved);
  if (k.load) {
    if (!checkpoint_exists(*k.load)) {
      if (k.exit_on_missing_checkpoint)
        throw UsageError("no checkpoint to load in '" + *k.load + "' (checkpoint.exit_on_missing_checkpoint is set)");
      std::fprintf(out, "WARNING: could not find the metadata file %s\n    will not load any checkpoints and will "
                   "start from random\n", tracker_path(*k.load).c_str());
    } else {
      LoadedCheckpoint ckpt = load_checkpoint(*k.load, k.ckpt_step, CheckpointVerify::kFilesRead);
      // A checkpoint of another model shape is refused with the differing fields named: the
      // "stale nemo_experiments" trap, made safe.
      check_model_shape(ckpt, model_shape_fields(c, d));
      check_parameters(ckpt, expected);
      read_rank_weights(ckpt.model, model, engine, saved);
      const bool resume = !k.finetune;
      if (resume && k.load_optim) {
        if (!ckpt.optimizer)
          throw UsageError("checkpoint " + ckpt.dir + " has no optimizer state; set checkpoint.load_optim=false "
                           "(--no-load-optim) to load the weights alone");
        read_rank_moments(*ckpt.optimizer, model, shards, engine);
        engine.set_optimizer_steps(ckpt.state.optimizer_steps);
        check_scheduler(ckpt.state.scheduler, scheduler_fields(c), c.scheduler.override_opt_param_scheduler, out);
      }
      std::fprintf(out, "  successfully loaded checkpoint from %s [ t 1/1, p 1/1 ] at iteration %lld%s\n",
                   ckpt.dir.c_str(), static_cast<long long>(ckpt.state.iteration),
                   resume ? "" : " (--finetune: weights only, starting at iteration 0)");
      std::fflush(out);
      if (resume) return ckpt.state;
      return std::nullopt;
    }
  }
  if (!peft && k.pretrained_checkpoint) read_pretrained(k, model, engine, out);
  return std::nullopt;
}

}  // namespace laoyao::train
