// Fuzzes what import-hf and --pretrained-checkpoint read of a Hugging Face folder before any weight:
// config.json (the architecture and its fields, then the flags, the tensor list and config.json
// written back) and model.safetensors.index.json (its weight map, naming shards). Parts: config.json,
// then the index.
#include <cstddef>
#include <cstdint>
#include <filesystem>

#include "fuzz/fuzz_util.hpp"
#include "train/hf_import.hpp"
#include "train/hf_model.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace laoyao;
  const auto parts = fuzz::split_parts(data, size, 2);
  const std::string config = parts.empty() ? "" : parts[0];
  fuzz::expect_clean([&] {
    const train::HfModel m = train::parse_hf_config(config, "config.json");
    (void)train::hf_megatron_flags(m);
    (void)train::hf_bridge_overrides(m);
    // The tensor list of a small model only (a large one is a fine config, just slow to list).
    if (m.gpt.num_layers * (1 + m.gpt.moe.num_experts) <= 256) {
      (void)train::hf_tensor_maps(m);
      (void)train::parse_hf_config(train::hf_config_json(m, "bfloat16"), "written config.json");
    }
  });
  if (parts.size() > 1) {
    const auto dir = fuzz::scratch_dir() / "hf";
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    fuzz::write_bytes(dir / "config.json", config);
    fuzz::write_bytes(dir / "model.safetensors.index.json", parts[1]);
    fuzz::expect_clean([&] { (void)train::import_hf(dir.string(), (fuzz::scratch_dir() / "out").string()); });
  }
  return 0;
}
