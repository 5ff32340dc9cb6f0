// Elementwise CPU kernels over strided (possibly broadcast) operands.
#pragma once

#include "core/tensor.h"

namespace roformer::cpu {

enum class BinaryOp { add, sub, mul, div };
// out = a (op) b; a and b are already expanded to out's shape.
void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out);

enum class UnaryOp {
  neg,
  exp,
  log,
  sqrt,
  rsqrt,
  tanh,
  pow,
  add_scalar,
  mul_scalar,
  rsub_scalar,
  elu_plus_one,
  elu_plus_one_grad
};
// out = f(a; scalar) elementwise.
void unary(UnaryOp op, const Tensor& a, const Tensor& out, double scalar = 0.0);

// out = cond != 0 ? a : b (all expanded to out's shape).
void where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out);

}  // namespace roformer::cpu
