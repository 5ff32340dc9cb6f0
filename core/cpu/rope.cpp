#include "core/cpu/rope.h"

#include <cmath>
#include <deque>
#include <mutex>

#include "core/cpu/strided_loop.h"

namespace roformer::cpu {

namespace {

struct TableEntry {
  std::vector<int64_t> positions;
  int64_t dim;
  double base;
  std::shared_ptr<const RopeTable> table;
};

std::shared_ptr<const RopeTable> build_table(const std::vector<int64_t>& positions, int64_t dim,
                                             double base) {
  auto t = std::make_shared<RopeTable>();
  t->positions = int64_t(positions.size());
  t->half = dim / 2;
  const size_t n = positions.size() * size_t(t->half);
  t->cos64.resize(n);
  t->sin64.resize(n);
  t->cos32.resize(n);
  t->sin32.resize(n);
  std::vector<double> theta(size_t(t->half));
  for (int64_t i = 0; i < t->half; ++i)
    theta[size_t(i)] = std::pow(base, -2.0 * double(i) / double(dim));
  for (size_t s = 0; s < positions.size(); ++s) {
    for (int64_t i = 0; i < t->half; ++i) {
      const size_t k = s * size_t(t->half) + size_t(i);
      const double angle = double(positions[s]) * theta[size_t(i)];
      t->cos64[k] = std::cos(angle);
      t->sin64[k] = std::sin(angle);
      t->cos32[k] = float(t->cos64[k]);
      t->sin32[k] = float(t->sin64[k]);
    }
  }
  return t;
}

template <class T>
void rotate(const Tensor& x, const RopeTable& table, bool interleaved, bool inverse,
            const Tensor& out) {
  using A = acc_t<T>;
  const int64_t nd = x.dim();
  const int64_t S = x.shape()[size_t(nd - 2)], D = x.shape()[size_t(nd - 1)];
  const int64_t half = D / 2;
  const int64_t ss = x.strides()[size_t(nd - 2)], sd = x.strides()[size_t(nd - 1)];
  const int64_t rows = x.numel() / std::max<int64_t>(D, 1);
  const T* px = static_cast<const T*>(x.data());
  T* po = static_cast<T*>(out.data());
  const A* cos_table = nullptr;
  const A* sin_table = nullptr;
  if constexpr (std::is_same_v<A, double>) {
    cos_table = table.cos64.data();
    sin_table = table.sin64.data();
  } else {
    cos_table = table.cos32.data();
    sin_table = table.sin32.data();
  }
  const A sign = inverse ? A(-1) : A(1);
  // Pair k's two elements sit at lo(k) and lo(k) + step in the head dim.
  const int64_t pair_stride = interleaved ? 2 : 1, step = interleaved ? 1 : half;
  parallel_rows(rows, D, [&](int64_t r) {
    const int64_t s = r % S;
    int64_t off = s * ss, rest = r / S;
    for (int64_t d = nd - 3; d >= 0; --d) {
      const int64_t size = x.shape()[size_t(d)];
      off += (rest % size) * x.strides()[size_t(d)];
      rest /= size;
    }
    const T* in = px + off;
    T* o = po + r * D;
    const A* c = cos_table + s * half;
    const A* sn = sin_table + s * half;
    if (sd == 1) {
      for (int64_t k = 0; k < half; ++k) {
        const int64_t lo = k * pair_stride;
        const A x0 = A(in[lo]), x1 = A(in[lo + step]), sk = sign * sn[k];
        o[lo] = T(x0 * c[k] - x1 * sk);
        o[lo + step] = T(x1 * c[k] + x0 * sk);
      }
    } else {
      for (int64_t k = 0; k < half; ++k) {
        const int64_t lo = k * pair_stride;
        const A x0 = A(in[lo * sd]), x1 = A(in[(lo + step) * sd]), sk = sign * sn[k];
        o[lo] = T(x0 * c[k] - x1 * sk);
        o[lo + step] = T(x1 * c[k] + x0 * sk);
      }
    }
  });
}

}  // namespace

std::shared_ptr<const RopeTable> rope_table(const std::vector<int64_t>& positions, int64_t dim,
                                            double base) {
  // A handful of tables covers a model (one per sequence length and base).
  constexpr size_t kCached = 8;
  static std::mutex mutex;
  static std::deque<TableEntry> cache;
  {
    std::lock_guard<std::mutex> lock(mutex);
    for (const TableEntry& e : cache)
      if (e.dim == dim && e.base == base && e.positions == positions) return e.table;
  }
  auto table = build_table(positions, dim, base);
  std::lock_guard<std::mutex> lock(mutex);
  cache.push_front(TableEntry{positions, dim, base, table});
  if (cache.size() > kCached) cache.pop_back();
  return table;
}

void rope(const Tensor& x, const RopeTable& table, bool interleaved, bool inverse,
          const Tensor& out) {
  RF_CHECK(x.dim() >= 2 && x.shape()[size_t(x.dim() - 2)] == table.positions &&
               x.shape().back() == 2 * table.half && out.shape() == x.shape() &&
               out.is_contiguous() && out.dtype() == x.dtype(),
           "rope kernel: bad geometry, x ", x.desc(), ", out ", out.desc(), ", table ",
           table.positions, " x ", table.half);
  if (x.numel() == 0) return;
  dispatch_floating(x.dtype(), "rope",
                    [&](auto tag) { rotate<decltype(tag)>(x, table, interleaved, inverse, out); });
}

}  // namespace roformer::cpu
