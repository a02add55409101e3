#include "data/tokenizer/tokenizer_factory.hpp"

#include "core/error.hpp"
#include "core/hf_hub.hpp"
#include "core/text.hpp"
#include "data/tokenizer/gpt2_bpe_tokenizer.hpp"
#include "data/tokenizer/hf_tokenizer.hpp"
#include "data/tokenizer/sentencepiece_tokenizer.hpp"

namespace laoyao::tokenizer {

const std::vector<std::string>& supported_tokenizer_types() {
  static const std::vector<std::string> kTypes = {
      "GPT2BPETokenizer",          "HuggingFaceTokenizer", "SentencePieceTokenizer",
      "GPTSentencePieceTokenizer", "Llama2Tokenizer",      "NullTokenizer", "SFTTokenizer"};
  return kTypes;
}

std::unique_ptr<Tokenizer> make_tokenizer(const TokenizerSpec& s) {
  auto need = [&](const std::string& value, const char* flag) {
    if (value.empty()) throw UsageError("--tokenizer-type " + s.type + " needs " + flag);
  };
  if (s.type == "GPT2BPETokenizer") {
    need(s.vocab_file, "--vocab-file (GPT-2's vocab.json)");
    need(s.merge_file, "--merge-file (GPT-2's merges.txt)");
    return std::make_unique<GPT2BPETokenizer>(s.vocab_file, s.merge_file);
  }
  // SFTTokenizer (pretrain_gpt.py --sft): a Hugging Face tokenizer whose vocabulary is len(tokenizer)
  // and EOD its eos_token, as the Hugging Face type's; its conversations are data/mlm_sft_dataset's.
  if (s.type == "HuggingFaceTokenizer" || s.type == "SFTTokenizer") {
    need(s.model, "--tokenizer-model (a directory with tokenizer.json, or the file itself)");
    // A hub id (the recipes name "Qwen/Qwen3-8B") is read from the local Hugging Face cache.
    return std::make_unique<HuggingFaceTokenizer>(resolve_hf_path(s.model, "--tokenizer-model"));
  }
  if (s.type == "SentencePieceTokenizer" || s.type == "GPTSentencePieceTokenizer" || s.type == "Llama2Tokenizer") {
    need(s.model, "--tokenizer-model (a SentencePiece .model file)");
    const SentencePieceFlavor flavor = s.type == "SentencePieceTokenizer" ? SentencePieceFlavor::kMegatron
                                       : s.type == "Llama2Tokenizer"      ? SentencePieceFlavor::kLlama2
                                                                          : SentencePieceFlavor::kGPT;
    return std::make_unique<SentencePieceTokenizer>(s.model, flavor, s.vocab_extra_ids);
  }
  if (s.type == "NullTokenizer") {
    if (!s.vocab_size) throw UsageError("--tokenizer-type NullTokenizer needs --vocab-size");
    return std::make_unique<NullTokenizer>(*s.vocab_size, s.null_semantics, s.null_eod_id);
  }
  static const std::vector<std::string> kKnownUnsupported = {
      "BertWordPieceLowerCase", "BertWordPieceCase", "TikTokenizer", "MultimodalTokenizer",
      "HuggingFaceTokenizerWithChatTemplate"};
  for (const auto& k : kKnownUnsupported) {
    if (s.type == k) {
      throw UsageError("--tokenizer-type " + s.type + " is a Megatron tokenizer laoyao does not support (supported: " +
                       join(supported_tokenizer_types(), ", ") + ")");
    }
  }
  throw UsageError("unknown --tokenizer-type '" + s.type + "'" + did_you_mean(s.type, supported_tokenizer_types()) +
                   " (supported: " + join(supported_tokenizer_types(), ", ") + ")");
}

}  // namespace laoyao::tokenizer
