// KernelTensor: what a kernel sees of a tensor -- a pointer, a dtype, sizes
// and strides (in elements), nothing else. No Tensor, no autograd, no
// ownership: the op keeps the storage alive for the duration of the call (and,
// on a device with streams, the caching allocator keeps it until the stream
// has passed). C++17 and free of host-only types so nvcc can read it.
#pragma once

#include <cstdint>

#include "core/dtype.h"

#if defined(__CUDACC__)
#define ROFORMER_HOST_DEVICE __host__ __device__
#else
#define ROFORMER_HOST_DEVICE
#endif

namespace roformer::kernels {

constexpr int kMaxDims = 8;

struct KernelTensor {
  void* data = nullptr;  // first element (storage start + offset)
  DType dtype = DType::f32;
  int32_t ndim = -1;  // -1: no tensor (an optional argument left out)
  int64_t sizes[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};  // in elements; 0 for broadcast dims

  ROFORMER_HOST_DEVICE bool defined() const { return ndim >= 0; }
  ROFORMER_HOST_DEVICE int64_t numel() const {
    int64_t n = 1;
    for (int32_t d = 0; d < ndim; ++d) n *= sizes[d];
    return ndim < 0 ? 0 : n;
  }
  ROFORMER_HOST_DEVICE int64_t size(int32_t d) const { return sizes[d < 0 ? d + ndim : d]; }
  ROFORMER_HOST_DEVICE int64_t stride(int32_t d) const { return strides[d < 0 ? d + ndim : d]; }
  // As Tensor::is_contiguous: a tensor with no element is contiguous.
  ROFORMER_HOST_DEVICE bool is_contiguous() const {
    for (int32_t d = 0; d < ndim; ++d)
      if (sizes[d] == 0) return true;
    int64_t expected = 1;
    for (int32_t d = ndim - 1; d >= 0; --d) {
      if (sizes[d] != 1 && strides[d] != expected) return false;
      expected *= sizes[d];
    }
    return true;
  }
  template <class T>
  ROFORMER_HOST_DEVICE T* as() const {
    return static_cast<T*>(data);
  }
};

// t with dimensions d0 and d1 swapped: a view, no data moves (a token stream
// [T, H, D] seen as [H, T, D]; g [T, N] seen as g^T).
inline KernelTensor swapped(KernelTensor t, int32_t d0, int32_t d1) {
  const int64_t size = t.sizes[d0], stride = t.strides[d0];
  t.sizes[d0] = t.sizes[d1];
  t.strides[d0] = t.strides[d1];
  t.sizes[d1] = size;
  t.strides[d1] = stride;
  return t;
}

}  // namespace roformer::kernels
