#pragma once

#include "core/tensor.h"

namespace roformer::cpu {

// out[..., M, N] = a[..., M, K] x b[..., K, N] (+ bias[N]). Operands may be
// transposed views (one unit stride in their last two dims) and may broadcast
// batch dims with stride 0. f32/bf16 run on oneDNN's matmul primitive (cached
// per geometry); f64 runs a plain loop (used by gradient checks).
void matmul(const Tensor& a, const Tensor& b, const Tensor& bias, const Tensor& out);

}  // namespace roformer::cpu
