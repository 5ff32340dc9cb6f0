// The dtypes and the residual dropout layer_norm_forward and
// layer_norm_backward accept (core/kernels/kernel_list.h), one rule checked
// alike by every device's kernel. C++17, no host-only types: nvcc reads this
// header.
#pragma once

#include "core/error.h"
#include "core/kernels/kernel_list.h"

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

// y's bf16 copy: of an f32 y, contiguous, y's size.
inline void check_layer_norm_y_low(const KernelTensor& y, const KernelTensor& y_low) {
  RF_CHECK(!y_low.defined() || (y.dtype == DType::f32 && y_low.dtype == DType::bf16 &&
                                y_low.is_contiguous() && y_low.numel() == y.numel()),
           "layer_norm_forward: y_low is a contiguous bf16 copy of an f32 y");
}

// x's gradient where it is not dx: x's dtype, dx's or bf16 on an f32 dx.
inline void check_layer_norm_x_grad(const KernelTensor& dx, const KernelTensor& dx_x) {
  RF_CHECK(!dx_x.defined() ||
               (dx_x.is_contiguous() && dx_x.numel() == dx.numel() &&
                (dx_x.dtype == dx.dtype || (dx.dtype == DType::f32 && dx_x.dtype == DType::bf16))),
           "layer_norm_backward: dx_x (", dx_x.defined() ? dtype_name(dx_x.dtype) : "none",
           ") must be a contiguous gradient of dx's size in dx's dtype (", dtype_name(dx.dtype),
           ") or bf16 for an f32 dx");
}

// A residual dropout needs somewhere to go (`target`: the forward's residual,
// the backward's dx_x) and rows that are whole tokens: `tokens` [rows, 2] i64,
// or rows a multiple of `positions`.
inline void check_residual_dropout(const char* kernel, const KernelTensor& x,
                                   const ResidualDropout& drop, const KernelTensor& tokens,
                                   const KernelTensor& target) {
  if (!(drop.p > 0.0)) return;
  const int64_t cols = x.ndim > 0 ? x.size(-1) : 0;
  const int64_t rows = cols > 0 ? x.numel() / cols : 0;
  RF_CHECK(drop.p < 1.0, kernel, ": a residual dropout needs p in (0, 1), got ", drop.p);
  RF_CHECK(target.defined(), kernel,
           ": a residual dropout needs the residual (forward) or dx_x (backward)");
  RF_CHECK(drop.positions >= 1, kernel, ": a residual dropout needs positions >= 1, got ",
           drop.positions);
  if (tokens.defined())
    RF_CHECK(tokens.ndim == 2 && tokens.sizes[0] == rows && tokens.sizes[1] == 2 &&
                 tokens.dtype == DType::i64 && tokens.is_contiguous(),
             kernel, ": residual dropout tokens must be contiguous [", rows, ", 2] i64, got ",
             dtype_name(tokens.dtype), " with ", tokens.ndim, " dims, ", tokens.numel(),
             " elements", tokens.is_contiguous() ? "" : ", strided");
  else
    RF_CHECK(rows % drop.positions == 0, kernel, ": ", rows, " rows are not whole sequences of ",
             drop.positions, " positions");
}

}  // namespace roformer::kernels
