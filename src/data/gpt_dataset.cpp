#include "data/gpt_dataset.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "core/error.hpp"

namespace laoyao::data {

namespace {
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
}

EpochPlan plan_epochs(int64_t tokens_per_epoch, std::optional<int64_t> num_samples,
                      int64_t seq_length, bool add_extra_token) {
  const int64_t extra = add_extra_token ? 1 : 0;
  if (seq_length <= 1) {
    throw UsageError("seq_length must be > 1, got " + std::to_string(seq_length));
  }
  if (tokens_per_epoch <= 1) {
    // helpers.cpp asserts tokens_per_epoch > 1; _get_num_epochs would never end with 0 tokens.
    throw UsageError("a dataset split has " + std::to_string(tokens_per_epoch) +
                     " tokens; at least 2 are needed to draw samples (check --split and the data)");
  }
  if (num_samples && *num_samples < 0) {
    throw UsageError("number of samples must be >= 0, got " + std::to_string(*num_samples));
  }
  EpochPlan plan;
  plan.tokens_per_epoch = tokens_per_epoch;
  // _get_num_epochs: the smallest e >= 1 with e * tokens_per_epoch >= num_samples*seq + extra.
  if (num_samples) {
    if (*num_samples > (std::numeric_limits<int64_t>::max() - extra) / seq_length) {
      throw UsageError("number of samples " + std::to_string(*num_samples) + " is too large");
    }
    const int64_t requested = *num_samples * seq_length + extra;
    plan.num_epochs = std::max<int64_t>(1, (requested + tokens_per_epoch - 1) / tokens_per_epoch);
  }
  if (plan.num_epochs > 1) {
    // GPTDataset._build_document_sample_shuffle_indices: shuffle the final epoch separately
    // when it contributes fewer than 80% of an epoch's samples.
    const int64_t sans_final = ((plan.num_epochs - 1) * tokens_per_epoch - extra) / seq_length;
    const int64_t from_final = *num_samples - sans_final;
    const int64_t per_epoch = (tokens_per_epoch - extra) / seq_length;
    if (from_final < 0 || from_final > per_epoch + 1) {
      throw Error("GPTDataset epoch plan: " + std::to_string(from_final) +
                  " samples from the final epoch is outside [0, " + std::to_string(per_epoch + 1) +
                  "]");
    }
    plan.num_samples_sans_final_epoch = sans_final;
    plan.separate_final_epoch =
        from_final < static_cast<int64_t>(0.80 * static_cast<double>(per_epoch));
  }
  return plan;
}

std::vector<int32_t> build_document_index(DocumentRange documents, int64_t num_epochs,
                                          RandomState& rs, bool separate_final_epoch) {
  if (documents.begin < 0 || documents.end < documents.begin || documents.end - 1 > kInt32Max) {
    throw Error("document range [" + std::to_string(documents.begin) + ", " +
                std::to_string(documents.end) + ") does not fit Megatron's int32 document index");
  }
  if (!separate_final_epoch || num_epochs == 1) {
    // numpy.mgrid[0:num_epochs, 0:n][1] filled with the documents, flattened, astype(int32),
    // then RandomState.shuffle in place.
    const int64_t n = documents.size();
    std::vector<int32_t> index(static_cast<size_t>(num_epochs * n));
    for (int64_t e = 0; e < num_epochs; ++e) {
      for (int64_t k = 0; k < n; ++k) index[e * n + k] = static_cast<int32_t>(documents.begin + k);
    }
    rs.shuffle(std::span<int32_t>(index));
    return index;
  }
  std::vector<int32_t> index = build_document_index(documents, num_epochs - 1, rs, false);
  const std::vector<int32_t> last = build_document_index(documents, 1, rs, false);
  index.insert(index.end(), last.begin(), last.end());
  return index;
}

std::vector<int64_t> build_sample_index(std::span<const int32_t> sizes, int64_t first_document,
                                        std::span<const int32_t> document_index,
                                        int64_t seq_length, int64_t num_epochs,
                                        int64_t tokens_per_epoch, bool drop_last_partial_sequence,
                                        bool add_extra_token) {
  const int64_t extra = add_extra_token ? 1 : 0;
  if (seq_length <= 1 || num_epochs <= 0 || tokens_per_epoch <= 1 || document_index.empty()) {
    throw Error("build_sample_index: invalid arguments");
  }
  int64_t num_samples = 0;
  if (drop_last_partial_sequence) {
    num_samples = (num_epochs * tokens_per_epoch - extra) / seq_length;
  } else {
    // helpers.cpp computes this in single precision: ceil(float(n) / seq_length).
    num_samples = static_cast<int64_t>(
        std::ceil(static_cast<float>(num_epochs * tokens_per_epoch - extra) /
                  static_cast<float>(seq_length)));
  }
  const auto doc_size = [&](int64_t position) -> int64_t {
    const int64_t d = static_cast<int64_t>(document_index[static_cast<size_t>(position)]) -
                      first_document;
    if (d < 0 || d >= static_cast<int64_t>(sizes.size())) {
      throw Error("build_sample_index: document outside the sizes given");
    }
    return sizes[static_cast<size_t>(d)];
  };
  const int64_t last_position = static_cast<int64_t>(document_index.size()) - 1;

  std::vector<int64_t> rows;
  rows.reserve(static_cast<size_t>(2 * (num_samples + 1)));
  int64_t position = 0;  // into document_index
  int64_t offset = 0;    // token offset in that document
  rows.push_back(position);
  rows.push_back(offset);
  for (int64_t sample = 1; sample <= num_samples; ++sample) {
    // Each sample takes seq_length + extra tokens; the next one starts on its last token.
    int64_t remaining = seq_length + extra;
    while (remaining != 0) {
      const int64_t length = doc_size(position) - offset;
      remaining -= length;
      if (remaining <= 0) {
        offset += remaining + length - extra;
        remaining = 0;
      } else {
        if (position == last_position) {
          // Out of documents: only the final (partial) sample may get here.
          if (sample != num_samples) {
            throw Error("build_sample_index: ran out of documents at sample " +
                        std::to_string(sample) + " of " + std::to_string(num_samples) +
                        " (Megatron's helpers.cpp asserts here)");
          }
          offset = doc_size(position) - extra;
          break;
        }
        ++position;
        offset = 0;
      }
    }
    rows.push_back(position);
    rows.push_back(offset);
  }
  return rows;
}

std::vector<int64_t> build_shuffle_index(int64_t num_samples, int64_t total_size,
                                         RandomState& rs) {
  if (num_samples < 0 || total_size < num_samples) {
    throw Error("build_shuffle_index: invalid sizes");
  }
  // Megatron stores uint32 (int64 from 2**32-2 samples on); the draws don't depend on it.
  std::vector<int64_t> index(static_cast<size_t>(total_size));
  for (int64_t i = 0; i < total_size; ++i) index[i] = i;
  rs.shuffle(std::span<int64_t>(index.data(), static_cast<size_t>(num_samples)));
  if (total_size > num_samples) {
    rs.shuffle(std::span<int64_t>(index.data() + num_samples,
                                  static_cast<size_t>(total_size - num_samples)));
  }
  return index;
}

GptDataset::GptDataset(std::shared_ptr<const LowLevelDataset> corpus, DocumentRange documents,
                       Split split, std::optional<int64_t> num_samples,
                       const GptDatasetConfig& config)
    : corpus_(std::move(corpus)),
      documents_(documents),
      split_(split),
      num_samples_(num_samples),
      config_(config) {
  if (!corpus_) throw Error("GptDataset: no corpus");
  if (config_.seq_length <= 1) {
    throw UsageError("seq_length must be > 1, got " + std::to_string(config_.seq_length));
  }
  if (documents.begin < 0 || documents.end > corpus_->num_documents() ||
      documents.end < documents.begin) {
    throw Error("GptDataset: documents [" + std::to_string(documents.begin) + ", " +
                std::to_string(documents.end) + ") outside " + corpus_->name() + " (" +
                std::to_string(corpus_->num_documents()) + " documents)");
  }
  const bool extra = config_.add_extra_token_to_sequence;

  // Megatron keeps sequence lengths as int32 (and asserts it).
  std::vector<int32_t> sizes(static_cast<size_t>(documents.size()));
  int64_t tokens_per_epoch = 0;
  for (int64_t d = documents.begin; d < documents.end; ++d) {
    const int64_t length = corpus_->document_length(d);
    if (length < 0 || length > kInt32Max) {
      throw Error(corpus_->name() + ": document " + std::to_string(d) + " has length " +
                  std::to_string(length) + ", outside int32");
    }
    sizes[static_cast<size_t>(d - documents.begin)] = static_cast<int32_t>(length);
    tokens_per_epoch += length;
  }
  try {
    plan_ = plan_epochs(tokens_per_epoch, num_samples, config_.seq_length, extra);
  } catch (const UsageError& e) {
    throw UsageError(corpus_->name() + " " + split_name(split) + " split (documents [" +
                     std::to_string(documents.begin) + ", " + std::to_string(documents.end) +
                     ")): " + e.what());
  }

  RandomState rs(config_.random_seed);
  document_index_ = build_document_index(documents, plan_.num_epochs, rs, plan_.separate_final_epoch);
  const bool drop_last =
      split == Split::kValid ? config_.drop_last_partial_validation_sequence : true;
  sample_index_ = build_sample_index(sizes, documents.begin, document_index_, config_.seq_length,
                                     plan_.num_epochs, tokens_per_epoch, drop_last, extra);
  const int64_t total = sample_index_rows() - 1;
  shuffle_index_ = build_shuffle_index(
      plan_.separate_final_epoch ? plan_.num_samples_sans_final_epoch : total, total, rs);
  if (num_samples && total < *num_samples) {
    // BlendedMegatronDatasetBuilder.build asserts num_samples <= len(dataset).
    throw Error(corpus_->name() + " " + split_name(split) + " split: built " +
                std::to_string(total) + " samples, fewer than the " +
                std::to_string(*num_samples) + " requested");
  }
}

std::pair<int64_t, int64_t> GptDataset::sample_index(int64_t row) const {
  if (row < 0 || row >= sample_index_rows()) {
    throw Error("GptDataset: sample index row " + std::to_string(row) + " out of range");
  }
  return {sample_index_[2 * row], sample_index_[2 * row + 1]};
}

std::vector<int64_t> GptDataset::text(int64_t index) const {
  if (index < 0 || index >= size()) {
    throw Error(corpus_->name() + " " + split_name(split_) + " dataset: sample " +
                std::to_string(index) + " out of range [0, " + std::to_string(size()) + ")");
  }
  const int64_t extra = config_.add_extra_token_to_sequence ? 1 : 0;
  const int64_t target = config_.seq_length + extra;
  const int64_t row = shuffle_index_[static_cast<size_t>(index)];
  const auto [first, first_offset] = sample_index(row);
  const auto [last, last_offset] = sample_index(row + 1);

  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(target));
  if (first == last) {
    corpus_->read_tokens(document_index_[first], first_offset, last_offset - first_offset + extra,
                         out);
  } else {
    for (int64_t p = first; p <= last; ++p) {
      const int64_t doc = document_index_[static_cast<size_t>(p)];
      const int64_t offset = p > first ? 0 : first_offset;
      const int64_t length =
          p < last ? corpus_->document_length(doc) - offset : last_offset + extra;
      corpus_->read_tokens(doc, offset, length, out);
    }
  }
  if (static_cast<int64_t>(out.size()) < target) out.resize(static_cast<size_t>(target), config_.pad_id);
  return out;
}

GptSample GptDataset::get(int64_t index) const {
  const std::vector<int64_t> text = this->text(index);
  const int64_t s = config_.seq_length;
  const int64_t pad = config_.pad_id;
  const int64_t eod = config_.eod_id;
  GptSample sample;
  if (config_.add_extra_token_to_sequence) {
    sample.tokens.assign(text.begin(), text.begin() + s);
    sample.labels.assign(text.begin() + 1, text.begin() + s + 1);
  } else {
    // tokens = text; labels = roll(text, -1) with the last label set to the pad id.
    sample.tokens = text;
    sample.labels.assign(text.begin() + 1, text.end());
    sample.labels.push_back(pad);
  }
  // _get_ltor_masks_and_position_ids (on the tokens before pads are replaced).
  sample.loss_mask.assign(static_cast<size_t>(s), 1.0f);
  sample.position_ids.resize(static_cast<size_t>(s));
  const bool documents = config_.reset_attention_mask && config_.create_attention_mask;
  if (documents) sample.key_start.resize(static_cast<size_t>(s));
  int64_t position = 0;
  for (int64_t t = 0; t < s; ++t) {
    const bool is_eod = sample.tokens[t] == eod;
    if (config_.eod_mask_loss && is_eod) sample.loss_mask[t] = 0.0f;
    sample.position_ids[t] = config_.reset_position_ids ? position : t;
    // Positions after an EOD restart at 0 (reset_position_ids); its document starts after it.
    if (documents) sample.key_start[t] = static_cast<int32_t>(t - position);
    position = is_eod ? 0 : position + 1;
  }
  // GPTDataset.__getitem__: no loss on pad labels; pad ids become 0 for the embedding.
  for (int64_t t = 0; t < s; ++t) {
    if (sample.labels[t] == pad) {
      sample.loss_mask[t] = 0.0f;
      sample.labels[t] = 0;
    }
    if (sample.tokens[t] == pad) sample.tokens[t] = 0;
  }
  return sample;
}

}  // namespace laoyao::data
