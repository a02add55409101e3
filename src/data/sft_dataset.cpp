#include "data/sft_dataset.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "data/batch_sampler.hpp"

namespace laoyao::data {

SftDataset::SftDataset(const std::string& path, const SftTokenizer& tok, const SftSplitConfig& cfg)
    : cfg_(cfg), eos_(tok.eos()) {
  if (cfg.seq_length < 2) throw UsageError("fine-tuning needs a sequence length of at least 2");
  if (cfg.pad_seq_to_mult < 1)
    throw UsageError("dataset.pad_seq_to_mult " + std::to_string(cfg.pad_seq_to_mult) + " must be a positive integer");
  // Bridge tokenises to max_seq_length = the sequence length (packed: the pack size), so an
  // example's row (its ids but the last) always fits; packing with pad_seq_to_mult > 1 tokenises
  // to one more and then pads or cuts each example to its rounded length (tokenize_dataset).
  const bool pre_pad = cfg.packed && cfg.pad_seq_to_mult > 1;
  const int64_t cap = cfg.seq_length / cfg.pad_seq_to_mult * cfg.pad_seq_to_mult;
  if (pre_pad && cap == 0)
    throw UsageError("dataset.seq_length (" + std::to_string(cfg.seq_length) +
                     ") must be at least dataset.pad_seq_to_mult (" + std::to_string(cfg.pad_seq_to_mult) + ")");
  // Chat rows are not truncated here (Bridge's _chat_preprocess): a row keeps its first seq_length
  // tokens, and packing skips examples longer than a pack.
  examples_ = cfg.chat ? read_chat_jsonl(path, *cfg.chat)
                       : read_prompt_completion_jsonl(path, tok, cfg.format, cfg.seq_length + (pre_pad ? 1 : 0));
  if (pre_pad)
    for (SftExample& ex : examples_) pre_pad_example(ex, cfg.pad_seq_to_mult, cap, eos_);
  if (cfg.packed) {
    packs_ = pack_first_fit_shuffle(examples_, cfg.seq_length, cfg.seed);
    std::vector<SftExample>().swap(examples_);
  }
}

int64_t SftDataset::rows() const {
  return static_cast<int64_t>(cfg_.packed ? packs_.size() : examples_.size());
}

int64_t SftDataset::size() const { return std::max(rows(), cfg_.num_samples); }

GptSample SftDataset::get(int64_t index) const {
  const bool pad = index == kPadRow;  // Bridge's __getitem__(-1): the last row, its loss masked off
  if ((index < 0 || index >= size()) && !pad)
    throw Error("fine-tuning sample " + std::to_string(index) + " of " + std::to_string(size()));
  const size_t i = static_cast<size_t>(pad ? rows() - 1 : index % rows());
  GptSample s;
  if (cfg_.packed) {
    PackedRow r = packed_row(packs_[i], cfg_.seq_length, eos_);
    s.tokens = std::move(r.tokens), s.labels = std::move(r.labels), s.loss_mask = std::move(r.loss_mask);
    s.position_ids = std::move(r.positions), s.key_start = std::move(r.key_start);
  } else {
    SftRow r = sft_row(examples_[i], cfg_.seq_length, eos_);
    s.tokens = std::move(r.tokens), s.labels = std::move(r.labels), s.loss_mask = std::move(r.loss_mask);
    s.position_ids.resize(static_cast<size_t>(cfg_.seq_length));
    for (int64_t t = 0; t < cfg_.seq_length; ++t) s.position_ids[static_cast<size_t>(t)] = t;
  }
  if (pad) std::fill(s.loss_mask.begin(), s.loss_mask.end(), 0.0f);
  return s;
}

}  // namespace laoyao::data
