// bf16 values as the emulated instructions see them (16-bit patterns), for
// the emulator's own tests.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace roformer::testing {

inline uint16_t bf16_bits(float x) {
  const __nv_bfloat16 b = __float2bfloat16_rn(x);
  uint16_t bits;
  std::memcpy(&bits, &b, 2);
  return bits;
}

inline float bf16_value(uint16_t bits) {
  const uint32_t w = uint32_t(bits) << 16;
  float f;
  std::memcpy(&f, &w, 4);
  return f;
}

// n normal draws rounded to bf16, as bit patterns.
inline std::vector<uint16_t> random_bf16(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist;
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = bf16_bits(dist(gen));
  return v;
}

}  // namespace roformer::testing
