// What dropout() and dropout_add_layer_norm (core/ops/layer_norm.cpp) share:
// the argument checks, one message for both.
#pragma once

#include "core/tensor.h"

namespace roformer {

// Throws naming `op` unless p is in [0, 1) and, when `tokens` is defined, it
// is [T, 2] i64 for x [T, ...].
void check_dropout_arguments(const char* op, const Tensor& x, double p, const Tensor& tokens);

}  // namespace roformer
