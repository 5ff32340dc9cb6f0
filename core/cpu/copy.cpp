// copy (with casts, any geometry, overlap-safe), fill and Philox random fill.
#include <cmath>
#include <cstring>

#include "core/cpu/strided_loop.h"
#include "core/cpu/vector_math.h"
#include "core/philox.h"

namespace roformer::kernels::cpu {

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

void copy_views(const View& src, const View& dst) {
  if (src.dtype() == dst.dtype() && src.is_contiguous() && dst.is_contiguous()) {
    std::memmove(dst.data(), src.data(), src.nbytes());
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
            // Unit-stride runs between f32 and bf16 (mixed-precision casts) vectorise.
            if constexpr (std::is_same_v<S, float> && std::is_same_v<D, bf16>) {
              if (st[0] == 1 && st[1] == 1) return to_bf16_row(x, o, n);
            } else if constexpr (std::is_same_v<S, bf16> && std::is_same_v<D, float>) {
              if (st[0] == 1 && st[1] == 1) return from_bf16_row(x, o, n);
            }
            for (int64_t i = 0; i < n; ++i) o[i * st[0]] = convert<D>(x[i * st[1]]);
          });
    });
  });
}
}  // namespace

void copy(Stream, KT src_kt, KT dst_kt) {
  const View src(src_kt), dst(dst_kt);
  RF_CHECK(src.shape() == dst.shape(), "copy: shape mismatch, source ", src.desc(),
           " vs destination ", dst.desc());
  // Overlapping views (a shifted narrow of the same storage) would read
  // elements already overwritten: go through a temporary. Contiguous
  // same-dtype copies use memmove, which handles overlap itself.
  const bool plain = src.dtype() == dst.dtype() && src.is_contiguous() && dst.is_contiguous();
  if (!plain && may_overlap(src, dst)) {
    const Scratch tmp(src.shape(), src.dtype());
    copy_views(src, tmp.view());
    copy_views(tmp.view(), dst);
    return;
  }
  copy_views(src, dst);
}

void fill(Stream, KT dst_kt, double value) {
  const View dst(dst_kt);
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

void random_fill(Stream, KT out_kt, uint64_t seed, uint64_t offset, bool normal) {
  const View out(out_kt);
  RF_CHECK(out.is_contiguous(), "random_fill: expected a contiguous output, got ", out.desc());
  const int64_t n = out.numel();
  const PhiloxKey key{uint32_t(seed), uint32_t(seed >> 32)};
  dispatch_floating(out.dtype(), "random_fill", [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(out.data());
    if (!normal) {
      // Word offset + i of the stream (four words per Philox block).
      parallel_rows(n, 16, [&](int64_t i) {
        const uint64_t word = offset + uint64_t(i);
        const uint64_t block = word / 4;
        const auto bits = philox4x32({uint32_t(block), uint32_t(block >> 32), 0, 0}, key);
        p[i] = convert<T>(double(uniform_from_bits(bits[word % 4])));
      });
      return;
    }
    // Two words per number (Box-Muller), words `word` and `word + 1` of the
    // stream (the second in the next block when the first ends one).
    parallel_rows(n, 64, [&](int64_t i) {
      const uint64_t word = offset + 2 * uint64_t(i);
      const uint64_t block = word / 4;
      const auto bits = philox4x32({uint32_t(block), uint32_t(block >> 32), 0, 0}, key);
      const double u1 = open_uniform_from_bits(bits[int(word % 4)]);
      const double u2 = open_uniform_from_bits(word % 4 < 3 ? bits[int(word % 4 + 1)]
                                                            : philox_word(seed, word + 1));
      p[i] = convert<T>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
    });
  });
}

}  // namespace roformer::kernels::cpu
