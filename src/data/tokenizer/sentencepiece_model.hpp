// The SentencePiece ModelProto (sentencepiece_model.proto), parsed from the .model file's
// protobuf wire format by hand (only the fields encoding needs), and its normalizer: the
// precompiled charsmap (a Darts double-array trie over UTF-8 plus a table of replacement
// strings), whitespace cleanup, the dummy prefix and "▁" escaping.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace laoyao::tokenizer {

struct SentencePieceModelProto {
  enum PieceType : int { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };
  enum ModelType : int { kUnigram = 1, kBpe = 2, kWord = 3, kChar = 4 };
  struct Piece {
    std::string piece;
    float score = 0.0f;
    int type = kNormal;
  };
  std::vector<Piece> pieces;
  // TrainerSpec
  int model_type = kUnigram;
  bool byte_fallback = false;
  bool treat_whitespace_as_suffix = false;
  int unk_id = 0, bos_id = 1, eos_id = 2, pad_id = -1;
  std::string unk_surface = " \xE2\x81\x87 ";
  // NormalizerSpec
  std::string normalizer_name;
  std::string precompiled_charsmap;
  bool add_dummy_prefix = true;
  bool remove_extra_whitespaces = true;
  bool escape_whitespaces = true;
};

// Parses a serialized ModelProto; a malformed one is a UsageError naming `what`.
SentencePieceModelProto parse_sentencepiece_model(std::string_view bytes, const std::string& what);

// SentencePiece's Normalizer::Normalize for the given spec; `user_defined` pieces are copied
// through unnormalized (longest match first), as SentencePiece's prefix matcher does.
class SentencePieceNormalizer {
 public:
  SentencePieceNormalizer(const SentencePieceModelProto& model, std::vector<std::string> user_defined,
                          const std::string& what);
  std::string normalize(std::string_view input) const;

 private:
  // The normalized text for the longest rule matching a prefix of `input`, and its length.
  std::pair<std::string_view, size_t> normalize_prefix(std::string_view input) const;

  bool add_dummy_prefix_, remove_extra_whitespaces_, escape_whitespaces_, suffix_;
  std::vector<uint32_t> trie_;     // Darts double-array units
  std::string normalized_;         // NUL-separated replacement strings
  std::vector<std::string> user_defined_;  // longest first
};

// Length of the longest user-defined symbol that prefixes `s` (0 if none).
size_t longest_prefix_match(const std::vector<std::string>& longest_first, std::string_view s);

}  // namespace laoyao::tokenizer
