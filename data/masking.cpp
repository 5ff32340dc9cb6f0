#include "data/masking.h"

#include <cmath>

#include "core/error.h"

namespace roformer::data {

void MaskingOptions::validate() const {
  RF_INPUT_CHECK(mask_prob >= 0 && mask_prob <= 1, "data.mask_prob must be in [0, 1], not ",
                 mask_prob);
  RF_INPUT_CHECK(mask_token_prob >= 0 && mask_token_prob <= 1,
                 "data.mask_token_prob must be in [0, 1], not ", mask_token_prob);
  RF_INPUT_CHECK(random_token_prob >= 0 && random_token_prob <= 1,
                 "data.random_token_prob must be in [0, 1], not ", random_token_prob);
  RF_INPUT_CHECK(mask_token_prob + random_token_prob <= 1 + 1e-9,
                 "data.mask_token_prob + data.random_token_prob must be <= 1, not ",
                 mask_token_prob + random_token_prob);
}

MaskingVocab MaskingVocab::from(const Vocab& vocab) {
  MaskingVocab m;
  m.vocab_size = vocab.size();
  m.mask_id = vocab.special().mask;
  m.special.resize(size_t(vocab.size()));
  m.continuation.resize(size_t(vocab.size()));
  for (int32_t id = 0; id < vocab.size(); ++id) {
    m.special[size_t(id)] = vocab.is_special(id);
    m.continuation[size_t(id)] = vocab.is_continuation(id);
    if (!vocab.is_special(id)) m.ordinary.push_back(id);
  }
  return m;
}

int64_t mask_tokens(std::span<int32_t> ids, std::span<int32_t> labels, const MaskingVocab& vocab,
                    const MaskingOptions& options, PhiloxStream& rng) {
  RF_CHECK(ids.size() == labels.size(), "mask_tokens: ", ids.size(), " ids but ", labels.size(),
           " labels");
  std::fill(labels.begin(), labels.end(), kIgnoreLabel);
  auto is_special = [&](int32_t id) {
    return id < 0 || id >= vocab.vocab_size || vocab.special[size_t(id)] != 0;
  };

  // Units that are chosen together: single tokens, or whole words.
  thread_local std::vector<uint32_t> unit_start, order;
  unit_start.clear();
  int64_t candidates = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (is_special(ids[i])) continue;
    ++candidates;
    const bool continues = options.whole_word_masking && i > 0 && !is_special(ids[i - 1]) &&
                           vocab.continuation[size_t(ids[i])] != 0;
    if (!continues) unit_start.push_back(uint32_t(i));
  }
  if (candidates == 0 || options.mask_prob <= 0) return 0;
  auto unit_end = [&](size_t u) {
    size_t end = unit_start[u] + 1;
    if (options.whole_word_masking)
      while (end < ids.size() && !is_special(ids[end]) && vocab.continuation[size_t(ids[end])])
        ++end;
    return end;
  };

  // Randomised rounding keeps E[chosen] = candidates * mask_prob exactly.
  const double want = double(candidates) * options.mask_prob;
  int64_t target = int64_t(std::floor(want));
  if (rng.next_uniform() < float(want - double(target))) ++target;

  // A random order of the units (Fisher-Yates), taken while they fit.
  const size_t units = unit_start.size();
  order.resize(units);
  for (size_t u = 0; u < units; ++u) order[u] = uint32_t(u);
  int64_t chosen = 0;
  for (size_t k = 0; k < units && chosen < target; ++k) {
    const size_t j = k + rng.next_below(uint32_t(units - k));
    std::swap(order[k], order[j]);
    const size_t begin = unit_start[order[k]], end = unit_end(order[k]);
    if (chosen + int64_t(end - begin) > target) continue;  // a word that does not fit
    for (size_t i = begin; i < end; ++i) {
      labels[i] = ids[i];
      const float r = rng.next_uniform();
      if (r < float(options.mask_token_prob)) {
        ids[i] = vocab.mask_id;
      } else if (r < float(options.mask_token_prob + options.random_token_prob)) {
        ids[i] = vocab.ordinary[rng.next_below(uint32_t(vocab.ordinary.size()))];
      }
      ++chosen;
    }
  }
  return chosen;
}

}  // namespace roformer::data
