// Philox for the CPU kernels' dropout (attention probabilities, hidden
// states): 16 counter blocks per call, written so the rounds vectorise.
#pragma once

#include <cstdint>

#include "core/philox.h"

namespace roformer::kernels::cpu {

// Philox4x32-10 on kLanes consecutive counter blocks at once (lanes are
// independent, so the compiler vectorises the rounds): out[4 * i + w] is word
// w of block (first + i, c1, c2, c3), the numbers philox4x32 gives one block
// at a time.
template <int kLanes>
inline void philox_blocks(uint32_t first, uint32_t c1v, uint32_t c2v, uint32_t c3v,
                          const PhiloxKey& key, uint32_t* __restrict out) {
  uint32_t c0[kLanes], c1[kLanes], c2[kLanes], c3[kLanes];
  for (int i = 0; i < kLanes; ++i) {
    c0[i] = first + uint32_t(i);
    c1[i] = c1v;
    c2[i] = c2v;
    c3[i] = c3v;
  }
  uint32_t k0 = key[0], k1 = key[1];
  for (int round = 0; round < 10; ++round) {
#pragma omp simd
    for (int i = 0; i < kLanes; ++i) {
      const uint64_t p0 = uint64_t(0xD2511F53u) * c0[i];
      const uint64_t p1 = uint64_t(0xCD9E8D57u) * c2[i];
      const uint32_t n0 = uint32_t(p1 >> 32) ^ c1[i] ^ k0;
      const uint32_t n2 = uint32_t(p0 >> 32) ^ c3[i] ^ k1;
      c1[i] = uint32_t(p1);
      c3[i] = uint32_t(p0);
      c0[i] = n0;
      c2[i] = n2;
    }
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  for (int i = 0; i < kLanes; ++i) {
    out[4 * i] = c0[i];
    out[4 * i + 1] = c1[i];
    out[4 * i + 2] = c2[i];
    out[4 * i + 3] = c3[i];
  }
}

// The dropout draws (core/philox.h) of kLanes consecutive counter blocks,
// 8 kLanes of them: out[8 i + d] is draw d of block (first + i, c1, c2, c3).
template <int kLanes>
inline void dropout_draws_blocks(uint32_t first, uint32_t c1, uint32_t c2, uint32_t c3,
                                 const PhiloxKey& key, uint16_t* __restrict out) {
  uint32_t words[4 * kLanes];
  philox_blocks<kLanes>(first, c1, c2, c3, key, words);
#pragma omp simd
  for (int w = 0; w < 4 * kLanes; ++w) {
    out[2 * w] = uint16_t(dropout_draw_in_word(words[w], 0));
    out[2 * w + 1] = uint16_t(dropout_draw_in_word(words[w], 1));
  }
}

// The draws of inner indices [0, n) of one (position, sequence, site, head)
// into out (room for n rounded up to 128): sixteen blocks per call, eight
// for a last part of at most 64 (a hidden size of 64 needs no more).
inline void dropout_draws_row(uint32_t c1, uint32_t c2, uint32_t c3, const PhiloxKey& key,
                              int64_t n, uint16_t* __restrict out) {
  constexpr int64_t kWide = 16 * kDropoutDrawsPerBlock, kNarrow = 8 * kDropoutDrawsPerBlock;
  for (int64_t i = 0; i < n; i += kWide) {
    const uint32_t block = uint32_t(i / kDropoutDrawsPerBlock);
    if (n - i <= kNarrow)
      dropout_draws_blocks<8>(block, c1, c2, c3, key, out + i);
    else
      dropout_draws_blocks<16>(block, c1, c2, c3, key, out + i);
  }
}

}  // namespace roformer::kernels::cpu
