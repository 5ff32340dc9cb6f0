// Sequence packing as BERT pretraining does it without next-sentence
// prediction: every sequence is [CLS] t1 ... tk [SEP] with the t's consecutive
// tokens of ONE document and k <= max_seq_len - 2. A document of n tokens
// gives ceil(n / (max_seq_len - 2)) sequences: full ones, then the remainder.
// Nothing is stored: the packing for a given max_seq_len is computed from the
// shards' document offsets, so every stage of a schedule reads the same shards
// at its own length.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "data/shard.h"

namespace roformer::data {

// A list of opened shards seen as one corpus (documents in shard order).
using ShardSet = std::vector<std::shared_ptr<const Shard>>;

// Opens every shard, each verified against `expected` (nullptr: against the
// first shard, so a mixed set is refused too).
ShardSet open_shards(const std::vector<std::string>& paths,
                     const TokenizerIdentity* expected = nullptr);

class Packing {
 public:
  Packing(ShardSet shards, int64_t max_seq_len);

  int64_t max_seq_len() const { return max_seq_len_; }
  // Number of sequences in one epoch.
  int64_t size() const { return int64_t(first_sequence_.back()); }
  int64_t num_tokens() const { return num_tokens_; }

  // The corpus tokens of sequence i (without [CLS]/[SEP]).
  std::span<const uint32_t> sequence(int64_t i) const;
  // Where sequence i lives: global document index and its token range there.
  struct Location {
    int64_t document;
    uint64_t begin, end;  // offsets within the document
  };
  Location locate(int64_t i) const;

 private:
  ShardSet shards_;
  int64_t max_seq_len_;
  int64_t num_tokens_ = 0;
  // Per global document: its shard, its index in the shard, and the index of
  // its first sequence; first_sequence_ has one extra entry (the total).
  std::vector<uint32_t> doc_shard_;
  std::vector<uint64_t> doc_local_;
  std::vector<uint64_t> first_sequence_;
};

}  // namespace roformer::data
