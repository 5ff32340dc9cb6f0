// Rotary position embedding kernels (paper eq. 34): the cos/sin table for the
// positions of a call and a strided rotation of [..., S, D] by it.
#include <cmath>

#include "core/cpu/strided_loop.h"

namespace roformer::kernels::cpu {

namespace {

template <class T, class A>
void rotate(const View& x, const A* cos_table, const A* sin_table, bool interleaved, bool inverse,
            const View& out) {
  const int64_t nd = x.dim();
  const int64_t S = x.shape()[size_t(nd - 2)], D = x.shape()[size_t(nd - 1)];
  const int64_t half = D / 2;
  const int64_t ss = x.strides()[size_t(nd - 2)], sd = x.strides()[size_t(nd - 1)];
  const int64_t rows = x.numel() / std::max<int64_t>(D, 1);
  const T* px = static_cast<const T*>(x.data());
  T* po = static_cast<T*>(out.data());
  const A sign = inverse ? A(-1) : A(1);
  // Pair k's two elements sit at lo(k) and lo(k) + step in the head dim.
  const int64_t pair_stride = interleaved ? 2 : 1, step = interleaved ? 1 : half;
  parallel_rows(rows, D, [&](int64_t r) {
    const int64_t s = r % S;
    int64_t off = s * ss, out_off = s * out.strides()[size_t(nd - 2)], rest = r / S;
    for (int64_t d = nd - 3; d >= 0; --d) {
      const int64_t size = x.shape()[size_t(d)], i = rest % size;
      off += i * x.strides()[size_t(d)];
      out_off += i * out.strides()[size_t(d)];
      rest /= size;
    }
    const T* in = px + off;
    T* o = po + out_off;
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

void rope_table(Stream, KT positions_kt, double base, KT table_kt) {
  const View positions(positions_kt), table(table_kt);
  RF_CHECK(table.dim() == 3 && table.shape()[0] == 2 && table.is_contiguous() &&
               positions.dim() == 1 && positions.shape()[0] == table.shape()[1],
           "rope_table: expected positions [S] and a contiguous table [2, S, D/2], got ",
           positions.desc(), " and ", table.desc());
  const int64_t S = table.shape()[1], half = table.shape()[2], dim = 2 * half;
  std::vector<double> theta(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    theta[size_t(i)] = std::pow(base, -2.0 * double(i) / double(dim));
  dispatch_index(positions.dtype(), "rope positions", [&](auto itag) {
    using I = decltype(itag);
    const I* pos = static_cast<const I*>(positions.data());
    const int64_t pstride = positions.strides()[0];
    dispatch_floating(table.dtype(), "rope table", [&](auto tag) {
      using T = decltype(tag);
      T* cos_out = static_cast<T*>(table.data());
      T* sin_out = cos_out + S * half;
      // Angles in double whatever the table's dtype.
      for (int64_t s = 0; s < S; ++s)
        for (int64_t i = 0; i < half; ++i) {
          const double angle = double(pos[s * pstride]) * theta[size_t(i)];
          cos_out[s * half + i] = T(std::cos(angle));
          sin_out[s * half + i] = T(std::sin(angle));
        }
    });
  });
}

void rope(Stream, KT x_kt, KT table_kt, bool interleaved, bool inverse, KT out_kt) {
  const View x(x_kt), table(table_kt), out(out_kt);
  RF_CHECK(x.dim() >= 2 && table.dim() == 3 && x.shape()[size_t(x.dim() - 2)] == table.shape()[1] &&
               x.shape().back() == 2 * table.shape()[2] && out.shape() == x.shape() &&
               out.strides().back() == 1 && out.dtype() == x.dtype() && table.is_contiguous(),
           "rope kernel: bad geometry, x ", x.desc(), ", out ", out.desc(), ", table ",
           table.desc());
  if (x.numel() == 0) return;
  const int64_t n = table.shape()[1] * table.shape()[2];
  dispatch_floating(x.dtype(), "rope", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    RF_CHECK(table.dtype() == dtype_of<A>(), "rope kernel: table ", table.desc(), " for x ",
             x.desc(), " (expected ", dtype_name(dtype_of<A>()), ")");
    const A* cos_table = static_cast<const A*>(table.data());
    rotate<T, A>(x, cos_table, cos_table + n, interleaved, inverse, out);
  });
}

}  // namespace roformer::kernels::cpu
