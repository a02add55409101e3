// Hugging Face hub ids ("meta-llama/Llama-3.2-1B") resolved offline, as transformers resolves them
// with no network: the snapshot folder the local cache's refs/main names
// (<cache>/models--org--name/snapshots/<commit>). Nothing is downloaded. The cache is
// huggingface_hub's: $HF_HUB_CACHE, else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else
// ~/.cache/huggingface/hub (and transformers' older $TRANSFORMERS_CACHE when set).
#pragma once
#include <string>
#include <vector>

namespace laoyao {

// Whether `s` reads as a hub id rather than a path: "org/name" (one slash, neither part empty, "."
// or "..", no leading "/", "./" or "~").
bool is_hf_hub_id(const std::string& s);

// The cache folders searched, in order (from the environment, read when called).
std::vector<std::string> hf_cache_dirs();

// `path_or_id` itself when it exists or is not a hub id; else the cached snapshot folder of the
// id. A UsageError for an id not in the cache names the folders searched and how to fill them;
// `what` names the setting ("--tokenizer-model", "import-hf HF_DIR").
std::string resolve_hf_path(const std::string& path_or_id, const std::string& what);

}  // namespace laoyao
