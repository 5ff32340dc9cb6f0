// Philox for the CPU kernels' dropout (attention probabilities, hidden
// states): 16 counter blocks per call, written so the rounds vectorise.
#pragma once

#include <cstdint>

#include "core/philox.h"

namespace roformer::kernels::cpu {

// Philox4x32-10 on 16 consecutive counter blocks at once (lanes are
// independent, so the compiler vectorises the rounds): out[4 * i + w] is word
// w of block (first + i, c1, c2, c3), the numbers philox4x32 gives one block
// at a time.
inline void philox_16_blocks(uint32_t first, uint32_t c1v, uint32_t c2v, uint32_t c3v,
                             const PhiloxKey& key, uint32_t* __restrict out) {
  constexpr int kLanes = 16;
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

}  // namespace roformer::kernels::cpu
