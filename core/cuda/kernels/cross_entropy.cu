// Fused log-softmax + negative log-likelihood over rows of logits [N, C]:
// one block per row for the log-sum-exp and the row loss, then one block
// sums the row losses and counts the rows (a fixed tree: deterministic).
#include "core/cuda/kernels/common.cuh"

namespace roformer::kernels::cuda {

namespace {

constexpr int kRowThreads = 256;
constexpr int kFinishThreads = 1024;

template <class I>
__device__ __forceinline__ bool counted(const I* targets, int64_t r, int64_t ignore, int64_t cols,
                                        int64_t* t_out) {
  const int64_t t = int64_t(targets[r]);
  *t_out = t;
  return t != ignore && t >= 0 && t < cols;
}

template <class T, class I>
__global__ void row_loss_kernel(const T* logits, const I* targets, int64_t cols, int64_t ignore,
                                double* lse, double* row_loss) {
  using A = acc_t<T>;
  __shared__ A shared[32];
  const int64_t r = blockIdx.x;
  const T* x = logits + r * cols;
  const auto [m, s] = row_max_sum_exp<T, A>(x, cols, shared);
  if (threadIdx.x == 0) {
    const double l = double(m + log(s));
    int64_t t;
    lse[r] = l;
    row_loss[r] = counted(targets, r, ignore, cols, &t) ? l - double(convert<A>(x[t])) : 0.0;
  }
}

template <class I, class L>
__global__ void finish_kernel(const I* targets, const double* row_loss, int64_t rows, int64_t cols,
                              int64_t ignore, L* loss, int64_t* count,
                              unsigned long long* first_bad) {
  __shared__ double shared_sum[32];
  __shared__ long long shared_count[32];
  double sum = 0.0;
  long long n = 0;
  unsigned long long bad = ~0ull;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    int64_t t;
    if (counted(targets, r, ignore, cols, &t)) {
      ++n;
      sum += row_loss[r];
    } else if (t != ignore && (unsigned long long)r < bad) {
      bad = (unsigned long long)r;
    }
  }
  sum = block_sum(sum, shared_sum);
  n = block_sum(n, shared_count);
  if (bad != ~0ull) atomicMin(first_bad, bad);
  if (threadIdx.x == 0) {
    *count = n;
    *loss = L(n > 0 ? sum / double(n) : 0.0);
  }
}

template <class T, class I, class G>
__global__ void cross_entropy_grad_kernel(const T* logits, const I* targets, const double* lse,
                                          const G* grad_loss, const int64_t* count, T* grad,
                                          int64_t cols, int64_t ignore) {
  using A = acc_t<T>;
  const int64_t r = blockIdx.x;
  const T* x = logits + r * cols;
  T* g = grad + r * cols;
  int64_t t;
  if (!counted(targets, r, ignore, cols, &t)) {
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) g[c] = convert<T>(0.0f);
    return;
  }
  const int64_t n = *count;
  const A s = A(n > 0 ? convert<double>(*grad_loss) / double(n) : 0.0);
  const A l = A(lse[r]);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const A p = exp(convert<A>(x[c]) - l) * s;
    g[c] = convert<T>(c == t ? p - s : p);
  }
}

}  // namespace

void cross_entropy_forward(Stream stream, const KernelTensor& logits, const KernelTensor& targets,
                           int64_t ignore_index, int32_t site, const KernelTensor& lse,
                           const KernelTensor& row_loss, const KernelTensor& loss,
                           const KernelTensor& count) {
  RF_CHECK(logits.ndim == 2 && logits.is_contiguous() && targets.is_contiguous() &&
               targets.numel() == logits.sizes[0],
           "cross_entropy_forward: expected contiguous logits [N, C] and targets [N]");
  const int64_t rows = logits.sizes[0], cols = logits.sizes[1];
  on_index_dtype(targets.dtype, "cross_entropy targets", [&](auto itag) {
    using I = decltype(itag);
    if (rows > 0 && cols > 0) {
      on_floating_dtype(logits.dtype, "cross_entropy", [&](auto tag) {
        using T = decltype(tag);
        RF_LAUNCH((row_loss_kernel<T, I>), unsigned(rows), kRowThreads, 0, native(stream),
                  logits.as<const T>(), targets.as<const I>(), cols, ignore_index, lse.as<double>(),
                  row_loss.as<double>());
      });
    }
    Scratch first(stream, sizeof(unsigned long long));
    RF_CUDA_CHECK(
        cudaMemsetAsync(first.as<void>(), 0xff, sizeof(unsigned long long), native(stream)));
    auto finish = [&](auto ltag) {
      using L = decltype(ltag);
      RF_LAUNCH((finish_kernel<I, L>), 1, kFinishThreads, 0, native(stream), targets.as<const I>(),
                row_loss.as<const double>(), rows, cols, ignore_index, loss.as<L>(),
                count.as<int64_t>(), first.as<unsigned long long>());
    };
    if (loss.dtype == DType::f64)
      finish(double{});
    else
      finish(float{});
    report_first_bad(stream, site, first.as<const unsigned long long>(), targets);
  });
}

void cross_entropy_backward(Stream stream, const KernelTensor& logits, const KernelTensor& targets,
                            int64_t ignore_index, const KernelTensor& lse,
                            const KernelTensor& grad_loss, const KernelTensor& count,
                            const KernelTensor& grad) {
  RF_CHECK(logits.ndim == 2 && logits.is_contiguous() && grad.is_contiguous(),
           "cross_entropy_backward: expected contiguous logits and gradient [N, C]");
  const int64_t rows = logits.sizes[0], cols = logits.sizes[1];
  if (rows == 0 || cols == 0) return;
  on_index_dtype(targets.dtype, "cross_entropy targets", [&](auto itag) {
    using I = decltype(itag);
    on_floating_dtype(logits.dtype, "cross_entropy", [&](auto tag) {
      using T = decltype(tag);
      on_floating_dtype(grad_loss.dtype, "cross_entropy grad", [&](auto gtag) {
        using G = decltype(gtag);
        RF_LAUNCH((cross_entropy_grad_kernel<T, I, G>), unsigned(rows), kRowThreads, 0,
                  native(stream), logits.as<const T>(), targets.as<const I>(),
                  lse.as<const double>(), grad_loss.as<const G>(), count.as<const int64_t>(),
                  grad.as<T>(), cols, ignore_index);
      });
    });
  });
}

}  // namespace roformer::kernels::cuda
