// Division by a divisor fixed at launch, as one high multiply and a shift
// (Granlund and Montgomery's method): a GPU has no integer divider, and
// nvcc's 64-bit division is a call of about 70 instructions, 32-bit about 25.
// Kernels whose index math divides by sizes per element (the rope kernels)
// take a FastDivmod per divisor, built on the host. Host and device alike,
// so the host tests check it on every divisor class.
#pragma once

#include <cstdint>

#include "core/kernels/kernel_tensor.h"

namespace roformer::kernels {

// The dividends a FastDivmod takes: [0, 2^31).
constexpr int64_t kFastDivmodLimit = int64_t(1) << 31;

struct FastDivmod {
  uint32_t divisor = 1;
  uint32_t multiplier = 0;  // 0: the divisor is 1
  uint32_t shift = 0;

  FastDivmod() = default;
  // For a divisor in [1, 2^31]. With l = ceil(log2 d) and p = 31 + l, the
  // multiplier m = ceil(2^p / d) < 2^32, and for n < 2^31 the error of
  // n m / 2^p against n / d is under n / 2^p < 2^-l <= 1 / d, too small to
  // carry n / d past the next integer: floor(n m / 2^p) = floor(n / d).
  explicit FastDivmod(uint32_t d) : divisor(d) {
    if (d <= 1) return;
    uint32_t l = 0;
    while ((uint64_t(1) << l) < d) ++l;
    const uint64_t p = 31 + l;
    multiplier = uint32_t(((uint64_t(1) << p) + d - 1) / d);
    shift = uint32_t(p - 32);
  }

  // n / divisor, for n in [0, 2^31).
  ROFORMER_HOST_DEVICE uint32_t div(uint32_t n) const {
    if (multiplier == 0) return n;
#if defined(__CUDA_ARCH__)
    return __umulhi(n, multiplier) >> shift;
#else
    return uint32_t((uint64_t(n) * multiplier) >> 32) >> shift;
#endif
  }
  // Quotient and remainder of n, for n in [0, 2^31).
  ROFORMER_HOST_DEVICE void divmod(uint32_t n, uint32_t& quotient, uint32_t& remainder) const {
    quotient = div(n);
    remainder = n - quotient * divisor;
  }
};

}  // namespace roformer::kernels
