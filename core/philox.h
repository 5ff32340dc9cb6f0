// Philox4x32-10: a counter-based random generator (Salmon et al., SC'11).
// A value is a pure function of (key, counter), so the numbers a tensor, a
// dropout mask or an MLM mask receives do not depend on thread count, batch
// layout or device, and a resumed run can draw the same numbers again.
//
// nvcc reads this header too (C++17, host + device functions), so a CUDA
// kernel draws exactly the words the CPU draws: dropout masks agree across
// devices.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define RF_HOST_DEVICE __host__ __device__
#else
#define RF_HOST_DEVICE
#endif

namespace roformer {

// Plain arrays rather than std::array: device code cannot call std::array's
// members without --expt-relaxed-constexpr.
struct PhiloxCounter {
  uint32_t v[4];
  RF_HOST_DEVICE uint32_t& operator[](int i) { return v[i]; }
  RF_HOST_DEVICE uint32_t operator[](int i) const { return v[i]; }
  // Word i (0..3) picked by selects: indexing v with a value known only at
  // run time puts the block in a GPU thread's local memory.
  RF_HOST_DEVICE uint32_t word(uint32_t i) const {
    return i == 0 ? v[0] : i == 1 ? v[1] : i == 2 ? v[2] : v[3];
  }
};
struct PhiloxKey {
  uint32_t v[2];
  RF_HOST_DEVICE uint32_t& operator[](int i) { return v[i]; }
  RF_HOST_DEVICE uint32_t operator[](int i) const { return v[i]; }
};

RF_HOST_DEVICE inline PhiloxCounter philox4x32(PhiloxCounter ctr, PhiloxKey key) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t(kM0) * ctr[0];
    const uint64_t p1 = uint64_t(kM1) * ctr[2];
    ctr = PhiloxCounter{{uint32_t(p1 >> 32) ^ ctr[1] ^ key[0], uint32_t(p1),
                         uint32_t(p0 >> 32) ^ ctr[3] ^ key[1], uint32_t(p0)}};
    key[0] += kW0;
    key[1] += kW1;
  }
  return ctr;
}

// Maps 32 random bits to a float in [0, 1) (24 bits of mantissa).
RF_HOST_DEVICE inline float uniform_from_bits(uint32_t bits) {
  return float(bits >> 8) * (1.0f / 16777216.0f);
}

// Maps 32 random bits to a double in (0, 1], safe for log().
RF_HOST_DEVICE inline double open_uniform_from_bits(uint32_t bits) {
  return (double(bits) + 1.0) / 4294967296.0;
}

// Word `word` of the Philox stream keyed by `seed` with counter blocks
// (word / 4, 0): the numbering Tensor::rand uses, one word per element.
RF_HOST_DEVICE inline uint32_t philox_word(uint64_t seed, uint64_t word) {
  const uint64_t block = word / 4;
  const PhiloxCounter bits =
      philox4x32(PhiloxCounter{{uint32_t(block), uint32_t(block >> 32), 0u, 0u}},
                 PhiloxKey{{uint32_t(seed), uint32_t(seed >> 32)}});
  return bits.word(uint32_t(word % 4));
}

// A stream of random numbers for one (seed, subsequence) (host only): the key is the seed,
// the counter is (block index, subsequence). Draws are sequential within the
// stream; different subsequences (e.g. one per example, per layer, per epoch)
// are independent.
class PhiloxStream {
 public:
  PhiloxStream(uint64_t seed, uint64_t subsequence, uint64_t block = 0)
      : key_{uint32_t(seed), uint32_t(seed >> 32)}, subsequence_(subsequence), block_(block) {}

  uint32_t next_u32() {
    if (index_ == 4) {
      buffer_ = philox4x32({uint32_t(block_), uint32_t(block_ >> 32), uint32_t(subsequence_),
                            uint32_t(subsequence_ >> 32)},
                           key_);
      ++block_;
      index_ = 0;
    }
    return buffer_[index_++];
  }
  float next_uniform() { return uniform_from_bits(next_u32()); }
  // Uniform integer in [0, n) (n > 0), by rejection so there is no modulo bias.
  uint32_t next_below(uint32_t n) {
    const uint32_t limit = uint32_t(-n) % n;  // 2^32 mod n
    for (;;) {
      const uint64_t product = uint64_t(next_u32()) * n;
      if (uint32_t(product) >= limit) return uint32_t(product >> 32);
    }
  }
  double next_normal() {
    const double u1 = open_uniform_from_bits(next_u32());
    const double u2 = open_uniform_from_bits(next_u32());
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  PhiloxKey key_;
  uint64_t subsequence_;
  uint64_t block_;
  PhiloxCounter buffer_{};
  int index_ = 4;
};

// Mixes several integers into one 64-bit subsequence id (splitmix64 finaliser),
// e.g. subsequence_of(epoch, example_index) for MLM masking.
RF_HOST_DEVICE inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
template <class... Ints>
RF_HOST_DEVICE uint64_t subsequence_of(uint64_t first, Ints... rest) {
  uint64_t h = mix64(first);
  ((h = mix64(h ^ uint64_t(rest))), ...);
  return h;
}

}  // namespace roformer

namespace roformer {

// --- the dropout rule, shared by every device ---------------------------------
// A dropout draw depends only on (seed, step, sequence, site, position, inner
// index), never on how the global batch is split into micro-batches or ranks,
// nor on padding: the key mixes seed and step; the counter block is
// (inner / 8, position, sequence, site << 8 | head), and inner's draw is the
// 16-bit half inner % 8 of that block (word (inner % 8) / 2, low half for an
// even inner, high half for an odd one).
// `sequence` is the row's index in the global batch, `site` counts the dropout
// sites of one forward pass in call order, `head` is the attention head (0 for
// hidden-state dropout), `position` the token (the query for attention) and
// `inner` the feature (the key for attention). Keep an element when its draw
// is >= ceil(p * 2^16), i.e. when its 16-bit uniform is >= p.
// Why 16 bits: one Philox call (ten rounds) gives eight decisions rather than
// four, which halves the cost that dominates dropout on both devices, and p
// is still met within 2^-16 (0.1 becomes 0.100006; 8-bit draws would make it
// 0.1016 and bias the 1 / (1 - p) rescaling).
// (Host and device: CUDA kernels draw the same words.)
constexpr uint32_t kDropoutDrawsPerBlock = 8;
RF_HOST_DEVICE inline PhiloxKey dropout_key(uint64_t seed, uint64_t step) {
  const uint64_t k = seed + (step + 1) * 0x9E3779B97F4A7C15ull;
  return PhiloxKey{{uint32_t(k), uint32_t(k >> 32)}};
}
RF_HOST_DEVICE inline PhiloxCounter dropout_block(uint32_t inner_block, uint32_t position,
                                                  uint32_t sequence, uint32_t site, uint32_t head) {
  return PhiloxCounter{{inner_block, position, sequence, (site << 8) | head}};
}
// The draw of an even (odd = 0) or odd (odd = 1) inner index in its word.
RF_HOST_DEVICE inline uint32_t dropout_draw_in_word(uint32_t word, uint32_t odd) {
  return odd ? (word >> 16) : (word & 0xFFFFu);
}
// Draw `lane` (inner % 8) of a block's four words.
RF_HOST_DEVICE inline uint32_t dropout_draw_of(const PhiloxCounter& words, uint32_t lane) {
  return dropout_draw_in_word(words.word(lane >> 1), lane & 1u);
}
// The draw for `inner` (one Philox call per draw: for tests and simple kernels).
RF_HOST_DEVICE inline uint32_t dropout_draw(const PhiloxKey& key, uint32_t inner, uint32_t position,
                                            uint32_t sequence, uint32_t site, uint32_t head) {
  return dropout_draw_of(
      philox4x32(dropout_block(inner / kDropoutDrawsPerBlock, position, sequence, site, head), key),
      inner % kDropoutDrawsPerBlock);
}
inline uint32_t dropout_threshold(double p) {
  return uint32_t(std::ceil(p * 65536.0));
}
// Both draws of a word decided at once, for kernels where the decisions'
// instructions cost as much as Philox itself: dropout_keep_halves<kHigh>(word,
// offset) has bit 15 set when the low draw is kept (>= the threshold), bit 31
// when the high one is, and every other bit clear. `offset` is
// dropout_halves_offset(threshold) and kHigh is threshold >=
// kDropoutHighThreshold (2^15), both of the same threshold. Each 16-bit half
// x with its top bit forced on, minus the offset's half (the threshold less
// 2^15 when kHigh, so 65536, "drop all", gives 2^15), cannot borrow from the
// next half, and its top bit then says whether x's low 15 bits reach it; with
// x's own top bit that decides x (either is enough below 2^15, both are
// needed from 2^15 up: a template argument, so a kernel's loop carries no
// select).
constexpr uint32_t kDropoutHighThreshold = 0x8000u;
RF_HOST_DEVICE inline uint32_t dropout_halves_offset(uint32_t threshold) {
  const uint32_t low = threshold >= kDropoutHighThreshold ? threshold - 0x8000u : threshold;
  return low | (low << 16);
}
template <bool kHigh>
RF_HOST_DEVICE inline uint32_t dropout_keep_halves(uint32_t word, uint32_t offset) {
  constexpr uint32_t kTops = 0x80008000u;
  const uint32_t z = (word | kTops) - offset;
  return (kHigh ? word & z : word | z) & kTops;
}
// Heads a dropout site may have (the head shares the counter word with the site).
constexpr int64_t kDropoutMaxHeads = 256;

}  // namespace roformer
