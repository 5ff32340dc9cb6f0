// Learns a WordPiece vocabulary from a corpus, the way Hugging Face's
// tokenizers WordPieceTrainer does it: count the words after BERT's basic
// tokenization, start from their characters (word-initial "c" and
// continuation "##c"), then repeatedly merge the most frequent adjacent pair
// of pieces into a new piece until the vocabulary is full. The special tokens
// come first: [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "data/text_reader.h"
#include "data/tokenizer.h"

namespace roformer::data {

struct VocabBuilderOptions {
  int64_t vocab_size = 30522;
  int64_t min_frequency = 2;      // a pair seen fewer times is never merged
  int64_t limit_alphabet = 1000;  // most frequent characters kept; rarer ones become [UNK]
  int threads = 0;                // 0: all cores
};

using WordCounts = std::unordered_map<std::string, int64_t>;

// Counts the words of `files` after basic tokenization (files in parallel).
WordCounts count_words(const std::vector<std::string>& files, const TextReadOptions& read,
                       const TokenizerOptions& tokenizer, int threads = 0);

// The pieces in id order, specials first. Deterministic for given counts.
std::vector<std::string> build_wordpiece_vocab(const WordCounts& counts,
                                               const VocabBuilderOptions& options);

}  // namespace roformer::data
