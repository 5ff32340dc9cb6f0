// The dtypes layer_norm_forward accepts (core/kernels/kernel_list.h), one rule
// checked alike by every device's kernel. C++17, no host-only types: nvcc
// reads this header.
#pragma once

#include "core/error.h"
#include "core/kernels/kernel_tensor.h"

namespace roformer::kernels {

// bf16 x added to an f32 residual stream (bf16 activations under autocast):
// the sum, the output and the parameters are f32.
inline bool layer_norm_mixed_residual(const KernelTensor& x, const KernelTensor& residual) {
  return residual.defined() && x.dtype == DType::bf16 && residual.dtype == DType::f32;
}

// Throws naming every dtype unless all tensors share one dtype (the mixed
// residual case aside) and mean and var are its accumulation dtype.
inline void check_layer_norm_forward_dtypes(const KernelTensor& x, const KernelTensor& residual,
                                            const KernelTensor& weight, const KernelTensor& bias,
                                            const KernelTensor& y, const KernelTensor& sum,
                                            const KernelTensor& mean, const KernelTensor& var) {
  // The rows normalised have the residual's dtype when there is one.
  const DType t = residual.defined() ? residual.dtype : x.dtype;
  const DType stat = t == DType::f64 ? DType::f64 : DType::f32;
  const auto is = [](const KernelTensor& k, DType d) { return !k.defined() || k.dtype == d; };
  const auto name = [](const KernelTensor& k) {
    return k.defined() ? dtype_name(k.dtype) : "none";
  };
  RF_CHECK((x.dtype == t || layer_norm_mixed_residual(x, residual)) && is(weight, t) &&
               is(bias, t) && y.dtype == t && is(sum, t) && mean.dtype == stat && var.dtype == stat,
           "layer_norm_forward: unsupported dtypes (x ", name(x), ", residual ", name(residual),
           ", weight ", name(weight), ", bias ", name(bias), ", y ", name(y), ", sum ", name(sum),
           ", mean ", name(mean), ", var ", name(var),
           "): expected one dtype for all but mean and var (f32, or f64 for f64), or bf16 x "
           "with an f32 residual and f32 for the rest");
}

}  // namespace roformer::kernels
