// Math the compiler can vectorise: loops over these stay SIMD, where calls to
// std::exp would not. Shared by the softmax-like kernels (attention,
// cross-entropy).
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/dtype.h"

namespace roformer::kernels::cpu {

// exp(x) for f32 without branches or calls (Cephes expf: x = n ln2 + r,
// |r| <= ln2/2, degree-6 polynomial for e^r; about 1 ulp). Inputs below -87
// give 0, above 88 are clamped.
[[gnu::always_inline]] inline float vexp(float x) {
  const float xc = std::min(std::max(x, -87.0f), 88.0f);
  // Round-to-nearest via the 1.5 * 2^23 trick (no call to nearbyint).
  const float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = xc - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const float scale = std::bit_cast<float>((int32_t(n) + 127) << 23);
  return x < -87.0f ? 0.0f : p * scale;
}

// f64 (gradient checks): exact.
inline double vexp(double x) {
  return std::exp(x);
}

// out[i] = bf16(in[i]) with round-to-nearest-even, NaN kept a NaN: the rule
// of core/dtype.h's bf16, written so the loop vectorises.
inline void to_bf16_row(const float* __restrict in, bf16* __restrict out, int64_t n) {
  uint16_t* o = reinterpret_cast<uint16_t*>(out);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = std::bit_cast<uint32_t>(in[i]);
    const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    o[i] = uint16_t(nan ? ((u >> 16) | 0x40u) : rounded);
  }
}

// out[i] = float(in[i]) (exact).
inline void from_bf16_row(const bf16* __restrict in, float* __restrict out, int64_t n) {
  const uint16_t* x = reinterpret_cast<const uint16_t*>(in);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = std::bit_cast<float>(uint32_t(x[i]) << 16);
}

}  // namespace roformer::kernels::cpu
