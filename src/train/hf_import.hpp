// `laoyao checkpoint import-hf`: a Hugging Face folder (config.json, one or many *.safetensors with
// model.safetensors.index.json, tokenizer files) into a folder that --pretrained-checkpoint reads:
// Megatron-Core-named safetensors in the source's dtype (every tensor only rearranged, so bit for
// bit), model_flags.txt (the Megatron-LM model flags, one line) and model_overrides.txt (the same
// as Megatron-Bridge overrides, with checkpoint.pretrained_checkpoint), hf_config.json (config.json
// as it was, for export-hf) and the tokenizer files.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "train/checkpoint.hpp"
#include "train/hf_model.hpp"

namespace laoyao::train {

struct HfImportResult {
  HfModel model;
  int64_t tensors = 0;
  uint64_t bytes = 0;                  // of tensor data written
  std::vector<std::string> tokenizer;  // tokenizer files copied
  std::string flags, overrides;        // what model_flags.txt and model_overrides.txt hold
};

// Progress as the tensors go (tensors done of all, bytes written, seconds since the start); called
// at most every few seconds.
using HfProgress = std::function<void(int64_t done, int64_t total, uint64_t bytes, double seconds)>;

// UsageError (and nothing left at out_dir) for a folder that is not a supported Hugging Face model:
// no config.json, an unknown architecture, a missing, extra, duplicated or misshapen tensor, mixed
// or non-float dtypes, an index naming an absent shard, a truncated file; out_dir must not exist
// (or be empty). Written to a scratch folder beside it, renamed at the end.
// hf_dir may be a hub id ("meta-llama/Llama-3.2-1B"), read from the local cache (core/hf_hub.hpp).
HfImportResult import_hf(const std::string& hf_dir, const std::string& out_dir, const HfProgress& progress = {});

// --pretrained-checkpoint (checkpoint.pretrained_checkpoint) naming a Hugging Face folder (one with
// config.json; a hub id is read from the local cache): whether `path` is one, and its weights read
// from the folder's own files (every architecture's parameters but GPT-2's are their sources' rows
// rearranged, each source entry a part of its parameter; GPT-2's transposed weights are imported
// through a scratch folder in the system's temp folder, removed once its files are mapped).
// Before anything is read, every setting of the run's model (`run`, the whole model)
// that contradicts config.json is refused by name: a UsageError listing each flag, its value and
// config.json's.
bool is_hf_folder(const std::string& path);
PretrainedSource open_hf_pretrained(const std::string& path, const model::GptConfig& run,
                                    const std::vector<ParamShape>& expected);

}  // namespace laoyao::train
