// Elementwise kernels: binary (operands expanded to the result's shape),
// unary with a scalar, where, GELU (erf form) and dropout.
#include "core/cuda/kernels/common.cuh"
#include "core/cuda/kernels/dropout.cuh"
#include "core/philox.h"

namespace roformer::kernels::cuda {

namespace {

template <class T>
using arith_t = std::conditional_t<std::is_integral_v<T>, T, acc_t<T>>;

template <class T>
__global__ void binary_kernel(BinaryOp op, const T* a, const T* b, T* out, Strided<3> geo,
                              int64_t n) {
  using A = arith_t<T>;
  RF_GRID_LOOP(i, n) {
    int64_t off[3];
    geo.offsets(i, off);
    const A x = convert<A>(a[off[1]]), y = convert<A>(b[off[2]]);
    A r;
    switch (op) {
      case BinaryOp::add:
        r = x + y;
        break;
      case BinaryOp::sub:
        r = x - y;
        break;
      case BinaryOp::mul:
        r = x * y;
        break;
      default:
        r = x / y;
        break;
    }
    out[off[0]] = convert<T>(r);
  }
}

template <class A>
__device__ __forceinline__ A unary_value(UnaryOp op, A x, A s) {
  switch (op) {
    case UnaryOp::neg:
      return -x;
    case UnaryOp::exp:
      return exp(x);
    case UnaryOp::log:
      return log(x);
    case UnaryOp::sqrt:
      return sqrt(x);
    case UnaryOp::rsqrt:
      return A(1) / sqrt(x);
    case UnaryOp::tanh:
      return tanh(x);
    case UnaryOp::pow:
      return pow(x, s);
    case UnaryOp::add_scalar:
      return x + s;
    case UnaryOp::mul_scalar:
      return x * s;
    case UnaryOp::rsub_scalar:
      return s - x;
    case UnaryOp::elu_plus_one:
      return x > A(0) ? x + A(1) : exp(x);
    case UnaryOp::elu_plus_one_grad:
      return x > A(0) ? A(1) : exp(x);
  }
  return x;
}

template <class T>
__global__ void unary_kernel(UnaryOp op, const T* a, T* out, Strided<2> geo, int64_t n,
                             double scalar) {
  using A = std::conditional_t<std::is_integral_v<T>, double, acc_t<T>>;
  const A s = A(scalar);
  RF_GRID_LOOP(i, n) {
    int64_t off[2];
    geo.offsets(i, off);
    out[off[0]] = convert<T>(unary_value<A>(op, convert<A>(a[off[1]]), s));
  }
}

template <class C, class T>
__global__ void where_kernel(const C* cond, const T* a, const T* b, T* out, Strided<4> geo,
                             int64_t n) {
  RF_GRID_LOOP(i, n) {
    int64_t off[4];
    geo.offsets(i, off);
    out[off[0]] = convert<float>(cond[off[1]]) != 0.0f ? a[off[2]] : b[off[3]];
  }
}

template <class T>
__global__ void gelu_forward_kernel(const T* x, T* y, Strided<2> geo, int64_t n) {
  using A = acc_t<T>;
  RF_GRID_LOOP(i, n) {
    int64_t off[2];
    geo.offsets(i, off);
    const A v = convert<A>(x[off[1]]);
    y[off[0]] = convert<T>(A(0.5) * v * (A(1) + erf(v * A(0.70710678118654752440))));
  }
}

template <class T>
__global__ void gelu_backward_kernel(const T* x, const T* dy, T* dx, Strided<3> geo, int64_t n) {
  using A = acc_t<T>;
  RF_GRID_LOOP(i, n) {
    int64_t off[3];
    geo.offsets(i, off);
    const A v = convert<A>(x[off[1]]);
    const A cdf = A(0.5) * (A(1) + erf(v * A(0.70710678118654752440)));
    const A pdf = exp(A(-0.5) * v * v) * A(0.39894228040143267794);
    dx[off[0]] = convert<T>(convert<A>(dy[off[2]]) * (cdf + v * pdf));
  }
}

// Element (r, s, f) of x [rows, positions, features] keeps its value when
// the shared rule's draw for (sequence first + r, position s, feature f) is
// >= the threshold (core/philox.h): the CPU's mask, bit for bit. A thread
// takes one token's group of eight features (one Philox block).
template <class T>
__global__ void dropout_kernel(const T* x, T* out, int64_t n_groups, int64_t positions,
                               int64_t features, PhiloxKey pkey, DropoutKey key, uint32_t threshold,
                               acc_t<T> scale) {
  const int64_t groups = dropout_groups(features);
  RF_GRID_LOOP(i, n_groups) {
    const int64_t group = i % groups, token = i / groups;
    const int64_t s = token % positions, r = token / positions;
    drop_feature_group(x + token * features, out + token * features, features, group,
                       uint32_t(key.first_sequence + r), uint32_t(s), pkey, key.site, threshold,
                       scale);
  }
}

}  // namespace

void binary(Stream stream, BinaryOp op, const KernelTensor& a, const KernelTensor& b,
            const KernelTensor& out) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const KernelTensor* ops[3] = {&out, &a, &b};
  const Strided<3> geo = strided(out, ops);
  on_any_dtype(out.dtype, [&](auto tag) {
    using T = decltype(tag);
    RF_LAUNCH((binary_kernel<T>), grid_for(n), kThreads, 0, native(stream), op, a.as<const T>(),
              b.as<const T>(), out.as<T>(), geo, n);
  });
}

void unary(Stream stream, UnaryOp op, const KernelTensor& a, const KernelTensor& out,
           double scalar) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const KernelTensor* ops[2] = {&out, &a};
  const Strided<2> geo = strided(out, ops);
  on_any_dtype(out.dtype, [&](auto tag) {
    using T = decltype(tag);
    RF_LAUNCH((unary_kernel<T>), grid_for(n), kThreads, 0, native(stream), op, a.as<const T>(),
              out.as<T>(), geo, n, scalar);
  });
}

void where(Stream stream, const KernelTensor& cond, const KernelTensor& a, const KernelTensor& b,
           const KernelTensor& out) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const KernelTensor* ops[4] = {&out, &cond, &a, &b};
  const Strided<4> geo = strided(out, ops);
  on_any_dtype(cond.dtype, [&](auto ctag) {
    using C = decltype(ctag);
    on_any_dtype(out.dtype, [&](auto tag) {
      using T = decltype(tag);
      RF_LAUNCH((where_kernel<C, T>), grid_for(n), kThreads, 0, native(stream), cond.as<const C>(),
                a.as<const T>(), b.as<const T>(), out.as<T>(), geo, n);
    });
  });
}

void gelu_forward(Stream stream, const KernelTensor& x, const KernelTensor& y) {
  const int64_t n = y.numel();
  if (n == 0) return;
  const KernelTensor* ops[2] = {&y, &x};
  const Strided<2> geo = strided(y, ops);
  on_floating_dtype(x.dtype, "gelu", [&](auto tag) {
    using T = decltype(tag);
    RF_LAUNCH((gelu_forward_kernel<T>), grid_for(n), kThreads, 0, native(stream), x.as<const T>(),
              y.as<T>(), geo, n);
  });
}

void gelu_backward(Stream stream, const KernelTensor& x, const KernelTensor& dy,
                   const KernelTensor& dx) {
  const int64_t n = dx.numel();
  if (n == 0) return;
  const KernelTensor* ops[3] = {&dx, &x, &dy};
  const Strided<3> geo = strided(dx, ops);
  on_floating_dtype(x.dtype, "gelu", [&](auto tag) {
    using T = decltype(tag);
    RF_LAUNCH((gelu_backward_kernel<T>), grid_for(n), kThreads, 0, native(stream), x.as<const T>(),
              dy.as<const T>(), dx.as<T>(), geo, n);
  });
}

void dropout(Stream stream, const KernelTensor& x, const KernelTensor& out, double p,
             const DropoutKey& key) {
  RF_CHECK(x.ndim == 3 && x.is_contiguous() && out.is_contiguous() && x.numel() == out.numel(),
           "dropout kernel: expected contiguous x and out [rows, positions, features]");
  if (x.numel() == 0) return;
  const int64_t n_groups = x.sizes[0] * x.sizes[1] * dropout_groups(x.sizes[2]);
  on_floating_dtype(x.dtype, "dropout", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    RF_LAUNCH((dropout_kernel<T>), grid_for(n_groups), kThreads, 0, native(stream), x.as<const T>(),
              out.as<T>(), n_groups, x.sizes[1], x.sizes[2], dropout_key(key.seed, key.step), key,
              dropout_threshold(p), A(1.0 / (1.0 - p)));
  });
}

}  // namespace roformer::kernels::cuda
