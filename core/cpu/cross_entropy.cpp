#include "core/cpu/cross_entropy.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "core/cpu/strided_loop.h"

namespace roformer::cpu {

namespace {

// exp(x) for f32 without branches or calls, so loops over it vectorise
// (Cephes expf: x = n ln2 + r, |r| <= ln2/2, degree-6 polynomial for e^r;
// about 1 ulp). Inputs below -87 give 0, above 88 are clamped.
inline float vexp(float x) {
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

inline double vexp(double x) {
  return std::exp(x);
}

// Rows are read in chunks that stay in L1: the chunk max, then the exp-sum
// against the running max, so each row streams from memory once.
constexpr int64_t kChunk = 1024;

template <class T>
using row_t = acc_t<T>;  // f32 for f32/bf16 rows, f64 for f64

// Pointer to chunk [c0, c0 + n) of row x as row_t values (bf16 converted into buf).
template <class T>
const row_t<T>* load_chunk(const T* x, int64_t c0, int64_t n, row_t<T>* buf) {
  if constexpr (std::is_same_v<T, row_t<T>>) {
    (void)n;
    (void)buf;
    return x + c0;
  } else {
    for (int64_t i = 0; i < n; ++i) buf[i] = row_t<T>(x[c0 + i]);
    return buf;
  }
}

template <class T>
row_t<T> row_logsumexp(const T* x, int64_t cols) {
  using A = row_t<T>;
  alignas(64) A buf[std::is_same_v<T, A> ? 1 : kChunk];
  A m = -std::numeric_limits<A>::infinity(), s = 0;
  for (int64_t c0 = 0; c0 < cols; c0 += kChunk) {
    const int64_t n = std::min(kChunk, cols - c0);
    const A* v = load_chunk(x, c0, n, buf);
    A cm = -std::numeric_limits<A>::infinity();
#pragma omp simd reduction(max : cm)
    for (int64_t i = 0; i < n; ++i) cm = v[i] > cm ? v[i] : cm;
    if (cm > m) {
      s *= std::exp(m - cm);
      m = cm;
    }
    A cs = 0;
#pragma omp simd reduction(+ : cs)
    for (int64_t i = 0; i < n; ++i) cs += vexp(v[i] - m);
    s += cs;
  }
  return m + std::log(s);
}

template <class Fn>
void with_targets(const Tensor& targets, Fn&& fn) {
  dispatch_index(targets.dtype(), "cross_entropy", [&](auto tag) {
    using I = decltype(tag);
    const I* p = static_cast<const I*>(targets.data());
    fn([p](int64_t n) { return int64_t(p[n]); });
  });
}

}  // namespace

void cross_entropy_forward(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                           const Tensor& lse, const Tensor& row_loss) {
  const int64_t rows = logits.shape()[0], cols = logits.shape()[1];
  double* plse = lse.data_as<double>();
  double* ploss = row_loss.data_as<double>();
  dispatch_floating(logits.dtype(), "cross_entropy", [&](auto tag) {
    using T = decltype(tag);
    const T* x = static_cast<const T*>(logits.data());
    with_targets(targets, [&](auto target) {
      parallel_rows(rows, cols, [&](int64_t r) {
        const T* xr = x + r * cols;
        const double l = double(row_logsumexp(xr, cols));
        const int64_t t = target(r);
        plse[r] = l;
        ploss[r] = t == ignore_index ? 0.0 : l - double(row_t<T>(xr[t]));
      });
    });
  });
}

void cross_entropy_backward(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                            const Tensor& lse, double scale, const Tensor& grad) {
  const int64_t rows = logits.shape()[0], cols = logits.shape()[1];
  const double* plse = lse.data_as<double>();
  dispatch_floating(logits.dtype(), "cross_entropy", [&](auto tag) {
    using T = decltype(tag);
    using A = row_t<T>;
    const T* x = static_cast<const T*>(logits.data());
    T* g = static_cast<T*>(grad.data());
    with_targets(targets, [&](auto target) {
      parallel_rows(rows, cols, [&](int64_t r) {
        const T* xr = x + r * cols;
        T* gr = g + r * cols;
        const int64_t t = target(r);
        if (t == ignore_index) {
          std::memset(static_cast<void*>(gr), 0, size_t(cols) * sizeof(T));
          return;
        }
        const A l = A(plse[r]), s = A(scale);
        if constexpr (std::is_same_v<T, A>) {
#pragma omp simd
          for (int64_t c = 0; c < cols; ++c) gr[c] = vexp(xr[c] - l) * s;
        } else {
          for (int64_t c = 0; c < cols; ++c) gr[c] = T(vexp(A(xr[c]) - l) * s);
        }
        gr[t] = T(A(gr[t]) - s);
      });
    });
  });
}

}  // namespace roformer::cpu
