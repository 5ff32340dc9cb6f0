// Fused log-softmax + negative log-likelihood over rows of logits [N, C]: one
// pass over each row (a running max and sum, rescaled per chunk, with a
// vectorised exp, and the first column of the max for the accuracy); rows
// run in parallel, the loss is summed in row order.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/cpu/argmax_rule.h"
#include "core/cpu/strided_loop.h"
#include "core/cpu/vector_math.h"

namespace roformer::kernels::cpu {

namespace {

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

template <class A>
struct RowStats {
  A lse;
  int64_t argmax;
};

template <class T>
RowStats<row_t<T>> row_logsumexp_argmax(const T* x, int64_t cols) {
  using A = row_t<T>;
  alignas(64) A buf[std::is_same_v<T, A> ? 1 : kChunk];
  A m = -std::numeric_limits<A>::infinity(), s = 0;
  int64_t first = 0;  // the first column of m
  for (int64_t c0 = 0; c0 < cols; c0 += kChunk) {
    const int64_t n = std::min(kChunk, cols - c0);
    const A* v = load_chunk(x, c0, n, buf);
    A cm = -std::numeric_limits<A>::infinity();
#pragma omp simd reduction(max : cm)
    for (int64_t i = 0; i < n; ++i) cm = v[i] > cm ? v[i] : cm;
    if (cm > m) {
      int64_t i = 0;
      while (i < n && !(v[i] == cm)) ++i;
      first = c0 + i;
      s *= std::exp(m - cm);
      m = cm;
    }
    A cs = 0;
#pragma omp simd reduction(+ : cs)
    for (int64_t i = 0; i < n; ++i) cs += vexp(v[i] - m);
    s += cs;
  }
  const A lse = m + std::log(s);
  // A finite lse means no NaN and no infinity in the row: then `first` is
  // argmax's answer. The other rows (a diverged run's) take the serial scan.
  return {lse, std::isfinite(lse) ? first : argmax_index(x, cols)};
}

template <class Fn>
void with_targets(const View& targets, Fn&& fn) {
  dispatch_index(targets.dtype(), "cross_entropy", [&](auto tag) {
    using I = decltype(tag);
    const I* p = static_cast<const I*>(targets.data());
    fn([p](int64_t n) { return int64_t(p[n]); });
  });
}

}  // namespace

void cross_entropy_forward(Stream stream, KT logits_kt, KT targets_kt, int64_t ignore_index,
                           int32_t site, KT lse_kt, KT row_loss_kt, KT loss_kt, KT count_kt,
                           KT correct_kt) {
  const View logits(logits_kt), targets(targets_kt), lse(lse_kt), row_loss(row_loss_kt),
      loss(loss_kt), count_out(count_kt), correct_out(correct_kt);
  RF_CHECK(logits.dim() == 2 && logits.is_contiguous() && targets.is_contiguous() &&
               targets.numel() == logits.shape()[0],
           "cross_entropy_forward: expected contiguous logits [N, C] and targets [N], got ",
           logits.desc(), " and ", targets.desc());
  const int64_t rows = logits.shape()[0], cols = logits.shape()[1];
  double* plse = lse.data_as<double>();
  double* ploss = row_loss.data_as<double>();
  int64_t count = 0;
  std::vector<uint8_t> hit(size_t(rows), 0);
  with_targets(targets, [&](auto target) {
    // Counted rows, and the first bad target in row order (reported, then
    // treated as ignored so nothing reads outside the row).
    bool reported = false;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t t = target(r);
      if (t == ignore_index) continue;
      if (t < 0 || t >= cols) {
        if (!reported) report_index_error(stream, site, r, t);
        reported = true;
        continue;
      }
      ++count;
    }
  });
  dispatch_floating(logits.dtype(), "cross_entropy", [&](auto tag) {
    using T = decltype(tag);
    const T* x = static_cast<const T*>(logits.data());
    with_targets(targets, [&](auto target) {
      parallel_rows(rows, cols, [&](int64_t r) {
        const T* xr = x + r * cols;
        const auto stats = row_logsumexp_argmax(xr, cols);
        const double l = double(stats.lse);
        const int64_t t = target(r);
        const bool in = t != ignore_index && t >= 0 && t < cols;
        plse[r] = l;
        ploss[r] = in ? l - double(row_t<T>(xr[t])) : 0.0;
        hit[size_t(r)] = in && stats.argmax == t;
      });
    });
  });
  // Summed in row order, so the loss does not depend on the thread count.
  double sum = 0.0;
  for (int64_t r = 0; r < rows; ++r) sum += ploss[r];
  const double mean = count > 0 ? sum / double(count) : 0.0;
  if (loss.dtype() == DType::f64)
    *loss.data_as<double>() = mean;
  else
    *loss.data_as<float>() = float(mean);
  *count_out.data_as<int64_t>() = count;
  int64_t correct = 0;
  for (uint8_t h : hit) correct += h;
  *correct_out.data_as<int64_t>() = correct;
}

void cross_entropy_backward(Stream, KT logits_kt, KT targets_kt, int64_t ignore_index, KT lse_kt,
                            KT grad_loss_kt, KT count_kt, KT grad_kt) {
  const View logits(logits_kt), targets(targets_kt), lse(lse_kt), grad_loss(grad_loss_kt),
      count_in(count_kt), grad(grad_kt);
  const int64_t rows = logits.shape()[0], cols = logits.shape()[1];
  const double* plse = lse.data_as<double>();
  const int64_t count = *count_in.data_as<int64_t>();
  double grad_value = 0.0;
  dispatch_floating(grad_loss.dtype(), "cross_entropy", [&](auto tag) {
    grad_value = double(*static_cast<const decltype(tag)*>(grad_loss.data()));
  });
  const double scale = count > 0 ? grad_value / double(count) : 0.0;
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
        if (t == ignore_index || t < 0 || t >= cols) {
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

}  // namespace roformer::kernels::cpu
