#include <cmath>

#include "core/cpu/strided_loop.h"

namespace roformer::kernels::cpu {

void binary(Stream, BinaryOp op, KT a_kt, KT b_kt, KT out_kt) {
  const View a(a_kt), b(b_kt), out(out_kt);
  dispatch_all(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using A = std::conditional_t<std::is_integral_v<T>, T, acc_t<T>>;
    const T* pa = static_cast<const T*>(a.data());
    const T* pb = static_cast<const T*>(b.data());
    T* po = static_cast<T*>(out.data());
    auto body = [&](auto f) {
      for_each_run<3>(
          out.shape(), {&out.strides(), &a.strides(), &b.strides()},
          [&](const std::array<int64_t, 3>& off, int64_t n, const std::array<int64_t, 3>& st) {
            T* o = po + off[0];
            const T* x = pa + off[1];
            const T* y = pb + off[2];
            if (st[0] == 1 && st[1] == 1 && st[2] == 1) {
              for (int64_t i = 0; i < n; ++i) o[i] = T(f(A(x[i]), A(y[i])));
            } else {
              for (int64_t i = 0; i < n; ++i) o[i * st[0]] = T(f(A(x[i * st[1]]), A(y[i * st[2]])));
            }
          });
    };
    switch (op) {
      case BinaryOp::add:
        body([](A x, A y) { return x + y; });
        break;
      case BinaryOp::sub:
        body([](A x, A y) { return x - y; });
        break;
      case BinaryOp::mul:
        body([](A x, A y) { return x * y; });
        break;
      case BinaryOp::div:
        body([](A x, A y) { return x / y; });
        break;
    }
  });
}

void unary(Stream, UnaryOp op, KT a_kt, KT out_kt, double scalar) {
  const View a(a_kt), out(out_kt);
  dispatch_all(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using A = std::conditional_t<std::is_integral_v<T>, double, acc_t<T>>;
    const A s = A(scalar);
    const T* pa = static_cast<const T*>(a.data());
    T* po = static_cast<T*>(out.data());
    auto body = [&](auto f) {
      for_each_run<2>(
          out.shape(), {&out.strides(), &a.strides()},
          [&](const std::array<int64_t, 2>& off, int64_t n, const std::array<int64_t, 2>& st) {
            T* o = po + off[0];
            const T* x = pa + off[1];
            for (int64_t i = 0; i < n; ++i) o[i * st[0]] = T(f(A(x[i * st[1]])));
          });
    };
    switch (op) {
      case UnaryOp::neg:
        body([](A x) { return -x; });
        break;
      case UnaryOp::exp:
        body([](A x) { return std::exp(x); });
        break;
      case UnaryOp::log:
        body([](A x) { return std::log(x); });
        break;
      case UnaryOp::sqrt:
        body([](A x) { return std::sqrt(x); });
        break;
      case UnaryOp::rsqrt:
        body([](A x) { return A(1) / std::sqrt(x); });
        break;
      case UnaryOp::tanh:
        body([](A x) { return std::tanh(x); });
        break;
      case UnaryOp::pow:
        body([s](A x) { return std::pow(x, s); });
        break;
      case UnaryOp::add_scalar:
        body([s](A x) { return x + s; });
        break;
      case UnaryOp::mul_scalar:
        body([s](A x) { return x * s; });
        break;
      case UnaryOp::rsub_scalar:
        body([s](A x) { return s - x; });
        break;
      case UnaryOp::elu_plus_one:
        body([](A x) { return x > A(0) ? x + A(1) : std::exp(x); });
        break;
      case UnaryOp::elu_plus_one_grad:
        body([](A x) { return x > A(0) ? A(1) : std::exp(x); });
        break;
    }
  });
}

void where(Stream, KT cond_kt, KT a_kt, KT b_kt, KT out_kt) {
  const View cond(cond_kt), a(a_kt), b(b_kt), out(out_kt);
  dispatch_all(cond.dtype(), [&](auto ctag) {
    using C = decltype(ctag);
    dispatch_all(out.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const C* pc = static_cast<const C*>(cond.data());
      const T* pa = static_cast<const T*>(a.data());
      const T* pb = static_cast<const T*>(b.data());
      T* po = static_cast<T*>(out.data());
      for_each_run<4>(
          out.shape(), {&out.strides(), &cond.strides(), &a.strides(), &b.strides()},
          [&](const std::array<int64_t, 4>& off, int64_t n, const std::array<int64_t, 4>& st) {
            for (int64_t i = 0; i < n; ++i)
              po[off[0] + i * st[0]] = float(pc[off[1] + i * st[1]]) != 0.0f
                                           ? pa[off[2] + i * st[2]]
                                           : pb[off[3] + i * st[3]];
          });
    });
  });
}

}  // namespace roformer::kernels::cpu
