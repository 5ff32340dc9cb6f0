// Reductions: sum over a set of dims (deterministic: over leading dims of a
// contiguous tensor, the bias gradients' case, as two-pass column sums;
// otherwise one thread per output element, the reduced elements in row-major
// order), max along a dim with its argmax, and the argmax scatter of max's
// backward.
#include "core/cuda/kernels/column_sums.cuh"
#include "core/cuda/kernels/common.cuh"

namespace roformer::kernels::cuda {

namespace {

// Kept and reduced sub-geometries of x.
struct SplitDims {
  int32_t kept_ndim = 0, red_ndim = 0;
  int64_t kept_sizes[kMaxDims] = {}, kept_strides[kMaxDims] = {};
  int64_t red_sizes[kMaxDims] = {}, red_strides[kMaxDims] = {};
  int64_t n_kept = 1, n_red = 1;
};

__device__ __forceinline__ int64_t walk(int64_t i, int32_t nd, const int64_t* sizes,
                                        const int64_t* strides) {
  int64_t off = 0;
  for (int32_t d = nd - 1; d >= 0; --d) {
    off += (i % sizes[d]) * strides[d];
    i /= sizes[d];
  }
  return off;
}

template <class T>
__global__ void sum_kernel(const T* x, T* out, SplitDims g) {
  using A = std::conditional_t<std::is_integral_v<T>, int64_t, double>;
  RF_GRID_LOOP(o, g.n_kept) {
    const int64_t base = walk(o, g.kept_ndim, g.kept_sizes, g.kept_strides);
    A acc = A(0);
    for (int64_t r = 0; r < g.n_red; ++r)
      acc += convert<A>(x[base + walk(r, g.red_ndim, g.red_sizes, g.red_strides)]);
    out[o] = convert<T>(acc);
  }
}

template <class T>
__global__ void max_kernel(const T* x, T* values, int64_t* indices, SplitDims g, int64_t n,
                           int64_t stride) {
  RF_GRID_LOOP(o, g.n_kept) {
    const T* p = x + walk(o, g.kept_ndim, g.kept_sizes, g.kept_strides);
    int64_t best = 0;
    double best_value = convert<double>(p[0]);
    for (int64_t i = 1; i < n; ++i) {
      const double v = convert<double>(p[i * stride]);
      if (v > best_value || (isnan(v) && !isnan(best_value))) {
        best_value = v;
        best = i;
      }
    }
    values[o] = p[best * stride];
    indices[o] = best;
  }
}

// One warp per output for long reductions (the MLM head's vocabulary rows):
// lanes scan every 32nd element, reading neighbours together, then combine
// by argmax_wins (common.cuh); the same winner as max_kernel's one-thread
// scan.
template <class T>
__global__ void max_warp_kernel(const T* x, T* values, int64_t* indices, SplitDims g, int64_t n,
                                int64_t stride) {
  const int lane = int(threadIdx.x % 32);
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t o = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; o < g.n_kept;
       o += warps) {
    const T* p = x + walk(o, g.kept_ndim, g.kept_sizes, g.kept_strides);
    int64_t best = lane;  // n >= 32: every lane has an element
    double best_value = convert<double>(p[lane * stride]);
    for (int64_t i = lane + 32; i < n; i += 32) {
      const double v = convert<double>(p[i * stride]);
      if (v > best_value || (isnan(v) && !isnan(best_value))) {
        best_value = v;
        best = i;
      }
    }
    for (int w = 16; w > 0; w /= 2) {
      const double other_value = __shfl_xor_sync(0xffffffffu, best_value, w);
      const int64_t other = __shfl_xor_sync(0xffffffffu, best, w);
      if (argmax_wins(other_value, other, best_value, best)) best_value = other_value, best = other;
    }
    if (lane == 0) {
      values[o] = p[best * stride];
      indices[o] = best;
    }
  }
}

template <class T>
__global__ void scatter_along_kernel(const T* grad, const int64_t* indices, T* grad_x, SplitDims gx,
                                     SplitDims gg, int64_t stride) {
  RF_GRID_LOOP(o, gx.n_kept) {
    grad_x[walk(o, gx.kept_ndim, gx.kept_sizes, gx.kept_strides) + indices[o] * stride] =
        grad[walk(o, gg.kept_ndim, gg.kept_sizes, gg.kept_strides)];
  }
}

SplitDims split(const KernelTensor& x, uint32_t reduced_mask) {
  SplitDims g;
  for (int32_t d = 0; d < x.ndim; ++d) {
    if ((reduced_mask >> d) & 1u) {
      g.red_sizes[g.red_ndim] = x.sizes[d];
      g.red_strides[g.red_ndim++] = x.strides[d];
      g.n_red *= x.sizes[d];
    } else {
      g.kept_sizes[g.kept_ndim] = x.sizes[d];
      g.kept_strides[g.kept_ndim++] = x.strides[d];
      g.n_kept *= x.sizes[d];
    }
  }
  return g;
}

}  // namespace

void sum(Stream stream, const KernelTensor& x, uint32_t reduced_dims, const KernelTensor& out) {
  const SplitDims g = split(x, reduced_dims);
  if (g.n_kept == 0) return;
  // Reduced dims 0..k-1 of a contiguous x: a [n_red, n_kept] matrix.
  const bool leading = x.is_contiguous() && out.is_contiguous() && g.red_ndim > 0 &&
                       reduced_dims == (1u << g.red_ndim) - 1u;
  on_any_dtype(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    using A = std::conditional_t<std::is_integral_v<T>, int64_t, double>;  // as sum_kernel
    if (leading) {
      column_sums<A>(stream, x.as<const T>(), out.as<T>(), g.n_red, g.n_kept);
      return;
    }
    RF_LAUNCH((sum_kernel<T>), grid_for(g.n_kept), kThreads, 0, native(stream), x.as<const T>(),
              out.as<T>(), g);
  });
}

void max(Stream stream, const KernelTensor& x, int32_t dim, const KernelTensor& values,
         const KernelTensor& indices) {
  const SplitDims g = split(x, 1u << dim);
  if (g.n_kept == 0) return;
  RF_CHECK(x.sizes[dim] > 0, "max: empty dimension ", dim);
  on_any_dtype(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    // A warp per output only where its lanes read neighbours (unit stride):
    // along a strided dim the one-thread scan's neighbours read neighbours.
    if (x.sizes[dim] >= 32 && x.strides[dim] == 1) {
      RF_LAUNCH((max_warp_kernel<T>), grid_for(g.n_kept * 32), kThreads, 0, native(stream),
                x.as<const T>(), values.as<T>(), indices.as<int64_t>(), g, x.sizes[dim],
                x.strides[dim]);
      return;
    }
    RF_LAUNCH((max_kernel<T>), grid_for(g.n_kept), kThreads, 0, native(stream), x.as<const T>(),
              values.as<T>(), indices.as<int64_t>(), g, x.sizes[dim], x.strides[dim]);
  });
}

void scatter_along(Stream stream, const KernelTensor& grad, const KernelTensor& indices,
                   int32_t dim, const KernelTensor& grad_x) {
  const SplitDims gx = split(grad_x, 1u << dim), gg = split(grad, 1u << dim);
  if (gx.n_kept == 0) return;
  on_any_dtype(grad_x.dtype, [&](auto tag) {
    using T = decltype(tag);
    RF_LAUNCH((scatter_along_kernel<T>), grid_for(gx.n_kept), kThreads, 0, native(stream),
              grad.as<const T>(), indices.as<const int64_t>(), grad_x.as<T>(), gx, gg,
              grad_x.strides[dim]);
  });
}

}  // namespace roformer::kernels::cuda
