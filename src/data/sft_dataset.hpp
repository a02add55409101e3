// A fine-tuning split as the training loop reads it: Megatron-Bridge's examples of one JSONL file
// (data/sft_example.hpp), as packs (data/sft_packing.hpp) or one example a row, each served as a
// row of seq_length tokens. Indices past the rows wrap around (the run reads the split again, as
// Bridge's cyclic loader does); kPadRow (-1, the batch sampler's padding) is the last row with no loss.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/gpt_dataset.hpp"
#include "data/sft_chat.hpp"
#include "data/sft_packing.hpp"

namespace laoyao::data {

struct SftSplitConfig {
  int64_t seq_length = 0;  // each row's tokens; with packing, the pack size too
  bool packed = false;
  int64_t seed = 1234;         // the packing's np.random.seed
  int64_t num_samples = 0;     // the samples the run reads (size() covers them)
  // Bridge's pad_seq_to_mult (packed rows only): each example padded so its tokens are a multiple
  // of it (pre_pad_example), as context parallelism's THD chunks need.
  int64_t pad_seq_to_mult = 1;
  PromptCompletionConfig format;
  // Chat rows (Bridge's ChatSFTPreprocessingConfig) when set: the file's rows are conversations
  // rendered by this tokenizer's chat template, not prompt-completion pairs.
  std::shared_ptr<const ChatTokenizer> chat;
};

class SftDataset final : public SampleDataset {
 public:
  // The examples of `path` tokenised by `tok`; UsageError naming the file (and line) when it cannot
  // be read or holds no example that fits.
  SftDataset(const std::string& path, const SftTokenizer& tok, const SftSplitConfig& cfg);
  int64_t size() const override;
  GptSample get(int64_t index) const override;
  int64_t rows() const;  // packs, or examples unpacked

 private:
  SftSplitConfig cfg_;
  tokenizer::TokenId eos_;
  std::vector<SftExample> examples_;  // unpacked
  std::vector<SftPack> packs_;        // packed
};

}  // namespace laoyao::data
