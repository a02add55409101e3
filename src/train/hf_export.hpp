// `laoyao checkpoint export-hf`: a laoyao checkpoint (a save folder or an iteration folder, saved at
// any TP/DP/EP size) or an import-hf folder, as a Hugging Face folder that transformers loads:
// config.json for the matching architecture (an imported folder's own, as it was), the weights under
// Hugging Face's names in safetensors files of at most max_shard_bytes with
// model.safetensors.index.json when there are several, and the tokenizer files the run had.
// BF16 weights are the fp32 main weights rounded to nearest even, as Megatron's export does. A LoRA
// run's checkpoint (the adapters alone) is exported merged into its base, or with `adapters` as
// PEFT's adapter files.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "train/hf_import.hpp"

namespace laoyao::train {

struct HfExportOptions {
  std::string dtype;  // "bf16" or "fp32"; empty: the run's (an imported folder: its weights')
  uint64_t max_shard_bytes = 5'000'000'000;  // transformers' default max_shard_size, "5GB"
  // A LoRA run's checkpoint: its adapters alone in PEFT's format (adapter_model.safetensors and
  // adapter_config.json, which peft's PeftModel.from_pretrained loads onto the base), not merged.
  bool adapters = false;
};

struct HfExportResult {
  HfModel model;
  std::string dtype;                   // "bf16" or "fp32"
  int64_t tensors = 0;                 // Hugging Face tensors written
  uint64_t bytes = 0;                  // their data
  std::vector<std::string> files;      // the safetensors files written
  std::vector<std::string> tokenizer;  // tokenizer files copied
};

// UsageError (and nothing left at out_dir) for a source that is neither, a model no supported
// architecture expresses, a bad dtype, or a checkpoint file that fails its checks; out_dir must not
// exist (or be empty). Written to a scratch folder beside it, renamed at the end.
HfExportResult export_hf(const std::string& source, const std::string& out_dir, const HfExportOptions& options = {},
                         const HfProgress& progress = {});

}  // namespace laoyao::train
