#pragma once

#include <vector>

#include "core/tensor.h"

namespace roformer::cpu {

// out (keepdim shape: 1 at reduced dims, contiguous) = sum of x over `dims`.
void sum(const Tensor& x, const std::vector<bool>& reduced, const Tensor& out);

// values/indices (contiguous, keepdim shape) = max of x along dim.
void max(const Tensor& x, int64_t dim, const Tensor& values, const Tensor& indices);

// grad_x (zeroed, x's shape) [argmax positions along dim] += grad (keepdim shape).
void scatter_along(const Tensor& grad, const Tensor& indices, int64_t dim, const Tensor& grad_x);

}  // namespace roformer::cpu
