#include "train/data_pipeline.hpp"

#include <algorithm>
#include <memory>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "core/error.hpp"
#include "core/hf_hub.hpp"
#include "core/text.hpp"
#include "data/blended_dataset.hpp"
#include "data/indexed_dataset.hpp"
#include "data/gpt_dataset_split.hpp"
#include "data/mlm_sft_dataset.hpp"
#include "data/mock_dataset.hpp"
#include "data/sft_dataset.hpp"
#include "train/run_setup.hpp"

namespace laoyao::train {

namespace {

// Bridge's blend form: [[prefix, ...], [weight, ...]] or [[prefix, ...], null].
data::Blend blend_from_value(const config::Value& v) {
  auto bad = [] {
    return UsageError("a dataset blend must be [[prefix, ...], [weight, ...]] or [[prefix, ...], null]");
  };
  if (v.kind != config::Value::Kind::List || v.list.size() != 2 || v.list[0].kind != config::Value::Kind::List)
    throw bad();
  data::Blend b;
  for (const auto& p : v.list[0].list) {
    if (p.kind != config::Value::Kind::String) throw bad();
    b.prefixes.push_back(p.s);
  }
  if (!v.list[1].is_null()) {
    if (v.list[1].kind != config::Value::Kind::List || v.list[1].list.size() != b.prefixes.size()) throw bad();
    for (const auto& w : v.list[1].list) {
      if (w.kind == config::Value::Kind::Int) b.weights.push_back(static_cast<double>(w.i));
      else if (w.kind == config::Value::Kind::Float) b.weights.push_back(w.f);
      else throw bad();
    }
  }
  return b;
}

// Bridge's dataset.preprocessing: what the rows are and how they are tokenised. Null: the
// prompt-completion rows Bridge resolves for a dataset_root ({"input", "output"}, separator " ").
struct SftPreprocessing {
  bool chat = false;
  data::ChatLossMode loss_mode = data::ChatLossMode::Assistant;
  data::PromptCompletionConfig prompt_completion;
};

SftPreprocessing parse_preprocessing(const config::Value& v) {
  SftPreprocessing out;
  if (v.is_null()) return out;
  const std::string chat_class = "ChatSFTPreprocessingConfig", pc_class = "PromptCompletionSFTPreprocessingConfig";
  const std::string accepted = "a mapping with _target_: megatron.bridge.data.sft_processing." + chat_class +
                               " (loss_mode) or ..." + pc_class + " (prompt_column, completion_column, prompt_template, "
                               "separator, loss_mode, strip_whitespace, add_bos, add_eos, truncation_method)";
  if (v.kind != config::Value::Kind::Map) throw UsageError("dataset.preprocessing must be null or " + accepted);
  const config::Value* target = nullptr;
  for (const auto& e : v.map)
    if (e.first == "_target_") target = &e.second;
  if (!target || target->kind != config::Value::Kind::String) throw UsageError("dataset.preprocessing needs " + accepted);
  const std::string cls = target->s.substr(target->s.rfind('.') == std::string::npos ? 0 : target->s.rfind('.') + 1);
  if (cls != chat_class && cls != pc_class)
    throw UsageError("dataset.preprocessing._target_ '" + target->s + "' is neither " + chat_class + " nor " + pc_class);
  out.chat = cls == chat_class;
  // Bridge's PromptCompletionSFTPreprocessingConfig defaults (not the SQuAD recipes' values).
  data::PromptCompletionConfig& pc = out.prompt_completion;
  pc.prompt_column = "prompt", pc.completion_column = "completion", pc.separator = "";
  auto text = [](const config::Value::Entry& e) {
    if (e.second.kind != config::Value::Kind::String)
      throw UsageError("dataset.preprocessing." + e.first + " must be a string");
    return e.second.s;
  };
  auto flag = [](const config::Value::Entry& e) {
    if (e.second.kind != config::Value::Kind::Bool)
      throw UsageError("dataset.preprocessing." + e.first + " must be true or false");
    return e.second.b;
  };
  for (const auto& e : v.map) {
    const std::string& k = e.first;
    if (k == "_target_") continue;
    if (out.chat) {
      if (k != "loss_mode") throw UsageError("dataset.preprocessing." + k + " is not a field of " + chat_class + " (loss_mode)");
      out.loss_mode = data::parse_chat_loss_mode(text(e));
      continue;
    }
    if (k == "prompt_column") pc.prompt_column = text(e);
    else if (k == "completion_column") pc.completion_column = text(e);
    else if (k == "prompt_template") pc.prompt_template = text(e);
    else if (k == "separator") pc.separator = text(e);
    else if (k == "strip_whitespace") pc.strip_whitespace = flag(e);
    else if (k == "add_bos") pc.add_bos = flag(e);
    else if (k == "add_eos") pc.add_eos = flag(e);
    else if (k == "add_sep") {
      if (flag(e)) throw UsageError("dataset.preprocessing.add_sep: true is not supported (the tokenizers here have no SEP)");
    } else if (k == "loss_mode") {
      const std::string m = text(e);
      if (m != "completion" && m != "full")
        throw UsageError("bad dataset.preprocessing.loss_mode '" + m + "': choose from completion, full");
      pc.completion_loss_only = m == "completion";
    } else if (k == "truncation_method") {
      const std::string m = text(e);
      if (m != "left" && m != "right")
        throw UsageError("bad dataset.preprocessing.truncation_method '" + m + "': choose from left, right");
      pc.truncate_right = m == "right";
    } else {
      throw UsageError("dataset.preprocessing." + k + " is not a field of " + pc_class);
    }
  }
  if (!out.chat) {
    if (pc.prompt_column.empty() || pc.completion_column.empty() || pc.prompt_column == pc.completion_column)
      throw UsageError("dataset.preprocessing's prompt_column and completion_column must be two different names");
    if (pc.prompt_template.find("{prompt}") == std::string::npos)
      throw UsageError("dataset.preprocessing.prompt_template must contain the {prompt} placeholder");
  }
  return out;
}

// Megatron-Bridge's fine-tuning splits: dataset_root's training.jsonl, validation.jsonl and
// test.jsonl (a split without its file: none, as Bridge warns and goes on; test only when
// evaluated), tokenised by the run's Hugging Face tokenizer, packed or a row each.
data::SplitDatasets build_sft_datasets(const config::ConfigContainer& c, const data::SplitSizes& sizes) {
  const auto& ds = c.dataset;
  const std::string root = *ds.dataset_root;
  if (!std::filesystem::is_directory(root))
    throw UsageError("dataset.dataset_root '" + root + "' is not a directory (it holds training.jsonl, validation.jsonl)");
  const std::string tokenizer_path = resolve_hf_path(c.tokenizer.tokenizer_model.value_or(""), "tokenizer.tokenizer_model");
  const std::shared_ptr<const data::SftTokenizer> tok = data::hf_sft_tokenizer(tokenizer_path);
  const SftPreprocessing pre = parse_preprocessing(ds.preprocessing);
  std::shared_ptr<const data::ChatTokenizer> chat;
  if (pre.chat) {
    if (c.tokenizer.chat_template && c.tokenizer.chat_template_path)
      throw UsageError("set only one of tokenizer.chat_template and tokenizer.chat_template_path");
    std::string override_text = c.tokenizer.chat_template.value_or("");
    if (c.tokenizer.chat_template_path) {
      std::ifstream in(*c.tokenizer.chat_template_path, std::ios::binary);
      if (!in) throw UsageError("cannot read tokenizer.chat_template_path '" + *c.tokenizer.chat_template_path + "'");
      override_text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    chat = std::make_shared<data::ChatTokenizer>(tok, data::load_chat_template(tokenizer_path, override_text),
                                                 pre.loss_mode);
  }
  data::SplitDatasets out;
  const char* files[3] = {"training.jsonl", "validation.jsonl", "test.jsonl"};
  const int64_t wanted[3] = {sizes[0].value_or(0), sizes[1].value_or(0), sizes[2].value_or(0)};
  for (int k = 0; k < 3; ++k) {
    const std::string path = (std::filesystem::path(root) / files[k]).string();
    if (wanted[k] <= 0) continue;
    if (!std::filesystem::exists(path)) {
      if (k == 0) throw UsageError("dataset.dataset_root '" + root + "' has no training.jsonl");
      continue;
    }
    data::SftSplitConfig sc;
    sc.seq_length = *ds.seq_length;
    sc.packed = ds.packed_sequence && k < 2;  // Bridge packs training and validation, never test
    sc.seed = ds.random_seed;
    sc.num_samples = wanted[k];
    sc.pad_seq_to_mult = ds.pad_seq_to_mult;
    sc.format = pre.prompt_completion;
    sc.chat = chat;
    out[static_cast<size_t>(k)] = std::make_shared<data::SftDataset>(path, *tok, sc);
  }
  return out;
}

// Megatron-LM's --sft: each JSONL file's lines split as a corpus's documents are, each split an
// SFTDataset of the samples the run reads from it; a weighted blend of files (--data-path W1 F1 W2
// F2 ...) as Megatron's builder blends any datasets: each file's SFTDataset sized by its weight
// (with the mid-level surplus), a BlendedDataset over them. With per-split paths
// (--train-data-path, --valid-data-path, --test-data-path: Megatron's blend_per_split) each split
// reads its own files whole, blended the same way.
data::SplitDatasets build_mlm_sft_datasets(const config::ConfigContainer& c, const data::SplitSizes& sizes) {
  const auto& ds = c.dataset;
  const std::vector<std::string>* split_paths[3] = {&ds.train_data_path, &ds.valid_data_path, &ds.test_data_path};
  const char* split_flags[3] = {"--train-data-path", "--valid-data-path", "--test-data-path"};
  const bool per_split = !ds.train_data_path.empty() || !ds.valid_data_path.empty() || !ds.test_data_path.empty();
  const std::string tokenizer_path = resolve_hf_path(c.tokenizer.tokenizer_model.value_or(""), "tokenizer.tokenizer_model");
  auto tok = std::make_shared<const data::MlmSftTokenizer>(
      tokenizer_path, c.tokenizer.tokenizer_prompt_format.value_or("nemotron-h-aligned"));
  const std::string split = ds.split.value_or("969, 30, 1");
  data::SplitDatasets out;
  for (size_t k = 0; k < 3; ++k) {
    if (per_split && split_paths[k]->empty()) continue;
    const data::Blend blend = data::parse_blend(per_split ? *split_paths[k] : ds.data_path);
    if (blend.prefixes.size() > 1 && blend.weights.empty())
      throw UsageError(std::string("dataset.sft (--sft) with several ") + (per_split ? split_flags[k] : "--data-path") +
                       " files needs a weight before each (W1 FILE1 W2 FILE2 ...): Megatron-LM's SFTDataset takes its "
                       "sample count from a weighted blend, and fails on an unweighted one");
    // Each file's lines of this split: its share by dataset.split, or (per-split paths) all of them.
    std::vector<std::optional<data::DocumentRange>> ranges;
    for (const auto& path : blend.prefixes) {
      const int64_t lines = data::count_jsonl_lines(path);
      ranges.push_back(per_split ? std::optional<data::DocumentRange>(data::DocumentRange{0, lines})
                                 : data::split_document_ranges(split, lines)[k]);
    }
    if (!ranges[0] || sizes[k].value_or(0) <= 0) continue;
    auto sft = [&](size_t d, int64_t samples) {
      if (!ranges[d] || ranges[d]->size() == 0)
        throw UsageError("the SFT data '" + blend.prefixes[d] + "' leaves the " +
                         data::split_name(static_cast<data::Split>(k)) + " split no lines" +
                         (per_split ? std::string(" (an empty file)") : " (split " + split + ")"));
      data::MlmSftConfig sc;
      sc.seq_length = *ds.seq_length;
      sc.context_parallel_size = c.model.context_parallel_size;
      sc.num_samples = samples;
      return std::make_shared<const data::MlmSftDataset>(blend.prefixes[d], ranges[d]->begin, ranges[d]->end, tok, sc);
    };
    if (blend.weights.empty()) {
      out[k] = sft(0, *sizes[k]);
      continue;
    }
    const std::vector<double> weights = data::normalize_weights(blend.weights);
    const std::vector<int64_t> target = data::samples_per_dataset(weights, *sizes[k], 0.0);
    const std::vector<int64_t> built = data::samples_per_dataset(weights, *sizes[k], data::kMidLevelDatasetSurplus);
    std::vector<std::shared_ptr<const data::SampleDataset>> parts;
    int64_t size = 0;
    for (size_t d = 0; d < blend.prefixes.size(); ++d) parts.push_back(sft(d, built[d])), size += target[d];
    out[k] = std::make_shared<const data::BlendedDataset>(std::move(parts), weights, size);
  }
  if (!out[0])
    throw UsageError(per_split ? std::string("dataset.sft (--sft) with per-split paths needs --train-data-path")
                               : "the SFT data leaves the training split no lines (split " + split + ")");
  return out;
}

}  // namespace

RunData build_run_data(const config::ConfigContainer& c, const config::Derived& d) {
  const auto& ds = c.dataset;
  RunData r;
  r.seq_length = *ds.seq_length;
  r.vocab = d.padded_vocab_size;
  r.budget = {d.train_samples, d.valid_samples, d.test_samples};  // validate() computed them
  r.train_layout = {*c.train.micro_batch_size, d.data_parallel_size, d.num_microbatches};
  int64_t eval_mbs = c.validation.eval_micro_batch_size.value_or(*c.train.micro_batch_size);
  int64_t eval_gbs = c.validation.eval_global_batch_size.value_or(*c.train.global_batch_size);
  r.eval_layout = {eval_mbs, d.data_parallel_size, eval_gbs / (eval_mbs * d.data_parallel_size)};

  data::GptDatasetConfig gc;
  gc.seq_length = r.seq_length;
  gc.random_seed = ds.random_seed;
  gc.eod_id = d.eod_id;
  gc.reset_position_ids = ds.reset_position_ids;
  // Samples carry the documents only where Megatron's attention applies the mask (document_mask).
  gc.reset_attention_mask = document_mask(c).applied;
  gc.create_attention_mask = !ds.skip_getting_attention_mask_from_dataset;
  gc.eod_mask_loss = ds.eod_mask_loss;
  data::SplitSizes sizes = {r.budget.train, r.budget.valid, r.budget.test};
  if (ds.sft) {
    r.datasets = build_mlm_sft_datasets(c, sizes);
    return r;
  }
  if (ds.dataset_root) {
    r.datasets = build_sft_datasets(c, sizes);
    if (ds.dataloader_type.value_or("") == "batch")
      for (int k = 0; k < 3; ++k)
        if (const auto* sft = dynamic_cast<const data::SftDataset*>(r.datasets[static_cast<size_t>(k)].get())) {
          const auto& L = k == 0 ? r.train_layout : r.eval_layout;
          r.batch_samplers[static_cast<size_t>(k)] =
              data::BatchSampler{sft->rows(), L.micro_batch_size, L.data_parallel_size,
                                 L.micro_batch_size * L.data_parallel_size * L.num_microbatches,
                                 static_cast<uint64_t>(ds.random_seed), /*drop_last=*/k == 0};
        }
    return r;
  }
  if (ds.mock.value_or(false)) {
    auto corpus = std::make_shared<data::MockGptLowLevelDataset>(d.tokenizer_vocab_size, d.eod_id);
    r.datasets = data::build_mock_gpt_datasets(corpus, sizes, gc);
    return r;
  }
  auto open = [](const data::Blend& b) {
    data::SplitBlend out;
    // Token ids are checked against the vocabulary as batches are embedded (no full scan here).
    for (const auto& prefix : b.prefixes) out.corpora.push_back(std::make_shared<data::IndexedDataset>(prefix));
    out.weights = b.weights;
    return out;
  };
  // Megatron's blend_per_split: --train/valid/test-data-path, or Bridge's dataset.blend_per_split.
  std::array<std::optional<data::Blend>, 3> per_split;
  const std::vector<std::string>* paths[3] = {&ds.train_data_path, &ds.valid_data_path, &ds.test_data_path};
  for (int k = 0; k < 3; ++k)
    if (!paths[k]->empty()) per_split[k] = data::parse_blend(*paths[k]);
  if (!ds.blend_per_split.is_null()) {
    if (ds.blend_per_split.kind != config::Value::Kind::List || ds.blend_per_split.list.size() != 3)
      throw UsageError("dataset.blend_per_split must be a list of three blends (train, validation, test)");
    for (int k = 0; k < 3; ++k)
      if (!ds.blend_per_split.list[k].is_null()) per_split[k] = blend_from_value(ds.blend_per_split.list[k]);
  }
  if (per_split[0] || per_split[1] || per_split[2]) {
    if (!ds.data_path.empty() || !ds.blend.is_null())
      throw UsageError("per-split data paths cannot be combined with --data-path / dataset.blend");
    std::array<data::SplitBlend, 3> blends;
    for (int k = 0; k < 3; ++k)
      if (per_split[k]) blends[k] = open(*per_split[k]);
    r.datasets = data::build_gpt_datasets_per_split(blends, sizes, gc);
    return r;
  }
  data::Blend blend = ds.blend.is_null() ? data::parse_blend(ds.data_path) : blend_from_value(ds.blend);
  if (!ds.blend.is_null() && !ds.data_path.empty())
    throw UsageError("set either dataset.data_path (--data-path) or dataset.blend, not both");
  data::SplitBlend one = open(blend);
  r.datasets = data::build_gpt_datasets(one.corpora, one.weights, ds.split.value_or("969, 30, 1"), sizes, gc);
  return r;
}

MicroBatchData load_micro_batch(const data::SampleDataset& ds, const std::vector<int64_t>& indices, int64_t vocab) {
  MicroBatchData mb;
  mb.b = static_cast<int64_t>(indices.size());
  mb.sample_indices = indices;
  for (int64_t idx : indices) {
    if ((idx < 0 || idx >= ds.size()) && idx != data::kPadRow)  // the dataset refuses kPadRow if it has none
      throw Error("sample " + std::to_string(idx) + " is past the end of a dataset of " + std::to_string(ds.size()) +
                  " samples");
    data::GptSample s = ds.get(idx);
    if (vocab > 0)
      for (const auto* ids : {&s.tokens, &s.labels})
        for (int64_t id : *ids)
          if (id < 0 || id >= vocab)
            throw UsageError("sample " + std::to_string(idx) + " holds token id " + std::to_string(id) +
                             ", outside the model's vocabulary [0, " + std::to_string(vocab) +
                             "): the data was tokenized with another vocabulary than the run's tokenizer "
                             "(check --tokenizer-type / --vocab-size against the --data-path files)");
    if (mb.s == 0) mb.s = static_cast<int64_t>(s.tokens.size());
    mb.tokens.insert(mb.tokens.end(), s.tokens.begin(), s.tokens.end());
    mb.labels.insert(mb.labels.end(), s.labels.begin(), s.labels.end());
    mb.positions.insert(mb.positions.end(), s.position_ids.begin(), s.position_ids.end());
    mb.loss_mask.insert(mb.loss_mask.end(), s.loss_mask.begin(), s.loss_mask.end());
    mb.key_start.insert(mb.key_start.end(), s.key_start.begin(), s.key_start.end());
  }
  return mb;
}

MicroBatchData context_parallel_chunks(const MicroBatchData& mb, int64_t cp_rank, int64_t cp_size) {
  const int64_t n = 2 * cp_size;
  if (mb.s % n != 0)
    throw UsageError("context parallelism over " + std::to_string(cp_size) + " ranks splits each sequence into " +
                     std::to_string(n) + " chunks: the sequence length " + std::to_string(mb.s) +
                     " is not a multiple of it");
  const bool documents = !mb.key_start.empty();
  // Each row's places this rank keeps, in its order: the row's (or each document's) chunks
  // cp_rank and n - 1 - cp_rank.
  std::vector<int64_t> places;
  auto keep = [&](int64_t first, int64_t length) {
    const int64_t c = length / n;
    for (const int64_t chunk : {cp_rank, n - 1 - cp_rank})
      for (int64_t i = 0; i < c; ++i) places.push_back(first + chunk * c + i);
  };
  for (int64_t r = 0; r < mb.b; ++r) {
    if (!documents) {
      keep(0, mb.s);
      continue;
    }
    const int32_t* ks = mb.key_start.data() + r * mb.s;
    for (int64_t first = 0; first < mb.s;) {
      int64_t end = first + 1;
      while (end < mb.s && ks[end] != end) ++end;  // (a document starts where its first key is itself)
      if ((end - first) % n != 0)
        throw UsageError("context parallelism over " + std::to_string(cp_size) + " ranks splits each packed sequence "
                         "into " + std::to_string(n) + " chunks: a sequence of " + std::to_string(end - first) +
                         " tokens (row " + std::to_string(r) + ", from token " + std::to_string(first) +
                         ") is not a multiple of it; set dataset.pad_seq_to_mult to a multiple of " + std::to_string(n) +
                         " (Megatron-Bridge pads each packed sequence to it)");
      keep(first, end - first);
      first = end;
    }
  }
  MicroBatchData out;
  out.b = mb.b, out.s = mb.s / cp_size;
  out.sample_indices = mb.sample_indices;
  auto take = [&](const auto& in, auto& dst) {
    if (in.empty()) return;
    for (int64_t r = 0; r < mb.b; ++r)
      for (int64_t i = 0; i < out.s; ++i)
        dst.push_back(in[static_cast<size_t>(r * mb.s + places[static_cast<size_t>(r * out.s + i)])]);
  };
  take(mb.tokens, out.tokens), take(mb.labels, out.labels), take(mb.positions, out.positions);
  take(mb.loss_mask, out.loss_mask);
  if (documents) {
    take(mb.key_start, out.key_start);
    for (const int64_t p : places) out.cp_places.push_back(static_cast<int32_t>(p));
  }
  return out;
}

namespace {

std::vector<int64_t> micro_batch_indices(const data::MicroBatchLayout& layout, int64_t consumed, int64_t microbatch,
                                         int64_t dp_rank) {
  const int64_t first = data::microbatch_first_sample(layout, consumed, microbatch, dp_rank);
  std::vector<int64_t> idx;
  for (int64_t k = 0; k < layout.micro_batch_size; ++k) idx.push_back(first + k);
  return idx;
}

}  // namespace

std::vector<int64_t> train_sample_indices(const RunData& d, int64_t consumed, int64_t microbatch, int64_t dp_rank) {
  if (const auto& s = d.batch_samplers[0]) return s->micro_batch(consumed, microbatch, dp_rank);
  return micro_batch_indices(d.train_layout, consumed, microbatch, dp_rank);
}

std::vector<int64_t> eval_sample_indices(const RunData& d, int split, int64_t consumed, int64_t microbatch,
                                         int64_t dp_rank) {
  if (split != 1 && split != 2) throw Error("eval_sample_indices: split " + std::to_string(split));
  if (const auto& s = d.batch_samplers[static_cast<size_t>(split)]) return s->micro_batch(consumed, microbatch, dp_rank);
  return micro_batch_indices(d.eval_layout, consumed, microbatch, dp_rank);
}

int64_t eval_round_samples(const RunData& d, int64_t eval_iters) {
  const auto& L = d.eval_layout;
  return eval_iters * L.micro_batch_size * L.data_parallel_size * L.num_microbatches;
}

namespace {

// Evaluations during training at iterations (from, to], as the loop runs them, plus the final one.
int64_t evaluations_left(const config::ConfigContainer& c, int64_t from, int64_t to) {
  int64_t n = 1;
  if (const auto& every = c.validation.eval_interval; every && *every > 0) {
    const int64_t first = std::max(c.validation.start_eval_at_iter.value_or(0), from + 1);
    if (first <= to) n += to / *every - (first - 1) / *every;
  }
  return n;
}

}  // namespace

void check_data_covers_run(const RunData& d, const config::ConfigContainer& c, int64_t train_iters,
                           const DataPosition& from) {
  const std::string source = from.state_file.empty() ? "" : " (from '" + from.state_file + "')";
  if (const auto& train = d.datasets[0]; train && from.iteration < train_iters && from.consumed_train >= train->size())
    throw UsageError("consumed_train_samples " + std::to_string(from.consumed_train) + source +
                     " is at or past the end of the training dataset (" + std::to_string(train->size()) +
                     " samples): no samples left to consume. The checkpoint was not written by a run on this data");
  const int64_t eval_iters = c.validation.eval_iters;
  if (eval_iters <= 0) return;
  const int64_t round = eval_round_samples(d, eval_iters);
  const std::string per_round = std::to_string(eval_iters) + " iterations (validation.eval_iters / --eval-iters) of " +
                                std::to_string(round / eval_iters) + " samples";
  // Batch-sampled splits (Bridge's fine-tuning) are read cyclically: they cannot run out.
  if (const auto& valid = d.datasets[1]; valid && !d.batch_samplers[1]) {
    if (from.consumed_valid >= valid->size())
      throw UsageError("consumed_valid_samples " + std::to_string(from.consumed_valid) + source +
                       " is at or past the end of the validation dataset (" + std::to_string(valid->size()) +
                       " samples). The checkpoint was not written by a run on this data");
    const int64_t evals = evaluations_left(c, from.iteration, train_iters);
    const int64_t needed = from.consumed_valid + evals * round;
    if (needed > valid->size()) {
      std::string why = "the validation dataset has " + std::to_string(valid->size()) + " samples, but this run's " +
                        std::to_string(evals) + " evaluation(s) of " + per_round + " read up to sample " +
                        std::to_string(needed);
      if (from.consumed_valid > 0)
        why += " (" + std::to_string(from.consumed_valid) + " of them read before" + source + ")";
      if (!c.validation.eval_interval)
        why += "; without validation.eval_interval / --eval-interval the split is sized for no evaluation during "
               "training, yet the end of training evaluates it";
      throw UsageError(why + ". Lower validation.eval_iters / --eval-iters, set validation.eval_interval / "
                             "--eval-interval, or give the validation split more data (dataset.split / --split)");
    }
  }
  if (const auto& test = d.datasets[2]; test && !d.batch_samplers[2] && round > test->size())
    throw UsageError("the test dataset has " + std::to_string(test->size()) + " samples, but the end of training's "
                     "test evaluation of " + per_round + " reads " + std::to_string(round) +
                     ". Lower validation.eval_iters / --eval-iters or give the test split more data (dataset.split / "
                     "--split)");
}

}  // namespace laoyao::train
