// What the emulated-kernel tests share: the two sides' streams, poisoned
// outputs, and the CUDA-vs-CPU comparison at the op table's tolerances.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/ops/dispatch.h"
#include "core/tensor.h"
#include "tests/cuda/gpu_test.h"
#include "tests/simt/emulated_kernels.h"

namespace roformer::testing::emulated {

using kernels::kernel_tensor;
using kernels::KernelError;
using kernels::KernelTensor;

// The emulated kernels' stream: its error record is host memory.
struct EmulatedStream {
  KernelError record{};
  kernels::Stream get() {
    kernels::Stream s;
    s.device_type = DeviceType::cuda;
    s.error = &record;
    return s;
  }
};

// The CPU kernels' stream (they report bad ids to the CPU's error record).
inline kernels::Stream cpu_stream() {
  return kernels::cpu::default_stream(0);
}

// An output filled with NaN (floats) or -777 (integers): unwritten
// elements show.
inline Tensor poisoned(const Shape& shape, DType dtype) {
  return Tensor::full(shape, is_floating(dtype) ? NAN : -777.0, dtype, Device::cpu());
}

// Normal values times `scale` plus `shift`, rounded to `dtype`: the same
// numbers on both sides.
inline Tensor random(const Shape& shape, uint64_t seed, DType dtype, double scale = 1.0,
                     double shift = 0.0) {
  Generator gen{seed, 0};
  std::vector<double> v = Tensor::randn(shape, gen, DType::f64).to_vector<double>();
  for (double& x : v) x = x * scale + shift;
  return Tensor::from_vector(v, shape).to(dtype);
}

// CUDA against the CPU, as tests/cuda/test_cuda_ops.cpp compares them:
// f64 and f32 tight (different summation orders), bf16 one rounding step.
inline double tolerance(DType dtype) {
  return dtype == DType::bf16 ? 1e-2 : dtype == DType::f32 ? 1e-5 : 1e-12;
}

// The error is relative to ref's norm, or absolute where that is below 1
// (a log-softmax of one column: 0 exactly here, 1e-6 from oneDNN).
inline void expect_close(const Tensor& got, const Tensor& ref, double tol,
                         const std::string& what) {
  ASSERT_EQ(got.shape(), ref.shape()) << what;
  const std::vector<double> a = host(got), b = host(ref);
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < b.size(); ++i) {
    if (a[i] == b[i]) continue;  // infinities too (the lse of a row with no key)
    ASSERT_TRUE(std::isfinite(a[i]) || std::isnan(b[i]))
        << what << ": element " << i << " is " << a[i] << ", the CPU's " << b[i];
    if (std::isnan(b[i])) continue;
    diff += (a[i] - b[i]) * (a[i] - b[i]);
    norm += b[i] * b[i];
  }
  EXPECT_LT(std::sqrt(diff / std::max(norm, 1.0)), tol) << what;
}

// Bit-identical (integers, indices, copies).
inline void expect_equal(const Tensor& got, const Tensor& ref, const std::string& what) {
  ASSERT_EQ(got.shape(), ref.shape()) << what;
  const std::vector<double> a = host(got), b = host(ref);
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    ASSERT_EQ(a[i], b[i]) << what << ": element " << i;
  }
}

// An attention kernel's outputs on one side, forward then backward.
struct AttentionOutputs {
  Tensor out, lse, bits, dq, dk, dv;
};

// out at `tol`, lse at `lse_tol`, the gradients at 2 tol, keep bits equal
// (when the reference has any).
inline void expect_attention_match(const AttentionOutputs& got, const AttentionOutputs& ref,
                                   double tol, double lse_tol) {
  expect_close(got.out, ref.out, tol, "out");
  expect_close(got.lse, ref.lse, lse_tol, "lse");
  if (ref.bits.defined()) expect_equal(got.bits, ref.bits, "keep bits");
  expect_close(got.dq, ref.dq, 2 * tol, "dq");
  expect_close(got.dk, ref.dk, 2 * tol, "dk");
  expect_close(got.dv, ref.dv, 2 * tol, "dv");
}

}  // namespace roformer::testing::emulated
