// laoyao data-samples [--iterations N] [--splits train,valid,test] [training flags]
// Prints, as JSON lines, exactly what a training run with those flags feeds the model: for each
// training iteration and micro-batch, each evaluation round, and the final validation and test
// evaluations, the dataset sample indices and their tokens, labels, loss mask and position ids.
// The training flags are Megatron-LM's (as pretrain-gpt takes them) or, starting with --recipe
// or --model, a run-recipe command line.
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/cli.hpp"
#include "config/front_ends.hpp"
#include "config/validate.hpp"
#include "core/error.hpp"
#include "core/text.hpp"
#include "train/data_pipeline.hpp"
#include "train/memory_estimate.hpp"
#include "train/run_setup.hpp"

namespace laoyao::cli {
namespace {

void emit(const data::SampleDataset& ds, const std::vector<int64_t>& idx, nlohmann::ordered_json line) {
  train::MicroBatchData mb = train::load_micro_batch(ds, idx);
  line["sample_indices"] = idx;
  auto rows = [&](const auto& flat) {
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    for (int64_t r = 0; r < mb.b; ++r) out.push_back(std::vector(flat.begin() + r * mb.s, flat.begin() + (r + 1) * mb.s));
    return out;
  };
  line["tokens"] = rows(mb.tokens);
  line["labels"] = rows(mb.labels);
  line["loss_mask"] = rows(mb.loss_mask);
  line["position_ids"] = rows(mb.positions);
  // --reset-attention-mask: each query's first key (Megatron's attention_mask row by row).
  if (!mb.key_start.empty()) line["attention_key_start"] = rows(mb.key_start);
  std::fputs((line.dump() + "\n").c_str(), stdout);
}

}  // namespace

int cmd_data_samples(const Args& args) {
  int64_t iterations = -1;
  std::string splits = "train,valid,test";
  Args rest;
  for (size_t k = 0; k < args.size(); ++k) {
    const std::string& a = args[k];
    auto value = [&](const std::string& flag) {
      if (k + 1 >= args.size()) throw UsageError("argument " + flag + ": expected one argument");
      return args[++k];
    };
    if (a == "--help" || a == "-h") {
      std::printf("usage: laoyao data-samples [--iterations N] [--splits train,valid,test] [training flags]\n\n"
                  "Prints one JSON object per micro-batch that the run would read: split, iteration (or\n"
                  "evaluation), micro-batch, sample_indices, tokens, labels, loss_mask, position_ids, and\n"
                  "where the attention keeps --reset-attention-mask's documents apart attention_key_start\n"
                  "(each token's first visible key).\n"
                  "Training flags: Megatron-LM's (as for pretrain-gpt), or a run-recipe command line\n"
                  "starting with --recipe/--model. --iterations defaults to the run's train iterations.\n");
      return 0;
    }
    if (a == "--iterations") {
      std::string v = value(a);
      char* end = nullptr;
      iterations = std::strtoll(v.c_str(), &end, 10);
      if (*end || iterations < 0) throw UsageError("bad value '" + v + "' for --iterations: expected an integer >= 0");
    } else if (a == "--splits") {
      splits = value(a);
    } else {
      rest.push_back(a);
    }
  }
  std::vector<std::string> wanted = split(splits, ',');
  for (const auto& s : wanted)
    if (s != "train" && s != "valid" && s != "test")
      throw UsageError("bad split '" + s + "' in --splits: choose from train, valid, test");
  auto want = [&](const char* s) { return std::find(wanted.begin(), wanted.end(), s) != wanted.end(); };

  bool recipe = !rest.empty() && (starts_with(rest[0], "--recipe") || starts_with(rest[0], "--model"));
  int64_t world = config::world_size_from_env();
  config::Resolved r = recipe ? config::resolve_recipe(config::parse_run_recipe_args(rest), world)
                              : config::resolve_mlm(rest, world);
  // The datasets' indices only: this command builds no model, so a model too big for this machine
  // may still have its data order inspected here.
  train::check_dataset_indices_fit(r.cfg, r.validated.derived, r.front_end, train::physical_memory_bytes());
  train::load_tokenizer_vocab(r.cfg, r.validated.derived, r.front_end);
  train::RunData data = train::build_run_data(r.cfg, r.validated.derived);
  const int64_t train_iters = r.validated.derived.train_iters;
  if (iterations < 0) iterations = train_iters;
  iterations = std::min(iterations, train_iters);
  const int64_t eval_iters = r.cfg.validation.eval_iters;
  const auto eval_interval = r.cfg.validation.eval_interval;
  int64_t consumed_valid = 0;
  auto eval_round = [&](int split_index, int64_t& consumed, const char* split, nlohmann::ordered_json tag) {
    const data::SampleDataset* ds = data.datasets[static_cast<size_t>(split_index)].get();
    if (!ds || eval_iters <= 0) return;
    for (int64_t it = 0; it < eval_iters; ++it) {
      for (int64_t m = 0; m < data.eval_layout.num_microbatches; ++m) {
        nlohmann::ordered_json line = tag;
        line["split"] = split;
        line["eval_iteration"] = it + 1;
        line["microbatch"] = m;
        emit(*ds, train::eval_sample_indices(data, split_index, consumed, m), line);
      }
      consumed += train::eval_round_samples(data, 1);
    }
  };
  // The global batch of each iteration: fixed, or growing along --rampup-batch-size.
  const data::BatchRampup ramp = config::batch_rampup(r.cfg, r.validated.derived);
  int64_t consumed_train = 0;
  for (int64_t k = 1; k <= iterations; ++k) {
    const int64_t gbs = ramp.running(consumed_train);
    if (want("train"))
      for (int64_t m = 0; m < gbs / ramp.micro_times_dp; ++m)
        emit(*data.datasets[0], train::train_sample_indices(data, consumed_train, m),
             {{"split", "train"}, {"iteration", k}, {"microbatch", m}});
    consumed_train += gbs;
    if (eval_interval && k % *eval_interval == 0) {
      if (want("valid")) eval_round(1, consumed_valid, "valid", {{"after_iteration", k}});
      else consumed_valid += train::eval_round_samples(data, eval_iters);
    }
  }
  if (iterations == train_iters) {  // the evaluations after training
    if (want("valid")) eval_round(1, consumed_valid, "valid", {{"after_iteration", iterations}, {"final", true}});
    int64_t consumed_test = 0;
    if (want("test")) eval_round(2, consumed_test, "test", {{"after_iteration", iterations}, {"final", true}});
  }
  return 0;
}

}  // namespace laoyao::cli
