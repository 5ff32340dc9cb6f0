// The tanh approximation of GELU (Hugging Face's "gelu_new", PyTorch's
// gelu(approximate="tanh")), the one cuBLASLt's GELU epilogues compute:
//   gelu_tanh(x) = x/2 (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
// and its derivative, in one header both compilers read so that the CPU
// kernel and the CUDA fallback compute the same formula.
#pragma once

#include <cmath>

#include "core/philox.h"  // RF_HOST_DEVICE

namespace roformer::kernels {

constexpr double kGeluTanhScale = 0.79788456080286535588;  // sqrt(2/pi)
constexpr double kGeluTanhCubic = 0.044715;

template <class A>
RF_HOST_DEVICE inline A gelu_tanh(A x) {
  using std::tanh;
  const A u = A(kGeluTanhScale) * (x + A(kGeluTanhCubic) * x * x * x);
  return A(0.5) * x * (A(1) + tanh(u));
}

// d/dx gelu_tanh(x) = (1 + t)/2 + x/2 (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2), t = tanh(u).
template <class A>
RF_HOST_DEVICE inline A gelu_tanh_grad(A x) {
  using std::tanh;
  const A u = A(kGeluTanhScale) * (x + A(kGeluTanhCubic) * x * x * x);
  const A t = tanh(u);
  const A du = A(kGeluTanhScale) * (A(1) + A(3 * kGeluTanhCubic) * x * x);
  return A(0.5) * (A(1) + t) + A(0.5) * x * (A(1) - t * t) * du;
}

}  // namespace roformer::kernels
