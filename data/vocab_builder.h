// Learns a WordPiece vocabulary from a corpus, the way Hugging Face's
// tokenizers WordPieceTrainer does it: count the words after BERT's basic
// tokenization, start from their characters (word-initial "c" and
// continuation "##c"), then repeatedly merge the most frequent adjacent pair
// of pieces into a new piece until the vocabulary is full. The special tokens
// come first: [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4.
//
// With the jieba pre-tokenizer (RoFormer's Chinese tokenization) it builds a
// word + character vocabulary, as the WoBERT / RoFormer Chinese vocabularies
// are made: every character seen, then the most frequent jieba words, then
// WordPiece pieces for the words that stay outside (English, numbers).
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
  // Word + character vocabularies: the share of the pieces left after the
  // characters that goes to WordPiece pieces (the rest: whole words).
  double wordpiece_fraction = 0.1;
};

using WordCounts = std::unordered_map<std::string, int64_t>;

// Counts the words of `files` after basic tokenization (files in parallel).
WordCounts count_words(const std::vector<std::string>& files, const TextReadOptions& read,
                       const TokenizerOptions& tokenizer, int threads = 0);

// The pieces in id order, specials first. Deterministic for given counts.
std::vector<std::string> build_wordpiece_vocab(const WordCounts& counts,
                                               const VocabBuilderOptions& options);

// Counts the pre-tokenizer's words of `files` (Tokenizer::pre_tokenize:
// lower-cased jieba words, special tokens and whitespace left out).
WordCounts count_pre_tokens(const std::vector<std::string>& files, const TextReadOptions& read,
                            const TokenizerOptions& tokenizer, int threads = 0);

// A word + character vocabulary from jieba word counts, in id order: the
// specials; every character of the words after BERT's basic tokenization,
// most frequent first; the most frequent words of two or more characters
// seen at least min_frequency times; WordPiece pieces learned on the basic
// words of the words not kept (wordpiece_fraction of what the characters
// leave); more words if room remains. Deterministic for given counts.
std::vector<std::string> build_word_vocab(const WordCounts& words,
                                          const TokenizerOptions& tokenizer,
                                          const VocabBuilderOptions& options);

}  // namespace roformer::data
