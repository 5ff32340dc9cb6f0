// The pretraining data loader: packed sequences (packing.h) in a shuffled
// order per epoch, MLM-masked (masking.h), split among data-parallel ranks,
// padded into micro-batches, produced by a background thread.
//
// Cursor. The loader walks one global stream of examples: epoch e is a
// permutation of the packing's sequences drawn from (seed, e, max_seq_len).
// Every call to next() on every rank consumes world_size * batch_size
// positions of that stream; rank r takes positions [r*B, (r+1)*B) of them. A
// micro-batch that runs past the end of an epoch continues into the next one,
// so no example is dropped and each epoch's examples are read exactly once
// across all ranks. The state {epoch, index} is the position of the next
// global micro-batch: the same on every rank, saved in checkpoints.
//
// Masks are drawn from PhiloxStream(seed, subsequence_of(epoch, sequence_id)),
// so they depend neither on threads nor on batch layout nor on world size.
//
// Stages. A new stage builds a new Loader (its own max_seq_len and batch
// size) from the previous stage's state(). The sequence ids of one packing
// mean nothing in another, so a state taken at a different max_seq_len starts
// the next epoch (epoch + 1, index 0; or the same epoch if its index was 0).
// A state taken at the same max_seq_len resumes exactly, even with another
// batch size or world size (the stream is the same; only its slicing differs).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "data/masking.h"
#include "data/packing.h"

namespace roformer::data {

// Sequence lengths of a batch are padded up to a multiple of this.
constexpr int64_t kSequenceBucket = 32;

struct LoaderOptions {
  int64_t max_seq_len = 128;
  int64_t batch_size = 8;  // rows per micro-batch on this rank
  uint64_t seed = 0;
  int rank = 0;
  int world_size = 1;
  bool shuffle = true;  // false: sequences in corpus order (evaluation)
  bool mask = true;     // false: labels all -100, ids untouched
  MaskingOptions masking;
  int prefetch_batches = 2;  // 0: build batches in next() on the caller's thread
};

// Where the global stream stands. Plain integers, saved in checkpoints.
struct LoaderState {
  uint64_t epoch = 0;
  uint64_t index = 0;          // position within the epoch's permutation
  int64_t max_seq_len = 0;     // of the packing the index refers to (0: none yet)
  uint64_t num_sequences = 0;  // size of that packing, to detect a changed corpus
  bool operator==(const LoaderState&) const = default;
};

// Row-major [batch_size, seq_len]; rows padded with [PAD] to the longest row,
// bucketed (bucketed_length).
struct Batch {
  int64_t batch_size = 0, seq_len = 0;
  std::vector<int32_t> input_ids, token_type_ids, attention_mask, labels;
  int64_t num_masked = 0;  // labels != -100
  int64_t num_tokens = 0;  // attention_mask == 1
  // Which example each row is: its epoch and its sequence id in the packing.
  std::vector<uint64_t> epochs;
  std::vector<int64_t> sequence_ids;
};

// The padded length of a batch whose longest row is `longest`: rounded up to a
// multiple of `multiple`, but never past max(longest, max_len). Batches then
// come in a few shapes, so the kernels' per-shape caches (oneDNN primitives)
// and the allocator's size bins stay small.
int64_t bucketed_length(int64_t longest, int64_t max_len, int64_t multiple = kSequenceBucket);

class Loader {
 public:
  Loader(ShardSet shards, std::shared_ptr<const Vocab> vocab, LoaderOptions options,
         LoaderState start = {});
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // The next micro-batch of this rank. Rethrows errors from the producer.
  Batch next();
  // The position after the last batch next() returned.
  LoaderState state() const;
  // Continue from `state` (see the header comment for other max_seq_lens).
  void restore(const LoaderState& state);

  int64_t num_sequences() const { return packing_.size(); }
  // next() calls that make up one epoch (rounded up).
  int64_t batches_per_epoch() const;
  const Packing& packing() const { return packing_; }
  const LoaderOptions& options() const { return options_; }

  // The batch of this rank at `at`, without moving the cursor (pure).
  Batch batch_at(const LoaderState& at) const;
  // The state one next() after `at`.
  LoaderState advance(const LoaderState& at) const;

 private:
  LoaderState normalize(const LoaderState& s) const;
  std::shared_ptr<const std::vector<uint32_t>> permutation(uint64_t epoch) const;
  void start_producer();
  void stop_producer();
  void produce();

  ShardSet shards_;
  std::shared_ptr<const Vocab> vocab_;
  LoaderOptions options_;
  Packing packing_;
  MaskingVocab mask_vocab_;

  mutable std::mutex perm_mutex_;
  mutable std::map<uint64_t, std::shared_ptr<const std::vector<uint32_t>>> perms_;

  LoaderState consumed_;  // after the last batch handed out
  struct Item {
    Batch batch;
    LoaderState after;
  };
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  std::exception_ptr error_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace roformer::data
