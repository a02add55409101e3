#include "config/front_ends.hpp"

#include <algorithm>
#include <cstdlib>

#include "config/mlm_args.hpp"
#include "config/overrides.hpp"
#include "config/recipes.hpp"
#include "config/yaml_io.hpp"
#include "core/error.hpp"
#include "core/file_io.hpp"
#include "core/text.hpp"

namespace laoyao::config {

int64_t world_size_from_env() {
  for (const char* name : {"WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"}) {
    const char* v = std::getenv(name);
    if (!v || !*v) continue;
    char* end = nullptr;
    long long n = std::strtoll(v, &end, 10);
    if (*end != '\0' || n <= 0)
      throw UsageError(std::string("environment variable ") + name + "='" + v + "' is not a positive integer");
    return n;
  }
  return 1;
}

Resolved resolve_mlm(const std::vector<std::string>& args, int64_t world_size) {
  Resolved r;
  r.front_end = FrontEnd::MegatronLM;
  r.cfg = parse_mlm_args(args);
  r.validated = validate(r.cfg, {FrontEnd::MegatronLM, world_size});
  // Megatron-LM sizes the validation data as (train_iters // eval_interval + 1) * eval_iters
  // batches (training.py's get_train_valid_test_num_samples), a TypeError before any data is read
  // when --eval-interval is unset. (Bridge's recipes may leave it unset: no evaluation then until
  // the end of training.)
  const ValidationConfig& v = r.cfg.validation;
  if (!v.eval_interval && !v.skip_train && !v.full_validation)
    throw UsageError("--eval-interval is required: Megatron-LM sizes the validation data as (--train-iters // "
                     "--eval-interval + 1) x --eval-iters batches and stops with a TypeError without it. Give "
                     "--eval-interval N (an evaluation every N iterations; more than --train-iters evaluates at the "
                     "end only)");
  return r;
}

std::string run_recipe_usage() {
  return "usage: laoyao run-recipe (--recipe NAME | --model STEM) [--mode pretrain|sft|lora|dora]\n"
         "                          [--config-file F.yaml] [--dataset mock|megatron-indexed] [--dry-run]\n"
         "                          [convenience flags] [KEY=VALUE ...]\n"
         "\n"
         "Builds the recipe's config, merges F.yaml over it, then applies the overrides (command line >\n"
         "YAML > recipe). Overrides use Hydra's grammar: a.b=3e-4, a.b=true, a.b=null, a.b=[1,2],\n"
         "'a.b=text with spaces', ++a.b=v (set), ~a.b (back to the default), env_vars.NAME=v.\n"
         "\n"
         "convenience flags (applied before the trailing overrides, so an override wins):\n"
         "  -ms/--max_steps N -> train.train_iters      -gb/--global_batch_size N  -mb/--micro_batch_size N\n"
         "  -sl/--seq_length N -> dataset.seq_length    -tp -pp -cp -vp -ep -etp N -> model.*_parallel_size\n"
         "  --lr X  --min_lr X  --warmup_iters N        --pretrained_checkpoint P  --save_dir D  --load_dir D\n"
         "  --save_interval N\n"
         "\n"
         "--dump-env prints the environment (values of *TOKEN*/*KEY*/*SECRET*/*PASSWORD* names redacted).\n"
         "--dry-run resolves and validates, writes the YAML to logger.save_config_filepath (or\n"
         "ConfigContainer.yaml), prints it and exits without training.\n"
         "`laoyao recipes` lists the recipes.\n";
}

namespace {

struct Convenience {
  std::vector<const char*> names;
  const char* path;
};

const std::vector<Convenience>& convenience_flags() {
  static const std::vector<Convenience> flags = {
      {{"-ms", "--max_steps", "--max-steps"}, "train.train_iters"},
      {{"-gb", "--global_batch_size", "--global-batch-size"}, "train.global_batch_size"},
      {{"-mb", "--micro_batch_size", "--micro-batch-size"}, "train.micro_batch_size"},
      {{"-sl", "--seq_length", "--seq-length"}, "dataset.seq_length"},
      {{"-tp", "--tensor_model_parallel_size"}, "model.tensor_model_parallel_size"},
      {{"-pp", "--pipeline_model_parallel_size"}, "model.pipeline_model_parallel_size"},
      {{"-cp", "--context_parallel_size"}, "model.context_parallel_size"},
      {{"-vp", "--virtual_pipeline_model_parallel_size"}, "model.virtual_pipeline_model_parallel_size"},
      {{"-ep", "--expert_model_parallel_size"}, "model.expert_model_parallel_size"},
      {{"-etp", "--expert_tensor_parallel_size"}, "model.expert_tensor_parallel_size"},
      {{"--lr"}, "optimizer.lr"},
      {{"--min_lr", "--min-lr"}, "optimizer.min_lr"},
      {{"--warmup_iters", "--warmup-iters"}, "scheduler.lr_warmup_iters"},
      {{"--pretrained_checkpoint", "--pretrained-checkpoint"}, "checkpoint.pretrained_checkpoint"},
      {{"--save_dir", "--save-dir"}, "checkpoint.save"},
      {{"--load_dir", "--load-dir"}, "checkpoint.load"},
      {{"--save_interval", "--save-interval"}, "checkpoint.save_interval"},
  };
  return flags;
}

std::string infer_mode(const std::string& recipe) {
  if (recipe.find("_pretrain") != std::string::npos) return "pretrain";
  if (recipe.find("_sft") != std::string::npos || recipe.find("_finetune") != std::string::npos) return "sft";
  if (recipe.find("_dora") != std::string::npos) return "dora";
  if (recipe.find("_peft") != std::string::npos || recipe.find("_lora") != std::string::npos) return "lora";
  return "";
}

// Bridge's sync step: model.seq_length follows dataset.seq_length.
void sync_seq_length(ConfigContainer& c, std::vector<std::string>* notes) {
  if (!c.dataset.seq_length || c.model.seq_length == *c.dataset.seq_length) return;
  if (notes)
    notes->push_back("model.seq_length (" + std::to_string(c.model.seq_length) + ") follows dataset.seq_length (" +
                     std::to_string(*c.dataset.seq_length) + "); set dataset.seq_length to change the sequence length");
  c.model.seq_length = *c.dataset.seq_length;
}

}  // namespace

RecipeInvocation parse_run_recipe_args(const std::vector<std::string>& args) {
  RecipeInvocation inv;
  std::string model;
  std::vector<std::string> known = {"--recipe",  "--model",         "--mode", "--config-file", "--dataset",
                                    "--dry-run", "--deterministic", "--step-func", "--dump-env", "--help"};
  for (const auto& c : convenience_flags())
    for (const char* n : c.names) known.emplace_back(n);
  for (size_t k = 0; k < args.size(); ++k) {
    std::string a = args[k], value;
    auto take = [&](const std::string& flag) {
      if (auto eq = a.find('='); eq != std::string::npos && starts_with(a, "--")) return a.substr(eq + 1);
      if (k + 1 >= args.size()) throw UsageError("argument " + flag + ": expected one argument");
      return args[++k];
    };
    std::string name = starts_with(a, "--") ? a.substr(0, a.find('=')) : a;
    if (name == "-h" || name == "--help") { inv.help = true; continue; }
    if (name == "--recipe") { inv.recipe = take(name); continue; }
    if (name == "--model") { model = take(name); continue; }
    if (name == "--mode") { inv.mode = take(name); continue; }
    if (name == "--config-file" || name == "--config_file") { inv.config_file = take(name); continue; }
    if (name == "--dataset") { inv.dataset = take(name); continue; }
    if (name == "--dry-run" || name == "--dry_run") { inv.dry_run = true; continue; }
    if (name == "--dump-env" || name == "--dump_env") { inv.dump_env = true; continue; }
    if (name == "--deterministic") {  // run_recipe.py: deterministic mode, no fused cross entropy
      inv.convenience.insert(inv.convenience.end(),
                             {"model.deterministic_mode=true", "model.cross_entropy_loss_fusion=false"});
      continue;
    }
    if (name == "--step-func" || name == "--step_func") {
      std::string f = take(name);
      if (f != "gpt_step" && f != "llm_step")
        throw UsageError("argument --step-func: '" + f + "' is not available in laoyao (gpt_step/llm_step only)");
      continue;
    }
    bool matched = false;
    for (const auto& c : convenience_flags()) {
      for (const char* n : c.names) {
        if (name != n) continue;
        std::string v = take(name);
        inv.convenience.push_back(std::string(c.path) + "=" + v);
        matched = true;
      }
    }
    if (matched) continue;
    if (starts_with(a, "-"))
      throw UsageError("Unknown option: " + a + did_you_mean(name, known) + "; overrides are written KEY=VALUE");
    if (a.find('=') == std::string::npos && !starts_with(a, "~"))
      throw UsageError("Expected override in KEY=VALUE form, got '" + a + "'");
    inv.overrides.push_back(a);
  }
  if (inv.help) return inv;
  static const Choices modes = {"pretrain", "sft", "lora", "dora"};
  if (!inv.mode.empty() && std::find(modes.begin(), modes.end(), inv.mode) == modes.end())
    throw UsageError("argument --mode: invalid choice '" + inv.mode + "' (choose from pretrain, sft, lora, dora)");
  if (!inv.recipe.empty() && !model.empty()) throw UsageError("argument --model: not allowed with argument --recipe");
  if (inv.recipe.empty() && model.empty()) throw UsageError("one of the arguments --recipe --model is required");
  if (!model.empty()) {
    if (inv.mode.empty()) throw UsageError("--model needs --mode (pretrain, sft, lora or dora) to name the recipe");
    inv.recipe = model + "_" + (inv.mode == "lora" || inv.mode == "dora" ? "peft" : inv.mode) + "_config";
  }
  std::string inferred = infer_mode(inv.recipe);
  if (inv.mode.empty()) {
    if (inferred.empty())
      throw UsageError("Unable to infer training mode from recipe '" + inv.recipe + "'; pass --mode");
    inv.mode = inferred;
  } else if (!inferred.empty() && inferred != inv.mode &&
             !(inferred == "lora" && inv.mode == "dora")) {
    throw UsageError("Mode '" + inv.mode + "' is incompatible with recipe '" + inv.recipe + "'.");
  }
  if (!inv.dataset.empty() && inv.dataset != "mock" && inv.dataset != "megatron-indexed")
    throw UsageError("argument --dataset: '" + inv.dataset +
                     "' is not available in laoyao (choose from mock, megatron-indexed)");
  return inv;
}

ConfigContainer recipe_with_overrides(const std::string& name, const std::vector<std::string>& overrides,
                                      std::vector<std::string>* notes) {
  ConfigContainer c = find_recipe(name).build();
  apply_overrides(c, overrides);
  sync_seq_length(c, notes);
  return c;
}

Resolved resolve_recipe(const RecipeInvocation& inv, int64_t world_size) {
  Resolved r;
  r.front_end = FrontEnd::Bridge;
  const Recipe& recipe = find_recipe(inv.recipe);
  r.recipe = recipe.name;
  r.notes.push_back("Loading library recipe '" + inv.recipe + "'");
  r.cfg = recipe.build();
  if (inv.mode == "dora") r.cfg.peft.scheme = "dora";
  if (!inv.dataset.empty()) {
    // run_recipe.py replaces the recipe's dataset with a preset built from model.seq_length.
    DatasetConfig d;
    d.seq_length = r.cfg.model.seq_length;
    d.random_seed = 1234;
    d.split = "9999,8,2";
    d.dataloader_type = "single";
    d.mock = inv.dataset == "mock";
    r.cfg.dataset = d;
  }
  if (!inv.config_file.empty()) apply_yaml(r.cfg, read_file(inv.config_file), inv.config_file);
  apply_overrides(r.cfg, inv.convenience);
  apply_overrides(r.cfg, inv.overrides);
  sync_seq_length(r.cfg, &r.notes);
  r.validated = validate(r.cfg, {FrontEnd::Bridge, world_size});
  return r;
}

}  // namespace laoyao::config
