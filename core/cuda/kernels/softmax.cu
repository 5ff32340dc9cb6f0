// Softmax and log-softmax over the last dim of contiguous rows: one block per
// row (max, sum of exponentials, then the outputs).
#include "core/cuda/kernels/common.cuh"

namespace roformer::kernels::cuda {

namespace {

constexpr int kRowThreads = 256;

template <class T>
__global__ void softmax_forward_kernel(const T* x, T* y, int64_t cols, bool log_out) {
  using A = acc_t<T>;
  __shared__ A shared[32];
  const T* xr = x + int64_t(blockIdx.x) * cols;
  T* yr = y + int64_t(blockIdx.x) * cols;
  const auto [m, s] = row_max_sum_exp<T, A>(xr, cols, shared);
  if (log_out) {
    const A shift = m + log(s);
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
      yr[c] = convert<T>(convert<A>(xr[c]) - shift);
  } else {
    const A inv = A(1) / s;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
      yr[c] = convert<T>(exp(convert<A>(xr[c]) - m) * inv);
  }
}

template <class T>
__global__ void softmax_backward_kernel(const T* y, const T* dy, T* dx, int64_t cols,
                                        bool log_out) {
  using A = acc_t<T>;
  __shared__ A shared[32];
  const int64_t base = int64_t(blockIdx.x) * cols;
  A s = 0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    s += log_out ? convert<A>(dy[base + c]) : convert<A>(dy[base + c]) * convert<A>(y[base + c]);
  s = block_sum(s, shared);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const A g = convert<A>(dy[base + c]), v = convert<A>(y[base + c]);
    // log: dx = dy - softmax * sum(dy); else dx = y * (dy - sum(dy * y)).
    dx[base + c] = convert<T>(log_out ? g - exp(v) * s : v * (g - s));
  }
}

void check_rows(const KernelTensor& a, const KernelTensor& b, const char* what) {
  RF_CHECK(a.ndim >= 1 && a.is_contiguous() && b.is_contiguous() && a.numel() == b.numel(), what,
           ": expected contiguous tensors of one shape");
}

}  // namespace

void softmax_forward(Stream stream, const KernelTensor& x, const KernelTensor& y, bool log) {
  check_rows(x, y, "softmax_forward");
  if (x.numel() == 0) return;
  const int64_t cols = x.size(-1), rows = x.numel() / cols;
  on_floating_dtype(x.dtype, "softmax", [&](auto tag) {
    using T = decltype(tag);
    RF_LAUNCH((softmax_forward_kernel<T>), unsigned(rows), kRowThreads, 0, native(stream),
              x.as<const T>(), y.as<T>(), cols, log);
  });
}

void softmax_backward(Stream stream, const KernelTensor& y, const KernelTensor& dy,
                      const KernelTensor& dx, bool log) {
  check_rows(y, dx, "softmax_backward");
  check_rows(dy, dx, "softmax_backward");
  if (y.numel() == 0) return;
  const int64_t cols = y.size(-1), rows = y.numel() / cols;
  on_floating_dtype(y.dtype, "softmax", [&](auto tag) {
    using T = decltype(tag);
    RF_LAUNCH((softmax_backward_kernel<T>), unsigned(rows), kRowThreads, 0, native(stream),
              y.as<const T>(), dy.as<const T>(), dx.as<T>(), cols, log);
  });
}

}  // namespace roformer::kernels::cuda
