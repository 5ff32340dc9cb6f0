// Shared by the CUDA tests: every case that needs a GPU starts with
// RF_REQUIRE_GPU(), which skips it with a message on a machine without one.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/cuda/backend.h"
#include "core/ops/dispatch.h"
#include "core/tensor.h"

#define RF_REQUIRE_GPU()                                           \
  do {                                                             \
    if (::roformer::cuda::device_count() == 0)                     \
      GTEST_SKIP() << "no GPU on this machine: CUDA test skipped"; \
  } while (0)

namespace roformer::testing {

inline const Device kGpu = Device::cuda(0);

// ||out - ref|| / ||ref||, NaN-safe (NaN anywhere gives infinity).
inline double relative_error(const std::vector<double>& out, const std::vector<double>& ref) {
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = out[i] - ref[i];
    if (!std::isfinite(d)) return INFINITY;
    diff += d * d;
    norm += ref[i] * ref[i];
  }
  return std::sqrt(diff / (norm > 0 ? norm : 1.0));
}

// Values rounded to bf16 (so both devices read the same numbers), as f32.
inline Tensor bf16_values(const Shape& shape, uint64_t seed) {
  Generator gen{seed, 0};
  return Tensor::randn(shape, gen, DType::f32).to(DType::bf16).to(DType::f32);
}

// A tensor's values on the host as f64, in logical order.
inline std::vector<double> host(const Tensor& t) {
  return t.to(Device::cpu()).to(DType::f64).contiguous().to_vector<double>();
}

// x [B, H, S, D] or [T, H, D] rotated once by `table` on x's device, as the
// op rotates q and k (set_rotate_once): the rope kernel along S, or along T
// through the [H, T, D] view.
inline Tensor rotated_once(const Tensor& x, const Tensor& table, bool interleaved) {
  const bool token_stream = x.dim() == 3;
  const Tensor along = token_stream ? x.transpose(0, 1) : x;
  const Tensor out = Tensor::empty(along.shape(), x.dtype(), x.device());
  launch::rope(x.device(), along, table, interleaved, false, out);
  return token_stream ? out.transpose(0, 1) : out;
}

}  // namespace roformer::testing
