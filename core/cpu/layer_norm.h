// Layer normalisation over the last dimension with optional affine weight/bias.
#pragma once

#include "core/tensor.h"

namespace roformer::cpu {

// y = (x - mean) / sqrt(var + eps) * weight + bias over the last dim D of
// contiguous x [rows, D] (any leading shape). weight/bias are [D] of x's dtype
// or undefined (no scale / no shift). mean and var [rows] receive the row
// statistics (f64 for f64 x, f32 otherwise) for the backward. f32 runs on
// oneDNN's layer_normalization_forward; bf16 and f64 run a loop.
void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                        const Tensor& y, const Tensor& mean, const Tensor& var);

// dx (and dweight/dbias [D] when defined, which the kernel overwrites) from
// the saved x, weight, mean, var and the output gradient dy. f32 runs on
// oneDNN's layer_normalization_backward; dweight/dbias are sums over rows in a
// fixed order (deterministic).
void layer_norm_backward(const Tensor& x, const Tensor& weight, const Tensor& mean,
                         const Tensor& var, const Tensor& dy, double eps, const Tensor& dx,
                         const Tensor& dweight, const Tensor& dbias);

}  // namespace roformer::cpu
