// Fuzzes the tokenizer-file readers: GPT-2's vocab.json + merges.txt, a Hugging Face
// tokenizer.json (+ tokenizer_config.json) and a SentencePiece model. The first byte picks the
// reader; the last part is text to tokenize with what was loaded (and detokenize back).
#include <cstddef>
#include <cstdint>
#include <memory>

#include "data/tokenizer/gpt2_bpe_tokenizer.hpp"
#include "data/tokenizer/hf_tokenizer.hpp"
#include "data/tokenizer/sentencepiece_tokenizer.hpp"
#include "fuzz/fuzz_util.hpp"

namespace {

void exercise(const laoyao::tokenizer::Tokenizer& t, const std::string& text) {
  for (const std::string& s : {std::string("Hello world, it's 2026: caf\xC3\xA9 \xE4\xB8\xAD\xE6\x96\x87 \t\n"), text}) {
    const auto ids = t.tokenize(s);
    (void)t.detokenize(ids);
  }
  (void)t.vocab_size();
  (void)t.eod();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace laoyao;
  if (size < 1) return 0;
  const auto parts = fuzz::split_parts(data + 1, size - 1, 3);
  const std::string text = parts[2].substr(0, 256);
  fuzz::expect_clean([&] {
    switch (data[0] % 3) {
      case 0:
        exercise(*tokenizer::GPT2BPETokenizer::from_strings(parts[0], parts[1]), text);
        break;
      case 1:
        exercise(*tokenizer::HuggingFaceTokenizer::from_json(parts[0], parts[1]), text);
        break;
      default: {
        const auto flavor = static_cast<tokenizer::SentencePieceFlavor>((data[0] >> 2) % 3);
        exercise(*tokenizer::SentencePieceTokenizer::from_bytes(parts[0], flavor, (data[0] >> 4) % 4), text);
        break;
      }
    }
  });
  return 0;
}
