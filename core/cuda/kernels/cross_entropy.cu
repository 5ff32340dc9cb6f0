// Fused log-softmax + negative log-likelihood over rows of logits [N, C]:
// one block per row reads it once (a running max and a sum of exp rescaled
// when the max grows, in 16-byte packs where the rows allow), giving the
// log-sum-exp, the row loss and whether the row's argmax is its target;
// then one block sums the row losses and counts the rows and the hits (a
// fixed tree: deterministic). The backward is one pass of packs a row.
#include "core/cuda/kernels/common.cuh"

namespace roformer::kernels::cuda {

namespace {

constexpr int kRowThreads = 256;
constexpr int kFinishThreads = 1024;
constexpr int64_t kNoColumn = INT64_MAX;

template <class I>
__device__ __forceinline__ bool counted(const I* targets, int64_t r, int64_t ignore, int64_t cols,
                                        int64_t* t_out) {
  const int64_t t = int64_t(targets[r]);
  *t_out = t;
  return t != ignore && t >= 0 && t < cols;
}

// Whether every row starts on a Pack8 boundary (16 bytes) in `data`; a
// row's last cols % 8 columns are then taken one by one.
template <class T>
bool rows_in_packs(const void* data, int64_t cols) {
  return sizeof(Pack8<T>) == 8 * sizeof(T) && on_pack_boundary(data) &&
         (cols * int64_t(sizeof(T))) % int64_t(alignof(Pack8<T>)) == 0;
}

// A thread's share of a row, its columns taken in increasing order: the
// running max, the sum of exp(x - max) (rescaled when the max grows) and the
// first of its columns holding the max. NaN never wins a comparison, so a
// NaN only shows in the sum, which it makes NaN.
template <class A>
struct RowScan {
  A max = A(-INFINITY);
  A sum = A(0);
  int64_t first = kNoColumn;

  template <int N>
  __device__ __forceinline__ void add(const A (&v)[N], int64_t c0) {
    A vm = A(-INFINITY);
#pragma unroll
    for (int e = 0; e < N; ++e) vm = v[e] > vm ? v[e] : vm;
    if (vm > max) {
      // vm is one of v (it beat -inf, so it is no NaN); the first of them,
      // found without indexing v by a variable (which would put v in memory).
      int at = 0;
#pragma unroll
      for (int e = N - 1; e >= 0; --e) at = v[e] == vm ? e : at;
      first = c0 + at;
      sum *= exp(max - vm);  // 0 while max is -inf: exp(-inf)
      max = vm;
    }
#pragma unroll
    for (int e = 0; e < N; ++e) sum += exp(v[e] - max);
  }
};

// argmax of a row by that rule, for the rows the fast scan cannot answer
// (a NaN or an infinity makes their log-sum-exp non-finite). Every thread
// gets it.
template <class T, class A>
__device__ int64_t exact_argmax(const T* x, int64_t cols, A* shared_value, int64_t* shared_column) {
  A best = A(-INFINITY);
  int64_t column = kNoColumn;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const A v = convert<A>(x[c]);
    if (column == kNoColumn || argmax_wins(v, c, best, column)) {
      best = v;
      column = c;
    }
  }
  // A tree over the block's threads; a thread without columns never wins.
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  for (int w = 16; w > 0; w /= 2) {
    const A ov = __shfl_xor_sync(0xffffffffu, best, w);
    const int64_t oc = __shfl_xor_sync(0xffffffffu, column, w);
    if (oc != kNoColumn && (column == kNoColumn || argmax_wins(ov, oc, best, column))) {
      best = ov;
      column = oc;
    }
  }
  if (lane == 0) {
    shared_value[warp] = best;
    shared_column[warp] = column;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < warps; ++w)
      if (shared_column[w] != kNoColumn &&
          (shared_column[0] == kNoColumn ||
           argmax_wins(shared_value[w], shared_column[w], shared_value[0], shared_column[0]))) {
        shared_value[0] = shared_value[w];
        shared_column[0] = shared_column[w];
      }
  }
  __syncthreads();
  const int64_t out = shared_column[0];
  __syncthreads();
  return out;
}

// Per row: lse, the row loss (0 for rows not counted) and hit (1 where a
// counted row's argmax is its target).
template <class T, class I, bool Packs>
__global__ void row_loss_kernel(const T* logits, const I* targets, int64_t cols, int64_t ignore,
                                double* lse, double* row_loss, int32_t* hit) {
  using A = acc_t<T>;
  __shared__ A shared[32];
  __shared__ int64_t shared_column[32];
  __shared__ double shared_lse;
  const int64_t r = blockIdx.x;
  const T* x = logits + r * cols;
  RowScan<A> scan;
  int64_t singles = 0;  // the first column taken one by one
  if constexpr (Packs) {
    // Two packs a step in flight, so a thread waits on memory half as often.
    const Pack8<T>* packs = reinterpret_cast<const Pack8<T>*>(x);
    const int64_t n = cols / 8, step = blockDim.x;
    int64_t p = threadIdx.x;
    for (; p + step < n; p += 2 * step) {
      const Pack8<T> a = packs[p], b = packs[p + step];
      A va[8], vb[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        va[e] = convert<A>(a.v[e]);
        vb[e] = convert<A>(b.v[e]);
      }
      scan.add(va, p * 8);
      scan.add(vb, (p + step) * 8);
    }
    if (p < n) {
      const Pack8<T> a = packs[p];
      A va[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) va[e] = convert<A>(a.v[e]);
      scan.add(va, p * 8);
    }
    // The tail past the packs: higher columns than any pack's, so each
    // thread still takes its columns in increasing order.
    singles = n * 8;
  }
  for (int64_t c = singles + threadIdx.x; c < cols; c += blockDim.x) {
    const A v[1] = {convert<A>(x[c])};
    scan.add(v, c);
  }
  const A m = block_max(scan.max, shared);
  const A s = block_sum(scan.max == m ? scan.sum : scan.sum * exp(scan.max - m), shared);
  int64_t first =
      block_reduce(scan.max == m ? scan.first : kNoColumn, shared_column, MinOp{}, kNoColumn);
  if (threadIdx.x == 0) shared_lse = double(m + log(s));
  __syncthreads();
  const double l = shared_lse;
  // Finite: no NaN or infinity in the row, and `first` is argmax's answer.
  if (!isfinite(l)) first = exact_argmax(x, cols, shared, shared_column);
  if (threadIdx.x == 0) {
    int64_t t;
    const bool in = counted(targets, r, ignore, cols, &t);
    lse[r] = l;
    row_loss[r] = in ? l - double(convert<A>(x[t])) : 0.0;
    hit[r] = in && first == t ? 1 : 0;
  }
}

template <class I, class L>
__global__ void finish_kernel(const I* targets, const double* row_loss, const int32_t* hit,
                              int64_t rows, int64_t cols, int64_t ignore, L* loss, int64_t* count,
                              int64_t* correct, unsigned long long* first_bad) {
  __shared__ double shared_sum[32];
  __shared__ long long shared_count[32];
  double sum = 0.0;
  long long n = 0, hits = 0;
  unsigned long long bad = ~0ull;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    int64_t t;
    if (counted(targets, r, ignore, cols, &t)) {
      ++n;
      hits += hit[r];
      sum += row_loss[r];
    } else if (t != ignore && (unsigned long long)r < bad) {
      bad = (unsigned long long)r;
    }
  }
  sum = block_sum(sum, shared_sum);
  n = block_sum(n, shared_count);
  hits = block_sum(hits, shared_count);
  if (bad != ~0ull) atomicMin(first_bad, bad);
  if (threadIdx.x == 0) {
    *count = n;
    *correct = hits;
    *loss = L(n > 0 ? sum / double(n) : 0.0);
  }
}

// grad = (softmax - onehot(t)) * s, s = grad_loss / count, for the columns
// [c0, c0 + N) of a counted row.
template <class T, class A, int N>
__device__ __forceinline__ void softmax_grad(const T* x, T* g, int64_t c0, int64_t t, A l, A s) {
#pragma unroll
  for (int e = 0; e < N; ++e) {
    const A p = exp(convert<A>(x[e]) - l) * s;
    g[e] = convert<T>(c0 + e == t ? p - s : p);
  }
}

template <class T, class I, class G, bool Packs>
__global__ void cross_entropy_grad_kernel(const T* logits, const I* targets, const double* lse,
                                          const G* grad_loss, const int64_t* count, T* grad,
                                          int64_t cols, int64_t ignore) {
  using A = acc_t<T>;
  const int64_t r = blockIdx.x;
  const T* x = logits + r * cols;
  T* g = grad + r * cols;
  int64_t t;
  const bool in = counted(targets, r, ignore, cols, &t);
  const int64_t n = *count;
  const A s = A(in && n > 0 ? convert<double>(*grad_loss) / double(n) : 0.0);
  const A l = A(lse[r]);
  int64_t singles = 0;  // the first column taken one by one
  if constexpr (Packs) {
    const Pack8<T>* xp = reinterpret_cast<const Pack8<T>*>(x);
    Pack8<T>* gp = reinterpret_cast<Pack8<T>*>(g);
    for (int64_t p = threadIdx.x; p < cols / 8; p += blockDim.x) {
      Pack8<T> out;
      if (in) {
        const Pack8<T> v = xp[p];
        softmax_grad<T, A, 8>(v.v, out.v, p * 8, t, l, s);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) out.v[e] = convert<T>(0.0f);
      }
      gp[p] = out;
    }
    singles = cols / 8 * 8;  // the tail past the packs
  }
  for (int64_t c = singles + threadIdx.x; c < cols; c += blockDim.x) {
    if (in)
      softmax_grad<T, A, 1>(x + c, g + c, c, t, l, s);
    else
      g[c] = convert<T>(0.0f);
  }
}

}  // namespace

void cross_entropy_forward(Stream stream, const KernelTensor& logits, const KernelTensor& targets,
                           int64_t ignore_index, int32_t site, const KernelTensor& lse,
                           const KernelTensor& row_loss, const KernelTensor& loss,
                           const KernelTensor& count, const KernelTensor& correct) {
  RF_CHECK(logits.ndim == 2 && logits.is_contiguous() && targets.is_contiguous() &&
               targets.numel() == logits.sizes[0],
           "cross_entropy_forward: expected contiguous logits [N, C] and targets [N]");
  const int64_t rows = logits.sizes[0], cols = logits.sizes[1];
  Scratch hits(stream, size_t(rows) * sizeof(int32_t));
  on_index_dtype(targets.dtype, "cross_entropy targets", [&](auto itag) {
    using I = decltype(itag);
    if (rows > 0 && cols > 0) {
      on_floating_dtype(logits.dtype, "cross_entropy", [&](auto tag) {
        using T = decltype(tag);
        const auto kernel = rows_in_packs<T>(logits.data, cols) ? row_loss_kernel<T, I, true>
                                                                : row_loss_kernel<T, I, false>;
        RF_LAUNCH(kernel, unsigned(rows), kRowThreads, 0, native(stream), logits.as<const T>(),
                  targets.as<const I>(), cols, ignore_index, lse.as<double>(),
                  row_loss.as<double>(), hits.as<int32_t>());
      });
    }
    Scratch first(stream, sizeof(unsigned long long));
    RF_CUDA_CHECK(
        cudaMemsetAsync(first.as<void>(), 0xff, sizeof(unsigned long long), native(stream)));
    auto finish = [&](auto ltag) {
      using L = decltype(ltag);
      RF_LAUNCH((finish_kernel<I, L>), 1, kFinishThreads, 0, native(stream), targets.as<const I>(),
                row_loss.as<const double>(), hits.as<const int32_t>(), rows, cols, ignore_index,
                loss.as<L>(), count.as<int64_t>(), correct.as<int64_t>(),
                first.as<unsigned long long>());
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
        const bool packs = rows_in_packs<T>(logits.data, cols) && rows_in_packs<T>(grad.data, cols);
        const auto kernel = packs ? cross_entropy_grad_kernel<T, I, G, true>
                                  : cross_entropy_grad_kernel<T, I, G, false>;
        RF_LAUNCH(kernel, unsigned(rows), kRowThreads, 0, native(stream), logits.as<const T>(),
                  targets.as<const I>(), lse.as<const double>(), grad_loss.as<const G>(),
                  count.as<const int64_t>(), grad.as<T>(), cols, ignore_index);
      });
    });
  });
}

}  // namespace roformer::kernels::cuda
