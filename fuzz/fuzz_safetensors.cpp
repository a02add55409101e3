// Fuzzes the safetensors reader (checkpoints, --pretrained-checkpoint, Hugging Face weights): the
// input is the whole file. A file the reader accepts must serve every tensor it lists.
#include <cstddef>
#include <cstdint>

#include "core/safetensors.hpp"
#include "fuzz/fuzz_util.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace laoyao;
  const auto path = (fuzz::scratch_dir() / "model.safetensors").string();
  fuzz::write_bytes(path, std::string(reinterpret_cast<const char*>(data), size));
  fuzz::expect_clean([&] {
    SafetensorsFile f(path);
    for (const auto& t : f.tensors()) {
      (void)f.find(t.name);
      if (t.numel() <= (1 << 20)) fuzz::expect_clean([&] { (void)f.read_f32(t); });
    }
  });
  return 0;
}
