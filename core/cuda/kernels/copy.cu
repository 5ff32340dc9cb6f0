// copy (casts, any geometry, overlap-safe), fill and the Philox random fill.
#include "core/cuda/kernels/common.cuh"
#include "core/philox.h"

namespace roformer::kernels::cuda {

namespace {

template <class S, class D>
__global__ void copy_kernel(const S* src, D* dst, Strided<2> geo, int64_t n) {
  RF_GRID_LOOP(i, n) {
    int64_t off[2];
    geo.offsets(i, off);
    dst[off[0]] = convert<D>(src[off[1]]);
  }
}

template <class D>
__global__ void fill_kernel(D* dst, Strided<1> geo, int64_t n, D value) {
  RF_GRID_LOOP(i, n) {
    int64_t off[1];
    geo.offsets(i, off);
    dst[off[0]] = value;
  }
}

template <class T>
__global__ void random_kernel(T* out, int64_t n, uint64_t seed, uint64_t offset, bool normal) {
  RF_GRID_LOOP(i, n) {
    if (!normal) {
      out[i] = convert<T>(double(uniform_from_bits(philox_word(seed, offset + uint64_t(i)))));
    } else {
      // Two words per number (Box-Muller), as the CPU draws them.
      const uint64_t word = offset + 2 * uint64_t(i);
      const double u1 = open_uniform_from_bits(philox_word(seed, word));
      const double u2 = open_uniform_from_bits(philox_word(seed, word + 1));
      out[i] = convert<T>(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
    }
  }
}

// Whether two views may share bytes (a conservative address-range test).
bool may_overlap(const KernelTensor& a, const KernelTensor& b) {
  auto range = [](const KernelTensor& t, const char*& lo, const char*& hi) {
    int64_t min_off = 0, max_off = 0;
    for (int32_t d = 0; d < t.ndim; ++d) {
      const int64_t span = (t.sizes[d] - 1) * t.strides[d];
      if (span < 0)
        min_off += span;
      else
        max_off += span;
    }
    const size_t es = dtype_size(t.dtype);
    lo = static_cast<const char*>(t.data) + min_off * int64_t(es);
    hi = static_cast<const char*>(t.data) + (max_off + 1) * int64_t(es);
  };
  if (a.numel() == 0 || b.numel() == 0) return false;
  const char *alo, *ahi, *blo, *bhi;
  range(a, alo, ahi);
  range(b, blo, bhi);
  return alo < bhi && blo < ahi;
}

void copy_views(const Stream& stream, const KernelTensor& src, const KernelTensor& dst) {
  const int64_t n = dst.numel();
  if (n == 0) return;
  if (src.dtype == dst.dtype && src.is_contiguous() && dst.is_contiguous()) {
    RF_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, nbytes_of(dst), cudaMemcpyDeviceToDevice,
                                  native(stream)));
    return;
  }
  const KernelTensor* ops[2] = {&dst, &src};
  const Strided<2> geo = strided(dst, ops);
  on_any_dtype(src.dtype, [&](auto s) {
    using S = decltype(s);
    on_any_dtype(dst.dtype, [&](auto d) {
      using D = decltype(d);
      RF_LAUNCH((copy_kernel<S, D>), grid_for(n), kThreads, 0, native(stream), src.as<const S>(),
                dst.as<D>(), geo, n);
    });
  });
}

}  // namespace

void copy(Stream stream, const KernelTensor& src, const KernelTensor& dst) {
  RF_CHECK(src.ndim == dst.ndim, "copy: ", src.ndim, "-d source for a ", dst.ndim,
           "-d destination");
  for (int32_t d = 0; d < dst.ndim; ++d)
    RF_CHECK(src.sizes[d] == dst.sizes[d], "copy: shape mismatch at dimension ", d);
  const bool plain = src.dtype == dst.dtype && src.is_contiguous() && dst.is_contiguous();
  if (plain && src.data == dst.data) return;  // a copy onto itself
  if (!plain && may_overlap(src, dst)) {
    // Threads would read elements others already overwrote: via a temporary.
    Scratch tmp(stream, nbytes_of(src));
    const KernelTensor staged = contiguous_like(src, tmp.as<void>(), src.dtype);
    copy_views(stream, src, staged);
    copy_views(stream, staged, dst);
    return;
  }
  if (plain && may_overlap(src, dst) && src.data != dst.data) {
    // cudaMemcpy does not promise memmove semantics.
    Scratch tmp(stream, nbytes_of(src));
    const KernelTensor staged = contiguous_like(src, tmp.as<void>(), src.dtype);
    copy_views(stream, src, staged);
    copy_views(stream, staged, dst);
    return;
  }
  copy_views(stream, src, dst);
}

void fill(Stream stream, const KernelTensor& dst, double value) {
  const int64_t n = dst.numel();
  if (n == 0) return;
  const KernelTensor* ops[1] = {&dst};
  const Strided<1> geo = strided(dst, ops);
  on_any_dtype(dst.dtype, [&](auto d) {
    using D = decltype(d);
    D v;
    if constexpr (std::is_same_v<D, bf16_t>)
      v = __float2bfloat16_rn(float(value));
    else
      v = D(value);
    RF_LAUNCH((fill_kernel<D>), grid_for(n), kThreads, 0, native(stream), dst.as<D>(), geo, n, v);
  });
}

void random_fill(Stream stream, const KernelTensor& out, uint64_t seed, uint64_t offset,
                 bool normal) {
  RF_CHECK(out.is_contiguous(), "random_fill: expected a contiguous output");
  const int64_t n = out.numel();
  if (n == 0) return;
  on_floating_dtype(out.dtype, "random_fill", [&](auto tag) {
    using T = decltype(tag);
    RF_LAUNCH((random_kernel<T>), grid_for(n), kThreads, 0, native(stream), out.as<T>(), n, seed,
              offset, normal);
  });
}

}  // namespace roformer::kernels::cuda
