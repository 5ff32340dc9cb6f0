// The host side of an unpadded micro-batch (docs/data.md, "Unpadded and
// packed batches"): the real tokens of its documents laid end to end, and
// the rows they sit in. layers/token_layout.h turns `rows` into the model's
// TokenLayout; this file knows nothing of tensors.
//
// Without packing every document is a row of its own. With packing,
// documents go into rows of at most `max_seq_len` tokens, first fit in
// order (deterministic): attention still stays inside each document, and
// dropout keys by the packed row and the position in it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace roformer::data {

// One document: its ids, token types and (optionally, else empty) labels.
struct TokenSource {
  std::span<const int32_t> input_ids, token_type_ids, labels;
};

struct TokenBatch {
  std::vector<int32_t> input_ids, token_type_ids, labels;  // [T]; labels empty if no source had any
  std::vector<std::vector<int64_t>> rows;                  // document lengths, row by row
  std::vector<int64_t> order;  // order[d]: the source index of the stream's document d
  int64_t num_tokens = 0;
  // Slots a padded batch of the same rows would hold: rows x bucketed longest
  // row (bucketed_length). num_tokens / padded_slots is the fill of the rows.
  int64_t padded_slots = 0;
};

// Rows of document indices: first fit, in order, at most `capacity` tokens a
// row (a longer document gets a row of its own).
std::vector<std::vector<int64_t>> pack_first_fit(const std::vector<int64_t>& lengths,
                                                 int64_t capacity);

// The stream of `docs`: one row each, or packed into rows of max_seq_len.
TokenBatch make_token_batch(const std::vector<TokenSource>& docs, bool packing,
                            int64_t max_seq_len);

}  // namespace roformer::data
