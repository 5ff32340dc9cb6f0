// Philox for the CPU kernels' dropout (attention probabilities, hidden
// states): 16 counter blocks per call, written so the rounds vectorise.
#pragma once

#include <cstdint>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "core/philox.h"

namespace roformer::kernels::cpu {

#if defined(__AVX512F__)
// The 16-block Philox in AVX-512. GCC vectorises the portable loop's
// 32 x 32 -> 64-bit products through 256-bit shuffles; here each product is
// two vpmuludq (even and odd lanes) and a blend, the three-way xors are one
// vpternlogd, and the words are transposed to block order by unpacks and
// 128-bit lane shuffles. The same numbers as philox4x32, block by block.
namespace philox_avx512 {
// GCC 12 warns (-Wuninitialized, its bug 105593) on the unmasked forms of
// these intrinsics, which pass an undefined vector through; the zero-masked
// forms with every lane selected are the same operations.
constexpr __mmask8 kAll8 = 0xFF;
constexpr __mmask16 kAll16 = 0xFFFF;
inline __m512i mul_epu32(__m512i a, __m512i b) {
  return _mm512_maskz_mul_epu32(kAll8, a, b);
}
inline __m512i srli64(__m512i a, unsigned n) {
  return _mm512_maskz_srli_epi64(kAll8, a, n);
}
inline __m512i slli64(__m512i a, unsigned n) {
  return _mm512_maskz_slli_epi64(kAll8, a, n);
}
// The high and low 32 bits of m * x in each lane (m the same in every lane).
inline void mul_hi_lo(__m512i m, __m512i x, __m512i& hi, __m512i& lo) {
  const __m512i even = mul_epu32(x, m);             // lanes 0, 2, ...
  const __m512i odd = mul_epu32(srli64(x, 32), m);  // lanes 1, 3, ...
  hi = _mm512_mask_blend_epi32(__mmask16(0xAAAA), srli64(even, 32), odd);
  lo = _mm512_mask_blend_epi32(__mmask16(0xAAAA), even, slli64(odd, 32));
}

inline void blocks16(uint32_t first, uint32_t c1, uint32_t c2, uint32_t c3, const PhiloxKey& key,
                     uint32_t* out) {
  __m512i x0 =
      _mm512_add_epi32(_mm512_set1_epi32(int(first)),
                       _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  __m512i x1 = _mm512_set1_epi32(int(c1)), x2 = _mm512_set1_epi32(int(c2));
  __m512i x3 = _mm512_set1_epi32(int(c3));
  const __m512i m0 = _mm512_set1_epi32(int(0xD2511F53u)), m1 = _mm512_set1_epi32(int(0xCD9E8D57u));
  uint32_t k0 = key[0], k1 = key[1];
  for (int round = 0; round < 10; ++round) {
    __m512i hi0, lo0, hi1, lo1;
    mul_hi_lo(m0, x0, hi0, lo0);
    mul_hi_lo(m1, x2, hi1, lo1);
    const __m512i n0 = _mm512_ternarylogic_epi32(hi1, x1, _mm512_set1_epi32(int(k0)), 0x96);
    const __m512i n2 = _mm512_ternarylogic_epi32(hi0, x3, _mm512_set1_epi32(int(k1)), 0x96);
    x0 = n0;
    x1 = lo1;
    x2 = n2;
    x3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  // Word w of block i to out[4 i + w]: within each 128-bit lane k, u_j holds
  // block 4 k + j; then the 4 x 4 transpose of the 128-bit lanes.
  const __m512i t0 = _mm512_maskz_unpacklo_epi32(kAll16, x0, x1),
                t1 = _mm512_maskz_unpackhi_epi32(kAll16, x0, x1);
  const __m512i t2 = _mm512_maskz_unpacklo_epi32(kAll16, x2, x3),
                t3 = _mm512_maskz_unpackhi_epi32(kAll16, x2, x3);
  const __m512i u0 = _mm512_maskz_unpacklo_epi64(kAll8, t0, t2),
                u1 = _mm512_maskz_unpackhi_epi64(kAll8, t0, t2);
  const __m512i u2 = _mm512_maskz_unpacklo_epi64(kAll8, t1, t3),
                u3 = _mm512_maskz_unpackhi_epi64(kAll8, t1, t3);
  const __m512i v0 = _mm512_maskz_shuffle_i32x4(kAll16, u0, u1, 0x44),
                v1 = _mm512_maskz_shuffle_i32x4(kAll16, u2, u3, 0x44);
  const __m512i v2 = _mm512_maskz_shuffle_i32x4(kAll16, u0, u1, 0xEE),
                v3 = _mm512_maskz_shuffle_i32x4(kAll16, u2, u3, 0xEE);
  _mm512_storeu_si512(out, _mm512_maskz_shuffle_i32x4(kAll16, v0, v1, 0x88));
  _mm512_storeu_si512(out + 16, _mm512_maskz_shuffle_i32x4(kAll16, v0, v1, 0xDD));
  _mm512_storeu_si512(out + 32, _mm512_maskz_shuffle_i32x4(kAll16, v2, v3, 0x88));
  _mm512_storeu_si512(out + 48, _mm512_maskz_shuffle_i32x4(kAll16, v2, v3, 0xDD));
}
}  // namespace philox_avx512
#endif

// Philox4x32-10 on kLanes consecutive counter blocks at once (lanes are
// independent, so the compiler vectorises the rounds): out[4 * i + w] is word
// w of block (first + i, c1, c2, c3), the numbers philox4x32 gives one block
// at a time.
template <int kLanes>
inline void philox_blocks(uint32_t first, uint32_t c1v, uint32_t c2v, uint32_t c3v,
                          const PhiloxKey& key, uint32_t* __restrict out) {
#if defined(__AVX512F__)
  if constexpr (kLanes == 16) {
    philox_avx512::blocks16(first, c1v, c2v, c3v, key, out);
    return;
  }
#endif
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

// The draws of inner indices [0, n) of one row, whose counter blocks are
// (j, row[1], row[2], row[3]) (dropout_block(0, position, sequence, site,
// head)), sixteen blocks per call, in this thread's buffer: valid until the
// thread's next call. (Eight blocks for a short row would cost as much: the
// portable loop vectorises eight lanes worse than sixteen, and the AVX-512
// call is 2.7x cheaper per block than the portable sixteen.)
inline const uint16_t* dropout_draws_row(const PhiloxCounter& row, const PhiloxKey& key,
                                         int64_t n) {
  constexpr int64_t kPerCall = 16 * kDropoutDrawsPerBlock;
  thread_local std::vector<uint16_t> draws;
  const int64_t padded = (n + kPerCall - 1) / kPerCall * kPerCall;
  if (int64_t(draws.size()) < padded) draws.resize(size_t(padded));
  for (int64_t i = 0; i < n; i += kPerCall)
    dropout_draws_blocks<16>(uint32_t(i / kDropoutDrawsPerBlock), row[1], row[2], row[3], key,
                             draws.data() + i);
  return draws.data();
}

}  // namespace roformer::kernels::cpu
