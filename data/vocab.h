// A WordPiece vocabulary: `vocab.txt`, one piece per line, the line number is
// the id, continuation pieces start with "##". The five BERT special tokens
// must be present.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace roformer::data {

inline constexpr std::string_view kPadToken = "[PAD]";
inline constexpr std::string_view kUnkToken = "[UNK]";
inline constexpr std::string_view kClsToken = "[CLS]";
inline constexpr std::string_view kSepToken = "[SEP]";
inline constexpr std::string_view kMaskToken = "[MASK]";
// In the order a built vocabulary places them (ids 0..4).
inline constexpr std::string_view kSpecialTokens[] = {kPadToken, kUnkToken, kClsToken, kSepToken,
                                                      kMaskToken};

struct SpecialIds {
  int32_t pad = -1, unk = -1, cls = -1, sep = -1, mask = -1;
};

class Vocab {
 public:
  // Reads a vocab.txt; throws InputError naming the file (and line) when it is
  // missing, empty, not UTF-8, or lacks one of the special tokens.
  static Vocab load(const std::string& path);
  // From pieces in id order; `source` names them in error messages.
  static Vocab from_tokens(std::vector<std::string> tokens, std::string source = "<memory>");

  // Writes one piece per line (atomically: temp file + rename).
  void save(const std::string& path) const;

  int32_t size() const { return int32_t(tokens_.size()); }
  // Id of `token`, or -1.
  int32_t find(std::string_view token) const {
    auto it = ids_.find(token);
    return it == ids_.end() ? -1 : it->second;
  }
  const std::string& token(int32_t id) const;
  const std::vector<std::string>& tokens() const { return tokens_; }
  const SpecialIds& special() const { return special_; }
  bool is_special(int32_t id) const {
    return id == special_.pad || id == special_.unk || id == special_.cls || id == special_.sep ||
           id == special_.mask;
  }
  // True for "##..." pieces (a word continues).
  bool is_continuation(int32_t id) const { return continuation_[size_t(id)] != 0; }
  // FNV-1a over the pieces (the file's content up to line endings): the
  // vocabulary's identity that shards record.
  const std::string& hash() const { return hash_; }
  const std::string& source() const { return source_; }
  // Longest piece in bytes, "##" excluded: WordPiece never looks further.
  size_t max_piece_bytes() const { return max_piece_bytes_; }

 private:
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  void index();

  std::vector<std::string> tokens_;
  std::unordered_map<std::string, int32_t, Hash, std::equal_to<>> ids_;
  std::vector<uint8_t> continuation_;
  SpecialIds special_;
  std::string hash_;
  std::string source_;
  size_t max_piece_bytes_ = 0;
};

}  // namespace roformer::data
