#include "core/cpu/copy.h"

#include <cstring>

#include "core/cpu/strided_loop.h"

namespace roformer::cpu {

namespace {
template <class To, class From>
To convert(From v) {
  if constexpr (std::is_same_v<To, bf16>)
    return bf16(float(v));
  else if constexpr (std::is_same_v<From, bf16>)
    return To(float(v));
  else
    return To(v);
}
}  // namespace

void copy_strided(const Tensor& src, const Tensor& dst) {
  RF_CHECK(src.shape() == dst.shape(), "copy: shape mismatch, source ", src.desc(),
           " vs destination ", dst.desc());
  if (src.dtype() == dst.dtype() && src.is_contiguous() && dst.is_contiguous()) {
    std::memcpy(dst.data(), src.data(), src.nbytes());
    return;
  }
  dispatch_all(src.dtype(), [&](auto s) {
    using S = decltype(s);
    dispatch_all(dst.dtype(), [&](auto d) {
      using D = decltype(d);
      const S* in = static_cast<const S*>(src.data());
      D* out = static_cast<D*>(dst.data());
      for_each_run<2>(
          dst.shape(), {&dst.strides(), &src.strides()},
          [&](const std::array<int64_t, 2>& off, int64_t n, const std::array<int64_t, 2>& st) {
            D* o = out + off[0];
            const S* x = in + off[1];
            for (int64_t i = 0; i < n; ++i) o[i * st[0]] = convert<D>(x[i * st[1]]);
          });
    });
  });
}

void fill(const Tensor& dst, double value) {
  dispatch_all(dst.dtype(), [&](auto d) {
    using D = decltype(d);
    const D v = convert<D>(value);
    D* out = static_cast<D*>(dst.data());
    for_each_run<1>(
        dst.shape(), {&dst.strides()},
        [&](const std::array<int64_t, 1>& off, int64_t n, const std::array<int64_t, 1>& st) {
          for (int64_t i = 0; i < n; ++i) out[off[0] + i * st[0]] = v;
        });
  });
}

}  // namespace roformer::cpu
