#pragma once

#include <cstdint>

namespace roformer::testing {

// Writes philox_word(seed, first + i) for i in [0, n) to device memory `out`.
void philox_words_on_device(uint64_t seed, uint64_t first, int64_t n, uint32_t* out);

}  // namespace roformer::testing
