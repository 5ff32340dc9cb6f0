// BERT's WordPiece tokenizer, giving the ids Hugging Face's (slow)
// BertTokenizer gives on the same vocab.txt:
//   1. the special tokens [PAD] [UNK] [CLS] [SEP] [MASK] are cut out of the
//      raw text first and never split;
//   2. lower-casing (optional) character by character, full case mapping;
//   3. clean-up: NUL, U+FFFD and control characters (category C*, except
//      tab/CR/LF) dropped, whitespace (Zs, tab, CR, LF) becomes a space;
//   4. CJK ideographs become single words; NFC; split on whitespace;
//   5. accent stripping (NFD, drop Mn), by default when lower-casing;
//   6. every punctuation character (ASCII 33-47, 58-64, 91-96, 123-126 and
//      Unicode P*) becomes its own word;
//   7. WordPiece: greedy longest-match-first with "##" continuations; a word
//      longer than 100 code points or with no match becomes [UNK].
// With the jieba pre-tokenizer it gives the ids of Hugging Face's
// RoFormerTokenizer instead: after the special tokens are cut out and the
// text lower-cased (when lower-casing), jieba (data/jieba.h, no HMM) splits
// it into words; a word that is itself in the vocab is one token, every
// other word goes through steps 2-7 above on its own.
// Unicode properties come from utf8proc. Thread-safe: all methods are const.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "data/jieba.h"
#include "data/vocab.h"

namespace roformer::data {

// What splits the text into words before the vocab and WordPiece see it.
enum class PreTokenizer { none, jieba };
PreTokenizer parse_pre_tokenizer(std::string_view name);  // "none" | "jieba"
std::string_view pre_tokenizer_name(PreTokenizer p);

struct TokenizerOptions {
  bool lowercase = true;
  PreTokenizer pre_tokenizer = PreTokenizer::none;
  std::string jieba_dict;  // jieba's dict.txt; "" = Jieba::default_dict_path()
  // nullopt: strip accents exactly when lower-casing (BERT's default).
  std::optional<bool> strip_accents;
  bool tokenize_chinese_chars = true;
  int max_input_chars_per_word = 100;

  bool strips_accents() const { return strip_accents.value_or(lowercase); }
};

// What makes two tokenizers give the same ids: recorded in every shard.
struct TokenizerIdentity {
  std::string vocab_hash;
  int64_t vocab_size = 0;
  bool lowercase = true;
  bool strip_accents = true;
  bool tokenize_chinese_chars = true;

  bool operator==(const TokenizerIdentity&) const = default;
  // e.g. "vocab 5f0c...(30522 pieces), lowercase=1, strip_accents=1, cjk=1"
  std::string describe() const;
};

struct Encoding {
  std::vector<int32_t> input_ids;
  std::vector<int32_t> token_type_ids;  // 0 for [CLS] A [SEP], 1 for B [SEP]
};

class Tokenizer {
 public:
  Tokenizer(std::shared_ptr<const Vocab> vocab, TokenizerOptions options = {});
  // Loads the vocab from `vocab_path`.
  Tokenizer(const std::string& vocab_path, TokenizerOptions options = {});

  // Ids of `text` without [CLS]/[SEP], appended to `out`.
  void encode_ids(std::string_view text, std::vector<int32_t>& out) const;
  std::vector<int32_t> encode_ids(std::string_view text) const;
  // WordPiece strings of `text`.
  std::vector<std::string> tokenize(std::string_view text) const;
  // Words after the basic (pre-WordPiece) stage.
  std::vector<std::string> basic_tokenize(std::string_view text) const;
  // The jieba words of `text` (lower-cased when lower-casing; special tokens
  // cut out first and kept; whitespace words dropped); the text as one word
  // without a pre-tokenizer.
  std::vector<std::string> pre_tokenize(std::string_view text) const;

  // [CLS] text [SEP] (and pair [SEP]); max_length > 0 truncates longest-first
  // (one token at a time from the longer side, from the second on ties),
  // counting the special tokens.
  Encoding encode(std::string_view text, std::optional<std::string_view> pair = std::nullopt,
                  int64_t max_length = 0) const;

  // Back to text: pieces joined by spaces, "##" continuations glued, then
  // BERT's clean-up of spaces before punctuation and contractions.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = true,
                     bool clean_up_spaces = true) const;

  const Vocab& vocab() const { return *vocab_; }
  std::shared_ptr<const Vocab> vocab_ptr() const { return vocab_; }
  const TokenizerOptions& options() const { return options_; }
  TokenizerIdentity identity() const;
  // "none", or "jieba (dict <hash>)": what prepare's fingerprint records
  // beside identity().
  std::string pre_tokenizer_identity() const;
  // The segmenter, or null without the jieba pre-tokenizer.
  const Jieba* jieba() const { return jieba_.get(); }

 private:
  template <class Emit>
  void basic_words(std::string_view segment, Emit&& emit) const;
  template <class Emit>
  void basic_chunk(std::string_view chunk, Emit&& emit) const;
  void wordpiece(std::string_view word, std::vector<int32_t>& out) const;
  // RoFormerTokenizer's rule on text without special tokens.
  void encode_jieba(std::string_view text, std::vector<int32_t>& out) const;
  // Lower-cased (when lower-casing) text cut by jieba into segments.
  void jieba_segments(std::string_view text, std::vector<std::string_view>& out) const;
  template <class Emit>
  void split_specials(std::string_view text, Emit&& emit) const;

  std::shared_ptr<const Vocab> vocab_;
  TokenizerOptions options_;
  std::shared_ptr<const Jieba> jieba_;
};

}  // namespace roformer::data
