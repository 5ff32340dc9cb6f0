// Chinese word segmentation as Python jieba 0.42 does it with
// `jieba.cut(text, HMM=False)`, the segmentation Hugging Face's
// RoFormerTokenizer runs before WordPiece:
//   1. the text is cut into blocks of "han" characters (U+4E00-U+9FD5, ASCII
//      letters and digits, + # & . _ % -) and the rest; outside the blocks
//      every character is a segment of its own ("\r\n" stays together);
//   2. in a block, every dictionary word starting at each position forms a
//      DAG, and the route maximising the sum of log(freq / total) wins (ties:
//      the longer word); characters no word covers count with frequency 1;
//   3. runs of single ASCII letters and digits on the route are joined.
// The dictionary is jieba's dict.txt ("word freq [tag]" per line), as Debian's
// python3-jieba ships it. Thread-safe: cut() is const.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace roformer::data {

class Jieba {
 public:
  // Reads a jieba dict.txt; InputError naming the file and line when it is
  // missing or malformed. Loaded dictionaries are shared: the same path is
  // read once per process.
  static std::shared_ptr<const Jieba> load(const std::string& path);
  // The dictionary when none is named: $ROFORMER_JIEBA_DICT, else Debian's
  // python3-jieba copy; InputError when neither exists.
  static std::string default_dict_path();
  // From dict.txt text; `source` names it in error messages.
  static Jieba from_text(std::string_view text, std::string source = "<memory>");

  // Appends the segments of `text` (byte ranges of `text`, in order, covering
  // it) to `out`. `text` must be valid UTF-8.
  void cut(std::string_view text, std::vector<std::string_view>& out) const;
  std::vector<std::string> cut(std::string_view text) const;

  // FNV-1a of the dictionary file: what makes two segmenters equal.
  const std::string& hash() const { return hash_; }
  const std::string& source() const { return source_; }
  int64_t words() const { return words_; }
  // True when the segmenter would look `cp` up in the dictionary.
  static bool is_han(char32_t cp) {
    return (cp >= 0x4E00 && cp <= 0x9FD5) || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') ||
           (cp >= '0' && cp <= '9') || cp == '+' || cp == '#' || cp == '&' || cp == '.' ||
           cp == '_' || cp == '%' || cp == '-';
  }

 private:
  Jieba() = default;
  // Child of trie node `node` along `cp`, or -1.
  int32_t child(int32_t node, char32_t cp) const;
  int32_t add_child(int32_t node, char32_t cp);
  void grow();
  void cut_block(std::string_view text, const uint32_t* offsets, const char32_t* cps, size_t n,
                 std::vector<std::string_view>& out) const;

  // The prefix dictionary as a trie: node 0 is the root; a node's score is
  // log(freq) - log(total) for a dictionary word, NaN for a bare prefix.
  std::vector<double> score_;
  // Open-addressing table (node << 21 | cp) -> child node.
  std::vector<uint64_t> keys_;
  std::vector<int32_t> values_;
  size_t used_ = 0;
  double unknown_score_ = 0;  // log(1) - log(total)
  int64_t words_ = 0;
  std::string hash_, source_;
};

}  // namespace roformer::data
