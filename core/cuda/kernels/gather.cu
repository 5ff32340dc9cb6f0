// Row gathers (embedding lookup, index_select) and the deterministic
// scatter-add of their backward: the (id, position) pairs are stably sorted
// by id (CUB radix sort), then each id's segment of rows is summed per column
// in position order, without float atomics. A segment can hold most of the
// batch (the token-type table has two rows), so the sorted pairs are cut into
// fixed chunks: one pass sums, per (chunk, column), the run of the id the
// chunk starts with; then one thread per (segment, column) adds its rows in
// its first chunk and those chunk sums for the chunks it goes on into.
#if !defined(ROFORMER_SIMT_EMULATION)  // tests/simt/kernel_emulation.h: a host sort in its place
#include <cub/device/device_radix_sort.cuh>
#endif

#include "core/cuda/kernels/common.cuh"

namespace roformer::kernels::cuda {

namespace {

template <class I>
__device__ __forceinline__ int64_t id_at(const I* ids, int64_t n) {
  return int64_t(ids[n]);
}

template <class I>
__global__ void first_bad_id(const I* ids, int64_t count, int64_t rows, unsigned long long* first) {
  RF_GRID_LOOP(n, count) {
    const int64_t v = id_at(ids, n);
    if (v < 0 || v >= rows) atomicMin(first, (unsigned long long)n);
  }
}

// One thread per (row, word W): the widest word (16 bytes down to the 2 that
// every dtype is a multiple of) that the rows' size and both pointers allow,
// so an f32 row of 768 takes 192 threads, not 1,536.
template <class I, class W>
__global__ void gather_rows_kernel(const char* table, const I* ids, char* out, int64_t count,
                                   int64_t rows, int64_t row_bytes) {
  const int64_t words = row_bytes / int64_t(sizeof(W));
  RF_GRID_LOOP(i, count * words) {
    const int64_t n = i / words, w = i % words;
    const int64_t v = id_at(ids, n);
    W* dst = reinterpret_cast<W*>(out + n * row_bytes) + w;
    *dst = v < 0 || v >= rows ? W{} : reinterpret_cast<const W*>(table + v * row_bytes)[w];
  }
}

// The width gather_rows_kernel moves: 16, 8, 4 or 2 bytes.
int gather_word_bytes(const void* table, const void* out, int64_t row_bytes) {
  const uintptr_t both = reinterpret_cast<uintptr_t>(table) | reinterpret_cast<uintptr_t>(out);
  for (int bytes : {16, 8, 4})
    if (row_bytes % bytes == 0 && both % uintptr_t(bytes) == 0) return bytes;
  return 2;
}

template <class I>
__global__ void make_keys(const I* ids, int64_t count, int64_t rows, int64_t* keys,
                          int64_t* positions) {
  RF_GRID_LOOP(n, count) {
    const int64_t v = id_at(ids, n);
    keys[n] = v < 0 || v >= rows ? rows : v;  // bad ids sort last and are skipped
    positions[n] = n;
  }
}

// Rows of sorted pairs per chunk, at least: about the square root of a
// batch's tokens, so neither pass is long for one thread.
constexpr int64_t kSegmentChunk = 256;

// The end of the run of `key` that starts at sorted index j, within
// [j, end): keys are sorted, so a binary search (a run can be most of the
// batch: the token-type table has two rows).
__device__ __forceinline__ int64_t run_end(const int64_t* keys, int64_t j, int64_t end,
                                           int64_t key) {
  int64_t lo = j + 1, hi = end;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (keys[mid] == key)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

// acc plus values at[j] for j in [j, e), added one by one in order (the bits
// of a plain loop), their loads issued eight at a time: a thread then waits
// on memory once per eight values, not once per value.
template <class A, class At>
__device__ __forceinline__ A add_in_order(A acc, int64_t j, int64_t e, At at) {
  constexpr int kInFlight = 8;
  for (; j + kInFlight <= e; j += kInFlight) {
    A v[kInFlight];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) v[u] = at(j + u);
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) acc += v[u];
  }
  for (; j < e; ++j) acc += at(j);
  return acc;
}

// first_run[chunk][c]: the sum of column c over the chunk's leading run of
// one id, in position order.
template <class T>
__global__ void leading_run_sums(const T* grad_out, const int64_t* keys, const int64_t* positions,
                                 acc_t<T>* first_run, int64_t count, int64_t dim, int64_t chunk) {
  using A = acc_t<T>;
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= dim) return;
  const int64_t begin = int64_t(blockIdx.y) * chunk;
  const int64_t end = begin + chunk < count ? begin + chunk : count;
  const int64_t run = run_end(keys, begin, end, keys[begin]);
  first_run[int64_t(blockIdx.y) * dim + c] = add_in_order(
      A(0), begin, run, [&](int64_t j) { return convert<A>(grad_out[positions[j] * dim + c]); });
}

// A block per segment start (the first sorted index of an id), blockIdx.y
// and the threads over the columns: the segment's rows in its first chunk,
// then the leading-run sums of the chunks it goes on into, in order.
template <class T>
__global__ void segment_sums(const T* grad_out, const int64_t* keys, const int64_t* positions,
                             const acc_t<T>* first_run, T* grad_table, int64_t count, int64_t rows,
                             int64_t dim, int64_t chunk) {
  using A = acc_t<T>;
  const int64_t c = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  for (int64_t s = blockIdx.x; s < count; s += gridDim.x) {
    const int64_t key = keys[s];
    if (key >= rows || (s > 0 && keys[s - 1] == key)) continue;  // not a segment start
    if (c >= dim) continue;
    const int64_t k0 = s / chunk;
    const int64_t first_end = (k0 + 1) * chunk < count ? (k0 + 1) * chunk : count;
    const int64_t e = run_end(keys, s, count, key);
    A acc = add_in_order(A(0), s, e < first_end ? e : first_end,
                         [&](int64_t j) { return convert<A>(grad_out[positions[j] * dim + c]); });
    // Past its first chunk, each chunk the segment reaches starts with it.
    if (e > first_end)
      acc = add_in_order(acc, k0 + 1, (e - 1) / chunk + 1,
                         [&](int64_t k) { return first_run[k * dim + c]; });
    T* dst = grad_table + key * dim + c;
    *dst = convert<T>(convert<A>(*dst) + acc);
  }
}

void check_rows(const KernelTensor& table, const KernelTensor& ids, const char* kernel) {
  RF_CHECK(table.ndim == 2 && table.is_contiguous() && ids.is_contiguous(), kernel,
           ": expected a contiguous table [N, R] and contiguous ids");
}

}  // namespace

void gather_rows(Stream stream, const KernelTensor& table, const KernelTensor& ids, int32_t site,
                 const KernelTensor& out) {
  check_rows(table, ids, "gather_rows");
  RF_CHECK(out.is_contiguous(), "gather_rows: expected a contiguous output");
  const int64_t count = ids.numel(), rows = table.sizes[0];
  const int64_t row_bytes = table.sizes[1] * int64_t(dtype_size(table.dtype));
  if (count == 0) return;
  on_index_dtype(ids.dtype, "gather ids", [&](auto tag) {
    using I = decltype(tag);
    Scratch first(stream, sizeof(unsigned long long));
    RF_CUDA_CHECK(
        cudaMemsetAsync(first.as<void>(), 0xff, sizeof(unsigned long long), native(stream)));
    RF_LAUNCH((first_bad_id<I>), grid_for(count), kThreads, 0, native(stream), ids.as<const I>(),
              count, rows, first.as<unsigned long long>());
    report_first_bad(stream, site, first.as<const unsigned long long>(), ids);
    if (row_bytes == 0) return;
    const int word = gather_word_bytes(table.data, out.data, row_bytes);
    const auto kernel = word == 16  ? gather_rows_kernel<I, uint4>
                        : word == 8 ? gather_rows_kernel<I, uint2>
                        : word == 4 ? gather_rows_kernel<I, uint32_t>
                                    : gather_rows_kernel<I, uint16_t>;
    RF_LAUNCH(kernel, grid_for(count * (row_bytes / word)), kThreads, 0, native(stream),
              table.as<const char>(), ids.as<const I>(), out.as<char>(), count, rows, row_bytes);
  });
}

void scatter_add_rows(Stream stream, const KernelTensor& grad_out, const KernelTensor& ids,
                      const KernelTensor& grad_table) {
  check_rows(grad_table, ids, "scatter_add_rows");
  const int64_t count = ids.numel(), rows = grad_table.sizes[0], dim = grad_table.sizes[1];
  if (count == 0 || dim == 0) return;
  RF_CHECK(grad_out.is_contiguous() && grad_out.dtype == grad_table.dtype &&
               grad_out.numel() == count * dim,
           "scatter_add_rows: the gradient does not match ", count, " rows of the table");
  // keys, positions, sorted keys, sorted positions, then CUB's temporary space.
  const size_t pairs = size_t(count) * sizeof(int64_t);
  Scratch buffers(stream, 4 * pairs);
  int64_t* keys = buffers.as<int64_t>();
  int64_t* positions = keys + count;
  int64_t* sorted_keys = positions + count;
  int64_t* sorted_positions = sorted_keys + count;
  int end_bit = 1;
  while (end_bit < 63 && (int64_t(1) << end_bit) <= rows) ++end_bit;
  on_index_dtype(ids.dtype, "scatter ids", [&](auto tag) {
    using I = decltype(tag);
    RF_LAUNCH((make_keys<I>), grid_for(count), kThreads, 0, native(stream), ids.as<const I>(),
              count, rows, keys, positions);
  });
  size_t temp_bytes = 0;
  RF_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys, sorted_keys, positions,
                                                sorted_positions, count, 0, end_bit,
                                                native(stream)));
  Scratch temp(stream, temp_bytes);
  RF_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.as<void>(), temp_bytes, keys, sorted_keys,
                                                positions, sorted_positions, count, 0, end_bit,
                                                native(stream)));
  const int64_t chunk = grid_y_chunk(count, kSegmentChunk);
  const int64_t chunks = (count + chunk - 1) / chunk;
  on_floating_dtype(grad_table.dtype, "scatter_add_rows", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    Scratch first_run(stream, size_t(chunks * dim) * sizeof(A));
    const dim3 grid(unsigned((dim + kThreads - 1) / kThreads), unsigned(chunks));
    RF_LAUNCH((leading_run_sums<T>), grid, kThreads, 0, native(stream), grad_out.as<const T>(),
              sorted_keys, sorted_positions, first_run.as<A>(), count, dim, chunk);
    // A block per sorted index up to 2^16 (most are not segment starts and
    // leave at once), then each block takes every 2^16-th.
    const dim3 segments(unsigned(count < 65536 ? count : 65536), grid.x);
    RF_LAUNCH((segment_sums<T>), segments, kThreads, 0, native(stream), grad_out.as<const T>(),
              sorted_keys, sorted_positions, first_run.as<const A>(), grad_table.as<T>(), count,
              rows, dim, chunk);
  });
}

}  // namespace roformer::kernels::cuda
