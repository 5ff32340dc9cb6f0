// Elementwise kernels: binary (operands expanded to the result's shape),
// unary with a scalar, where, GELU (erf form) and dropout. Binary and GELU
// over contiguous, aligned operands take eight elements a thread as whole
// 16-byte words (packs_of_eight), the n % 8 left by the strided kernel.
#include "core/cuda/kernels/common.cuh"
#include "core/cuda/kernels/dropout.cuh"
#include "core/philox.h"

namespace roformer::kernels::cuda {

namespace {

template <class T>
using arith_t = std::conditional_t<std::is_integral_v<T>, T, acc_t<T>>;

template <class T>
__device__ __forceinline__ T binary_value(BinaryOp op, T a, T b) {
  using A = arith_t<T>;
  const A x = convert<A>(a), y = convert<A>(b);
  switch (op) {
    case BinaryOp::add:
      return convert<T>(x + y);
    case BinaryOp::sub:
      return convert<T>(x - y);
    case BinaryOp::mul:
      return convert<T>(x * y);
    default:
      return convert<T>(x / y);
  }
}

template <class T>
__global__ void binary_kernel(BinaryOp op, const T* a, const T* b, T* out, Strided<3> geo,
                              int64_t n) {
  RF_GRID_LOOP(i, n) {
    int64_t off[3];
    geo.offsets(i, off);
    out[off[0]] = binary_value(op, a[off[1]], b[off[2]]);
  }
}

// Contiguous, aligned operands: eight elements a thread (packs_of_eight).
template <class T>
__global__ void binary_packed_kernel(BinaryOp op, const Pack8<T>* a, const Pack8<T>* b,
                                     Pack8<T>* out, int64_t packs) {
  RF_GRID_LOOP(i, packs) {
    const Pack8<T> x = a[i], y = b[i];
    Pack8<T> r;
#pragma unroll
    for (int e = 0; e < 8; ++e) r.v[e] = binary_value(op, x.v[e], y.v[e]);
    out[i] = r;
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

// GELU (erf form) and its gradient at x, dy.
template <class T>
__device__ __forceinline__ T gelu_value(T x) {
  using A = acc_t<T>;
  const A v = convert<A>(x);
  return convert<T>(A(0.5) * v * (A(1) + erf(v * A(0.70710678118654752440))));
}

template <class T>
__device__ __forceinline__ T gelu_gradient(T x, T dy) {
  using A = acc_t<T>;
  const A v = convert<A>(x);
  const A cdf = A(0.5) * (A(1) + erf(v * A(0.70710678118654752440)));
  const A pdf = exp(A(-0.5) * v * v) * A(0.39894228040143267794);
  return convert<T>(convert<A>(dy) * (cdf + v * pdf));
}

template <class T>
__global__ void gelu_forward_kernel(const T* x, T* y, Strided<2> geo, int64_t n) {
  RF_GRID_LOOP(i, n) {
    int64_t off[2];
    geo.offsets(i, off);
    y[off[0]] = gelu_value(x[off[1]]);
  }
}

// The packed GELU kernels take packs i and i + half a thread (half = the
// packs' first half, rounded up), both loaded before either is used: one
// 16-byte load a thread in flight left HBM short of requests at full
// occupancy (2,048 threads x 16 bytes an SM for bf16), two double it. The
// launch covers the first half (gelu_pack_pairs).
__host__ __device__ inline int64_t gelu_pack_pairs(int64_t packs) {
  return (packs + 1) / 2;
}

template <class T>
__global__ void gelu_forward_packed_kernel(const Pack8<T>* x, Pack8<T>* y, int64_t packs) {
  const int64_t half = gelu_pack_pairs(packs);
  RF_GRID_LOOP(i, half) {
    const bool second = i + half < packs;
    Pack8<T> in[2];
    in[0] = x[i];
    if (second) in[1] = x[i + half];
    Pack8<T> out[2];
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int e = 0; e < 8; ++e) out[h].v[e] = gelu_value(in[h].v[e]);
    y[i] = out[0];
    if (second) y[i + half] = out[1];
  }
}

template <class T>
__global__ void gelu_backward_kernel(const T* x, const T* dy, T* dx, Strided<3> geo, int64_t n) {
  RF_GRID_LOOP(i, n) {
    int64_t off[3];
    geo.offsets(i, off);
    dx[off[0]] = gelu_gradient(x[off[1]], dy[off[2]]);
  }
}

template <class T>
__global__ void gelu_backward_packed_kernel(const Pack8<T>* x, const Pack8<T>* dy, Pack8<T>* dx,
                                            int64_t packs) {
  const int64_t half = gelu_pack_pairs(packs);
  RF_GRID_LOOP(i, half) {
    const bool second = i + half < packs;
    Pack8<T> v[2], g[2];
    v[0] = x[i];
    g[0] = dy[i];
    if (second) {
      v[1] = x[i + half];
      g[1] = dy[i + half];
    }
    Pack8<T> out[2];
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int e = 0; e < 8; ++e) out[h].v[e] = gelu_gradient(v[h].v[e], g[h].v[e]);
    dx[i] = out[0];
    if (second) dx[i + half] = out[1];
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
    const void* const data[3] = {out.data, a.data, b.data};
    const int64_t packs = packs_of_eight<T>(geo, data) ? n / 8 : 0, done = packs * 8;
    if (packs > 0)
      RF_LAUNCH((binary_packed_kernel<T>), grid_for(packs), kThreads, 0, native(stream), op,
                a.as<const Pack8<T>>(), b.as<const Pack8<T>>(), out.as<Pack8<T>>(), packs);
    if (done < n)  // the rest (all of it unless packed): contiguous from `done` when packed
      RF_LAUNCH((binary_kernel<T>), grid_for(n - done), kThreads, 0, native(stream), op,
                a.as<const T>() + done, b.as<const T>() + done, out.as<T>() + done, geo, n - done);
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
    const void* const data[2] = {y.data, x.data};
    const int64_t packs = packs_of_eight<T>(geo, data) ? n / 8 : 0, done = packs * 8;
    if (packs > 0)
      RF_LAUNCH((gelu_forward_packed_kernel<T>), grid_for(gelu_pack_pairs(packs)), kThreads, 0,
                native(stream), x.as<const Pack8<T>>(), y.as<Pack8<T>>(), packs);
    if (done < n)
      RF_LAUNCH((gelu_forward_kernel<T>), grid_for(n - done), kThreads, 0, native(stream),
                x.as<const T>() + done, y.as<T>() + done, geo, n - done);
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
    const void* const data[3] = {dx.data, x.data, dy.data};
    const int64_t packs = packs_of_eight<T>(geo, data) ? n / 8 : 0, done = packs * 8;
    if (packs > 0)
      RF_LAUNCH((gelu_backward_packed_kernel<T>), grid_for(gelu_pack_pairs(packs)), kThreads, 0,
                native(stream), x.as<const Pack8<T>>(), dy.as<const Pack8<T>>(), dx.as<Pack8<T>>(),
                packs);
    if (done < n)
      RF_LAUNCH((gelu_backward_kernel<T>), grid_for(n - done), kThreads, 0, native(stream),
                x.as<const T>() + done, dy.as<const T>() + done, dx.as<T>() + done, geo, n - done);
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
