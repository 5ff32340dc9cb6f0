// MLM masking as BERT does it: of the non-special tokens of a sequence,
// mask_prob are chosen for prediction; a chosen token becomes [MASK] with
// probability mask_token_prob, a random ordinary token with random_token_prob,
// and stays itself otherwise. Labels hold the original id at chosen positions
// and -100 (ignored by the loss) elsewhere. With whole_word_masking all pieces
// of a word ("##" continuations with the piece before them) are chosen
// together.
//
// The number chosen in a sequence of n candidates is n * mask_prob rounded up
// or down at random (so its expectation is exactly n * mask_prob, even for
// short sequences). Random draws come from the caller's Philox stream, keyed by
// (seed, epoch, example) in the loader: masks do not depend on thread count,
// batch layout or world size, and change every epoch.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/philox.h"
#include "data/vocab.h"

namespace roformer::data {

inline constexpr int32_t kIgnoreLabel = -100;

// Mirrors the data section of the config.
struct MaskingOptions {
  double mask_prob = 0.15;
  double mask_token_prob = 0.8;
  double random_token_prob = 0.1;
  bool whole_word_masking = false;

  void validate() const;  // InputError naming the bad key
};

// What masking needs to know about the vocabulary.
struct MaskingVocab {
  int32_t vocab_size = 0;
  int32_t mask_id = -1;
  std::vector<uint8_t> special;       // never chosen, never drawn as a random token
  std::vector<uint8_t> continuation;  // "##" pieces
  std::vector<int32_t> ordinary;      // ids a random replacement is drawn from

  static MaskingVocab from(const Vocab& vocab);
};

// Masks `ids` in place and fills `labels` (same length). Returns the number of
// positions chosen for prediction.
int64_t mask_tokens(std::span<int32_t> ids, std::span<int32_t> labels, const MaskingVocab& vocab,
                    const MaskingOptions& options, PhiloxStream& rng);

}  // namespace roformer::data
