// Fuzzes what a run reads back of earlier runs: a training log (`compare-logs` takes Megatron's
// or laoyao's text logs), a checkpoint's train_state.json (its counters, file list and checksums,
// read before any tensor) and the tracker latest_checkpointed_iteration.txt. The first byte picks.
#include <cstddef>
#include <cstdint>
#include <filesystem>

#include "fuzz/fuzz_util.hpp"
#include "train/checkpoint.hpp"
#include "train/log_parse.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace laoyao;
  if (size < 1) return 0;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  const auto root = fuzz::scratch_dir() / "ckpt";
  switch (data[0] % 3) {
    case 0:
      fuzz::expect_clean([&] { (void)train::parse_training_log(text); });
      break;
    case 1: {
      // Not named iter_N: its name would have to match the iteration the input holds.
      const auto dir = root / "state";
      std::filesystem::create_directories(dir);
      fuzz::write_bytes(dir / "train_state.json", text);
      fuzz::expect_clean([&] { (void)train::load_checkpoint(dir.string()); });
      break;
    }
    default:
      std::filesystem::create_directories(root);
      fuzz::write_bytes(train::tracker_path(root.string()), text);
      fuzz::expect_clean([&] {
        (void)train::latest_iteration(root.string());
        (void)train::load_checkpoint(root.string());
      });
      break;
  }
  return 0;
}
