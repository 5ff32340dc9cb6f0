// Double-precision central finite-difference gradient check: compares the
// analytic gradient of sum(f(inputs) * r), with r a fixed random projection,
// against (L(x + h) - L(x - h)) / 2h for every element of every input.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <vector>

#include "core/ops.h"

namespace roformer::testing {

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

// Random f64 tensor with values in [lo, hi).
inline Tensor random_f64(const Shape& shape, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  Generator gen{seed, 0};
  return add(mul(Tensor::rand(shape, gen, DType::f64), hi - lo), lo);
}

inline ::testing::AssertionResult gradcheck(const Fn& f, std::vector<Tensor> inputs,
                                            double h = 1e-6, double tol = 1e-6) {
  for (Tensor& t : inputs) {
    if (t.dtype() == DType::f64) t = t.detach().clone().set_requires_grad(true);
  }
  Tensor out = f(inputs);
  Generator gen{99, 0};
  const Tensor r = Tensor::rand(out.shape(), gen, DType::f64);
  sum(mul(out, r)).backward();

  auto loss_at = [&]() {
    NoGradGuard no_grad;
    return sum(mul(f(inputs), r)).item();
  };
  for (size_t k = 0; k < inputs.size(); ++k) {
    Tensor& x = inputs[k];
    if (!x.requires_grad()) continue;
    const Tensor grad = x.grad();
    if (!grad.defined())
      return ::testing::AssertionFailure() << "input " << k << " got no gradient";
    const std::vector<double> analytic = grad.to_vector<double>();
    double* p = x.data_as<double>();
    for (int64_t i = 0; i < x.numel(); ++i) {
      const double saved = p[i];
      p[i] = saved + h;
      const double up = loss_at();
      p[i] = saved - h;
      const double down = loss_at();
      p[i] = saved;
      const double numeric = (up - down) / (2 * h);
      const double err = std::abs(numeric - analytic[i]);
      if (err > tol * (1.0 + std::abs(numeric)))
        return ::testing::AssertionFailure()
               << "input " << k << " element " << i << ": analytic " << analytic[i]
               << " vs numeric " << numeric << " (shape " << shape_str(x.shape()) << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

// Max |a - b| / (atol + rtol * |b|) <= 1 for every element.
inline ::testing::AssertionResult all_close(const Tensor& a, const Tensor& b, double rtol = 1e-5,
                                            double atol = 1e-6) {
  if (a.shape() != b.shape())
    return ::testing::AssertionFailure() << "shapes differ: " << a.desc() << " vs " << b.desc();
  const auto va = a.to_vector<double>(), vb = b.to_vector<double>();
  for (size_t i = 0; i < va.size(); ++i) {
    if (!(std::abs(va[i] - vb[i]) <= atol + rtol * std::abs(vb[i])))
      return ::testing::AssertionFailure()
             << "element " << i << ": " << va[i] << " vs " << vb[i] << " (" << a.desc() << ")";
  }
  return ::testing::AssertionSuccess();
}

}  // namespace roformer::testing
