// laoyao pretrain-gpt [Megatron-LM flags]: pretrain_gpt.py's command line.
#include <cstdio>

#include "cli/cli.hpp"
#include "cli/run_common.hpp"
#include "config/front_ends.hpp"
#include "train/run_setup.hpp"

namespace laoyao::cli {

int cmd_pretrain_gpt(const Args& args) {
  if (args.size() == 1 && (args[0] == "--help" || args[0] == "-h")) {
    std::printf(
        "usage: laoyao pretrain-gpt [Megatron-LM pretrain_gpt.py flags]\n\n"
        "Takes Megatron-LM's flags with its names, defaults and argparse rules (--flag value,\n"
        "--flag=value, store-true switches, --no-* switches, multi-value flags such as\n"
        "--data-path 0.3 a 0.7 b). Flags that change nothing in laoyao (e.g. --use-mcore-models)\n"
        "are accepted; Megatron-LM flags laoyao does not support are refused by name.\n"
        "`laoyao convert-args [flags]` prints the equivalent run-recipe command.\n");
    return 0;
  }
  config::Resolved r = config::resolve_mlm(args, config::world_size_from_env());
  train::load_tokenizer_vocab(r.cfg, r.validated.derived, r.front_end);
  const auto& d = r.validated.derived;
  const auto& m = r.cfg.model;
  std::printf("using world size: %lld, data-parallel size: %lld, context-parallel size: %lld, "
              "tensor-model-parallel size: %lld, pipeline-model-parallel size: %lld\n",
              (long long)d.world_size, (long long)d.data_parallel_size, (long long)m.context_parallel_size,
              (long long)m.tensor_model_parallel_size, (long long)m.pipeline_model_parallel_size);
  if (const auto& ramp = r.cfg.train.rampup_batch_size; ramp.size() == 3)
    std::printf("will use batch size rampup starting from global batch size %lld to global batch size %lld with "
                "batch size increments %lld over %lld samples.\n",
                (long long)ramp[0], (long long)*r.cfg.train.global_batch_size, (long long)ramp[1], (long long)ramp[2]);
  else
    std::printf("setting number of microbatches to constant %lld\n", (long long)d.num_microbatches);
  if (d.padded_vocab_size > 0)
    std::printf(" > padded vocab (size: %lld) with %lld dummy tokens (new size: %lld)\n",
                (long long)d.tokenizer_vocab_size, (long long)(d.padded_vocab_size - d.tokenizer_vocab_size),
                (long long)d.padded_vocab_size);
  print_messages(r);
  return start_training(r);
}

}  // namespace laoyao::cli
