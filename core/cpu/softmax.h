// Softmax and log-softmax over the last dimension.
#pragma once

#include "core/tensor.h"

namespace roformer::cpu {

// y = softmax(x) (log_softmax(x) when `log`) over the last dim. x and y are
// contiguous and of one floating dtype. f32/bf16 run on oneDNN's
// softmax_forward / logsoftmax_forward (cached per geometry); f64 runs a loop.
void softmax_forward(const Tensor& x, const Tensor& y, bool log);

// dx from the forward's output y and the output gradient dy (all contiguous,
// same shape and dtype): oneDNN softmax_backward / logsoftmax_backward, or a
// loop for f64.
void softmax_backward(const Tensor& y, const Tensor& dy, const Tensor& dx, bool log);

}  // namespace roformer::cpu
