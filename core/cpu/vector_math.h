// Math the compiler can vectorise: loops over these stay SIMD, where calls to
// std::exp would not. Shared by the softmax-like kernels (attention,
// cross-entropy).
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

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

}  // namespace roformer::kernels::cpu
