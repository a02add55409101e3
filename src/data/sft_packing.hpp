// Megatron-Bridge's offline packing of fine-tuning examples (docs/reference/megatron-bridge-finetuning.md
// §4): First-Fit over the examples' lengths shuffled by numpy's legacy global RNG (np.random.seed(seed)),
// each length's examples then drawn in a permuted order, and the training row a pack becomes (the
// examples shifted one by one, positions restarting at each, attention kept inside each).
#pragma once
#include <cstdint>
#include <vector>

#include "data/sft_example.hpp"

namespace laoyao::data {

struct SftPack {
  std::vector<tokenizer::TokenId> input_ids;  // the examples' whole sequences, one after another
  std::vector<uint8_t> loss_mask;             // each example's mask rolled left by one (aligned with its labels)
  std::vector<int64_t> seq_start;             // where each example starts in input_ids
};

// Bridge's packing metadata, plus the examples left out for being longer than a pack.
struct PackingStats {
  int64_t dataset_max_seqlen = 0, max_samples_per_bin = 0, pack_size = 0, min_packed_seqlen = 0;
  double packing_factor = 0, packing_efficiency = 0;  // (Bridge rounds both to 2 decimals)
  int64_t skipped = 0;
};

// Packs of at most pack_size shifted tokens (an example of n ids counts n - 1), as Bridge's
// create_hist + create_packing_strategy("first_fit_shuffle") + fill_packing_strategy with
// np.random.seed(seed). Examples longer than a pack are skipped (counted in stats).
std::vector<SftPack> pack_first_fit_shuffle(const std::vector<SftExample>& examples, int64_t pack_size, int64_t seed,
                                            PackingStats* stats = nullptr);

// Bridge's _pre_pad_data_point for packing with pad_seq_to_mult > 1: the example's shifted length
// (its ids but one) rounded up to a multiple of `mult`, at most `cap` (the pack size rounded down to
// one); its ids padded with EOS and its mask with 0 to that plus one, or cut to it. Inside a pack
// the padding stays with its example (positions run on; later tokens never reach back into it), so
// every example starts at a multiple of `mult`.
void pre_pad_example(SftExample& ex, int64_t mult, int64_t cap, tokenizer::TokenId eos);

// A pack as one training row of max_length tokens (Bridge's packed collate with pad_to_max_length):
// each example contributes its ids but the last as tokens, its ids but the first as labels and its
// rolled mask but the last entry; positions restart at 0 for each example; the tail is padded with
// EOS (no loss, positions 0) and attends within itself. key_start[t]: the first token of t's
// example; cu_seqlens: the examples' boundaries, with max_length appended when the tail is padding.
struct PackedRow {
  std::vector<tokenizer::TokenId> tokens, labels;
  std::vector<float> loss_mask;
  std::vector<int64_t> positions;
  std::vector<int32_t> key_start;
  std::vector<int64_t> cu_seqlens;
};
PackedRow packed_row(const SftPack& pack, int64_t max_length, tokenizer::TokenId eos);

}  // namespace laoyao::data
