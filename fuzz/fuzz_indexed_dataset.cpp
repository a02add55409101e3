// Fuzzes Megatron's indexed dataset reader: input = the .idx bytes, separator, the .bin bytes.
// An index the reader accepts must then serve every sequence within the .bin.
#include <cstddef>
#include <cstdint>

#include "data/indexed_dataset.hpp"
#include "fuzz/fuzz_util.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace laoyao;
  const auto parts = fuzz::split_parts(data, size, 2);
  const auto prefix = (fuzz::scratch_dir() / "corpus").string();
  fuzz::write_bytes(data::idx_path(prefix), parts[0]);
  fuzz::write_bytes(data::bin_path(prefix), parts[1]);
  fuzz::expect_clean([&] {
    data::IndexedDataset ds(prefix);
    const int64_t n = std::min<int64_t>(ds.sequence_count(), 4096);
    std::vector<int64_t> tokens;
    for (int64_t s = 0; s < n; ++s) {
      tokens = ds.sequence(s);
      const int64_t len = ds.document_length(s);
      if (len > 0) ds.read_tokens(s, len / 2, len - len / 2, tokens);
    }
    for (int64_t i = 0; i < std::min<int64_t>(ds.document_index_count(), 4096); ++i) (void)ds.document_index(i);
  });
  return 0;
}
