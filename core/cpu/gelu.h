// GELU, erf form: 0.5 x (1 + erf(x / sqrt 2)).
#pragma once

#include "core/tensor.h"

namespace roformer::cpu {

// y = gelu(x) elementwise; x and y contiguous, same shape and floating dtype.
// f32/bf16 run on oneDNN's eltwise_gelu_erf; f64 runs a loop.
void gelu_forward(const Tensor& x, const Tensor& y);

// dx = dy * gelu'(x), from the forward's input x (all contiguous).
void gelu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx);

}  // namespace roformer::cpu
