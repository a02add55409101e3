// SentencePiece tokenizers from a `.model` file, in Megatron's three flavours:
//   kMegatron ("SentencePieceTokenizer"): Megatron adds <CLS> <SEP> <EOD> <MASK> and the pad/bos/
//     eos pieces as special tokens (appending the ones the model lacks to the vocab), splits the
//     text on them first, and eod is <EOD>'s id.
//   kGPT ("GPTSentencePieceTokenizer"): plain encode_as_ids; eod = the model's eos_id.
//   kLlama2 ("Llama2Tokenizer"): [bos_id] + encode; eod = eos_id.
// The encoder is SentencePiece's own: its normalizer, then BPE (merge the adjacent pair whose
// concatenation is the highest-scoring piece, leftmost first; unused pieces re-split) or unigram
// (Viterbi over the piece lattice, unknown characters at min_score - 10), consecutive unknowns
// merged into one <unk>, and byte fallback to <0xXX> pieces.
#pragma once
#include <memory>
#include <string>
#include <unordered_map>

#include "data/tokenizer/sentencepiece_model.hpp"
#include "data/tokenizer/tokenizer.hpp"

namespace laoyao::tokenizer {

enum class SentencePieceFlavor { kMegatron, kGPT, kLlama2 };

class SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(const std::string& model_file,
                         SentencePieceFlavor flavor = SentencePieceFlavor::kGPT,
                         int vocab_extra_ids = 0);
  static std::unique_ptr<SentencePieceTokenizer> from_bytes(std::string_view model_proto,
                                                            SentencePieceFlavor flavor = SentencePieceFlavor::kGPT,
                                                            int vocab_extra_ids = 0);
  ~SentencePieceTokenizer() override;

  std::vector<TokenId> tokenize(std::string_view text) const override;
  std::string detokenize(std::span<const TokenId> ids) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  TokenId eod() const override { return eod_; }
  std::string name() const override;

  // SentencePieceProcessor::EncodeAsIds / EncodeAsPieces (no special-token handling).
  std::vector<TokenId> encode_as_ids(std::string_view text) const;
  std::vector<std::string> encode_as_pieces(std::string_view text) const;
  // SentencePieceProcessor::DecodeIds.
  std::string decode_ids(std::span<const TokenId> ids) const;
  const SentencePieceModelProto& model() const { return model_; }

 private:
  SentencePieceTokenizer() = default;
  void init(std::string_view bytes, const std::string& what, SentencePieceFlavor flavor, int extra_ids);
  struct Piece {
    std::string_view text;
    TokenId id;
  };
  std::vector<Piece> encode_pieces(const std::string& normalized) const;
  std::vector<Piece> encode_bpe(const std::string& normalized) const;
  std::vector<Piece> encode_unigram(const std::string& normalized) const;
  TokenId piece_to_id(std::string_view piece) const;  // unk_id when absent
  bool is_unused(TokenId id) const;

  SentencePieceModelProto model_;
  SentencePieceFlavor flavor_ = SentencePieceFlavor::kGPT;
  std::unique_ptr<SentencePieceNormalizer> normalizer_;
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  using Map = std::unordered_map<std::string, TokenId, Hash, std::equal_to<>>;
  Map pieces_;    // normal, user-defined, unused (what the encoders may produce)
  Map reserved_;  // control, unknown, byte
  std::vector<std::string> user_defined_;              // longest first
  TokenId unk_id_ = 0;
  TokenId byte_ids_[256];
  float min_score_ = 0, max_score_ = 0;
  size_t max_piece_bytes_ = 0;
  // Megatron's added special tokens (kMegatron): content -> id, in insertion order.
  std::vector<std::pair<std::string, TokenId>> specials_;
  std::unordered_map<TokenId, std::string> special_by_id_;
  int64_t vocab_size_ = 0;
  TokenId eod_ = -1;
};

}  // namespace laoyao::tokenizer
