#include <cmath>
#include <limits>

#include "core/cpu/argmax_rule.h"
#include "core/cpu/strided_loop.h"

namespace roformer::kernels::cpu {

void sum(Stream, KT x_kt, uint32_t reduced_dims, KT out_kt) {
  const View x(x_kt), out(out_kt);
  const int64_t nd = x.dim();
  std::vector<bool> reduced(static_cast<size_t>(nd));
  for (int64_t d = 0; d < nd; ++d) reduced[size_t(d)] = (reduced_dims >> d) & 1u;
  dispatch_all(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using A = std::conditional_t<std::is_integral_v<T>, int64_t, double>;
    const T* px = static_cast<const T*>(x.data());
    T* po = static_cast<T*>(out.data());
    // Fast path: contiguous input whose reduced dims all come first (a sum over
    // rows, as bias gradients are): add whole rows into the result.
    int64_t lead = 0;
    while (lead < nd && reduced[lead]) ++lead;
    bool rows_first = x.is_contiguous();
    for (int64_t d = lead; d < nd && rows_first; ++d) rows_first = !reduced[d];
    if (rows_first && lead > 0) {
      int64_t rows = 1, cols = 1;
      for (int64_t d = 0; d < lead; ++d) rows *= x.shape()[d];
      for (int64_t d = lead; d < nd; ++d) cols *= x.shape()[d];
      std::vector<A> acc(size_t(cols), A(0));
      for (int64_t r = 0; r < rows; ++r) {
        const T* row = px + r * cols;
        for (int64_t c = 0; c < cols; ++c) acc[c] += A(row[c]);
      }
      for (int64_t c = 0; c < cols; ++c) po[c] = T(acc[c]);
      return;
    }
    // General case: one output element per task, walking the reduced sub-shape.
    Shape kept_sizes, kept_strides, red_sizes, red_strides;
    for (int64_t d = 0; d < nd; ++d) {
      if (reduced[d]) {
        red_sizes.push_back(x.shape()[d]);
        red_strides.push_back(x.strides()[d]);
      } else {
        kept_sizes.push_back(x.shape()[d]);
        kept_strides.push_back(x.strides()[d]);
      }
    }
    const int64_t n_out = shape_numel(kept_sizes), n_red = shape_numel(red_sizes);
    parallel_rows(n_out, n_red, [&](int64_t o) {
      int64_t base = 0, rest = o;
      for (int64_t d = int64_t(kept_sizes.size()) - 1; d >= 0; --d) {
        base += (rest % kept_sizes[d]) * kept_strides[d];
        rest /= kept_sizes[d];
      }
      A acc = A(0);
      for (int64_t r = 0; r < n_red; ++r) {
        int64_t off = base, rr = r;
        for (int64_t d = int64_t(red_sizes.size()) - 1; d >= 0; --d) {
          off += (rr % red_sizes[d]) * red_strides[d];
          rr /= red_sizes[d];
        }
        acc += A(px[off]);
      }
      po[o] = T(acc);
    });
  });
}

namespace {
// Geometry of "one dim out of the rest": for each outer index, the base offset.
struct AlongDim {
  Shape rest_sizes, rest_strides;
  int64_t n_rest = 1;
  int64_t base(int64_t o) const {
    int64_t off = 0;
    for (int64_t d = int64_t(rest_sizes.size()) - 1; d >= 0; --d) {
      off += (o % rest_sizes[d]) * rest_strides[d];
      o /= rest_sizes[d];
    }
    return off;
  }
};
AlongDim along(const View& x, int64_t dim) {
  AlongDim a;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (d == dim) continue;
    a.rest_sizes.push_back(x.shape()[d]);
    a.rest_strides.push_back(x.strides()[d]);
  }
  a.n_rest = shape_numel(a.rest_sizes);
  return a;
}
}  // namespace

void max(Stream, KT x_kt, int32_t dim, KT values_kt, KT indices_kt) {
  const View x(x_kt), values(values_kt), indices(indices_kt);
  const AlongDim geo = along(x, dim);
  const int64_t n = x.shape()[dim], stride = x.strides()[dim];
  dispatch_all(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* px = static_cast<const T*>(x.data());
    T* pv = static_cast<T*>(values.data());
    int64_t* pi = indices.data_as<int64_t>();
    parallel_rows(geo.n_rest, n, [&](int64_t o) {
      const T* p = px + geo.base(o);
      const int64_t best = argmax_index(p, n, stride);
      pv[o] = p[best * stride];
      pi[o] = best;
    });
  });
}

void scatter_along(Stream, KT grad_kt, KT indices_kt, int32_t dim, KT grad_x_kt) {
  const View grad(grad_kt), indices(indices_kt), grad_x(grad_x_kt);
  const AlongDim geo = along(grad_x, dim);
  const int64_t stride = grad_x.strides()[dim];
  dispatch_all(grad_x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    // grad has the keepdim shape of indices; walk it in that (row-major) order.
    const AlongDim gg = along(grad, dim);
    const T* pg = static_cast<const T*>(grad.data());
    const int64_t* pi = indices.data_as<int64_t>();
    T* px = static_cast<T*>(grad_x.data());
    for (int64_t o = 0; o < geo.n_rest; ++o) px[geo.base(o) + pi[o] * stride] = pg[gg.base(o)];
  });
}

}  // namespace roformer::kernels::cpu
