// Column sums of a contiguous [rows, cols] matrix, as bias gradients need
// them, in two passes: fixed chunks of rows summed per column (consecutive
// threads take consecutive columns, so every row is read coalesced), then
// each column's chunk partials in order. The order depends only on the shape:
// deterministic, no atomics. One thread per column summing every row would
// leave a bias gradient (768 columns, up to 10^5 rows) to a handful of blocks.
// The chunks are gridDim.y (at most 65535): they grow past kRowChunk rows when
// there would be more.
#pragma once

#include "core/cuda/kernels/common.cuh"

namespace roformer::kernels::cuda {

namespace column_sums_detail {

constexpr int64_t kRowChunk = 64;

template <class A, class T>
__global__ void partials(const T* x, A* partial, int64_t rows, int64_t cols, int64_t chunk_rows) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  const int64_t r0 = int64_t(blockIdx.y) * chunk_rows;
  const int64_t r1 = r0 + chunk_rows < rows ? r0 + chunk_rows : rows;
  A s = A(0);
  for (int64_t r = r0; r < r1; ++r) s += convert<A>(x[r * cols + c]);
  partial[int64_t(blockIdx.y) * cols + c] = s;
}

template <class A, class T>
__global__ void finish(const A* partial, T* out, int64_t chunks, int64_t cols) {
  RF_GRID_LOOP(c, cols) {
    A s = A(0);
    for (int64_t k = 0; k < chunks; ++k) s += partial[k * cols + c];
    out[c] = convert<T>(s);
  }
}

}  // namespace column_sums_detail

// out[c] = the sum over r of x[r * cols + c], accumulated in A.
template <class A, class T>
void column_sums(const Stream& stream, const T* x, T* out, int64_t rows, int64_t cols) {
  namespace d = column_sums_detail;
  if (cols == 0) return;
  const int64_t chunk_rows = grid_y_chunk(rows, d::kRowChunk);
  const int64_t chunks = rows > 0 ? (rows + chunk_rows - 1) / chunk_rows : 0;
  if (chunks == 0) {
    RF_CUDA_CHECK(cudaMemsetAsync(out, 0, size_t(cols) * sizeof(T), native(stream)));  // 0 bits: 0
    return;
  }
  Scratch partial(stream, size_t(chunks * cols) * sizeof(A));
  const dim3 grid(unsigned((cols + kThreads - 1) / kThreads), unsigned(chunks));
  RF_LAUNCH((d::partials<A, T>), grid, kThreads, 0, native(stream), x, partial.as<A>(), rows, cols,
            chunk_rows);
  RF_LAUNCH((d::finish<A, T>), grid_for(cols), kThreads, 0, native(stream), partial.as<const A>(),
            out, chunks, cols);
}

}  // namespace roformer::kernels::cuda
