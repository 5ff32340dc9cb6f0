// The operands linear_weight_grads accepts (core/kernels/kernel_list.h), one
// rule checked alike by every device's kernel. C++17, no host-only types:
// nvcc reads this header.
#pragma once

#include "core/error.h"
#include "core/kernels/kernel_tensor.h"

namespace roformer::kernels {

// g [T, N], x [T, K], dw [N, K] and a contiguous db [N] in g's dtype.
inline void check_linear_weight_grads(const KernelTensor& g, const KernelTensor& x,
                                      const KernelTensor& dw, const KernelTensor& db) {
  RF_CHECK(g.ndim == 2 && x.ndim == 2 && dw.ndim == 2 && db.ndim == 1 && db.is_contiguous() &&
               x.sizes[0] == g.sizes[0] && dw.sizes[0] == g.sizes[1] && dw.sizes[1] == x.sizes[1] &&
               db.sizes[0] == g.sizes[1] && db.dtype == g.dtype,
           "linear_weight_grads kernel: expected g [T, N], x [T, K], dw [N, K] and a contiguous "
           "db [N] in g's dtype");
}

}  // namespace roformer::kernels
