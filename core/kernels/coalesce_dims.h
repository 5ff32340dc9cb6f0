// The geometry of an elementwise call made as flat as its operands allow:
// dims of size 1 are dropped, and two adjacent dims merge when every operand
// steps over the outer one as one stride of the inner one (outer stride ==
// inner stride x inner size). A call on contiguous operands of one shape
// becomes a single dim, and a bias added to rows two; the row-major index of
// every element, and so each operand's offset for it, is unchanged. GPU
// kernels then divide by fewer sizes per element. Host code, no device.
#pragma once

#include <cstdint>

#include "core/kernels/kernel_tensor.h"

namespace roformer::kernels {

// Rewrites sizes[0, ndim) and strides[k][0, ndim) of `operands` operands in
// place; returns the new ndim (0 when every dim has size 1).
inline int32_t coalesce_dims(int32_t ndim, int64_t* sizes, int64_t (*strides)[kMaxDims],
                             int operands) {
  int32_t out = 0;
  for (int32_t d = 0; d < ndim; ++d) {
    if (sizes[d] == 1) continue;
    bool merge = out > 0;
    for (int k = 0; merge && k < operands; ++k)
      merge = strides[k][out - 1] == strides[k][d] * sizes[d];
    if (merge) {
      sizes[out - 1] *= sizes[d];
      for (int k = 0; k < operands; ++k) strides[k][out - 1] = strides[k][d];
    } else {
      sizes[out] = sizes[d];
      for (int k = 0; k < operands; ++k) strides[k][out] = strides[k][d];
      ++out;
    }
  }
  return out;
}

}  // namespace roformer::kernels
