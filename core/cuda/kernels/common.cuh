// What every CUDA kernel of the list shares: element types, strided index
// math over KernelTensor, dtype dispatch, launch sizes, per-call scratch
// memory and index-error reports. C++17 (nvcc).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "core/cuda/backend.h"
#include "core/cuda/check.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/kernels/coalesce_dims.h"
#include "core/kernels/kernel_list.h"

namespace roformer::kernels::cuda {

using bf16_t = __nv_bfloat16;

inline cudaStream_t native(const Stream& s) {
  return static_cast<cudaStream_t>(s.native);
}

// --- element types ---------------------------------------------------------------
// Arithmetic type of T: roformer::acc_t (core/dtype.h), double for f64 and
// float for f32 and bf16, as on the CPU.

template <class To, class From>
__device__ __forceinline__ To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<From, bf16_t>) {
    return convert<To>(__bfloat162float(v));
  } else if constexpr (std::is_same_v<To, bf16_t>) {
    return __float2bfloat16_rn(float(v));  // from double: via float, as the CPU does
  } else {
    return To(v);
  }
}

// The dtype dispatch of core/dtype.h with bf16 as __nv_bfloat16.
template <class Fn>
void on_any_dtype(DType t, Fn&& fn) {
  dispatch_all<bf16_t>(t, std::forward<Fn>(fn));
}
template <class Fn>
void on_floating_dtype(DType t, const char* what, Fn&& fn) {
  dispatch_floating<bf16_t>(t, what, std::forward<Fn>(fn));
}
template <class Fn>
void on_index_dtype(DType t, const char* what, Fn&& fn) {
  dispatch_index(t, what, std::forward<Fn>(fn));
}

// --- geometry ----------------------------------------------------------------------
// Shape of an elementwise call plus up to N operands' strides over it.
template <int N>
struct Strided {
  int32_t ndim = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[N][kMaxDims] = {};

  // Element offsets of linear index i (row-major over sizes) in each operand.
  __device__ __forceinline__ void offsets(int64_t i, int64_t (&out)[N]) const {
    if (ndim == 1) {  // coalesced to one dim (contiguous operands): no division
#pragma unroll
      for (int k = 0; k < N; ++k) out[k] = i * strides[k][0];
      return;
    }
#pragma unroll
    for (int k = 0; k < N; ++k) out[k] = 0;
    for (int32_t d = ndim - 1; d >= 0; --d) {
      const int64_t idx = i % sizes[d];
      i /= sizes[d];
#pragma unroll
      for (int k = 0; k < N; ++k) out[k] += idx * strides[k][d];
    }
  }
};

// `shape` gives the sizes; operands must have that many dims (broadcast dims
// carry stride 0, as the op expands them). The dims are coalesced
// (core/kernels/coalesce_dims.h).
template <int N>
Strided<N> strided(const KernelTensor& shape, const KernelTensor* const (&operands)[N]) {
  Strided<N> s;
  s.ndim = shape.ndim;
  for (int32_t d = 0; d < shape.ndim; ++d) s.sizes[d] = shape.sizes[d];
  for (int k = 0; k < N; ++k) {
    RF_CHECK(operands[k]->ndim == shape.ndim, "cuda kernel: operand with ", operands[k]->ndim,
             " dims for a result with ", shape.ndim);
    for (int32_t d = 0; d < shape.ndim; ++d) s.strides[k][d] = operands[k]->strides[d];
  }
  s.ndim = coalesce_dims(s.ndim, s.sizes, s.strides, N);
  return s;
}

// Eight consecutive elements, moved as whole 16-byte words (16 B of bf16,
// 32 of f32, 64 of f64): a warp's lanes then read and write adjacent words,
// where one 2- or 4-byte access a lane needs 4-8x the instructions per byte.
template <class T>
struct alignas(16) Pack8 {
  T v[8];
};
static_assert(alignof(Pack8<double>) == 16 && alignof(Pack8<bf16_t>) == 16,
              "a Pack8 of any element type starts on a 16-byte boundary");

// Whether p may be read or written as Pack8s (of any element type).
__host__ __device__ __forceinline__ bool on_pack_boundary(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// Whether every operand of `geo` is contiguous (coalesced to one dim of unit
// stride) and starts on a Pack8 boundary: then a kernel may take eight
// elements a thread as one Pack8.
template <class T, int N>
bool packs_of_eight(const Strided<N>& geo, const void* const (&data)[N]) {
  // Types under 2 bytes would pad a Pack8 past their eight elements.
  if (sizeof(Pack8<T>) != 8 * sizeof(T) || geo.ndim != 1) return false;
  for (int k = 0; k < N; ++k)
    if (geo.strides[k][0] != 1 || !on_pack_boundary(data[k])) return false;
  return true;
}

// Offset of linear index i (row-major) in t.
__device__ __forceinline__ int64_t offset_of(const KernelTensor& t, int64_t i) {
  int64_t off = 0;
  for (int32_t d = t.ndim - 1; d >= 0; --d) {
    off += (i % t.sizes[d]) * t.strides[d];
    i /= t.sizes[d];
  }
  return off;
}

// --- launches ------------------------------------------------------------------------
constexpr int kThreads = 256;
constexpr int64_t kMaxGridY = 65535;  // gridDim.y's (and z's) limit

// Rows per chunk when `rows` are cut into chunks of at least `at_least` rows,
// one per gridDim.y index: more rows per chunk past kMaxGridY chunks.
inline int64_t grid_y_chunk(int64_t rows, int64_t at_least) {
  const int64_t needed = (rows + kMaxGridY - 1) / kMaxGridY;
  return needed > at_least ? needed : at_least;
}

inline unsigned grid_for(int64_t n, int threads = kThreads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return unsigned(blocks < 1 ? 1 : (blocks > 65535 * 32 ? 65535 * 32 : blocks));
}

// Grid-stride loop over [0, n).
#define RF_GRID_LOOP(i, n)                                                  \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += int64_t(gridDim.x) * blockDim.x)

// A kernel's dynamic shared memory (the launch's third argument) as
// `unsigned char name[]`; the SIMT emulator (tests/simt/simt.h) defines its own.
#ifndef RF_DYNAMIC_SHARED
#define RF_DYNAMIC_SHARED(name) extern __shared__ __align__(16) unsigned char name[]
#endif

// Launches and checks; wrap a template kernel in parentheses:
// RF_LAUNCH((k<T, U>), grid, block, shared, stream, args...).
#define RF_LAUNCH(kernel, grid, block, shared, stream, ...)                 \
  do {                                                                      \
    auto* launched_kernel_ = kernel;                                        \
    launched_kernel_<<<(grid), (block), (shared), (stream)>>>(__VA_ARGS__); \
    ::roformer::cuda::check_launch(#kernel, __FILE__, __LINE__);            \
  } while (0)

// --- block reductions (fixed order for a given block size: deterministic) -----------
struct SumOp {
  template <class A>
  __device__ __forceinline__ A operator()(A a, A b) const {
    return a + b;
  }
};
struct MaxOp {
  template <class A>
  __device__ __forceinline__ A operator()(A a, A b) const {
    return b > a ? b : a;
  }
};
struct MinOp {
  template <class A>
  __device__ __forceinline__ A operator()(A a, A b) const {
    return b < a ? b : a;
  }
};
template <class A, class Op>
__device__ __forceinline__ A warp_reduce(A v, Op op) {
#pragma unroll
  for (int w = 16; w > 0; w /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, w));
  return v;
}
// Every thread gets op over the block's values (`identity`: op's neutral
// value); blockDim.x a multiple of 32, <= 1024. `shared` holds 32 values; the
// call ends with a barrier, so it can be reused.
template <class A, class Op>
__device__ A block_reduce(A v, A* shared, Op op, A identity) {
  v = warp_reduce(v, op);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const A total = warp_reduce(lane < warps ? shared[lane] : identity, op);
  __syncthreads();
  return total;
}
template <class A>
__device__ A block_sum(A v, A* shared) {
  return block_reduce(v, shared, SumOp{}, A(0));
}
template <class A>
__device__ A block_max(A v, A* shared) {
  return block_reduce(v, shared, MaxOp{}, A(-INFINITY));
}

// Whether (value a, index ia) wins over (b, ib) as max's serial scan decides
// (max_kernel; argmax_index, core/cpu/argmax_rule.h): the first NaN, else the
// first of the largest value. For reductions that split the scan.
template <class A>
__device__ __forceinline__ bool argmax_wins(A a, int64_t ia, A b, int64_t ib) {
  const bool a_nan = isnan(a), b_nan = isnan(b);
  if (a_nan != b_nan) return a_nan;
  if (!a_nan && a != b) return a > b;
  return ia < ib;
}

// The max of a row and the sum of exp(x - max) over it, in A = acc_t<T>:
// softmax's first pass (one block per row; every thread gets both; the
// cross-entropy scans its rows once, cross_entropy.cu). `shared` holds 32 values of A.
template <class A>
struct RowMaxSumExp {
  A max, sum;
};
template <class T, class A>
__device__ RowMaxSumExp<A> row_max_sum_exp(const T* row, int64_t cols, A* shared) {
  A m = -INFINITY;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const A v = convert<A>(row[c]);
    m = v > m ? v : m;
  }
  m = block_max(m, shared);
  A s = 0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) s += exp(convert<A>(row[c]) - m);
  return {m, block_sum(s, shared)};
}

// Device memory for one kernel call's temporaries, ordered on its stream:
// freed at the end of the call, the block is reused only by later work there
// (StreamMemory owns it). Never null: a request of 0 bytes takes 1 (cub
// reads a null temporary as a question about its size).
class Scratch {
 public:
  Scratch(const Stream& stream, size_t nbytes)
      : memory_(stream.device_index, native(stream), nbytes > 0 ? nbytes : 1) {}
  template <class T>
  T* as() const {
    return static_cast<T*>(memory_.get());
  }

 private:
  ::roformer::cuda::StreamMemory memory_;
};

// A contiguous KernelTensor over memory of `dtype` with `t`'s sizes.
inline KernelTensor contiguous_like(const KernelTensor& t, void* data, DType dtype) {
  KernelTensor out;
  out.data = data;
  out.dtype = dtype;
  out.ndim = t.ndim;
  int64_t s = 1;
  for (int32_t d = t.ndim - 1; d >= 0; --d) {
    out.sizes[d] = t.sizes[d];
    out.strides[d] = s;
    s *= t.sizes[d];
  }
  return out;
}

inline size_t nbytes_of(const KernelTensor& t) {
  return size_t(t.numel()) * dtype_size(t.dtype);
}

// --- index errors ---------------------------------------------------------------------
// The first bad index of a call (smallest position): kernels atomicMin the
// position into `first` (initialised to INT64_MAX), then report_first_bad
// copies it, the id and the site to the stream's error record, unless an
// earlier report is still there.
void report_first_bad(const Stream& stream, int32_t site, const unsigned long long* first,
                      const KernelTensor& ids);

// The record report_first_bad writes (one thread; also the SIMT emulator's
// stand-in for it): the first bad position and its id, unless the record
// already holds a report.
__device__ __forceinline__ void record_first_bad(KernelError* record, int32_t site,
                                                 const unsigned long long* first,
                                                 const KernelTensor& ids) {
  const unsigned long long position = *first;
  if (position == ~0ull || record->raised) return;
  const int64_t off = offset_of(ids, int64_t(position));
  record->raised = 1;
  record->site = site;
  record->position = int64_t(position);
  record->value = ids.dtype == DType::i32 ? int64_t(ids.as<const int32_t>()[off])
                                          : ids.as<const int64_t>()[off];
}

}  // namespace roformer::kernels::cuda
